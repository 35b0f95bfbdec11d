"""A training loop instrumented with the shim, for the live-page test: run as
``python shim_writer.py RUN_DIR SECONDS``. Each iteration: ``load`` 5 ms,
``forward`` 20 ms (sleeps), 64 tokens; the recorder flushes every 0.2 s."""

from __future__ import annotations

import sys
import time

from dflash_runtime import Recorder


def main() -> None:
    run_dir, seconds = sys.argv[1], float(sys.argv[2])
    rec = Recorder(run_dir, stage="main", rank=0, world_size=1, flush_interval=0.2,
                   run_id="live", tags={"gpus": "1", "kind": "live"})
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with rec.iteration(tokens=64) as it:
            with it.phase("load"):
                time.sleep(0.005)
            with it.phase("forward"):
                time.sleep(0.020)
    rec.close()


if __name__ == "__main__":
    main()
