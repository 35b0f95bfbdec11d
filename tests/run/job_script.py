"""A small job for ``tlog run``'s tests: the shim only (no torch), iterations of a few ms.

Each iteration records the phases ``data_wait`` (``--data-ms``) and ``compute``
(``--compute-ms``), both ``time.sleep``. The script's own count of iterations is the
truth the tests compare the ingested run with: ``--progress FILE`` gets
``"<started> <completed>"`` rewritten after each change (it survives a death by
signal), and on the way out through an exception (Ctrl-C's ``KeyboardInterrupt``)
``--report FILE`` gets JSON ``{"pid", "rank", "started", "completed", "ended_by"}``.
``{rank}`` in a path is replaced by ``RANK`` (torchrun sets it).

Options for the cases under test: ``--steps N`` (default: until a signal),
``--exit-code N`` (after the loop), ``--ignore-sigint`` (Ctrl-C alone cannot stop
it), ``--orphan FILE`` (start a ``sleep`` in a session of its own, as torchrun
starts its ranks, that outlives the job; its pid goes to FILE), ``--no-shim``
(record nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=0, help="0: until a signal")
    p.add_argument("--data-ms", type=float, default=2.0)
    p.add_argument("--compute-ms", type=float, default=5.0)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--progress")
    p.add_argument("--report")
    p.add_argument("--ignore-sigint", action="store_true")
    p.add_argument("--orphan")
    p.add_argument("--no-shim", action="store_true")
    p.add_argument("--pid", help="write this process's pid here at start")
    args = p.parse_args()
    rank = os.environ.get("RANK", "0")
    if args.pid:
        with open(args.pid.replace("{rank}", rank), "w") as f:
            f.write(str(os.getpid()))
    if args.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.orphan:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True)
        with open(args.orphan.replace("{rank}", rank), "w") as f:
            f.write(str(child.pid))
    if args.no_shim:
        return args.exit_code

    from dflash_runtime import Recorder

    rec = Recorder.from_env()
    fd = None
    if args.progress:
        fd = os.open(args.progress.replace("{rank}", rank), os.O_WRONLY | os.O_CREAT, 0o644)
    started = completed = 0

    def progress() -> None:
        if fd is not None:
            os.pwrite(fd, f"{started:>10} {completed:>10}\n".encode(), 0)

    ended_by = "steps"
    try:
        while args.steps == 0 or completed < args.steps:
            with rec.iteration(samples=1) as it:
                started += 1
                progress()
                with it.phase("data_wait"):
                    time.sleep(args.data_ms / 1e3)
                with it.phase("compute"):
                    time.sleep(args.compute_ms / 1e3)
            completed += 1
            progress()
    except BaseException as exc:
        ended_by = type(exc).__name__
        raise
    finally:
        if args.report:
            with open(args.report.replace("{rank}", rank), "w") as f:
                json.dump({"pid": os.getpid(), "rank": int(rank), "started": started,
                           "completed": completed, "ended_by": ended_by}, f)
    rec.close()
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
