"""A job for ``tlog run`` beside the service: ``python exit_job.py CODE``. Records 30
iterations (``load`` 2 ms, ``forward`` 8 ms, sleeps) with ``Recorder.from_env()``,
then exits with CODE."""

from __future__ import annotations

import sys
import time

from dflash_runtime import Recorder


def main() -> None:
    rec = Recorder.from_env(flush_interval=0.2)
    for _ in range(30):
        with rec.iteration(tokens=16) as it:
            with it.phase("load"):
                time.sleep(0.002)
            with it.phase("forward"):
                time.sleep(0.008)
    rec.close()
    sys.exit(int(sys.argv[1]))


if __name__ == "__main__":
    main()
