"""``tlog report``: write a self-contained HTML report of a run or a comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tlog.app import DbOption, JsonOption, app, console, open_database, print_json
from tlog.ingest.errors import UsageError


@app.command()
def report(
    run: Annotated[
        str | None, typer.Option("--run", metavar="RUN_ID", help="Report on this run.")
    ] = None,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--compare",
            metavar="BASELINE CANDIDATE",
            help="Report on what changed from BASELINE to CANDIDATE.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            dir_okay=False,
            help="HTML file to write (default: ./tlog-reports/<run_id>/index.html).",
        ),
    ] = None,
    png: Annotated[
        bool, typer.Option("--png", help="Also write each chart as PNG beside it.")
    ] = False,
    svg: Annotated[
        bool, typer.Option("--svg", help="Also write each chart as SVG beside it.")
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write an offline HTML report (verdict, findings, charts) of a run or a comparison."""
    if (run is None) == (compare is None):
        msg = "give exactly one of --run RUN_ID or --compare BASELINE CANDIDATE"
        raise UsageError(msg)
    formats = [f for f, on in (("png", png), ("svg", svg)) if on]
    database = open_database(db)
    if run is not None:
        files = database.report_files(run, output, image_formats=formats)
    else:
        files = database.compare_report_files(compare[0], compare[1], output,
                                              image_formats=formats)
    html = files.html
    images = [str(p) for p in files.images]
    if as_json:
        print_json({"html": str(html), "images": images})
        return
    console.print(f"Report written to {html}", highlight=False, markup=False, soft_wrap=True)
    for path in images:
        console.print(f"  chart: {path}", highlight=False, markup=False, soft_wrap=True)
