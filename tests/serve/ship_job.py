"""One rank of a "remote" job for the shipping test: ``python ship_job.py RUN_DIR RANK
WORLD SECONDS OUT``. Records ``step`` iterations (a 4 ms sleep in phase ``work``)
for SECONDS with the shim (TLOG_SERVER, when set, ships from the shim's own
thread), and writes to OUT, per iteration, the time the shim took around the
work as bare ``perf_counter`` timers see it (seconds, one per line)."""

from __future__ import annotations

import sys
import time

from dflash_runtime import Recorder


def main() -> None:
    run_dir, rank, world, seconds, out = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                          float(sys.argv[4]), sys.argv[5])
    rec = Recorder(run_dir, stage="main", rank=rank, world_size=world, flush_interval=0.2)
    overhead = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        with rec.iteration(tokens=32) as it, it.phase("work"):
            w0 = time.perf_counter()
            time.sleep(0.004)
            w1 = time.perf_counter()
        overhead.append((time.perf_counter() - t0) - (w1 - w0))
    rec.close()
    with open(out, "w") as fh:
        fh.write("\n".join(f"{x:.6f}" for x in overhead) + "\n")


if __name__ == "__main__":
    main()
