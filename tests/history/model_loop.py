"""A training-like loop whose "model" is N hash layers, recorded with the shim
at its default sampling pace; run as its own process by
test_compare_model_change.py:

    python model_loop.py RUN_DIR LAYERS SPINNERS

The process pins itself to one core (``os.sched_setaffinity``); SPINNERS busy
processes inherit that core (the load). ``forward`` hashes 1 MiB LAYERS times,
``backward`` 2 times; the run's ``config`` is ``{"layers": LAYERS}``. Prints
one JSON line of the loop's own truth, per iteration ``[thread CPU s, wall s,
run-queue s]`` of its whole cycle, by bare ``time.thread_time``,
``time.perf_counter`` and ``/proc/self/task/<tid>/schedstat`` field 2. Linux
only; standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from dflash_runtime import Recorder
from tests.support.loops import crowd_one_core, run_queue_s, stop_all

BUF = b"\x07" * (1 << 20)


def main() -> None:
    run_dir, layers, spinners = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    procs = crowd_one_core(spinners)
    rec = Recorder(run_dir, run_id=os.path.basename(run_dir), config={"layers": layers},
                   install_handlers=False)
    truth = []
    c0, t0, q0 = time.thread_time(), time.perf_counter(), run_queue_s()
    for _ in range(200):
        with rec.iteration() as it:
            with it.phase("forward"):
                for _ in range(layers):
                    hashlib.sha256(BUF).digest()
            with it.phase("backward"):
                for _ in range(2):
                    hashlib.sha256(BUF).digest()
        c1, t1, q1 = time.thread_time(), time.perf_counter(), run_queue_s()
        truth.append([c1 - c0, t1 - t0, q1 - q0])
        c0, t0, q0 = c1, t1, q1
    rec.close()
    stop_all(procs)
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
