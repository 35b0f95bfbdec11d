"""tlog from Python: ``db = tlog.open(path)``, then ``db.ingest(dir)``, ``db.diagnose(run)``.

One object, :class:`Database`, stands for a tlog database file and does what
the CLI does, returning typed results instead of printing (in the spirit of
sqlite-utils' ``Database``)::

    import tlog

    with tlog.open("runs.duckdb") as db:
        db.ingest("logs/run-42")             # IngestReport
        db.runs()                            # polars frame, one row per run
        d = db.diagnose("run-42")            # Diagnosis (shows as HTML in a notebook)
        d.bottleneck.phase, d.stage_table()  # typed fields, frames where tabular
        db.compare("run-41", "run-42")       # Comparison
        db.sql("SELECT count(*) FROM iterations")   # read-only, as tlog sql

Each call opens the file for its own duration and closes it again (read-only
for reading), so a notebook never holds the database locked between cells
and a ``tlog ingest --follow`` in another process can write meanwhile.
While a ``tlog serve`` holds the file, reads borrow it from the service
(:func:`tlog.web.endpoint.reading`) and writes raise
:class:`tlog.web.endpoint.ServedDatabaseError` (docs/SERVE.md).
Errors are :class:`tlog.ingest.errors.TlogError` subclasses with a
one-line message (the CLI prints the same line).
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from tlog.ingest.errors import DatabaseLockedError, UsageError
from tlog.ingest.follow import FOLLOW_INTERVAL_S, FOLLOW_STORE_INTERVAL_S

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from tlog.analyze.baseline import HighWaterMark
    from tlog.analyze.compare import Comparison
    from tlog.analyze.frames import RunAnalysis
    from tlog.analyze.live import LiveView
    from tlog.analyze.rules import Rule, Thresholds
    from tlog.analyze.verdict import Diagnosis
    from tlog.ingest.errors import RunDirError
    from tlog.ingest.run import IngestReport

#: Seconds a write waits for another process's lock on the database. Source:
#: tlog's choice (a ``tlog ingest --follow`` round takes well under a minute).
WAIT_S = 60.0

#: Columns of :meth:`Database.runs`, in order.
RUN_COLUMNS = ("run_id", "name", "source", "started", "iterations", "steady",
               "iters_per_s", "tokens_per_s", "samples_per_s", "bottleneck_stage",
               "bottleneck_category", "bottleneck_phase", "verdict", "confidence", "tags")


def open(path: str | Path | None = None, *, read_only: bool = False,
         wait_s: float = WAIT_S) -> Database:
    """The tlog database at ``path`` (default: ``$TLOG_DB``, else ``tlog.duckdb``
    in the user data dir), as a :class:`Database`. Nothing is opened yet: the
    file is created by the first ingest."""
    return Database(path, read_only=read_only, wait_s=wait_s)


class Database:
    """A tlog database file and what tlog does with it (module docstring).

    Args:
        path: the database file (default: ``$TLOG_DB``, else the user data dir).
        read_only: refuse to write (``ingest`` and ``follow`` raise UsageError).
        wait_s: seconds a write waits while another process holds the file.
        on_wait: told ``(path, wait_s)`` before such a wait (the CLI says so
            on stderr).

    Usable as a context manager; :meth:`close` ends its use (later calls
    raise UsageError). It holds no connection between calls.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False,
                 wait_s: float = WAIT_S,
                 on_wait: Callable[[Path, float], None] | None = None) -> None:
        from tlog.ingest.db import default_db_path

        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.read_only = read_only
        self.wait_s = wait_s
        self._on_wait = on_wait
        self._closed = False

    # --- connections ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError(f"the tlog database {self.path} was closed: tlog.open() it again")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise UsageError(f"{self.path} was opened read-only: tlog.open(path) to write")

    def _writer(self) -> duckdb.DuckDBPyConnection:
        """A read-write connection, waiting :attr:`wait_s` for another writer."""
        from tlog.ingest.db import connect
        from tlog.web.endpoint import refuse_writes

        self._check_writable()
        refuse_writes(self.path, "ingest")
        try:
            return connect(self.path)
        except DatabaseLockedError:
            if self.wait_s <= 0:
                raise
            if self._on_wait is not None:
                self._on_wait(self.path, self.wait_s)
            return connect(self.path, wait_s=self.wait_s)

    @contextmanager
    def _reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        from tlog.ingest.db import connect
        from tlog.web.endpoint import reading

        self._check_open()
        with reading(self.path):    # a live tlog serve lends the file (tlog.web.endpoint)
            con = connect(self.path, read_only=True)
            try:
                yield con
            finally:
                con.close()

    def close(self) -> None:
        """End the use of this object (it holds no open file between calls)."""
        self._closed = True

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"tlog.Database({str(self.path)!r}{mode})"

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>"

    # --- writing ------------------------------------------------------------------

    def ingest(self, run_dir: str | Path, run_id: str | None = None, *, reload: bool = False,
               progress: bool = False) -> IngestReport:
        """Load what is new in ``run_dir`` (``tlog ingest``) and store the run's diagnosis.

        Args:
            run_dir: a run directory (JSONL logs, torch.profiler traces) or one trace file.
            run_id: the run's id (default: run.json's, else the directory name).
            reload: forget what is loaded of the run and load it again.
            progress: show a progress bar on stderr.

        Returns:
            The :class:`~tlog.ingest.run.IngestReport` (``.run_id``, records
            loaded and rejected, warnings).

        Raises:
            RunDirError: missing or empty run directory. UsageError: bad run id,
            or opened read-only. DatabaseLockedError: another writer past ``wait_s``.
        """
        return next(self.follow(run_dir, run_id, rounds=1, reload=reload, progress=progress))

    def follow(self, run_dir: str | Path, run_id: str | None = None, *,
               interval_s: float = FOLLOW_INTERVAL_S, rounds: int | None = None,
               reload: bool = False, progress: bool = False,
               on_retry: Callable[[RunDirError, float], None] | None = None,
               store_interval_s: float = FOLLOW_STORE_INTERVAL_S,
               sleep: Callable[[float], None] = time.sleep,
               ) -> Iterator[IngestReport]:
        """Ingest a live run every ``interval_s`` seconds (``tlog ingest --follow``);
        yield each round's report. Stop by leaving the loop (or Ctrl-C), or
        give ``rounds``. The file is closed between rounds.

        The run's diagnosis is stored (``tlog runs`` and the stored queries
        read it) after the first round, then at most every ``store_interval_s``
        seconds (:data:`~tlog.ingest.follow.FOLLOW_STORE_INTERVAL_S`: a store
        re-diagnoses the whole run under the write lock) when something was
        loaded, and once more when following ends (rounds done, the loop
        left, Ctrl-C) if something was loaded since. Readers meanwhile
        diagnose the stale run in memory: their figures are right throughout.
        Other arguments as :meth:`ingest` and :func:`tlog.ingest.follow.follow`
        (``sleep`` waits between rounds: ``tlog watch`` reads keys meanwhile,
        and ends following by raising KeyboardInterrupt from it, as Ctrl-C does).

        Raises:
            UsageError: at once (before the first round), for a bad
            ``interval_s`` or run id, a read-only or closed database.
            Others as :func:`tlog.ingest.follow.follow`.
        """
        from tlog.ingest.manifest import run_id_problem

        if not interval_s > 0:
            raise UsageError(f"interval_s must be a positive number of seconds, got {interval_s}")
        if run_id is not None and (problem := run_id_problem(run_id)):
            shown = run_id if len(run_id) <= 60 else run_id[:60] + "..."
            raise UsageError(f"run id {shown!r} {problem}: give a short name without control "
                             f"characters, or leave it out to use run.json's run_id or the "
                             f"directory name")
        self._check_writable()
        return self._follow(run_dir, run_id, interval_s=interval_s, rounds=rounds,
                            reload=reload, progress=progress, on_retry=on_retry,
                            sleep=sleep, store=DiagnosisStore(store_interval_s))

    def _follow(self, run_dir: str | Path, run_id: str | None, *, store: DiagnosisStore,
                **kwargs: Any) -> Iterator[IngestReport]:
        from tlog.ingest.follow import follow

        try:
            yield from follow(self._writer, run_dir, run_id=run_id,
                              after_round=store.after_round, **kwargs)
        except (GeneratorExit, KeyboardInterrupt):
            store.finish(self._writer)
            raise
        store.finish(self._writer)

    # --- reading ------------------------------------------------------------------

    def runs(self, *, tags: Mapping[str, str] | None = None,
             since: float | None = None) -> pl.DataFrame:
        """The runs, oldest first (``tlog runs``), one row each.

        Args:
            tags: only runs whose manifest tags have these values (text compare;
                names and values must be text).
            since: only runs started at or after this epoch second (a number).

        Returns:
            A polars frame with :data:`RUN_COLUMNS`: ``started`` (epoch s),
            ``iterations``/``steady`` (counts), throughput in ``*_per_s``
            (null when not reported), the verdict's ``bottleneck_*`` (null
            without steady iterations), ``verdict``, ``confidence`` and
            ``tags`` (a struct-free JSON text). In a notebook it shows as
            polars' HTML table, which escapes every cell.

        Raises:
            UsageError: ``since`` not a number, ``tags`` not text to text.
        """
        import json

        import polars as pl

        from tlog.analyze.history import list_runs

        if since is not None and (isinstance(since, bool)
                                  or not isinstance(since, int | float)
                                  or math.isnan(since)):
            raise UsageError(f"since must be an epoch second (a number), got {since!r}")
        if tags is not None and not (isinstance(tags, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in tags.items())):
            raise UsageError(f"tags must map tag names to text values, got {tags!r}")
        with self._reader() as con:
            rows = list_runs(con, tags=tags, since=since)
        out: dict[str, list[Any]] = {c: [] for c in RUN_COLUMNS}
        for r in rows:
            bn = r.bottleneck or {}
            values = {"run_id": r.run_id, "name": r.name, "source": r.source,
                      "started": r.started, "iterations": r.iterations.get("total"),
                      "steady": r.iterations.get("steady"), **{
                          k: r.throughput.get(k)
                          for k in ("iters_per_s", "tokens_per_s", "samples_per_s")},
                      "bottleneck_stage": bn.get("stage"),
                      "bottleneck_category": bn.get("category"),
                      "bottleneck_phase": bn.get("phase"), "verdict": r.verdict,
                      "confidence": r.confidence,
                      "tags": json.dumps(r.tags, sort_keys=True, default=str)}
            for c in RUN_COLUMNS:
                out[c].append(values[c])
        schema = {"run_id": pl.String, "name": pl.String, "source": pl.String,
                  "started": pl.Float64, "iterations": pl.Int64, "steady": pl.Int64,
                  "iters_per_s": pl.Float64, "tokens_per_s": pl.Float64,
                  "samples_per_s": pl.Float64, "bottleneck_stage": pl.String,
                  "bottleneck_category": pl.String, "bottleneck_phase": pl.String,
                  "verdict": pl.String, "confidence": pl.String, "tags": pl.String}
        return pl.DataFrame(out, schema=schema)

    def diagnose(self, run: str, *, thresholds: Thresholds | None = None,
                 rules: Sequence[Rule] | None = None) -> Diagnosis:
        """The verdict of ``run`` (``tlog diagnose``): a typed
        :class:`~tlog.analyze.verdict.Diagnosis`; ``.to_dict()`` is
        ``tlog diagnose --json``, ``.analysis`` holds the attributed frames.

        Raises:
            RunNotFoundError: no such run, or it holds no iterations.
            UsageError: ``run`` is not a text.
        """
        from tlog.analyze.verdict import diagnose

        _check_run_id(run)
        with self._reader() as con:
            return diagnose(con, run, thresholds=thresholds, rules=rules)

    def high_water_mark(self, run: str, *, match: Sequence[str] | None = None
                        ) -> HighWaterMark:
        """The high-water mark of ``run``: the best earlier run of the same
        configuration (``tlog compare``'s default baseline; ``match`` as in
        :meth:`compare`), as a :class:`~tlog.analyze.baseline.HighWaterMark`
        (its ``run_id`` None and ``reason`` set when there is none).

        Raises:
            RunNotFoundError: no such run. UsageError: ``match`` names a tag
            the run does not have.
        """
        from tlog.analyze.baseline import high_water_mark

        _check_run_id(run)
        if isinstance(match, str):
            match = [match]
        with self._reader() as con:
            return high_water_mark(con, run, match=match)

    def live_view(self, run: str, *, window_s: float | None = None,
                  high_water: HighWaterMark | None = None) -> LiveView:
        """Where a growing run stands now (``tlog watch``): throughput over
        its last ``window_s`` seconds (default
        :data:`~tlog.analyze.live.DEFAULT_WINDOW_S`) and against
        ``high_water`` (:meth:`high_water_mark`, looked up once by the
        caller), the window's diagnosis, queue depths, memory trend
        (:class:`~tlog.analyze.live.LiveView`).

        Raises:
            RunNotFoundError: no such run, or no iteration yet.
            UsageError: ``window_s`` not a positive number.
        """
        from tlog.analyze.live import DEFAULT_WINDOW_S, live_view

        _check_run_id(run)
        if window_s is None:
            window_s = DEFAULT_WINDOW_S
        if isinstance(window_s, bool) or not isinstance(window_s, int | float) \
                or not window_s > 0 or math.isinf(window_s):
            raise UsageError(f"window_s must be a positive number of seconds, got {window_s!r}")
        with self._reader() as con:
            return live_view(con, run, window_s=window_s, high_water=high_water)

    def attribute(self, run: str) -> RunAnalysis:
        """The attributed frames of ``run`` without a verdict:
        ``.iteration_frame()`` and ``.phase_frame()`` (docs/DIAGNOSIS.md section 10).

        Raises:
            RunNotFoundError: no such run, or it holds no iterations.
        """
        from tlog.analyze.frames import attribute

        _check_run_id(run)
        with self._reader() as con:
            return attribute(con, run)

    def compare(self, baseline: str, candidate: str | None = None, *,
                match: Sequence[str] | None = None) -> Comparison:
        """Explain the throughput change from ``baseline`` to ``candidate``
        (``tlog compare``). With ``candidate`` None, ``baseline`` is the
        candidate and the baseline is the best earlier run whose tags match
        (``match``: the tag keys that must, a list or one key as a string;
        default every shared tag except identity tags).

        Raises:
            RunNotFoundError: a run is missing. UsageError: the same run twice,
            or ``match`` given with two runs.
        """
        from tlog.analyze.compare import compare, compare_to_best

        for r in (baseline, candidate) if candidate is not None else (baseline,):
            _check_run_id(r)
        if candidate is not None and match is not None:
            raise UsageError("match chooses the baseline; give it with one run only")
        if isinstance(match, str):          # one tag key, not its letters
            match = [match]
        with self._reader() as con:
            if candidate is None:
                return compare_to_best(con, baseline, match=match)
            return compare(con, baseline, candidate)

    def report(self, run: str, out: str | Path | None = None) -> Path:
        """Write the offline HTML report of ``run`` (``tlog report --run``) to
        ``out`` (default ``./tlog-reports/<run>/index.html``); return its path."""
        from tlog.reports import write_run_report

        _check_run_id(run)
        with self._reader() as con:
            return Path(write_run_report(con, run, out).html)

    def sql(self, query: str) -> pl.DataFrame:
        """Run one read-only SQL statement over the database (``tlog sql``):
        the same guards (no write, no file access outside the database).

        Raises:
            WriteRefusedError: the statement would write. QueryError: DuckDB
            rejects it.
        """
        from tlog.queries import check_read_only, run_sql
        from tlog.web.endpoint import reading

        self._check_open()
        check_read_only(query)
        with reading(self.path):
            return run_sql(query, db=self.path)


def _check_run_id(run: object) -> None:
    """UsageError unless ``run`` is a run id (text): DuckDB would raise its own
    conversion error for ``diagnose(5)``."""
    if not isinstance(run, str):
        raise UsageError(f"a run id is text (see db.runs()), got {run!r}")


class DiagnosisStore:
    """When :meth:`Database.follow` stores the followed run's diagnosis
    (:func:`tlog.analyze.persist.ensure_attribution`): after the first round;
    after a later round that loaded or recategorised something, once
    ``interval_s`` seconds have passed since the last store; and in
    :meth:`finish` if a round loaded something since."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.pending: str | None = None     # a run loaded into since its last store
        self.last = -math.inf

    def after_round(self, con: duckdb.DuckDBPyConnection, report: IngestReport, n: int) -> None:
        if not n or report.records_total or report.recategorized:
            self.pending = report.run_id
        if self.pending is not None and (not n or self.clock() - self.last >= self.interval_s):
            self._store(con)

    def _store(self, con: duckdb.DuckDBPyConnection) -> None:
        from tlog.analyze.persist import ensure_attribution

        ensure_attribution(con, [self.pending])
        self.pending, self.last = None, self.clock()

    def finish(self, open_db: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        """The last store, in a connection of its own, if one is due."""
        if self.pending is None:
            return
        con = open_db()
        try:
            self._store(con)
        finally:
            con.close()
