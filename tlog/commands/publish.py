"""``tlog publish``: add or replace runs of a database in a run lake (Parquet, docs/LAKE.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tlog.app import DbOption, JsonOption, app, console, open_database, print_json


@app.command("publish")
def publish_command(
    lake: Annotated[Path, typer.Argument(
        help="The lake folder (on shared storage; created if missing).", file_okay=False,
        show_default=False)],
    run: Annotated[list[str] | None, typer.Option(
        "--run", help="Publish only this run (repeat for several; default: every run).",
        show_default=False)] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Publish runs into a run lake that DuckDB and Spark read; a run published again
    replaces its earlier version. Many hosts may publish into one folder at once.

    Example: tlog publish /shared/tlog-lake, then tlog query runs_by_throughput
    --lake /shared/tlog-lake --engine spark
    """
    reports = open_database(db).publish(lake, run_ids=run)
    if json_:
        print_json([r.to_dict() for r in reports])
        return
    for r in reports:
        rows = sum(r.rows.values())
        what = "superseded by a later publish" if r.superseded else (
            "replaced" if r.replaced else "added")
        console.print(f"{r.run_id}: {rows:,} rows, {r.bytes:,} bytes, {what} "
                      f"({r.seconds:.1f} s)", highlight=False, markup=False)
    console.print(f"Published {len(reports)} run(s) to {reports[0].lake if reports else lake}",
                  highlight=False, markup=False)
