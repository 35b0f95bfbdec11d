"""``tlog forget RUN``: remove a run from the database (its logs stay on disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tlog.app import DbOption, JsonOption, app, console, print_json, shown
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
    from tlog.web.endpoint import reading, refuse_writes

    if yes:
        refuse_writes(db, "forget")
    with reading(db):
        _forget(db, run_id, yes=yes, json_=json_)


def _forget(db: Path | None, run_id: str, *, yes: bool, json_: bool) -> None:
    from tlog.ingest.db import connect
    from tlog.ingest.run import forget_run

    con = connect(db, read_only=not yes)
    try:
        if not yes:
            counts = {t: int(con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?",
                                         [run_id]).fetchall()[0][0])
                      for t in ("runs", "iterations", "rejects")}
            if not counts["runs"]:
                forget_run(con, run_id)      # raises: no such run
            raise UsageError(f"would remove run {shown(run_id)} ({counts['iterations']:,} "
                             f"iterations, {counts['rejects']:,} rejects); add --yes to "
                             f"remove it")
        counts = forget_run(con, run_id)
        from tlog.analyze.persist import ensure_attribution
        ensure_attribution(con, [])      # drops the forgotten run's stored diagnosis
    finally:
        con.close()
    if json_:
        print_json({"run_id": run_id, "removed": counts})
        return
    console.print(f"Removed run {shown(run_id)}: {counts['iterations']:,} iterations, "
                  f"{counts['rejects']:,} rejects, {counts['files']:,} files' state "
                  f"(the logs on disk are untouched)", highlight=False, soft_wrap=True)
