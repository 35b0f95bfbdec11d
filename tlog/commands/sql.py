"""``tlog sql``: one read-only SQL statement over the run history."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from tlog.app import DbOption, app, open_database
from tlog.ingest.errors import UsageError
from tlog.render import FormatOption, OutputFormat, render_frame


@app.command("sql")
def sql_command(
    statement: Annotated[str | None, typer.Argument(
        help="The SQL statement; '-' or nothing reads it from stdin.", show_default=False)] = None,
    fmt: FormatOption = OutputFormat.table,
    db: DbOption = None,
) -> None:
    """Run one read-only SQL statement (SELECT, DESCRIBE, SHOW, EXPLAIN) over the database.

    Statements that would write (INSERT, DROP, ATTACH, COPY ... TO, SET ...) are
    refused and the database is left unchanged. Tables: runs, iterations,
    queue_samples, events, rejects, workers, files, sys_samples, machines; views phases,
    iteration_categories, iteration_positions (docs/DATABASE.md).
    """
    if statement is None or statement == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("give a SQL statement as an argument or on stdin")
        statement = sys.stdin.read()
    from tlog.queries import check_read_only

    check_read_only(statement)      # a write is refused before any service is asked
    frame = open_database(db).sql(statement)
    render_frame(frame, fmt)
