"""``tlog export``: write the history as Parquet for Spark, Trino or DuckDB."""

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
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Export the tables as Parquet partitioned by run, for engines other than tlog.

    Example: tlog export --parquet /shared/tlog-history, then in DuckDB:
    SELECT * FROM read_parquet('/shared/tlog-history/iterations/*/*.parquet', hive_partitioning=true)
    """
    if parquet is None:
        raise UsageError("give the export folder with --parquet DIR (Parquet is the only format)")
    report = open_database(db).export_parquet(parquet, run_ids=run, overwrite=overwrite)
    if json_:
        print_json(report.to_dict())
        return
    rows = sum(report.tables.values())
    console.print(f"Exported {len(report.runs)} run(s), {rows:,} rows in {report.files} Parquet "
                  f"file(s) to {report.directory}", highlight=False, markup=False)
    for table, count in report.tables.items():
        console.print(f"  {table:<22} {count:>12,}", highlight=False, markup=False)
