"""``tlog runs``: the runs in the database, oldest first, with throughput and bottleneck."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from tlog.app import DbOption, JsonOption, app, open_database, print_json
from tlog.render import render_table


def _local(epoch: float | None) -> str | None:
    """Local time of ``epoch`` (s); an impossible one (a run loaded before
    ingest checked ``started``) prints as the number, so one bad run cannot
    fail the listing of all."""
    if epoch is None:
        return None
    try:
        return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{epoch:g} (not a date)"


@app.command("runs")
def runs_command(
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", help="Only runs with this tag, as key=value (repeat: all must match).",
        show_default=False)] = None,
    since: Annotated[str | None, typer.Option(
        "--since", help="Only runs started at or after this date (ISO: 2026-11-29 or "
                        "2026-11-29T08:00; local time).", show_default=False)] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """List the runs, oldest first, with steady throughput and the verdict's bottleneck."""
    from tlog.analyze.history import bottleneck_label, parse_since, parse_tag_filters

    tags = parse_tag_filters(tag)
    since_s = parse_since(since) if since is not None else None
    runs = open_database(db).run_summaries(tags=tags, since=since_s)
    if json_:
        print_json([r.to_dict() for r in runs])
        return
    # The table stays narrow enough for a terminal: names are in --json.
    columns = [("run_id", False), ("source", False), ("started", False),
               ("steady/total", False), ("tokens/s", True), ("it/s", True),
               ("bottleneck", False)]
    rows = [(r.run_id, r.source, _local(r.started),
             f"{r.iterations['steady']}/{r.iterations['total']}",
             _rounded(r.throughput.get("tokens_per_s"), 0),
             _rounded(r.throughput.get("iters_per_s"), 2), bottleneck_label(r.bottleneck))
            for r in runs]
    if all(r.source == "jsonl" for r in runs):
        columns.pop(1)
        rows = [row[:1] + row[2:] for row in rows]
    render_table(columns, rows, len(rows), keep_whole=("run_id",))


def _rounded(value: float | None, digits: int) -> float | None:
    """``value`` rounded half to even to ``digits`` places (as polars' ``round``), or None."""
    return None if value is None else float(round(float(value), digits))
