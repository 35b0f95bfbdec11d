"""A producer and a consumer thread joined by a ``TimedQueue`` of 4 slots, the
consumer starved: run as its own process by test_queue_occupancy.py.

    python queue_loop.py RUN_DIR N

The producer (stage ``target``) makes an item in 10 ms (a sleep: I/O-like,
leaving the GIL), the consumer (stage ``drafter``) spends 2 ms on each (a sleep too: the
shared machine's load then moves the truth less), so the
queue sits empty about 80% of the time. Prints one JSON line of the loop's
own truth: the consumer's seconds blocked in ``get`` (the queue empty, by
bare ``perf_counter`` reads around each call) and its wall seconds, per
iteration. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from dflash_runtime import Recorder
from dflash_runtime.queues import TimedQueue


def main() -> None:
    run_dir, n = sys.argv[1], int(sys.argv[2])
    run_id = os.path.basename(run_dir)
    target = Recorder(run_dir, stage="target", rank=0, world_size=2, run_id=run_id,
                      install_handlers=False)
    drafter = Recorder(run_dir, stage="drafter", rank=1, world_size=2, run_id=run_id,
                       install_handlers=False)
    q = TimedQueue(4, name="hs")

    def produce() -> None:
        for _ in range(n + 3):  # at most the capacity left over
            with target.iteration() as it:
                with it.phase("forward"):
                    time.sleep(0.010)
                q.put(object())

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    truth = []
    pc = time.perf_counter
    t0 = pc()
    for _ in range(n):
        with drafter.iteration() as it:
            g0 = pc()
            q.get()
            g1 = pc()
            with it.phase("train"):
                time.sleep(0.002)
        t1 = pc()
        truth.append([g1 - g0, t1 - t0])
        t0 = t1
    t.join()
    target.close()
    drafter.close()
    print(json.dumps(truth))


if __name__ == "__main__":
    main()
