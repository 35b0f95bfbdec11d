"""Size and speed of the HTML report of a 1M-iteration run.

Run alone: ``python -m benchmarks.bench_report`` (``--iterations N``,
``--no-browser``, ``--json``); ``make bench`` runs it with the others.

Budgets: the report of a run of 1M iteration records is under
:data:`SIZE_BUDGET_BYTES` and renders in under :data:`RENDER_BUDGET_S`,
measured two ways: writing it (``reports.write_run_report``: analysis, charts,
HTML) and drawing it in headless Chromium (navigation until every chart is
drawn, driven by Playwright through tests/support/browser.py; skipped with a
note when Chromium or Playwright is missing). Exit status 1 if a budget is
missed.

The run is ``benchmarks.bench_diagnose``'s synthetic DFlash pipeline (2 target
workers, 6 drafter ranks, device times), plus a queue sampled every 0.1 s and
a checkpoint event every 5,000 target iterations. Printed beside the report
figures, measured in the same process: ``analyze.diagnose`` alone on the same
run, so the report's own cost shows as a ratio, and the size of the inlined
Vega bundle, the floor of any report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

#: Budget: bytes of the HTML report of a 1M-iteration run.
SIZE_BUDGET_BYTES = 2_000_000
#: Budget: seconds to write the report, and to draw it in a browser.
RENDER_BUDGET_S = 5.0

#: Queue sampling period (s) and events cadence (target iterations) of the synthetic run.
QUEUE_PERIOD_S = 0.1
EVENT_EVERY = 5_000


def build(path: Path, iterations: int) -> str:
    """The synthetic run of ``bench_diagnose`` plus queue samples and checkpoint events."""
    from tlog.ingest.db import connect

    from benchmarks.bench_diagnose import build as build_run

    run_id = build_run(path, iterations)
    con = connect(path)
    lo, hi = con.execute(
        "SELECT min(ts), max(ts + dur) FROM iterations WHERE run_id = ?", [run_id]
    ).fetchall()[0]
    con.execute(
        "INSERT INTO queue_samples (run_id, rank, stage, worker, name, ts, depth, capacity) "
        "SELECT $run, 0, 'target', 'target-0', 'hs_queue', $lo + i * $p, "
        "(i * 7 + i // 500) % 9, 8 FROM range(CAST(($hi - $lo) / $p AS BIGINT)) t(i)",
        {"run": run_id, "lo": lo, "hi": hi, "p": QUEUE_PERIOD_S},
    )
    con.execute(
        "INSERT INTO events (run_id, rank, stage, worker, name, ts, dur) "
        "SELECT $run, 0, 'target', 'target-0', 'checkpoint', ts, 2.0 FROM iterations "
        "WHERE run_id = $run AND stage = 'target' AND rank = 0 AND iter % $every = $every - 1",
        {"run": run_id, "every": EVENT_EVERY},
    )
    con.close()
    return run_id


def main(argv: list[str] | None = None) -> int:
    """Build the run, write its report, open it in Chromium, print the figures."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--no-browser", action="store_true", help="skip the Chromium timing")
    parser.add_argument(
        "--keep", type=Path, default=None, help="also copy the report to this file (to look at it)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from tlog.analyze import diagnose
    from tlog.ingest.db import connect
    from tlog.reports import write_run_report
    from tlog.reports.bundle import javascript_bundle

    from tests.support.browser import find_chromium, open_page

    bundle_bytes = len(javascript_bundle().encode())  # built (or read from cache) untimed
    with tempfile.TemporaryDirectory(prefix="tlog-bench-report-") as tmp:
        db = Path(tmp) / "bench.duckdb"
        t = time.perf_counter()
        run_id = build(db, args.iterations)
        build_s = time.perf_counter() - t
        con = connect(db, read_only=True)
        n_iter = con.execute(
            "SELECT count(*) FROM iterations WHERE run_id = ?", [run_id]
        ).fetchall()[0][0]
        t = time.perf_counter()
        diagnose(con, run_id)
        diagnose_s = time.perf_counter() - t
        out = Path(tmp) / "report" / "index.html"
        t = time.perf_counter()
        files = write_run_report(con, run_id, out)
        write_s = time.perf_counter() - t
        con.close()
        size = files.html.stat().st_size
        if args.keep:
            args.keep.parent.mkdir(parents=True, exist_ok=True)
            args.keep.write_bytes(files.html.read_bytes())
        browser: dict | None = None
        note = None
        if args.no_browser:
            note = "browser timing skipped (--no-browser)"
        elif find_chromium() is None:
            note = "browser timing skipped: chromium is not installed"
        elif importlib.util.find_spec("playwright") is None:
            note = "browser timing skipped: playwright is not installed (pip install -e '.[dev]')"
        else:
            res = open_page(files.html, timeout_s=60)
            browser = {
                "wall_s": res.wall_s,
                "render_ms": res.status.get("renderMs"),
                "charts": len(res.status.get("charts") or {}),
                "errors": res.console_errors + list(res.status.get("errors") or []),
                "timed_out": res.timed_out,
            }

    size_ok = size < SIZE_BUDGET_BYTES
    write_ok = write_s < RENDER_BUDGET_S
    browser_ok = browser is None or (
        not browser["timed_out"] and not browser["errors"] and browser["wall_s"] < RENDER_BUDGET_S
    )
    result = {
        "iterations": n_iter,
        "build_s": build_s,
        "report_bytes": size,
        "bundle_bytes": bundle_bytes,
        "data_and_text_bytes": size - bundle_bytes,
        "size_budget_bytes": SIZE_BUDGET_BYTES,
        "write_s": write_s,
        "diagnose_s": diagnose_s,
        "write_to_diagnose": write_s / diagnose_s if diagnose_s else None,
        "render_budget_s": RENDER_BUDGET_S,
        "browser": browser,
        "note": note,
        "within_budget": size_ok and write_ok and browser_ok,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        ok = {True: "OK", False: "MISSED"}
        print(
            f"report: {n_iter:,} iteration records (building the database: {build_s:.1f} s, "
            "untimed)"
        )
        print(
            f"  size: {size / 1e6:.2f} MB (Vega bundle {bundle_bytes / 1e6:.2f} MB + data and "
            f"text {(size - bundle_bytes) / 1e3:.0f} kB); budget {SIZE_BUDGET_BYTES / 1e6:.1f} MB "
            f"-> {ok[size_ok]}"
        )
        print(
            f"  write (analysis + charts + HTML): {write_s:.2f} s = "
            f"{result['write_to_diagnose']:.1f}x "
            f"diagnose alone ({diagnose_s:.2f} s); budget {RENDER_BUDGET_S:.0f} s -> {ok[write_ok]}"
        )
        if browser is not None:
            print(
                f"  headless Chromium: all {browser['charts']} charts drawn "
                f"{browser['wall_s']:.2f} s "
                f"after navigation (page script: {browser['render_ms'] or 0:.0f} ms); budget "
                f"{RENDER_BUDGET_S:.0f} s -> {ok[browser_ok]}"
                + (f"; errors: {browser['errors']}" if browser["errors"] else "")
            )
        else:
            print(f"  {note}")
    return 0 if result["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
