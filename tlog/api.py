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
While a ``tlog serve`` owns the file, each call is made in the service
(:meth:`tlog.web.endpoint.ServiceInfo.call`) and returns the same result:
reads on a snapshot that never waits for an ingest round, writes through
the service's one writer (docs/SERVE.md). The CLI goes through this class,
so every command works the same with or without a service.
Errors are :class:`tlog.ingest.errors.TlogError` subclasses with a
one-line message (the CLI prints the same line).
"""

from __future__ import annotations

import functools
import html
import inspect
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
    from tlog.analyze.rules import Policies, Rule
    from tlog.analyze.verdict import Diagnosis
    from tlog.ingest.errors import RunDirError
    from tlog.ingest.run import IngestReport
    from tlog.reports.data import RunReportData
    from tlog.web.endpoint import ServiceInfo

#: Seconds a write waits for another process's lock on the database. Source:
#: tlog's choice (a ``tlog ingest --follow`` round takes well under a minute).
WAIT_S = 60.0

#: Columns of :meth:`Database.runs`, in order.
RUN_COLUMNS = ("run_id", "name", "source", "started", "iterations", "steady",
               "iters_per_s", "tokens_per_s", "samples_per_s", "bottleneck_stage",
               "bottleneck_category", "bottleneck_phase", "verdict", "confidence", "tags")


def _served(method: Callable[..., Any]) -> Callable[..., Any]:
    """Make the decorated :class:`Database` call in a live ``tlog serve`` that
    owns the file (:meth:`Database._service`), with the same arguments, and
    return its result; without one, call it here."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(self: Database, *args: Any, **kwargs: Any) -> Any:
        info = self._service()
        if info is None:
            return method(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        sent = {k: v for k, v in bound.arguments.items() if k != "self"}
        return self._call(info, method.__name__, sent)

    return call


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
        on_served: told ``(service)`` (a :class:`~tlog.web.endpoint.ServiceInfo`)
            the first time a write is made by a live ``tlog serve`` instead
            (the CLI says so on stderr, once).

    Usable as a context manager; :meth:`close` ends its use (later calls
    raise UsageError). It holds no connection between calls.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False,
                 wait_s: float = WAIT_S,
                 on_wait: Callable[[Path, float], None] | None = None,
                 on_served: Callable[[ServiceInfo], None] | None = None) -> None:
        from tlog.ingest.db import default_db_path

        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.read_only = read_only
        self.wait_s = wait_s
        self._on_wait = on_wait
        self._on_served = on_served
        self._closed = False

    # --- a live tlog serve ------------------------------------------------------------

    def _service(self) -> ServiceInfo | None:
        """The live ``tlog serve`` that owns the file, or None (then calls run here)."""
        from tlog.web.endpoint import live_service

        self._check_open()
        return live_service(self.path)

    def _call(self, info: ServiceInfo, method: str, kwargs: dict[str, Any]) -> Any:
        """``method(**kwargs)`` made in the service (:func:`_served`).

        Raises:
            UsageError: an argument cannot be sent (custom rules or policies,
            objects that are not JSON).
        """
        import json

        if kwargs.get("rules") is not None or kwargs.get("policies") is not None:
            raise UsageError(f"tlog serve (pid {info.pid}) owns {self.path}: custom rules or "
                             f"policies cannot be sent to it; diagnose with the default "
                             f"rules, or stop the service")
        kwargs = {k: v.to_dict() if hasattr(v, "to_dict") else v    # typed values as JSON
                  for k, v in kwargs.items() if k not in ("rules", "policies")}
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError):
            raise UsageError(f"tlog serve (pid {info.pid}) owns {self.path}: the arguments of "
                             f"{method} must be text, numbers, lists or dicts to reach it, got "
                             f"{kwargs!r}") from None
        return info.call(method, **kwargs)

    def _write_served(self, info: ServiceInfo) -> None:
        """Say once that the service takes the writes (``on_served``)."""
        if self._on_served is not None:
            self._on_served(info)
            self._on_served = None

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

        self._check_writable()
        try:
            return connect(self.path)
        except DatabaseLockedError:
            if self.wait_s <= 0:
                raise
            if self._on_wait is not None:
                self._on_wait(self.path, self.wait_s)
            return connect(self.path, wait_s=self.wait_s)

    @contextmanager
    def _reader(self, *, sealed: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection for the ``with`` block; ``sealed``: one that
        can reach no file outside the database either
        (:func:`tlog.queries.read_only_connection`, for the user's SQL)."""
        from tlog.ingest.db import connect

        self._check_open()
        if sealed:
            from tlog.queries import read_only_connection

            with read_only_connection(self.path) as con:
                yield con
            return
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

    def ingest_many(self, run_dirs: Sequence[str | Path], *, each: bool = False,
                    on_report: Callable[[IngestReport], None] | None = None,
                    stop: Callable[[], bool] | None = None,
                    ) -> list[IngestReport]:
        """Ingest several run directories in one call (``tlog ingest DIR DIR ...``)
        and store each run's diagnosis, as :meth:`ingest` of each in turn
        would, on one connection: the database is opened and closed once, and
        the diagnoses are stored a group of runs at a time
        (:func:`ingest_runs`), so a sweep of thousands of small runs loads in
        a fraction of the time of one call per run.

        Args:
            run_dirs: run directories (or trace files), loaded in this order,
                each under the run id one :meth:`ingest` of it gives (a
                symlinked trace file: the link's name); the same directory
                twice (or through a symlink) is loaded once.
            each: every entry of ``run_dirs`` is instead a folder whose
                subdirectories are run directories (a sweep's folder): those
                holding logs or a ``run.json`` are loaded, by name; the others
                are left out. A folder with logs or a ``run.json`` of its own is
                refused (RunDirError): it is one run.
            on_report: told each run's report once it is loaded (the CLI
                prints it).
            stop: asked before each run (beside ``tlog serve``: before each
                part of the list sent); true: the diagnoses of the runs loaded
                are stored and ``KeyboardInterrupt`` is raised (the CLI's
                Ctrl-C: every run loaded so far is whole, its diagnosis stored).

        Returns:
            One :class:`~tlog.ingest.run.IngestReport` per run loaded, in order.

        Raises:
            RunDirError: before anything is loaded: a directory is missing or
                holds no logs, a folder given with ``each`` holds no run
                directory, or two directories claim the same run id. While
                loading (a directory changed since it was checked, a run id
                the database holds for another directory): the runs loaded
                before it stay loaded with their diagnoses stored, the rest
                are not loaded, and the message says how many of each (once
                that directory is fixed or left out, the same call again loads
                only what is missing).
            UsageError: no directory given, empty text for one (which
                ``Path`` takes for the current directory), an invalid run id,
                a read-only or closed database. DatabaseLockedError: another writer past
                ``wait_s``.
        """
        self._check_writable()
        dirs = _planned_dirs(run_dirs, each=each)
        info = self._service()
        if info is not None:
            self._write_served(info)
            out: list[IngestReport] = []
            for k in range(0, len(dirs), SERVICE_RUNS_PER_CALL):
                if stop is not None and stop():
                    raise KeyboardInterrupt
                part = [str(d) for d in dirs[k:k + SERVICE_RUNS_PER_CALL]]
                for report in info.call("ingest_runs", run_dirs=part, done_before=k,
                                        total=len(dirs)):
                    out.append(report)
                    if on_report is not None:
                        on_report(report)
            return out
        with self._writing() as con:
            return ingest_runs(con, dirs, on_report=on_report, stop=stop)

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
            ``interval_s`` or run id, empty text for ``run_dir``, a read-only
            or closed database. Others as :func:`tlog.ingest.follow.follow`.
        """
        from tlog.ingest.manifest import run_id_problem

        _given_path(run_dir)
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

        info = self._service()
        if info is not None:
            yield from self._follow_served(info, run_dir, run_id, **kwargs)
            return
        try:
            yield from follow(self._writer, run_dir, run_id=run_id,
                              after_round=store.after_round, **kwargs)
        except (GeneratorExit, KeyboardInterrupt):
            store.finish(self._writer)
            raise
        store.finish(self._writer)

    def _follow_served(self, info: ServiceInfo, run_dir: str | Path, run_id: str | None,
                       **kwargs: Any) -> Iterator[IngestReport]:
        """:meth:`follow`, each round made by the live service ``info`` (its one
        writer, beside its own watcher: the same incremental ingest, so a line
        is loaded once whoever reads it first); the diagnosis stored by the
        service as :meth:`follow` stores it."""
        from tlog.ingest.errors import TlogError
        from tlog.ingest.follow import follow

        # absolute, not resolved: a symlinked trace file's run id is the link's name
        path = str(Path(run_dir).expanduser().absolute())
        kwargs.pop("progress", None)        # a bar would show on the service's terminal
        self._write_served(info)

        def one_round(n: int, reload: bool) -> IngestReport:
            return info.call("ingest_round", run_dir=path, run_id=run_id, n=n, reload=reload)

        try:
            yield from follow(None, run_dir, run_id=run_id, round_fn=one_round, **kwargs)
        finally:
            try:
                info.call("ingest_finish", run_dir=path, run_id=run_id)
            except TlogError:
                pass     # the service stores it at its next round or at exit

    @_served
    def forget(self, run: str, *, dry_run: bool = False) -> dict[str, int]:
        """Remove ``run`` from the database (``tlog forget``): every row of it;
        its logs on disk are untouched, so :meth:`ingest` loads it again.

        Args:
            run: the run id.
            dry_run: remove nothing; return what would be removed.

        Returns:
            Rows per table: removed (``{"iterations": 123, "rejects": 0,
            "files": 4, ...}``), or with ``dry_run`` the rows ``runs``,
            ``iterations`` and ``rejects`` hold for it.

        Raises:
            RunNotFoundError: no such run. UsageError: read-only, or not a text.
        """
        from tlog.analyze.persist import ensure_attribution
        from tlog.ingest.run import forget_run

        _check_run_id(run)
        if dry_run:
            with self._reader() as con:
                counts = {t: int(con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?",
                                             [run]).fetchall()[0][0])
                          for t in ("runs", "iterations", "rejects")}
                if not counts["runs"]:
                    forget_run(con, run)      # raises: no such run (names a few)
                return counts
        with self._writing() as con:
            counts = forget_run(con, run)
            ensure_attribution(con, [])       # drops the forgotten run's stored diagnosis
            return counts

    @contextmanager
    def _writing(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A writable connection for the ``with`` block (:meth:`_writer`), closed after."""
        con = self._writer()
        try:
            yield con
        finally:
            con.close()

    # --- reading ------------------------------------------------------------------

    def publish(self, lake: str | Path, *, run_ids: Sequence[str] | None = None) -> list[Any]:
        """Publish runs into a run lake (``tlog publish``,
        :func:`tlog.queries.lake.publish_runs`); return a
        :class:`~tlog.queries.lake.PublishReport` per run. While a live ``tlog serve``
        owns the database the service publishes (the lake path resolved here first),
        reading one snapshot beside its writer.

        Raises:
            As :func:`~tlog.queries.lake.publish_runs`.
        """
        from tlog.queries.lake import publish_runs

        self._check_open()
        where = Path(lake).expanduser().resolve()
        info = self._service()
        if info is not None:
            return self._call(info, "publish", {"lake": str(where),
                                                "run_ids": None if run_ids is None
                                                else list(run_ids)})
        with self._reader() as con:
            return publish_runs(con, where, run_ids=run_ids)

    def export_parquet(self, directory: str | Path, *, run_ids: Sequence[str] | None = None,
                       overwrite: bool = False) -> Any:
        """Write the tables as Parquet partitioned by run (``tlog export``):
        :func:`tlog.queries.export.export_parquet`, whose
        :class:`~tlog.queries.export.ExportReport` it returns. With a live
        service the rows are read in the service and the files written here.

        Raises:
            ExportError: as :func:`~tlog.queries.export.export_parquet`.
        """
        from tlog.queries.export import export_parquet

        self._check_open()
        info = self._service()
        if info is None:
            with self._reader() as con:
                return export_parquet(con, directory, run_ids=run_ids, overwrite=overwrite)
        import duckdb

        con = duckdb.connect()        # the served rows, in memory, written from here
        try:
            for table, arrow in self._call(info, "export_tables", {"run_ids": run_ids}).items():
                con.register(f"_tlog_{table}", arrow)
                con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM "_tlog_{table}"')
                con.unregister(f"_tlog_{table}")
            return export_parquet(con, directory, run_ids=run_ids, overwrite=overwrite)
        finally:
            con.close()

    @_served
    def latest_run(self) -> str:
        """The id of the run ingested last (``tlog diagnose`` without ``--run``).

        Raises:
            RunNotFoundError: the database holds no runs.
        """
        from tlog.ingest.errors import RunNotFoundError

        with self._reader() as con:
            rows = con.execute("SELECT run_id FROM runs ORDER BY last_ingested DESC NULLS LAST, "
                               "started DESC NULLS LAST LIMIT 1").fetchall()
        if not rows:
            raise RunNotFoundError("the database holds no runs: run 'tlog ingest RUN_DIR' first")
        return rows[0][0]

    @_served
    def run_root(self, run: str) -> str | None:
        """The directory ``run`` was ingested from (None: no such run, or the
        database does not exist yet)."""
        if not self.path.is_file():
            return None
        with self._reader() as con:
            rows = con.execute("SELECT root FROM runs WHERE run_id = ?", [run]).fetchall()
        return rows[0][0] if rows else None

    @_served
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

        if since is not None and (isinstance(since, bool)
                                  or not isinstance(since, int | float)
                                  or math.isnan(since)):
            raise UsageError(f"since must be an epoch second (a number), got {since!r}")
        if tags is not None and not (isinstance(tags, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in tags.items())):
            raise UsageError(f"tags must map tag names to text values, got {tags!r}")
        rows = self.run_summaries(tags=tags, since=since)
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

    @_served
    def run_summaries(self, *, tags: Mapping[str, str] | None = None,
                      since: float | None = None) -> list[Any]:
        """The runs, oldest first, as :class:`~tlog.analyze.history.RunSummary`
        objects (``tlog runs``; ``.to_dict()`` is a row of ``tlog runs --json``).
        Filters as :meth:`runs`."""
        from tlog.analyze.history import list_runs

        with self._reader() as con:
            return list_runs(con, tags=tags, since=since)

    @_served
    def diagnose(self, run: str, *, policies: Policies | None = None,
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
            return diagnose(con, run, policies=policies, rules=rules)

    @_served
    def stored_diagnosis(self, run: str) -> dict[str, Any] | None:
        """``tlog diagnose --json`` of ``run`` as the last ingest stored it, when
        it is still fresh (the run's data and the rules unchanged since:
        :func:`tlog.analyze.persist.stored_diagnosis`); else None, and
        :meth:`diagnose` computes it. Loads no analysis: ``tlog diagnose``
        prints a stored run's verdict from it. Always None while a rule plugin
        is installed (``tlog.rules``): :meth:`diagnose` then loads the plugins,
        so one that fails to load is said on every diagnose, not only at ingest.

        Raises:
            UsageError: ``run`` is not a text.
        """
        import json

        from tlog.analyze.persist import stored_diagnosis
        from tlog.analyze.plugins import rule_set_key

        _check_run_id(run)
        if not self.path.is_file() or rule_set_key():
            return None
        with self._reader() as con:
            text = stored_diagnosis(con, run)
        return None if text is None else json.loads(text)

    @_served
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

    @_served
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
        from tlog.analyze.baseline import HighWaterMark
        from tlog.analyze.live import DEFAULT_WINDOW_S, live_view

        _check_run_id(run)
        if isinstance(high_water, Mapping):        # as sent to a live service
            high_water = HighWaterMark(**high_water)
        if window_s is None:
            window_s = DEFAULT_WINDOW_S
        if isinstance(window_s, bool) or not isinstance(window_s, int | float) \
                or not window_s > 0 or math.isinf(window_s):
            raise UsageError(f"window_s must be a positive number of seconds, got {window_s!r}")
        with self._reader() as con:
            return live_view(con, run, window_s=window_s, high_water=high_water)

    @_served
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

    @_served
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

    def report(self, run: str, out: str | Path | None = None, *,
               image_formats: Sequence[str] = ()) -> Path:
        """Write the offline HTML report of ``run`` (``tlog report --run``) to
        ``out`` (default ``./tlog-reports/<run>/index.html``); return its path.
        ``image_formats``: also each chart as ``"png"``/``"svg"`` beside it
        (:meth:`report_files` returns their paths too).

        Raises:
            RunNotFoundError: no such run. UsageError: an unknown image format.
            ReportWriteError: the file cannot be written.
        """
        return self.report_files(run, out, image_formats=image_formats).html

    def report_files(self, run: str, out: str | Path | None = None, *,
                     image_formats: Sequence[str] = ()) -> Any:
        """:meth:`report`, returning the :class:`~tlog.reports.run_report.ReportFiles`
        (``.html``, ``.images``). The data is read where the database is (a
        live service reads it), the files are written here."""
        from tlog.reports.export import check_format
        from tlog.reports.run_report import write_report_of

        _check_run_id(run)
        formats = [check_format(f) for f in image_formats]
        return write_report_of(self.report_data(run), out, image_formats=formats)

    def compare_report_files(self, baseline: str, candidate: str,
                             out: str | Path | None = None, *,
                             image_formats: Sequence[str] = ()) -> Any:
        """The offline HTML report of what changed from ``baseline`` to
        ``candidate`` (``tlog report --compare``), written to ``out``; returns
        its :class:`~tlog.reports.run_report.ReportFiles`.

        Raises:
            RunNotFoundError: a run is missing. UsageError: an unknown image format.
        """
        from tlog.reports.compare_report import write_compare_report_of
        from tlog.reports.export import check_format

        for r in (baseline, candidate):
            _check_run_id(r)
        formats = [check_format(f) for f in image_formats]
        return write_compare_report_of(self.compare_report_data(baseline, candidate), out,
                                       image_formats=formats)

    @_served
    def report_data(self, run: str) -> RunReportData:
        """What the run report of ``run`` shows (:class:`~tlog.reports.data.RunReportData`).

        Raises:
            RunNotFoundError: no such run.
        """
        from tlog.reports.data import load_report_data

        _check_run_id(run)
        with self._reader() as con:
            return load_report_data(con, run)

    @_served
    def compare_report_data(self, baseline: str, candidate: str) -> Any:
        """What the compare report shows (``tlog.reports.compare_report.load_compare_data``).

        Raises:
            RunNotFoundError: a run is missing.
        """
        from tlog.reports.compare_report import load_compare_data

        with self._reader() as con:
            return load_compare_data(con, baseline, candidate)

    @_served
    def perfetto(self, run: str, *, iters: Sequence[int] | None = None) -> Any:
        """The timeline of ``run`` for Perfetto (``tlog export --perfetto``): a
        :class:`~tlog.reports.perfetto.PerfettoTrace` (``.write(path)``);
        ``iters``: only iterations ``first`` to ``last`` of each worker.

        Raises:
            RunNotFoundError: no such run, or no iteration in the window.
            UsageError: a bad window.
        """
        from tlog.reports.perfetto import perfetto_trace

        _check_run_id(run)
        window = None if iters is None else tuple(iters)
        with self._reader() as con:
            return perfetto_trace(con, run, iters=window)

    @_served
    def sql(self, query: str) -> pl.DataFrame:
        """Run one read-only SQL statement over the database (``tlog sql``):
        the same guards (no write, no file access outside the database).

        Raises:
            WriteRefusedError: the statement would write. QueryError: DuckDB
            rejects it.
        """
        from tlog.queries import check_read_only, run_sql

        self._check_open()
        check_read_only(query)
        with self._reader(sealed=True) as con:
            return run_sql(query, con=con)

    @_served
    def query(self, name: str, params: Mapping[str, Any] | None = None) -> pl.DataFrame:
        """Run the stored query ``name`` (``tlog query NAME -p k=v``) with
        ``params`` (strings are parsed by the declared type).

        Raises:
            QueryNotFoundError: no such stored query. UsageError: a missing or
            bad parameter. QueryError: DuckDB rejects it.
        """
        from tlog.queries import load_query, run_query

        self._check_open()
        query = load_query(name)
        query.bind(dict(params or {}))      # parameter errors before the database is opened
        with self._reader(sealed=True) as con:
            return run_query(con, query, params)


#: Most runs whose diagnoses :func:`ingest_runs` stores together (one
#: transaction, their frames held in memory meanwhile). Source: tlog's choice
#: (a store's fixed statements shared by many small runs; a group of 64 small
#: runs holds a few MB).
STORE_GROUP_RUNS = 64
#: A group is stored sooner once its runs hold this many iterations, so a
#: group of large runs does not hold all their attributed frames at once.
#: Source: tlog's choice (about the size of one large run's frames).
STORE_GROUP_ITERS = 200_000
#: Largest run (bytes of its logs on disk) that :func:`ingest_runs` ingests
#: and diagnoses on one DuckDB thread, with every run of its group as small:
#: the statements of such a run read a few thousand rows at most, and a second
#: thread only adds its hand-offs (less CPU and wall time measured, in
#: docs/DATABASE.md "The fixed cost of a run"). Source of the size: tlog's
#: choice (about 5,000 iterations of a few phases).
ONE_THREAD_RUN_BYTES = 1 << 20
#: Run directories per call sent to a live ``tlog serve`` (each call holds its
#: write lock; a few seconds of small runs). Source: tlog's choice.
SERVICE_RUNS_PER_CALL = 64


def _planned_dirs(run_dirs: Sequence[str | Path], *, each: bool) -> list[Path]:
    """The run directories :meth:`Database.ingest_many` loads, absolute and in
    order, after the checks it makes before loading anything (its Raises)."""
    from tlog.ingest.errors import RunDirError
    from tlog.ingest.run import check_run_dir, run_dirs_under

    if isinstance(run_dirs, str | Path) or not run_dirs:
        raise UsageError("give a list of run directories (at least one)")
    given = [_given_path(d) for d in run_dirs]
    out: list[Path] = []
    seen: set[Path] = set()
    accepted: set[Path] = set()
    owner: dict[str, Path] = {}
    bad: list[str] = []
    for parent in given if each else [None]:
        dirs = given if parent is None else run_dirs_under(parent)
        found = 0
        for d in dirs:
            try:
                where = d.resolve()
            except (OSError, RuntimeError):     # a symlink loop: check_run_dir says so
                where = d.absolute()
            if where in seen:
                found += where in accepted
                continue
            seen.add(where)
            try:
                rid = check_run_dir(d)
            except (RunDirError, UsageError) as exc:
                if parent is None:
                    bad.append(str(exc))
                continue      # with each: a subdirectory that is no run (plots/, ...)
            found += 1
            if rid in owner:
                bad.append(f"{owner[rid]} and {d} both hold run {rid!r}: give one of them "
                           f"another run_id in its run.json, or ingest it alone with --run-id")
                continue
            owner[rid] = d
            # the path as given (not resolved): a symlinked trace file's run id is
            # the link's name, as check_run_dir said and one ingest of it loads
            out.append(d.absolute())
            accepted.add(where)
        if parent is not None and not found:
            bad.append(f"{parent} holds no run directory (a subdirectory with logs or a "
                       f"run.json)")
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise RunDirError(f"{bad[0]}{more}; nothing was loaded")
    return out


def _given_path(run_dir: str | Path) -> Path:
    """``run_dir`` as a path, ``~`` expanded; UsageError for empty text, which
    ``Path`` would take for the current directory (an unset shell variable:
    ``tlog ingest --each "$SWEEP"`` would load every folder under it)."""
    if isinstance(run_dir, str) and not run_dir:
        raise UsageError("a run directory given is empty text (an unset shell variable?): "
                         "give its path, or . for the current directory")
    return Path(run_dir).expanduser()


def _partly_loaded(message: str, loaded: int, total: int) -> str:
    """``message`` of a run that failed while :func:`ingest_runs` loaded a list,
    with what became of the others."""
    left = total - loaded - 1
    return (f"{message}; {loaded} of {total} runs were loaded before it (kept, diagnoses "
            f"stored), {left} after it were not: fix it (or leave it out) and the same command "
            f"again loads what is missing")


def ingest_runs(con: duckdb.DuckDBPyConnection, run_dirs: Sequence[str | Path], *,
                on_report: Callable[[IngestReport], None] | None = None,
                done_before: int = 0, total: int | None = None,
                stop: Callable[[], bool] | None = None) -> list[IngestReport]:
    """Ingest each of ``run_dirs`` on the open writable ``con``
    (:func:`tlog.ingest.run.ingest_run`: its own transactions per run, as
    ever) and store their diagnoses (:func:`tlog.analyze.persist.ensure_attribution`)
    a group at a time: :data:`STORE_GROUP_RUNS` runs, or fewer holding
    :data:`STORE_GROUP_ITERS` iterations. The rows and diagnoses stored are
    those of one :meth:`Database.ingest` per run (tests/tlog/test_api.py
    compares them); ``tlog serve`` calls it on its writer, a part of the
    list at a time (``done_before``: runs of the list loaded by earlier
    calls; ``total``: the whole list's length, for the error message).
    ``stop`` is asked before each run: true stores the pending diagnoses and
    raises ``KeyboardInterrupt``. A full group of small runs (the one-thread
    case below) is stored on a second thread while the next group loads, when
    the process has two cores or more and does not share the database; the
    call returns or raises only once every store has ended.

    Raises:
        RunDirError, UsageError: a run failed (:meth:`Database.ingest_many`
        says what becomes of the others); the diagnoses of the runs loaded
        before it are stored first. Others as ``ingest_run``.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    import duckdb

    from dflash_runtime.sysinfo import usable_cores
    from tlog.analyze.persist import ensure_attribution
    from tlog.ingest.db import memory_limit_is_shared, query_threads
    from tlog.ingest.errors import RunDirError
    from tlog.ingest.run import absent_runs, ingest_run, survey_run_dir

    reports: list[IngestReport] = []
    pending: list[str] = []
    iters = 0
    absent: set[str] = set()
    # DuckDB's threads, a setting of the whole database: left alone when the
    # user set them ($TLOG_THREADS) or other threads share the database (serve)
    own_threads = query_threads() is None and not memory_limit_is_shared()
    threads_before: list[str] = []      # the setting to restore, once changed

    def look_ahead(k: int) -> None:
        """Of the next group of runs: which the database holds nothing of (one
        statement instead of five look-ups per run in ``ingest_run``), and
        whether all are small enough for one DuckDB thread."""
        ids, small = [], True
        for path in run_dirs[k:k + STORE_GROUP_RUNS]:
            try:
                rid, size = survey_run_dir(path)
            except (RunDirError, UsageError):
                continue    # ingest_run says what is wrong when it gets there
            ids.append(rid)
            small = small and size <= ONE_THREAD_RUN_BYTES
        absent.clear()
        absent.update(absent_runs(con, ids))
        if own_threads and small != bool(threads_before):
            if small:
                threads_before.append(str(con.execute(
                    "SELECT current_setting('threads')").fetchall()[0][0]))
                con.execute("SET threads = 1")
            else:
                con.execute(f"SET threads = {int(threads_before.pop())}")

    # A group of small runs has its diagnoses stored on a thread of its own (a cursor
    # of the connection) while the next group loads: both spend most of their time
    # in DuckDB and polars, which release the GIL, so a second core takes one. Not
    # beside tlog serve (its readers share the database) nor on one core.
    background = (ThreadPoolExecutor(1, thread_name_prefix="tlog-store")
                  if own_threads and (usable_cores() or 1) > 1 else None)
    storing: list[Future[None]] = []

    def attribute(c: duckdb.DuckDBPyConnection, ids: list[str]) -> None:
        try:
            ensure_attribution(c, ids)
        except KeyboardInterrupt:
            # DuckDB interrupts the statements running when SIGINT comes (on any
            # thread), whatever Python's handler does: a Ctrl-C that only asked to
            # stop (``stop``) has the store made again; a second one ends it
            if stop is None or not stop():
                raise
            ensure_attribution(c, ids)

    def wait_store() -> None:
        if storing:
            storing.pop().result()

    def store(*, now: bool = True) -> None:
        """Store the pending runs' diagnoses: at once, or (``now`` false, a group of
        small runs) on the background thread, after the one it may still store."""
        nonlocal iters
        wait_store()
        if not pending:
            return
        ids = list(pending)
        pending.clear()
        iters = 0
        if now or background is None or not threads_before:
            attribute(con, ids)
            return
        cur = con.cursor()

        def job() -> None:
            try:
                attribute(cur, ids)
            finally:
                cur.close()

        storing.append(background.submit(job))

    try:
        for k, path in enumerate(run_dirs):
            if stop is not None and stop():
                store()
                raise KeyboardInterrupt
            if k % STORE_GROUP_RUNS == 0:
                look_ahead(k)
            try:
                report = ingest_run(con, path, absent=absent)
            except (RunDirError, UsageError) as exc:
                store()
                raise type(exc)(_partly_loaded(f"{path}: {exc}", done_before + len(reports),
                                               total or len(run_dirs))) from None
            except BaseException:
                store()
                raise
            reports.append(report)
            absent.discard(report.run_id)
            if report.run_id not in pending:
                pending.append(report.run_id)
            iters += report.records_loaded.get("iter", 0)
            if len(pending) >= STORE_GROUP_RUNS or iters >= STORE_GROUP_ITERS:
                store(now=False)
            if on_report is not None:
                on_report(report)
        store()
    finally:
        if background is not None:
            try:
                wait_store()       # never left writing once this returns or raises
            finally:
                background.shutdown()
        if threads_before:
            try:
                con.execute(f"SET threads = {int(threads_before.pop())}")
            except duckdb.Error:
                pass    # a connection gone with the error being raised: keep that one
    return reports



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
        self.last_run: str | None = None    # the run stored last
        self.last = -math.inf

    def after_round(self, con: duckdb.DuckDBPyConnection, report: IngestReport, n: int) -> None:
        if not n or report.records_total or report.recategorized:
            self.pending = report.run_id
        if self.pending is not None and (not n or self.clock() - self.last >= self.interval_s):
            self._store(con)

    def _store(self, con: duckdb.DuckDBPyConnection) -> None:
        from tlog.analyze.persist import ensure_attribution

        ensure_attribution(con, [self.pending])
        self.last_run, self.pending, self.last = self.pending, None, self.clock()

    def finish(self, open_db: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        """The last store, in a connection of its own, if one is due."""
        if self.pending is None:
            return
        con = open_db()
        try:
            self._store(con)
        finally:
            con.close()
