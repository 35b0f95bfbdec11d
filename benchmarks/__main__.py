"""Run every benchmark: ``python -m benchmarks`` (``make bench``).

Imports each ``benchmarks/bench_*.py`` module in name order and calls its
``main([])``; prints a summary and exits 1 if any benchmark misses its budget
(``main`` returned non-zero) or fails with an exception.

``python -m benchmarks shim ingest`` runs only the named ones.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
import traceback
from pathlib import Path


def discover() -> list[str]:
    """Names (without the ``bench_`` prefix) of the benchmark modules, sorted."""
    here = Path(__file__).resolve().parent
    return sorted(m.name.removeprefix("bench_") for m in pkgutil.iter_modules([str(here)])
                  if m.name.startswith("bench_"))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks named in ``argv`` (default all); return 1 if any failed."""
    names = list(sys.argv[1:] if argv is None else argv) or discover()
    unknown = sorted(set(names) - set(discover()))
    if unknown:
        print(f"benchmarks: error: no benchmark named {', '.join(unknown)}; "
              f"choose from {', '.join(discover())}", file=sys.stderr)
        return 2
    results: list[tuple[str, str, float]] = []
    for name in names:
        print(f"== bench_{name} ==", flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.bench_{name}")
            rc = module.main([])
            status = "ok" if rc == 0 else f"FAILED (exit {rc})"
        except Exception:  # noqa: BLE001 - report every benchmark, then fail
            traceback.print_exc()
            status = "ERROR"
        results.append((name, status, time.perf_counter() - t0))
        print(flush=True)
    print("== summary ==")
    for name, status, secs in results:
        print(f"  bench_{name:<12} {status:<16} {secs:6.1f} s")
    return 0 if all(s == "ok" for _, s, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
