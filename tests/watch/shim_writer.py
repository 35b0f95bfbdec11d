"""A training loop with a known bottleneck, written by the runtime shim (run
as a script by the watch tests).

Each iteration waits ``SLEEP_S`` in ``load_batch`` (a starvation phase by
its name) and spins ``SPIN_S`` in ``forward`` (compute). After every
iteration it writes its own timer to ``status.json`` beside the run
directory: ``{"n": iterations done, "elapsed": seconds since the first
began}``. It stops when the file ``stop`` appears there (or after
``MAX_S``, or the seconds given as a third argument), closes the recorder (every record flushed) and writes the final
count with ``"done": true``.

Usage: python shim_writer.py RUN_DIR WORK_DIR [MAX_S]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from dflash_runtime import Recorder

SLEEP_S = 0.030
SPIN_S = 0.010
MAX_S = 60.0


def _status(work: Path, **fields: object) -> None:
    tmp = work / "status.tmp"
    tmp.write_text(json.dumps(fields))
    os.replace(tmp, work / "status.json")


def main() -> None:
    run_dir, work = Path(sys.argv[1]), Path(sys.argv[2])
    max_s = float(sys.argv[3]) if len(sys.argv) > 3 else MAX_S
    rec = Recorder(run_dir, stage="main", run_id="watched", flush_interval=0.2, mem_every=0)
    print("shim writer started", flush=True)      # the job's own output
    n = 0
    t0 = time.perf_counter()
    while not (work / "stop").exists() and time.perf_counter() - t0 < max_s:
        with rec.iteration() as it:
            with it.phase("load_batch"):
                time.sleep(SLEEP_S)
            with it.phase("forward"):
                end = time.perf_counter() + SPIN_S
                while time.perf_counter() < end:
                    pass
        n += 1
        _status(work, n=n, elapsed=time.perf_counter() - t0)
    rec.close()
    _status(work, n=n, elapsed=time.perf_counter() - t0, done=True)


if __name__ == "__main__":
    main()
