"""Start-up of the CLI: ``tlog --help`` against ``python -c "import typer"``, side by side.

Run alone: ``python -m benchmarks.bench_startup`` (``--json`` for machine-readable
output); ``make bench`` runs it with the others.

Method: each command runs in a fresh interpreter (``subprocess``), ``--repeat``
times, the two commands interleaved so that both see the same machine load; the
minimum wall time of each is kept (the least-disturbed run; this machine is
shared) and their ratio printed. ``tlog --help`` is the installed console script
beside this interpreter (else ``python -m tlog``), as a user types it.

Budget (docs: "fast where users wait"): ``tlog --help`` within
:data:`BUDGET_RATIO` times the bare ``import typer`` (the floor of any typer CLI).
Exit status 1 if missed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

#: ``tlog --help`` may take at most this many times ``python -c "import typer"``.
#: Source: tlog's aim ("aim <= 2x").
BUDGET_RATIO = 2.0


def tlog_command() -> list[str]:
    """The ``tlog`` console script beside this interpreter, else ``python -m tlog``."""
    script = Path(sys.executable).with_name("tlog")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tlog"]


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def measure(repeat: int) -> dict[str, float]:
    """Minimum wall seconds of ``tlog --help`` and of ``python -c "import typer"``
    over ``repeat`` interleaved runs, and their ratio."""
    help_cmd = [*tlog_command(), "--help"]
    typer_cmd = [sys.executable, "-c", "import typer"]
    helps, typers = [], []
    for _ in range(repeat):
        helps.append(_wall(help_cmd))
        typers.append(_wall(typer_cmd))
    h, t = min(helps), min(typers)
    return {"tlog_help_s": h, "import_typer_s": t, "ratio": h / t, "repeat": repeat}


def main(argv: list[str] | None = None) -> int:
    """Measure, print the figures; 1 if the ratio exceeds :data:`BUDGET_RATIO`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_startup",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    r = measure(args.repeat)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"tlog --help {r['tlog_help_s'] * 1000:.0f} ms vs python -c 'import typer' "
              f"{r['import_typer_s'] * 1000:.0f} ms: {r['ratio']:.2f}x "
              f"(budget <= {BUDGET_RATIO:g}x; min of {r['repeat']} interleaved runs)")
    return 0 if r["ratio"] <= BUDGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
