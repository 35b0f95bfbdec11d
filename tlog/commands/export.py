"""``tlog export``: write the history as Parquet for Spark, Trino or DuckDB, or one
run's timeline for Perfetto (``--perfetto RUN``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tlog.app import DbOption, JsonOption, app, console, open_database, print_json
from tlog.ingest.errors import UsageError


@app.command("export")
def export_command(
    parquet: Annotated[Path | None, typer.Option(
        "--parquet", help="Folder to write: one sub-folder per table, partitioned by run "
                          "(hive style: TABLE/run_id=ID/*.parquet).",
        file_okay=False, show_default=False)] = None,
    run: Annotated[list[str] | None, typer.Option(
        "--run", help="Export only this run (repeat for several; default: every run).",
        show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace the table folders of an earlier export.")] = False,
    perfetto: Annotated[str | None, typer.Option(
        "--perfetto", metavar="RUN_ID", help="Write this run's timeline for ui.perfetto.dev "
                                             "(Trace Event Format JSON) instead.",
        show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", dir_okay=False, help="The timeline file (default: "
                                               "./tlog-reports/<run>.perfetto.json).",
        show_default=False)] = None,
    iters: Annotated[str | None, typer.Option(
        "--iters", metavar="FIRST:LAST", help="Only these iterations of each worker (and "
                                              "what happened meanwhile).",
        show_default=False)] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Export the tables as Parquet partitioned by run, for engines other than tlog.

    Example: tlog export --parquet /shared/tlog-history, then in DuckDB:
    SELECT * FROM read_parquet('/shared/tlog-history/iterations/*/*.parquet', hive_partitioning=true)
    """
    if perfetto is not None:
        if parquet is not None or run or overwrite:
            raise UsageError("--perfetto RUN_ID writes one run's timeline: leave out --parquet, "
                             "--run and --overwrite")
        _perfetto(db, perfetto, output, iters, json_)
        return
    if output is not None or iters is not None:
        raise UsageError("-o and --iters go with --perfetto RUN_ID")
    if parquet is None:
        raise UsageError("give the export folder with --parquet DIR, or a run's timeline with "
                         "--perfetto RUN_ID")
    report = open_database(db).export_parquet(parquet, run_ids=run, overwrite=overwrite)
    if json_:
        print_json(report.to_dict())
        return
    rows = sum(report.tables.values())
    console.print(f"Exported {len(report.runs)} run(s), {rows:,} rows in {report.files} Parquet "
                  f"file(s) to {report.directory}", highlight=False, markup=False)
    for table, count in report.tables.items():
        console.print(f"  {table:<22} {count:>12,}", highlight=False, markup=False)


def _perfetto(db: Path | None, run_id: str, output: Path | None, iters: str | None,
              json_: bool) -> None:
    window = None
    if iters is not None:
        first, sep, last = iters.partition(":")
        if not (sep and first.strip().isdigit() and last.strip().isdigit()
                and int(first) <= int(last)):
            raise UsageError(f"--iters {iters!r}: write FIRST:LAST, e.g. --iters 1000:1200")
        window = (int(first), int(last))
    trace = open_database(db).perfetto(run_id, iters=window)
    out = trace.write(output if output is not None
                      else Path("tlog-reports") / f"{run_id}.perfetto.json")
    if json_:
        print_json({"run_id": run_id, "path": str(out), "iterations": trace.iterations,
                    "phases": trace.phases, "counters": trace.counters})
        return
    console.print(f"Wrote the timeline of run {run_id} to {out}: {trace.iterations:,} "
                  f"iterations, {trace.phases:,} phases, {trace.counters:,} counter samples; "
                  f"open it in https://ui.perfetto.dev", highlight=False, markup=False,
                  soft_wrap=True)
