"""What ``tlog serve`` does besides HTTP: own the database, ingest watched runs, answer.

- :class:`Gate`: the service's one DuckDB connection, shared by its threads
  (a cursor each): readers on a snapshot, writers one at a time.
- :class:`Watcher`: a thread that ingests every run directory under the
  watched directories each ``interval_s``, one round at a time
  (:func:`tlog.ingest.follow.ingest_round`, the round of ``tlog ingest
  --follow``; the run's diagnosis stored as ``follow`` stores it,
  :class:`tlog.api.DiagnosisStore`).
- :class:`Service`: the answers of the JSON API, each the content of the
  matching CLI ``--json`` output, computed by the same library calls.

The connection is opened with ``enable_external_access = false``: no SQL run
on it (the SQL page) can read or write a file outside the database; the
service itself reads only the watched directories (ingest reads files in
Python, without following links, and hands DuckDB Arrow tables).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tlog.api import Database
from tlog.ingest.errors import DatabaseError, RunDirError, TlogError

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger("tlog.serve")

#: Seconds a write waits for the write lock (the ingest round in progress)
#: before answering 503. Source: tlog's choice.
GATE_WAIT_S = 30.0

#: Seconds between two ingest rounds of the watched directories: a live run's
#: shim flushes at least every second (docs/RUNTIME.md). Source: tlog's choice.
SERVE_INTERVAL_S = 2.0

#: Rows the SQL page and ``/api/sql`` return at most: a ``SELECT *`` of a big
#: table (tens of millions of phase rows) would hold gigabytes in the service
#: (3 million short rows took 2 GB). Source: tlog's choice; ``tlog sql`` has
#: no limit.
SQL_MAX_ROWS = 10_000

#: Seconds one statement of the SQL page or ``/api/sql`` may run before it is
#: interrupted: it holds the write lock, so ingest waits for it. Source: tlog's
#: choice (the stored queries take well under a second on a run of a day).
SQL_TIMEOUT_S = 30.0

#: Diagnoses kept in memory (one per run, the latest data): the run page and
#: the load of many clients ask for the same run again and again.
CACHE_RUNS = 16

#: Seconds the high-water marks of every run are kept while runs grow: each
#: is the best of every run of a configuration, so computing them reads every
#: run, and some run changes at every ingest round. Source: tlog's choice (the
#: runs page refreshes every few seconds; a mark 10 s old is still the mark).
MARKS_EVERY_S = 10.0

#: Runs on one page of the runs list (``/``). Source: tlog's choice.
PAGE_RUNS = 100
#: With ``tlog serve --publish LAKE``: a watched run whose files have not changed for
#: this many seconds is taken as finished and published into the lake. tlog's
#: choice; publishing replaces, so a run that grows again (after a long checkpoint
#: save) is published again when it is quiet again.
PUBLISH_QUIET_S = 60.0


class GateBusyError(DatabaseError):
    """The write lock stayed taken past :data:`GATE_WAIT_S`, or the service is stopping."""


class Gate:
    """The service's connection to ``path`` and its write lock.

    Readers take :meth:`reader`: a cursor of their own in a transaction, so
    they see one snapshot of the database while an ingest round commits, and
    never wait for it (DuckDB's MVCC inside one process); the diagnoses they
    compute stay in memory (:func:`tlog.analyze.persist.diagnosed_in_memory`).
    Writers take :meth:`use` with ``write=True``: ingest rounds and the
    writes the CLI sends, one at a time, so DuckDB never sees two
    transactions writing the same rows.

    Raises (on open): DatabaseError, DatabaseLockedError: as
    :func:`tlog.ingest.db.connect`.
    """

    def __init__(self, path: Path) -> None:
        from tlog.ingest.db import connect

        self.path = path
        self._write = threading.Lock()
        self._lock = threading.Lock()
        self._users = 0
        self._closed = False
        self._con = connect(self.path, wait_s=2.0)
        self._con.execute("SET enable_external_access = false")

    @contextmanager
    def use(self, *, write: bool = False,
            wait_s: float = GATE_WAIT_S) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor of the connection for the ``with`` block (closed after it);
        ``write``: holding the write lock.

        Raises:
            GateBusyError: the write lock stayed taken for ``wait_s``, or the
            service is stopping.
        """
        from tlog.ingest.db import sharing_database

        with self._lock:
            if self._closed:
                raise GateBusyError("the service is stopping")
            self._users += 1
        try:
            if write and not self._write.acquire(timeout=wait_s):
                raise GateBusyError("the database is busy writing; try again in a moment")
            try:
                cur = self._con.cursor()
                try:
                    with sharing_database():
                        yield cur
                finally:
                    cur.close()
            finally:
                if write:
                    self._write.release()
        finally:
            with self._lock:
                self._users -= 1

    @contextmanager
    def reader(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor on one snapshot, for reading (class docstring)."""
        from tlog.analyze.persist import diagnosed_in_memory

        with self.use() as cur, diagnosed_in_memory():
            cur.execute("BEGIN TRANSACTION")
            try:
                yield cur
            finally:
                with contextlib.suppress(Exception):
                    cur.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection once the threads using it are done (at most
        :data:`GATE_WAIT_S`)."""
        with self._lock:
            self._closed = True
        deadline = time.monotonic() + GATE_WAIT_S
        while self._users and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._write:
            self._con.close()


def _looks_like_run(path: Path) -> bool:
    try:
        return any(e.name == "run.json" or (e.is_file(follow_symlinks=False)
                                            and ".jsonl" in e.name)
                   for e in os.scandir(path))
    except OSError:
        return False


def run_dirs(roots: list[Path]) -> list[Path]:
    """The run directories under the watched ``roots``: a root that holds
    logs itself (``run.json`` or a ``.jsonl`` file) is one run, else each of
    its sub-directories is (hidden ones and links left out: only the watched
    directories are read)."""
    out: list[Path] = []
    for root in roots:
        if _looks_like_run(root):
            out.append(root)
            continue
        try:
            entries = sorted(os.scandir(root), key=lambda e: e.name)
        except OSError:
            continue
        out.extend(Path(e.path) for e in entries
                   if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
    return out


@dataclass
class _Followed:
    store: Any
    rounds: int = 0
    said: str | None = None
    seen: tuple | None = None      # the files' sizes and times at the last round
    run_id: str | None = None
    changed_at: float = 0.0        # time.monotonic() when ``seen`` last changed
    published: tuple | None = None  # ``seen`` when the run was last published


def files_state(run_dir: Path, depth: int = 3) -> tuple:
    """What the files under ``run_dir`` look like: sorted (path, size, mtime in
    ns) of every file up to ``depth`` levels down, links left out. Equal
    between two rounds: nothing to ingest (a round of an unchanged run costs
    about 0.1 s of CPU; a directory of a thousand finished runs, minutes)."""
    out = []
    stack = [(run_dir, 0)]
    while stack:
        d, level = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if level + 1 < depth:
                        stack.append((Path(e.path), level + 1))
                elif e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    out.append((e.path, st.st_size, st.st_mtime_ns))
            except OSError:
                continue
    return tuple(sorted(out))


class Watcher(threading.Thread):
    """Ingest the runs under ``roots`` every ``interval_s`` seconds until :meth:`stop`.

    A round of one run holds the write lock; runs take turns, so requests are
    answered between them. A run directory not ready yet (no logs) is tried
    again next round; its error is logged once per distinct message.
    """

    def __init__(self, gate: Gate, roots: list[Path], interval_s: float = SERVE_INTERVAL_S,
                 service: Service | None = None, lake: Path | None = None,
                 publish_quiet_s: float = PUBLISH_QUIET_S) -> None:
        super().__init__(name="tlog-serve-ingest", daemon=True)
        self.gate = gate
        self.service = service
        self.lake = lake
        self.publish_quiet_s = publish_quiet_s
        self.published = 0
        self.roots = roots
        self.interval_s = interval_s
        self.followed: dict[Path, _Followed] = {}
        self._halt = threading.Event()
        self.rounds = 0

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except Exception:   # the service keeps serving; the log says why
                log.exception("ingest round failed")
            self._halt.wait(self.interval_s)

    def tick(self) -> None:
        """One round over every run directory."""
        from tlog.api import DiagnosisStore
        from tlog.ingest.follow import FOLLOW_STORE_INTERVAL_S, ingest_round

        for run_dir in run_dirs(self.roots):
            if self._halt.is_set():
                return
            state = self.followed.get(run_dir)
            if state is None:
                state = _Followed(store=DiagnosisStore(FOLLOW_STORE_INTERVAL_S))
            seen = files_state(run_dir)
            if state.rounds and seen == state.seen and state.store.pending is None:
                self._publish_if_quiet(run_dir, state)
                continue                    # nothing changed since its last round
            try:
                with self.gate.use(write=True) as cur:
                    report = ingest_round(cur, run_dir, state.rounds,
                                          after_round=state.store.after_round)
                    if self.service is not None and (report.records_total or not state.rounds
                                                     or report.recategorized):
                        self.service.refresh(cur, [report.run_id])
            except GateBusyError:
                return
            except (RunDirError, TlogError) as exc:
                if str(exc) != state.said:
                    log.warning("%s: %s", run_dir, exc)
                    state.said = str(exc)
                self.followed.setdefault(run_dir, state)
                continue
            self.followed[run_dir] = state
            state.rounds += 1
            state.said = None
            state.run_id = report.run_id
            if seen != state.seen:
                state.seen, state.changed_at = seen, time.monotonic()
            if report.records_total:
                log.info("ingested %d records of run %s", report.records_total, report.run_id)
        self.rounds += 1

    def _publish_if_quiet(self, run_dir: Path, state: _Followed) -> None:
        """Publish a watched run into the lake (``--publish``) once its files have been
        unchanged for :attr:`publish_quiet_s` seconds, and not since they last changed.
        Runs on a reader (the write lock stays free); a failure is logged and tried
        again next round."""
        if (self.lake is None or state.run_id is None or state.published == state.seen
                or time.monotonic() - state.changed_at < self.publish_quiet_s):
            return
        from tlog.queries.lake import publish_run

        try:
            with self.gate.reader() as cur:
                report = publish_run(cur, state.run_id, self.lake)
        except TlogError as exc:
            if str(exc) != state.said:
                log.warning("%s: publishing into %s: %s", run_dir, self.lake, exc)
                state.said = str(exc)
            return
        state.published = state.seen
        self.published += 1
        log.info("published run %s into %s (%d iterations, %.1f s)", report.run_id,
                 self.lake, report.rows.get("iterations", 0), report.seconds)

    def stop(self) -> None:
        """Stop after the current round; store each followed run's diagnosis if due."""
        self._halt.set()
        if self.is_alive():
            self.join()
        for state in self.followed.values():
            if state.store.pending is None:
                continue
            try:
                with self.gate.use(write=True) as cur:
                    state.store.finish(cur.cursor)
            except TlogError as exc:
                log.warning("storing the diagnosis at exit: %s", exc)


class _Memo:
    """Values computed from the database, each kept with the digest of the data
    it was computed from (``key``), for the ``capacity`` names used last; a value asked for by many threads at once is computed once
    (the others wait for it). Thread-safe."""

    def __init__(self, capacity: int = CACHE_RUNS) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._busy: dict[str, threading.Lock] = {}

    def get(self, name: str, key: Any, compute: Callable[[], Any]) -> Any:
        """The value of ``name`` computed from data ``key`` (``compute()`` if none is)."""
        with self._lock:
            hit = self._items.get(name)
            if hit is not None and hit[0] == key:
                return hit[1]
            busy = self._busy.setdefault(name, threading.Lock())
        with busy:
            with self._lock:
                hit = self._items.get(name)
                if hit is not None and hit[0] == key:
                    return hit[1]
            value = compute()
            with self._lock:
                self._items[name] = (key, value)
                self._items.move_to_end(name)
                while len(self._items) > self.capacity:
                    old, _ = self._items.popitem(last=False)
                    self._busy.pop(old, None)
            return value


class Service:
    """The answers of the JSON API (docs/SERVE.md), each what the CLI's ``--json`` prints.

    The service is the database's only writer, so the data changes only when
    its :class:`Watcher` ingests: after each round it calls :meth:`refresh`,
    which keeps each run's data digest (:func:`tlog.analyze.persist.data_keys`)
    and a generation number that grows when any digest changed. Answers are
    kept per run and digest (a diagnosis, its charts) or per generation
    (the runs list, high-water marks: they read every run), so many clients
    asking about an unchanged run cost one computation.

    Args:
        gate: the database.
    """

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.db = ServedDatabase(gate)
        self._stores: dict[tuple[str, str | None], Any] = {}
        self._stores_lock = threading.Lock()
        self._keys: dict[str, str] = {}
        self.generation = 0
        self._marks_lock = threading.Lock()
        self._marks_gen, self._marks_at = -1, -math.inf
        self._diagnoses = _Memo()          # Diagnosis objects (with their frames)
        self._answers = _Memo()            # their JSON, charts, runs lists
        with gate.reader() as cur:
            self.refresh(cur)

    def refresh(self, cur: duckdb.DuckDBPyConnection, run_ids: list[str] | None = None) -> None:
        """Read the data digests of ``run_ids`` (None: every run) after a write."""
        from tlog.analyze.persist import data_keys

        keys = data_keys(cur, run_ids)
        new = {**self._keys, **keys} if run_ids is not None else keys
        if run_ids is not None:
            for r in run_ids:
                if r not in keys:
                    new.pop(r, None)
        if new != self._keys:
            self._keys = new
            self.generation += 1

    # --- calls of the facade from other processes (POST /api/call) -------------------

    def call(self, method: str, kwargs: Mapping[str, Any]) -> Any:
        """Make the facade call ``method(**kwargs)`` here (``POST /api/call``,
        :meth:`tlog.web.endpoint.ServiceInfo.call`): a :class:`tlog.api.Database`
        method that reads or writes the database (:data:`FACADE_CALLS`), or one
        of the writes a client's follow loop sends (:meth:`ingest_round`,
        :meth:`ingest_finish`) or :meth:`export_tables`.

        Raises:
            UsageError: no such call, or arguments it does not take.
            TlogError: what the call raises.
        """
        from tlog.ingest.errors import UsageError

        if method in _SERVICE_CALLS:
            fn = getattr(self, method)
        elif method in FACADE_CALLS:
            fn = getattr(self.db, method)
        else:
            raise UsageError(f"tlog serve has no call {method!r}: is the client the same "
                             f"version of tlog?")
        try:
            inspect.signature(fn).bind(**kwargs)
        except TypeError as exc:
            raise UsageError(f"bad arguments for {method}: {exc}") from None
        result = fn(**kwargs)
        if method == "forget":
            with self.gate.reader() as cur:
                self.refresh(cur)
        return result

    def ingest_round(self, run_dir: str, run_id: str | None = None, n: int = 0,
                     reload: bool = False) -> Any:
        """One ingest round of ``run_dir`` (a path on this host) for a client's
        :meth:`tlog.api.Database.follow`, under the write lock beside the
        watcher's rounds (the same incremental ingest: a line is loaded once,
        whichever loads it first); the run's diagnosis stored as ``follow``
        stores it. Returns the :class:`~tlog.ingest.run.IngestReport`.

        Raises:
            RunDirError: the run directory is missing or holds no logs.
            UsageError: ``run_dir`` is not an absolute path.
        """
        from tlog.api import DiagnosisStore
        from tlog.ingest.errors import UsageError
        from tlog.ingest.follow import FOLLOW_STORE_INTERVAL_S
        from tlog.ingest.follow import ingest_round as one_round

        path = Path(run_dir)
        if not path.is_absolute():
            raise UsageError(f"run directory {run_dir!r} must be an absolute path on the "
                             f"service's host")
        with self._stores_lock:
            store = self._stores.setdefault((run_dir, run_id),
                                            DiagnosisStore(FOLLOW_STORE_INTERVAL_S))
        with self.gate.use(write=True) as cur:
            report = one_round(cur, path, n, run_id=run_id, reload=reload,
                               after_round=store.after_round)
            self.refresh(cur, [report.run_id])
        return report

    def ingest_runs(self, run_dirs: list[str], done_before: int = 0,
                    total: int | None = None) -> list[Any]:
        """Ingest the run directories ``run_dirs`` (absolute paths on this host)
        for a client's :meth:`tlog.api.Database.ingest_many`, under the write
        lock, and store their diagnoses (:func:`tlog.api.ingest_runs`; the
        client sends a long list in parts). Returns the runs'
        :class:`~tlog.ingest.run.IngestReport` objects.

        Raises:
            UsageError: a path is not absolute. RunDirError: as ``ingest_runs``.
        """
        from tlog.api import ingest_runs
        from tlog.ingest.errors import UsageError

        if not isinstance(run_dirs, list) or not all(
                isinstance(d, str) and Path(d).is_absolute() for d in run_dirs):
            raise UsageError("run directories must be a list of absolute paths on the "
                             "service's host")
        with self.gate.use(write=True) as cur:
            try:
                reports = ingest_runs(cur, run_dirs, done_before=done_before, total=total)
            except BaseException:
                self.refresh(cur)       # which runs loaded before the failure: read them all
                raise
            self.refresh(cur, [r.run_id for r in reports])
            return reports

    def ingest_finish(self, run_dir: str, run_id: str | None = None) -> None:
        """A client stopped following ``run_dir``: store its diagnosis if due."""
        with self._stores_lock:
            store = self._stores.pop((run_dir, run_id), None)
        if store is None or store.pending is None:
            return
        with self.gate.use(write=True) as cur:
            store.finish(cur.cursor)
            self.refresh(cur, [store.last_run] if store.last_run else None)

    def publish(self, lake: str, run_ids: list[str] | None = None) -> list[Any]:
        """Publish runs into the run lake ``lake`` (an absolute path on this host) for a
        client's :meth:`tlog.api.Database.publish`, on one snapshot (a stale stored
        diagnosis is computed in memory for the files); the write lock stays free.

        Raises:
            UsageError: ``lake`` is not an absolute path. Others as
            :func:`tlog.queries.lake.publish_runs`.
        """
        from tlog.ingest.errors import UsageError

        if not Path(lake).is_absolute():
            raise UsageError(f"lake {lake!r} must be an absolute path on the service's host")
        return self.db.publish(lake, run_ids=run_ids)     # ServedDatabase: on a snapshot

    def export_tables(self, run_ids: list[str] | None = None) -> dict[str, Any]:
        """The rows ``tlog export`` writes, as Arrow tables by name
        (:data:`tlog.queries.export.EXPORT_TABLES`), of ``run_ids`` (None: every
        run), read on one snapshot; the client writes the files."""
        from tlog.queries.export import EXPORT_TABLES

        out = {}
        with self.gate.reader() as cur:
            for table in EXPORT_TABLES:
                where = "" if run_ids is None else " WHERE run_id IN (SELECT unnest(?::VARCHAR[]))"
                out[table] = cur.sql(f"SELECT * FROM {table}{where}",
                                     params=None if run_ids is None else [list(run_ids)]
                                     ).to_arrow_table()
        return out

    # --- runs -----------------------------------------------------------------------

    def runs(self, *, tags: Mapping[str, str] | None = None,
             since: float | None = None) -> list[dict[str, Any]]:
        """``tlog runs --json``: the runs oldest first (``RunSummary.to_dict()``)."""
        return self.runs_page(tags=tags, since=since)[0]

    def runs_page(self, *, tags: Mapping[str, str] | None = None, since: float | None = None,
                  q: str = "", offset: int = 0, limit: int | None = None,
                  ) -> tuple[list[dict[str, Any]], int]:
        """One page of the runs list: the rows of ``tlog runs --json`` (oldest
        first) whose run id, name or tags contain ``q`` (case-insensitive),
        from ``offset``, at most ``limit`` (None: all), and how many match.

        Only the page's runs are filled from their stored diagnosis (stale
        ones diagnosed in memory), so a page of a history of 10,000 runs
        costs what a page of 100 does, plus one scan of the ``runs`` table.
        """
        from tlog.analyze.history import _fill_stored, run_rows
        from tlog.analyze.persist import ensure_attribution

        def compute() -> tuple[list[dict[str, Any]], int]:
            with self.gate.reader() as cur:
                rows = run_rows(cur, tags=tags, since=since)
                if q:
                    needle = q.lower()
                    rows = [r for r in rows if needle in " ".join(
                        (r.run_id, r.name or "", json.dumps(r.tags, default=str))).lower()]
                page = rows[offset:] if limit is None else rows[offset:offset + limit]
                if page:
                    ensure_attribution(cur, [r.run_id for r in page])
                    _fill_stored(cur, page)
                return [r.to_dict() for r in page], len(rows)

        name = "runs:" + repr((sorted((tags or {}).items()), since, q, offset, limit))
        return self._answers.get(name, self.generation, compute)

    def high_water_marks(self, runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per run of ``runs`` (rows of :meth:`runs`): its high-water mark
        (:func:`tlog.analyze.baseline.high_water_marks`, every run's at once,
        kept per generation) with the run against it
        (:meth:`~tlog.analyze.baseline.HighWaterMark.versus`)."""
        from tlog.analyze.baseline import high_water_marks

        def compute() -> dict[str, Any]:
            with self.gate.reader() as cur:
                return high_water_marks(cur)

        # computed anew at most every MARKS_EVERY_S: each is the best of every
        # run, and the data of some run changes at every ingest round
        now = time.monotonic()
        with self._marks_lock:
            if self._marks_gen != self.generation and now - self._marks_at >= MARKS_EVERY_S:
                self._marks_gen, self._marks_at = self.generation, now
            key = self._marks_gen
        marks = self._answers.get("marks", key, compute)
        out = {}
        for r in runs:
            hw = marks.get(r["run_id"])
            if hw is not None:
                out[r["run_id"]] = {**hw.to_dict(),
                                    "versus": hw.versus(r["run_id"], r["throughput"])}
        return out

    def run(self, run_id: str) -> dict[str, Any]:
        """One run's summary (as a row of ``tlog runs --json``, filled from its
        diagnosis as ``tlog runs`` fills it) and its ``high_water_mark``
        (:meth:`high_water_marks`). A run without iterations has the empty
        figures ``tlog runs`` shows for it.

        Raises:
            RunNotFoundError: no such run.
        """
        from tlog.analyze.history import fill_from_diagnosis, run_rows
        from tlog.ingest.errors import RunNotFoundError

        with self.gate.reader() as cur:
            rows = [r for r in run_rows(cur) if r.run_id == run_id]
        if not rows:
            raise RunNotFoundError(f"no run {run_id!r} in the database")
        row = rows[0]
        try:
            d, _ = self._diagnosis(run_id)
        except RunNotFoundError:
            row.verdict = "no iterations"
        else:
            fill_from_diagnosis(row, d)
        out = row.to_dict()
        out["high_water_mark"] = self.high_water_marks([out]).get(run_id)
        return out

    # --- one run's diagnosis and charts ---------------------------------------------

    def _key(self, run_id: str) -> str:
        from tlog.ingest.errors import RunNotFoundError

        key = self._keys.get(run_id)
        if key is None:
            raise RunNotFoundError(f"no run {run_id!r} with iterations in the database: the "
                                   f"runs page lists them")
        return key

    def diagnosis(self, run_id: str) -> tuple[dict[str, Any], str]:
        """``tlog diagnose --run RUN --json`` and the digest of the data it read
        (:func:`tlog.analyze.persist.data_keys`: it changes whenever the run
        grows). The diagnosis of unchanged data is kept in memory.

        Raises:
            RunNotFoundError: no such run, or it holds no iterations.
        """
        d, key = self._diagnosis(run_id)
        return self._answers.get("diagnosis:" + run_id, key, d.to_dict), key

    def _diagnosis(self, run_id: str) -> tuple[Any, str]:
        from tlog.analyze.verdict import diagnose

        key = self._key(run_id)

        def compute() -> Any:
            with self.gate.reader() as cur:
                return diagnose(cur, run_id)

        return self._diagnoses.get(run_id, key, compute), key

    def live(self, run_id: str, window_s: float | None = None) -> tuple[dict[str, Any], str]:
        """``tlog watch``'s view of the run's latest ``window_s`` seconds
        (default :data:`tlog.analyze.live.DEFAULT_WINDOW_S`) as JSON
        (:meth:`tlog.analyze.live.LiveView.to_dict`: the window's verdict and
        stragglers: a straggler that began a minute ago is named here while
        the whole run's diagnosis still averages it away) and the data
        digest. Kept in memory per digest and window.

        Raises:
            RunNotFoundError: no such run, or it holds no iterations.
            UsageError: ``window_s`` not a positive number.
        """
        from tlog.analyze.live import DEFAULT_WINDOW_S, live_view
        from tlog.ingest.errors import UsageError

        window = DEFAULT_WINDOW_S if window_s is None else window_s
        if not (isinstance(window, int | float) and math.isfinite(window) and window > 0):
            raise UsageError(f"window must be a positive number of seconds, got {window_s!r}")
        key = self._key(run_id)

        def compute() -> dict[str, Any]:
            with self.gate.reader() as cur:
                return live_view(cur, run_id, window_s=window).to_dict()

        return self._answers.get(f"live:{window!r}:{run_id}", key, compute), key

    def charts(self, run_id: str) -> tuple[list[dict[str, Any]], str]:
        """The run report's charts (``[{key, title, caption, spec}]``, Vega-Lite
        specs, :func:`tlog.reports.run_report.run_charts`) and the data digest.

        Raises:
            RunNotFoundError: no such run, or it holds no iterations.
        """
        from tlog.reports.charts import spec
        from tlog.reports.data import load_report_data
        from tlog.reports.run_report import run_charts

        d, key = self._diagnosis(run_id)

        def compute() -> list[dict[str, Any]]:
            with self.gate.reader() as cur:
                data = load_report_data(cur, run_id, diagnosis=d)
            return [{"key": c.key, "title": c.title, "caption": c.caption,
                     "spec": spec(c.chart)} for c in run_charts(data)]

        return self._answers.get("charts:" + run_id, key, compute), key

    # --- compare and SQL ---------------------------------------------------------------

    def compare(self, baseline: str | None, candidate: str, *,
                match: list[str] | None = None) -> dict[str, Any]:
        """``tlog compare [BASELINE] CANDIDATE --json``: with ``baseline`` None,
        against the candidate's default baseline (the best earlier run of its
        configuration).

        Raises:
            RunNotFoundError, NoBaselineError, UsageError: as ``tlog compare``.
        """
        from tlog.analyze.compare import compare, compare_to_best

        with self.gate.reader() as cur:
            if baseline is None:
                return compare_to_best(cur, candidate, match=match).to_dict()
            return compare(cur, baseline, candidate).to_dict()

    def sql(self, statement: str) -> list[dict[str, Any]]:
        """``tlog sql STATEMENT --format json``: one read-only statement's rows,
        the first :data:`SQL_MAX_ROWS` of them (:meth:`sql_rows` says whether
        there were more)."""
        return self.sql_rows(statement)[0]

    def sql_rows(self, statement: str) -> tuple[list[dict[str, Any]], bool]:
        """One read-only statement's first :data:`SQL_MAX_ROWS` rows (as
        ``tlog sql --format json``) and whether it had more.

        The same guards as ``tlog sql`` (:func:`tlog.queries.run_sql`: only
        statements that read; no file access, the connection has none), and
        the statement runs in a transaction that is rolled back. It is
        interrupted after :data:`SQL_TIMEOUT_S` seconds.

        Raises:
            WriteRefusedError: the statement would write. QueryError: DuckDB
            rejects it, or it ran longer than :data:`SQL_TIMEOUT_S`.
        """
        from tlog.analyze.persist import ensure_attribution
        from tlog.ingest.errors import QueryError
        from tlog.queries import check_read_only, run_sql
        from tlog.render import frame_rows

        check_read_only(statement)      # refused before the database is touched
        with self.gate.reader() as cur:
            ensure_attribution(cur)      # kept in memory, so the query reads them fresh
            timer = threading.Timer(SQL_TIMEOUT_S, cur.interrupt)
            timer.start()
            try:
                frame = run_sql(statement, con=cur, max_rows=SQL_MAX_ROWS + 1)
            except QueryError as exc:
                if "Interrupted" in str(exc) and not timer.is_alive():
                    raise QueryError(f"the statement ran longer than {SQL_TIMEOUT_S:g} s and "
                                     f"was stopped; narrow it (WHERE run_id = ..., LIMIT), or "
                                     f"run it with tlog sql") from exc
                raise
            finally:
                timer.cancel()
        rows = frame_rows(frame)
        return rows[:SQL_MAX_ROWS], len(rows) > SQL_MAX_ROWS


class ServedDatabase(Database):
    """The facade inside the service: each call reads one snapshot of the
    service's connection (:meth:`Gate.reader`) or writes under its write lock;
    never forwarded (it is the service)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__(gate.path)
        self.gate = gate

    def _service(self) -> None:
        return None

    @contextmanager
    def _reader(self, *, sealed: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.gate.reader() as cur:       # sealed already: no external access
            yield cur

    @contextmanager
    def _writing(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.gate.use(write=True) as cur:
            yield cur


#: The :class:`tlog.api.Database` calls another process may make in the
#: service: those that go to a live service (decorated ``_served``).
FACADE_CALLS = frozenset(name for name, fn in vars(Database).items()
                         if not name.startswith("_")
                         and getattr(fn, "__wrapped__", None) is not None)

#: The service's own calls (:meth:`Service.call`).
_SERVICE_CALLS = frozenset({"ingest_round", "ingest_finish", "ingest_runs", "export_tables",
                            "publish"})


@dataclass
class ServeConfig:
    """How ``tlog serve`` was started (for the pages and the announcement)."""

    db: Path
    watch: list[Path] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    write_token: str | None = None
    spool: Path | None = None
    lake: Path | None = None
    interval_s: float = SERVE_INTERVAL_S
    poll_s: float = 1.0
    started: float = field(default_factory=time.time)
