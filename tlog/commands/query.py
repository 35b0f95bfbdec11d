"""``tlog query``: run a stored query (``queries/*.sql``) or list them."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from tlog.app import DbOption, app, open_database, print_json
from tlog.ingest.errors import UsageError
from tlog.render import FormatOption, OutputFormat, render_frame


class Engine(StrEnum):
    """What runs a stored query over a run lake (``tlog.queries.lake_sql.ENGINES``)."""

    duckdb = "duckdb"
    spark = "spark"


def parse_params(items: list[str] | None) -> dict[str, str]:
    """Turn ``-p key=value`` items into a dict (the value may itself hold ``=``).

    Raises:
        UsageError: an item has no ``=`` or an empty key, or a key is given twice.
    """
    params: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("$")
        if not sep or not key:
            raise UsageError(f"bad parameter {item!r}: write -p key=value, e.g. -p run_id=r1")
        if key in params:
            raise UsageError(f"parameter {key!r} given twice")
        params[key] = value
    return params


@app.command("query")
def query_command(
    name: Annotated[str | None, typer.Argument(help="Stored query to run (see --list).",
                                               show_default=False)] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", help="A parameter as key=value (repeat for several).",
        show_default=False)] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the stored queries and their "
                                                       "purpose.")] = False,
    fmt: FormatOption = OutputFormat.table,
    lake: Annotated[Path | None, typer.Option(
        "--lake", help="Run the query over this run lake (tlog publish) instead of a "
                       "database.", file_okay=False, show_default=False)] = None,
    engine: Annotated[Engine, typer.Option(
        "--engine", help="What runs the query over --lake: DuckDB in this process, or "
                         "Spark SQL.", case_sensitive=False)] = Engine.duckdb,
    spark_master: Annotated[str | None, typer.Option(
        "--spark-master", help="Spark master URL for --engine spark (default: "
                               "$SPARK_REMOTE, else local[*]).", show_default=False)] = None,
    db: DbOption = None,
) -> None:
    """Run a stored SQL query over the run history (read-only), or --list them.

    Example: tlog query phase_breakdown -p run_id=RUN --format csv;
    over a lake: tlog query runs_by_throughput --lake /shared/tlog-lake --engine spark
    """
    if list_:
        if name is not None or param:
            raise UsageError("--list takes no query name or parameters")
        _list(fmt)
        return
    if name is None:
        raise UsageError("name a stored query (tlog query --list shows them)")
    from tlog.queries import load_query

    params = parse_params(param)
    query = load_query(name)
    query.bind(params)  # parameter errors before the database is opened
    if lake is not None:
        if db is not None:
            raise UsageError("give --lake or --db, not both")
        from tlog.queries.lake_sql import run_lake_query

        frame = run_lake_query(lake, query, params, engine=engine.value, master=spark_master)
    elif engine != Engine.duckdb or spark_master is not None:
        raise UsageError("--engine spark and --spark-master read a run lake: give --lake DIR")
    else:
        frame = open_database(db).query(name, params)
    render_frame(frame, fmt, title=query.name)


def _list(fmt: OutputFormat) -> None:
    import polars as pl

    from tlog.queries import load_queries

    queries = load_queries()    # a file that cannot be loaded: a warning, the rest listed
    if fmt == OutputFormat.json:
        print_json([q.to_dict() for q in queries])
        return
    frame = pl.DataFrame({
        "query": [q.name for q in queries],
        "parameters": [" ".join(f"{p.name}" if p.required else f"[{p.name}]"
                                for p in q.parameters) for q in queries],
        "purpose": [q.summary for q in queries],
    })
    render_frame(frame, fmt)
