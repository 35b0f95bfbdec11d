"""``tlog demo``: run the reference DFlash pipeline, ingest its logs, print the diagnosis.

The whole path once, on a real run: :func:`dflash_runtime.pipeline.run_pipeline`
writes a run directory (default ``./tlog-reports/demo-runs/<run_id>/``),
:func:`ingest.ingest_run` loads it into the database (``--db``, ``$TLOG_DB`` or
the user data dir, so ``tlog runs`` sees it afterwards), and
:func:`analyze.diagnose` judges it; the diagnosis is rendered by ``tlog
diagnose``'s own renderer. ``--scenario`` injects a known bottleneck, so the
verdict can be checked against what was injected (docs/PIPELINE.md).

Progress goes to stderr; stdout holds the diagnosis (or, with ``--json``, one
JSON object: the run, the ingest report and the diagnosis).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from dflash_runtime.pipeline.scenarios import DEFAULT_STEPS, SCENARIOS, make_config
from tlog.app import DbOption, JsonOption, app, console, err_console, open_database, print_json
from tlog.ingest.errors import TlogError, UsageError

#: Where demo runs go unless ``--out`` says otherwise: generated output lives
#: under ``./tlog-reports/`` in the working directory (DESIGN.md), never in the
#: source tree.
DEFAULT_OUT = Path("tlog-reports") / "demo-runs"

#: Seconds ``tlog demo`` waits for another tlog process to release the database.
DB_WAIT_S = 10.0


def run_demo(*, scenario: str, steps: int, out: Path, db: Path | None) -> dict[str, Any]:
    """Run, ingest and diagnose one demo run; return what the command prints.

    Returns:
        ``{"run_id", "run_dir", "scenario", "steps", "world_size", "pipeline_s",
        "expected", "ingest": IngestReport, "diagnosis": Diagnosis, "report": HTML path}``
        (the run's HTML report, written by :func:`reports.write_run_report`
        beside the run directory: ``<out>/<run_id>.html``).

    Raises:
        UsageError: bad scenario, step count or output directory.
        TlogError: torch is missing, the pipeline failed, or ingest/diagnose did.
    """
    try:
        cfg = make_config(scenario, steps=steps)  # torch-free check before the slow imports
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        from dflash_runtime.pipeline.train import run_pipeline
    except ImportError as exc:
        msg = (f"tlog demo runs the reference pipeline, which needs torch ({exc}); "
               "install it with: pip install 'tlog[torch]' (or make setup)")
        raise TlogError(msg) from None
    start = time.perf_counter()
    with err_console.status(f"running the reference DFlash pipeline: scenario {scenario}, "
                            f"{steps} steps, {cfg.world_size} ranks ..."):
        try:
            run_dir = run_pipeline(out, scenario=scenario, steps=steps)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except RuntimeError as exc:
            msg = f"the demo pipeline failed: {exc}"
            raise TlogError(msg) from None
    pipeline_s = time.perf_counter() - start
    err_console.print(f"run written to {run_dir} in {pipeline_s:.1f} s", highlight=False,
                      soft_wrap=True)
    database = open_database(db, wait_s=DB_WAIT_S)
    report = database.ingest(run_dir)
    diagnosis = database.diagnose(report.run_id)
    html = database.report(report.run_id, Path(out) / f"{run_dir.name}.html")
    return {
        "run_id": report.run_id, "run_dir": str(run_dir), "scenario": scenario, "steps": steps,
        "world_size": cfg.world_size, "pipeline_s": round(pipeline_s, 3),
        "expected": SCENARIOS[scenario].expect, "ingest": report, "diagnosis": diagnosis,
        "report": str(html),
    }


def _ingest_line(report: dict[str, Any]) -> str:
    loaded = report.get("records_loaded") or {}
    parts = ", ".join(f"{n} {kind}" for kind, n in loaded.items())
    line = f"ingested {sum(loaded.values())} records ({parts})"
    rejected = report.get("records_rejected") or 0
    if rejected:
        line += f"; {rejected} rejected (tlog ingest --json lists them)"
    return line


def _next_steps(run_id: str, db: Path | None) -> list[str]:
    """Commands to go further with this run (the reports helper may add the HTML path here)."""
    db_opt = f" --db {db}" if db is not None else ""
    return [f"tlog diagnose --run {run_id}{db_opt}",
            f"tlog report --run {run_id}{db_opt}"]


@app.command("demo")
def demo_command(
    scenario: Annotated[str, typer.Option(
        "--scenario", "-s", metavar="NAME",
        help=f"Bottleneck to inject: {', '.join(SCENARIOS)}.")] = "balanced",
    steps: Annotated[int, typer.Option(
        "--steps", "-n", metavar="N", help="Drafter optimizer steps per drafter rank.")
    ] = DEFAULT_STEPS,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", metavar="DIR", file_okay=False,
        help=f"Parent directory of the run (default: ./{DEFAULT_OUT}).",
        show_default=False)] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Run the reference DFlash pipeline, ingest its logs and print the bottleneck verdict."""
    from tlog.commands.diagnose import render

    result = run_demo(scenario=scenario, steps=steps, out=out or DEFAULT_OUT, db=db)
    report, diagnosis = result["ingest"].to_dict(), result["diagnosis"]
    if json_:
        print_json({**result, "ingest": report, "diagnosis": diagnosis.to_dict()})
        return
    err_console.print(_ingest_line(report), highlight=False, soft_wrap=True)
    render(diagnosis)
    console.print()
    console.print(f"Scenario {scenario}: {SCENARIOS[scenario].description}; "
                  f"expected: {result['expected']}.", highlight=False, soft_wrap=True)
    console.print(f"Report: {result['report']}", highlight=False, soft_wrap=True)
    console.print("Next:", highlight=False)
    for command in _next_steps(result["run_id"], db):
        console.print(f"  {command}", highlight=False, soft_wrap=True)
