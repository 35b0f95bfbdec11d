"""Follow a live run: ingest what is new, again and again (``tlog ingest --follow``).

:func:`follow` is the loop; the CLI renders each round's report, and a
notebook iterates it (``for report in db.follow(run_dir): ...``). Each round
opens the database, ingests what is new since the last round
(:func:`tlog.ingest.run.ingest_run`, incremental) and closes it again, so
that another process (``tlog diagnose``) can read the file between rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tlog.ingest.errors import RunDirError

if TYPE_CHECKING:
    import duckdb
    from tlog.ingest.run import IngestReport

#: Seconds between two rounds (a live run's shim flushes about every second).
#: Source: tlog's choice.
FOLLOW_INTERVAL_S = 5.0

#: Fewest seconds between two stores of the followed run's diagnosis
#: (:meth:`tlog.api.Database.follow`): a store re-diagnoses the whole run while
#: holding the write lock (seconds at 300k iterations: docs/DATABASE.md), so
#: storing every round would keep readers out much of the time. Readers
#: diagnose a stale run in memory meanwhile, so their figures stay right; the
#: last store happens when following ends. Source: tlog's choice.
FOLLOW_STORE_INTERVAL_S = 30.0


def follow(open_db: Callable[[], duckdb.DuckDBPyConnection] | None, run_dir: str | Path, *,
           run_id: str | None = None, interval_s: float = FOLLOW_INTERVAL_S,
           reload: bool = False, progress: bool = False, rounds: int | None = None,
           on_retry: Callable[[RunDirError, float], None] | None = None,
           after_round: Callable[[duckdb.DuckDBPyConnection, IngestReport, int], None]
           | None = None,
           sleep: Callable[[float], None] = time.sleep,
           round_fn: Callable[[int, bool], IngestReport] | None = None,
           ) -> Iterator[IngestReport]:
    """Ingest ``run_dir`` every ``interval_s`` seconds; yield each round's report.

    Args:
        open_db: opens the database for one round (the caller chooses the
            file and how long to wait for another writer); closed after it.
        run_dir: the run directory (or one trace file).
        run_id: the run's id (default: run.json's, else the directory name).
        interval_s: seconds between rounds (after each report, not before the first).
        reload: forget what is loaded of the run and load it again, in the
            first round only.
        progress: show a progress bar on stderr while ingesting.
        rounds: stop after this many rounds (None: until the caller stops
            iterating, or Ctrl-C; a run directory that does not exist yet or
            holds no logs yet is waited for, told once to ``on_retry``).
            ``rounds=1`` is one plain ingest. A round
            that found the run directory unreadable counts too; when the last
            round is such a one, its RunDirError is raised (a run directory
            that vanished ends ``rounds=N`` instead of retrying forever).
        on_retry: told ``(error, interval_s)`` when a round after the first
            (and not the last of ``rounds``) finds the run directory unreadable
            (e.g. run.json caught mid-save); it is tried again after ``interval_s``.
        after_round: called ``(con, report, round)`` (round 0 first) after each
            round's ingest, while its connection is open (e.g. to store the
            run's diagnosis: ingest cannot, it sits below analyze).
        sleep: waits between rounds (``time.sleep``; tests pass their own).
        round_fn: makes one round instead (``(round, reload) -> report``;
            ``open_db`` and ``after_round`` unused): the facade passes one that
            asks a live ``tlog serve`` to make it.

    Yields:
        One :class:`~tlog.ingest.run.IngestReport` per round, also when
        nothing was new (``records_total`` 0).

    Raises:
        RunDirError: with ``rounds`` given, the run directory is missing or
            holds no logs in the first round, or in the last of ``rounds``.
        DatabaseLockedError, DatabaseError: from ``open_db``.
    """
    done = tried = 0
    said = ""
    while rounds is None or tried < rounds:
        tried += 1
        con = open_db() if round_fn is None else None
        try:
            if con is None:
                report = round_fn(done, reload and not done)
            else:
                report = ingest_round(con, run_dir, done, run_id=run_id, progress=progress,
                                      reload=reload and not done, after_round=after_round)
        except RunDirError as exc:
            if rounds is not None and (not done or tried >= rounds):
                raise
            # A live run is worth following on: try again next round. Before the
            # first load this is a job not started yet (its directory or first log
            # appears once it has imported torch and built the model): said once
            # per distinct problem, not every round.
            if on_retry is not None and (done or str(exc) != said):
                on_retry(exc, interval_s)
            said = str(exc)
            sleep(interval_s)
            continue
        finally:
            if con is not None:
                con.close()
        done += 1
        yield report
        if rounds is None or tried < rounds:
            sleep(interval_s)


def ingest_round(con: duckdb.DuckDBPyConnection, run_dir: str | Path, n: int = 0, *,
                 run_id: str | None = None, reload: bool = False, progress: bool = False,
                 after_round: Callable[[duckdb.DuckDBPyConnection, IngestReport, int], None]
                 | None = None) -> IngestReport:
    """One round of :func:`follow` on an open connection: ingest what is new in
    ``run_dir`` (:func:`tlog.ingest.run.ingest_run`, incremental and
    crash-safe), then ``after_round(con, report, n)``. ``tlog serve`` calls it
    for each watched run on its own connection (docs/SERVE.md).

    Args:
        con: the open, writable database (not closed here).
        n: the round's number, 0 first (told to ``after_round``).
        Others as :func:`follow`.

    Raises:
        RunDirError: the run directory is missing, unreadable or holds no logs yet.
    """
    from tlog.ingest import run  # looked up per round: tests replace run.ingest_run

    report = run.ingest_run(con, run_dir, run_id=run_id, progress=progress, reload=reload)
    if after_round is not None:
        after_round(con, report, n)
    return report
