"""``tlog ingest RUN_DIR [RUN_DIR ...]``: load run directories into the database.

Loads what is new since the last ingest (new files, grown files, rewritten
files); a partial last line waits for the next ingest. Prints a summary (or
``--json``: ``IngestReport.to_dict()``). ``--follow`` ingests again every
``--interval`` seconds until Ctrl-C (the round in progress finishes first;
Ctrl-C again stops at once), closing the database between rounds so
that ``tlog diagnose`` can read it meanwhile; the run's diagnosis is stored
after the first round, at most every ``FOLLOW_STORE_INTERVAL_S`` (30 s) after
that, and when following stops. When another tlog process holds
the database, waits up to ``--wait`` seconds, saying so on stderr. The loop is
the library's (:meth:`tlog.api.Database.follow`); this command renders it.

Several run directories (``tlog ingest runs/*``, or ``--each runs`` for a
folder of run directories) are loaded on one connection with their diagnoses
stored a group at a time (:meth:`tlog.api.Database.ingest_many`): every
directory is checked before anything is loaded, and one that fails while
loading leaves the runs before it loaded.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tlog.api import WAIT_S
from tlog.app import (
    DbOption,
    JsonOption,
    app,
    check_wait,
    console,
    err_console,
    open_database,
    print_json,
)
from tlog.commands._stop import StopRequest
from tlog.ingest.errors import UsageError
from tlog.ingest.follow import FOLLOW_INTERVAL_S

if TYPE_CHECKING:
    from tlog.ingest.run import IngestReport

#: Rejected lines listed in the human output (``--json`` lists up to 100).
SHOW_ERRORS = 10


def _render(report: IngestReport) -> None:
    from tlog.ingest.run import summarize_reasons

    loaded = report.records_loaded
    kinds = ("iter", "queue", "event", "meta") + (("sys",) if loaded.get("sys") else ())
    parts = ", ".join(f"{loaded.get(k, 0):,} {k}" for k in kinds)
    mb = report.bytes_read / 1e6
    console.print(f"Run {report.run_id}: loaded {parts} from {report.files_read} of "
                  f"{report.files} files ({mb:,.1f} MB) in {report.seconds:.2f} s",
                  highlight=False, soft_wrap=True)
    if report.files_unchanged:
        console.print(f"  {report.files_unchanged} files unchanged since the last ingest",
                      highlight=False, soft_wrap=True)
    if report.files_rewritten:
        console.print(f"  rewritten, loaded again: {', '.join(report.files_rewritten)}",
                      highlight=False, soft_wrap=True)
    for m in report.files_moved:
        console.print(f"  found renamed (rotated): {m['from']} -> {m['to']}; its rows moved "
                      f"with it", highlight=False, markup=False, soft_wrap=True)
    for r in report.files_replaced:
        console.print(f"  {r['path']} holds another file now: read from its start; the "
                      f"old file's rows stay, as {r['old_rows_as']}", highlight=False,
                      markup=False, soft_wrap=True)
    if report.duplicates:
        console.print(f"  {report.duplicates:,} duplicate iterations (same run, rank, stage, "
                      f"worker, iter) kept once", highlight=False, soft_wrap=True)
    if report.lines_skipped:
        console.print(f"  skipped {report.lines_skipped:,} lines of other text in timer logs",
                      highlight=False, soft_wrap=True)
    if report.partial_lines:
        console.print(f"  partial last line left for the next ingest: "
                      f"{', '.join(report.partial_lines)}", highlight=False, soft_wrap=True)
    if report.records_rejected:
        summary = ", ".join(f"{n:,} {code}" for code, n, _ in summarize_reasons(report))
        console.print(f"  rejected {report.records_rejected:,} lines ({summary}); all are in "
                      f"the rejects table", highlight=False, soft_wrap=True)
        for e in report.errors[:SHOW_ERRORS]:
            console.print(f"    {e['file']}:{e['line']}: {e['reason']}", highlight=False,
                          markup=False, soft_wrap=True)
        if report.records_rejected > SHOW_ERRORS:
            console.print(f"    ... {report.records_rejected - SHOW_ERRORS:,} more",
                          highlight=False, soft_wrap=True)
    if report.recategorized:
        moved = ", ".join(f"{c['phase']} {c['from']} -> {c['to']}"
                          for c in report.recategorized[:SHOW_ERRORS])
        more = len(report.recategorized) - SHOW_ERRORS
        console.print(f"  categories now as run.json phase_kinds / the name rules say: {moved}"
                      + (f" (and {more:,} more; all in --json)" if more > 0 else ""),
                      highlight=False, markup=False, soft_wrap=True)
    for w in report.warnings:
        console.print(f"  warning: {w}", highlight=False, markup=False, soft_wrap=True)


@app.command("ingest")
def ingest_command(
    # text, not Path: Path("") is ".", and empty text (an unset shell variable) is refused
    run_dirs: Annotated[list[str], typer.Argument(
        metavar="RUN_DIR",
        help="Run directory (rank*.jsonl, *.jsonl.gz, torch.profiler traces, optional "
             "run.json; logs in its subdirectories belong to it too), or one trace file. "
             "Several are loaded in one go (e.g. a sweep: runs/*), each as its own run.",
        show_default=False)],
    db: DbOption = None,
    as_json: JsonOption = False,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default: run.json "
                                               "run_id, else the directory name).")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep ingesting new lines every "
                                         "--interval seconds until Ctrl-C (a run "
                                         "directory not there yet is waited for).")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between --follow "
                                            "rounds.")] = FOLLOW_INTERVAL_S,
    wait: Annotated[float, typer.Option("--wait", help="Seconds to wait while another tlog "
                                        "process uses the database.")] = WAIT_S,
    reload: Annotated[bool, typer.Option("--reload", help="Forget what is loaded of this run "
                                         "and load it again from its logs (e.g. after a tlog "
                                         "upgrade).")] = False,
    each: Annotated[bool, typer.Option("--each", help="Each RUN_DIR is a folder of run "
                                       "directories (a sweep): every subdirectory holding "
                                       "logs or a run.json is loaded as a run of its own "
                                       "(without --each such a folder is one run whose logs "
                                       "are in subdirectories; a folder with logs or a "
                                       "run.json of its own is refused).")] = False,
) -> None:
    """Load run directories into the database (only what is new since the last ingest)."""
    from tlog.ingest.manifest import run_id_problem

    if len(run_dirs) > 1 or each:
        _ingest_many(run_dirs, db=db, as_json=as_json, each=each, wait=wait,
                     single_only={"--run-id": run_id is not None, "--follow": follow,
                                  "--reload": reload})
        return
    run_dir = run_dirs[0]

    if not (math.isfinite(interval) and interval > 0):
        raise UsageError(f"--interval must be a positive number of seconds, got {interval:g}")
    check_wait(wait)
    if run_id is not None and (problem := run_id_problem(run_id)):
        shown = run_id if len(run_id) <= 60 else run_id[:60] + "..."
        raise UsageError(f"--run-id {shown!r} {problem}: give a short name without control "
                         f"characters, or leave --run-id out to use run.json's run_id or "
                         f"the directory name")

    def retrying(exc: Exception, interval_s: float) -> None:
        # e.g. run.json caught mid-save, or a job not started yet: a live run is
        # worth following on
        if rounds == 0:
            err_console.print(f"tlog: waiting: {exc}; looking again every {interval_s:g} s "
                              f"until it appears (Ctrl-C to stop)",
                              highlight=False, markup=False, soft_wrap=True)
            return
        err_console.print(f"tlog: warning: {exc}; trying again in {interval_s:g} s",
                          highlight=False, markup=False, soft_wrap=True)

    database = open_database(db, wait_s=wait, quiet=as_json)
    show_bar = not as_json and sys.stderr.isatty()
    rounds = 0
    # --follow: Ctrl-C stops at the next wait between rounds (tlog.commands._stop:
    # raised inside DuckDB it was lost or became another error)
    stop = StopRequest()
    with stop.handling(follow), stop.ending(follow):
        for report in database.follow(run_dir, run_id, interval_s=interval,
                                      rounds=None if follow else 1, reload=reload,
                                      progress=show_bar, on_retry=retrying,
                                      sleep=stop.sleep(time.sleep)):
            rounds += 1
            if as_json:
                print_json(report.to_dict())
            elif (not follow or rounds == 1 or report.records_total
                  or report.records_rejected or report.recategorized):
                _render(report)
    if follow and not as_json:
        err_console.print(f"tlog: stopped following after {rounds} rounds{stop.forced_note}",
                          highlight=False, soft_wrap=True)


def _ingest_many(run_dirs: list[str], *, db: Path | None, as_json: bool, each: bool,
                 wait: float, single_only: dict[str, bool]) -> None:
    """``tlog ingest DIR DIR ...`` / ``--each``: :meth:`tlog.api.Database.ingest_many`,
    each run's summary printed as it is loaded (``--json``: one JSON list of
    the reports at the end)."""
    given = [name for name, on in single_only.items() if on]
    if given:
        raise UsageError(f"{given[0]} takes one run directory: give one RUN_DIR with it, or "
                         f"leave {given[0]} out to ingest several")
    check_wait(wait)
    database = open_database(db, wait_s=wait, quiet=as_json)
    # Ctrl-C asks to stop before the next run, so that every run loaded is whole with
    # its diagnosis stored; a second Ctrl-C stops where it lands
    stop = StopRequest((signal.SIGINT,))
    loaded: list[IngestReport] = []

    def on_report(report: IngestReport) -> None:
        loaded.append(report)
        if not as_json:
            _render(report)

    with stop.handling():
        try:
            reports = database.ingest_many(run_dirs, each=each, stop=lambda: stop.asked,
                                           on_report=on_report)
        except KeyboardInterrupt:
            if stop.forced:
                raise
            err_console.print(f"tlog: stopped by Ctrl-C after {len(loaded)} runs, each loaded "
                              f"whole with its diagnosis stored; the same command again "
                              f"loads the rest", highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
    if as_json:
        print_json([r.to_dict() for r in reports])
    else:
        err_console.print(f"tlog: {len(reports)} runs ingested", highlight=False,
                          soft_wrap=True)
