"""A short run recorded with the shim at its default sampling pace, run as its
own process by test_short_runs.py:

    python short_loop.py RUN_DIR MODE

- MODE ``leak``: 30 steps of ~100 ms of hashing, each keeping 8 MiB (written,
  so resident);
- MODE ``crowded``: a 3-second loop of ~10 ms steps, pinned to one core
  (``os.sched_setaffinity``) beside two spinning processes that inherit it.

The recorder is made as a user makes it (``Recorder(run_dir)``, no
``sys_interval``). Prints one JSON line of the loop's own truth, per
iteration ``[RSS bytes after the step, thread CPU s, wall s, run-queue s]``,
the last three over the iteration's whole cycle (from its start to the next
one's), by bare ``/proc/self/statm``, ``time.thread_time``,
``time.perf_counter`` and the thread's ``/proc/self/task/<tid>/schedstat``
field 2. Linux only; standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from dflash_runtime import Recorder
from tests.support.loops import crowd_one_core, run_queue_s, stop_all

MiB = 1 << 20
BUF = b"\x07" * MiB


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hash_for(seconds: float) -> None:
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        hashlib.sha256(BUF[:65536]).digest()


def main() -> None:
    run_dir, mode = sys.argv[1], sys.argv[2]
    spinners = crowd_one_core(2) if mode == "crowded" else []
    rec = Recorder(run_dir, run_id=os.path.basename(run_dir), install_handlers=False)
    kept = []
    truth = []
    c0, t0, q0 = time.thread_time(), time.perf_counter(), run_queue_s()
    end = t0 + 3.0
    n = 0
    while (n < 30) if mode == "leak" else (time.perf_counter() < end):
        with rec.iteration() as it:
            with it.phase("forward"):
                _hash_for(0.06 if mode == "leak" else 0.006)
            with it.phase("backward"):
                _hash_for(0.04 if mode == "leak" else 0.004)
            if mode == "leak":
                with it.phase("retain"):
                    kept.append(bytearray(b"\x01" * (8 * MiB)))
        c1, t1, q1 = time.thread_time(), time.perf_counter(), run_queue_s()
        truth.append([_rss(), c1 - c0, t1 - t0, q1 - q0])
        c0, t0, q0 = c1, t1, q1
        n += 1
    rec.close()
    stop_all(spinners)
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
