"""A loop on a core shared with two spinning processes, recorded with the shim
and timed with bare ``perf_counter`` reads in the same loop; run as its own
process by test_contention_gap.py:

    python gap_loop.py RUN_DIR SECONDS CLOCK

CLOCK ``shim``: the recorder as a user makes it (``Recorder(run_dir)``);
``thread_time``: the same recorder held on ``time.thread_time()`` for its
``cpu`` readings (the control: the clock that hands the core away at the
iteration boundary on Linux's EEVDF scheduler).

Prints one JSON line: the bare gaps (seconds) between the end of one ``with
rec.iteration()`` block and the start of the next, read just outside it, in
iteration order. Linux only (``os.sched_setaffinity``); standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from dflash_runtime import Recorder
from tests.support.loops import crowd_one_core, stop_all

BUF = b"\x07" * (1 << 18)


def main() -> None:
    run_dir, seconds, clock = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    spinners = crowd_one_core(2)
    rec = Recorder(run_dir, run_id=os.path.basename(run_dir), install_handlers=False)
    if clock == "thread_time":
        rec._cpu_clock = time.thread_time
        rec._note_run_queue = lambda share: None
    pc = time.perf_counter
    gaps = []
    end = None
    stop = pc() + seconds
    while True:
        start = pc()
        if end is not None:
            gaps.append(start - end)
        if start > stop:
            break
        with rec.iteration() as it, it.phase("hash"):
            for _ in range(4):
                hashlib.sha256(BUF).digest()
        end = pc()
    rec.close()
    stop_all(spinners)
    print(json.dumps(gaps[:-1]))


if __name__ == "__main__":
    main()
