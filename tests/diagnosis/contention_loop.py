"""A loop recorded with the shim that is off the CPU in ``forward`` for one of two
reasons, run as its own process by test_contention_truth.py:

    python contention_loop.py RUN_DIR N MODE

- MODE ``sleep``: ``forward`` allocates 8 MiB, hashes 1 MiB (a few ms of CPU)
  and sleeps 30 ms: off the CPU mostly asleep (blocked, not waiting for a core);
- MODE ``plain``: the same without the sleep (the baseline of a comparison);
- MODE ``crowded``: the process pins itself to one core
  (``os.sched_setaffinity``) and starts three spinning processes that inherit
  that core; ``forward`` hashes 4 MiB: off the CPU mostly runnable, waiting
  for the core the spinners hold.

Prints one JSON line of the loop's own truth, per iteration
``[thread CPU s, wall s, run-queue s]`` of the iteration's whole cycle (from its
start to the next one's), measured with bare ``time.thread_time`` /
``time.perf_counter`` and the scheduler's run-queue delay of this thread
(``/proc/self/task/<tid>/schedstat`` field 2, ns). Linux only; standard library only.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import threading
import time

from dflash_runtime import Recorder

MiB = 1 << 20
BUF = b"\x07" * MiB


def _run_queue_s() -> float:
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def _spin() -> None:
    while True:
        pass


def main() -> None:
    run_dir, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    spinners = []
    if mode == "crowded":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        ctx = multiprocessing.get_context("fork")
        spinners = [ctx.Process(target=_spin, daemon=True) for _ in range(3)]
        for p in spinners:
            p.start()       # each inherits the one core
    rec = Recorder(run_dir, run_id=os.path.basename(run_dir), sys_interval=0.02,
                   install_handlers=False)
    truth = []
    keep = None
    # Read at each iteration's start and after the last one: iteration i's truth is
    # the whole cycle up to the next start (its phases, the time in no phase and the
    # step between iterations), the wall time tlog's steady window covers.
    c0, t0, q0 = time.thread_time(), time.perf_counter(), _run_queue_s()
    for _ in range(n):
        with rec.iteration() as it, it.phase("forward"):
            if mode in ("sleep", "plain"):
                keep = bytearray(8 * MiB)
                hashlib.sha256(BUF).digest()
                if mode == "sleep":
                    time.sleep(0.03)
            else:
                for _ in range(4):
                    hashlib.sha256(BUF).digest()
        c1, t1, q1 = time.thread_time(), time.perf_counter(), _run_queue_s()
        truth.append([c1 - c0, t1 - t0, q1 - q0])
        c0, t0, q0 = c1, t1, q1
    rec.close()
    del keep
    for p in spinners:
        p.terminate()
        p.join()
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
