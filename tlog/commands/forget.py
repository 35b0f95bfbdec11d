"""``tlog forget RUN``: remove a run from the database (its logs stay on disk)."""

from __future__ import annotations

from typing import Annotated

import typer

from tlog.app import DbOption, JsonOption, app, console, open_database, print_json, shown
from tlog.ingest.errors import UsageError


@app.command("forget")
def forget_command(
    run_id: Annotated[str, typer.Argument(help="The run to remove (see 'tlog runs').",
                                          show_default=False)],
    yes: Annotated[bool, typer.Option("--yes", help="Really remove it (without --yes, "
                                      "only say what would be removed).")] = False,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Remove a run (every row of it) from the database; its logs are untouched,
    so 'tlog ingest RUN_DIR' can load it again. Needs --yes."""
    database = open_database(db, quiet=json_)
    if not yes:
        counts = database.forget(run_id, dry_run=True)
        raise UsageError(f"would remove run {shown(run_id)} ({counts['iterations']:,} "
                         f"iterations, {counts['rejects']:,} rejects); add --yes to remove it")
    counts = database.forget(run_id)
    if json_:
        print_json({"run_id": run_id, "removed": counts})
        return
    console.print(f"Removed run {shown(run_id)}: {counts['iterations']:,} iterations, "
                  f"{counts['rejects']:,} rejects, {counts['files']:,} files' state "
                  f"(the logs on disk are untouched)", highlight=False, soft_wrap=True)
