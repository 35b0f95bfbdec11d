"""A small training-like loop recorded with the shim, run as its own process by
test_machine_loops.py (pinning and the shim's writer thread are per process).

    python machine_loop.py RUN_DIR N PIN BUSY KEEP_MIB

- PIN 1: the process is pinned to one core first (``os.sched_setaffinity``),
  so every thread it starts, the shim's writer too, shares that core;
- BUSY: threads hashing beside the loop (hashlib releases the GIL: each
  wants a core of its own);
- KEEP_MIB: MiB the loop keeps each step (written, so resident).

Each iteration: ``forward`` (2 hashes of 2 MiB), ``backward`` (3), ``retain``.
Prints one JSON line of the loop's own truth: ``bare`` ([thread CPU seconds,
wall seconds] of each iteration's compute phases, bare ``time.thread_time`` /
``time.perf_counter``) and ``rss`` ([iteration, RSS bytes] read from
/proc/self/statm after each step) and ``phase_wall`` (bare wall seconds of
``forward`` and ``backward`` summed over the run). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time

from dflash_runtime import Recorder

MiB = 1 << 20
BUF = b"\x07" * (2 * MiB)


def _hash(times: int) -> None:
    for _ in range(times):
        hashlib.sha256(BUF).digest()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    run_dir, n, pin, busy, keep_mib = (sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1",
                                       int(sys.argv[4]), int(sys.argv[5]))
    if pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    stop = threading.Event()

    def burn() -> None:
        while not stop.is_set():
            _hash(1)

    threads = [threading.Thread(target=burn, daemon=True) for _ in range(busy)]
    for t in threads:
        t.start()
    rec = Recorder(run_dir, run_id=os.path.basename(run_dir), sys_interval=0.02,
                   install_handlers=False)
    keep, rss, bare = [], [], []
    phase_wall = {"forward": 0.0, "backward": 0.0}
    for i in range(n):
        with rec.iteration() as it:
            c0, t0 = time.thread_time(), time.perf_counter()
            with it.phase("forward"):
                _hash(2)
            t1 = time.perf_counter()
            with it.phase("backward"):
                _hash(3)
            t2 = time.perf_counter()
            phase_wall["forward"] += t1 - t0
            phase_wall["backward"] += t2 - t1
            bare.append([time.thread_time() - c0, time.perf_counter() - t0])
            with it.phase("retain"):
                if keep_mib:
                    keep.append(bytearray(b"\x01" * (keep_mib * MiB)))
        rss.append([i, _rss()])
    rec.close()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({"bare": bare, "rss": rss, "phase_wall": phase_wall}))


if __name__ == "__main__":
    main()
