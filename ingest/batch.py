"""Load one parsed batch (stages C-E) inside the caller's transaction.

The batch was parsed and checked by the SQL of :mod:`tlog.ingest.parse_sql`
(``_tlog_p``: a temp table, or after the template pass alone a temp view
over :data:`~tlog.ingest.parse_sql.FAST_TABLE`; temp table ``_tlog_b``). Python only works on the few
*distinct* things of a batch: templates, phase layouts, ``meta`` lines, files.

C. **Layouts**: each template, and each distinct ``(phase names, gpu names,
   kinds)`` of the other loadable lines, gets a layout id (names in record
   order, then gpu-only names, and the category of each: record ``kinds`` >
   manifest ``phase_kinds`` > :func:`dflash_runtime.format.categorize`).
D. **Meta defaults**: ``meta`` lines cut each file into segments; a record's
   ``rank``/``stage``/``worker`` default to its segment's (else rank 0, stage
   ``main``, worker ``<stage>-<rank>``); a record giving its own ``rank`` or
   ``stage`` but no ``worker`` is worker ``<stage>-<rank>``, not the segment's.
E. **Load**: iterations (phase times as lists in layout order), duplicates by
   ``(run, rank, stage, worker, iter)`` kept once (the first by file, line;
   then against what the database holds), queue samples, events, workers,
   rejects.

Tests run every case three ways (templates, every line through stage B, tiny
batches) and expect the same rows: ``tests/ingest/test_reader_cases.py``.
"""

from __future__ import annotations

import json
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
from tlog.ingest.parse_sql import (
    EMPTY_B_SQL,
    EXACT_DISABLED_OPTIMIZERS,
    EXACT_SQL,
    FAST_TABLE,
    MACROS_SQL,
    MAX_DEPTH,
    RAW_KEEP,
    fast_only_sql,
    fast_positions,
    nesting_depth,
    screen_sql,
    sql_str,
    struct_at,
)
from tlog.ingest.sources import LinesStream
from tlog.ingest.templates import Template

from dflash_runtime.format import (
    CUDA_FIELDS,
    GPU_FIELDS,
    GPU_INT_FIELDS,
    MACHINE_FIELDS,
    PHASE_CATEGORIES,
    categorize,
)


@dataclass
class BatchFile:
    """A file of the batch: ``fid`` is its index in the lines table."""

    fid: int
    rel: str
    meta: dict[str, Any]           # meta defaults carried in (from earlier lines)
    meta_out: dict[str, Any] = field(default_factory=dict)  # after this batch


@dataclass
class BatchResult:
    """What one batch loaded (counts of records by kind, rejects, duplicates)."""

    loaded: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)   # by code
    duplicates: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)   # first few {file, line, reason}
    warnings: list[str] = field(default_factory=list)
    min_ts: float | None = None
    ranks: set[int] = field(default_factory=set)


class LayoutBook:
    """The phase layouts of one run: ``(names, given kinds, categories) -> layout id``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, *,
                 new_run: bool = False) -> None:
        self.run_id = run_id
        rows = [] if new_run else con.execute(
            "SELECT layout, list(phase ORDER BY seq), list(given ORDER BY seq), "
            "list(category ORDER BY seq) FROM phase_layouts WHERE run_id = ? GROUP BY layout",
            [run_id]).fetchall()
        self.ids: dict[tuple[tuple[str, ...], tuple[str | None, ...], tuple[str, ...]], int] = {
            (tuple(names), tuple(given), tuple(cats)): int(layout)
            for layout, names, given, cats in rows}
        self.next_id = max(self.ids.values(), default=-1) + 1
        self.pending: list[tuple[int, tuple[str, ...], tuple[str | None, ...],
                                 tuple[str, ...]]] = []

    def get(self, names: tuple[str, ...], given: tuple[str | None, ...],
            cats: tuple[str, ...]) -> int:
        """Layout id of ``(names, given, cats)`` (``given``: the category each
        name's record ``kinds`` gave, or None); a new one is stored by :meth:`flush`."""
        key = (names, given, cats)
        found = self.ids.get(key)
        if found is not None:
            return found
        layout = self.next_id
        self.next_id += 1
        self.pending.append((layout, names, given, cats))
        self.ids[key] = layout
        return layout

    def flush(self, con: duckdb.DuckDBPyConnection) -> None:
        """Insert the new layouts into ``phase_layouts`` in one statement
        (``executemany`` costs about 0.5 ms a row: 1,000 new layouts of 256
        phases took 140 s)."""
        if not self.pending:
            return
        rows = [(layout, seq, name, name.rsplit("/", 1)[0] if "/" in name else None, cat, g)
                for layout, names, given, cats in self.pending
                for seq, (name, g, cat) in enumerate(zip(names, given, cats, strict=True))]
        cols = list(zip(*rows, strict=True))
        table = pa.table({"layout": pa.array(cols[0], pa.int32()),
                          "seq": pa.array(cols[1], pa.int32()),
                          "phase": pa.array(cols[2], pa.string()),
                          "parent": pa.array(cols[3], pa.string()),
                          "category": pa.array(cols[4], pa.string()),
                          "given": pa.array(cols[5], pa.string())})
        con.register("_tlog_new_layouts", table)
        try:
            con.execute("INSERT INTO phase_layouts (run_id, layout, seq, phase, parent, category, "
                        "given) SELECT $run, layout, seq, phase, parent, category, given "
                        "FROM _tlog_new_layouts", {"run": self.run_id})
        finally:
            con.unregister("_tlog_new_layouts")
        self.pending = []

    def forget(self) -> None:
        """Drop the cache (after a rolled-back transaction)."""
        self.ids.clear()
        self.next_id = 0
        self.pending = []


#: Errors listed per ingest in the report (all rejects are in the ``rejects`` table).
MAX_ERRORS = 100
#: Above this many distinct phase names or layouts per batch, phase values are
#: read through a DuckDB MAP instead of one STRUCT (slower, any size).
MAX_STRUCT_NAMES = 256
MAX_STRUCT_COMBOS = 64


def _temp_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """``CREATE OR REPLACE TEMP TABLE name`` holding the Arrow ``table``: one
    statement (``executemany`` costs milliseconds a row; a batch of 10,000
    small files has 10,000 files and meta segments)."""
    view = f"{name}_arrow"
    con.register(view, table)
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {view}")
    finally:
        con.unregister(view)


#: Connections whose temp macros (:data:`MACROS_SQL`) exist: they live as long
#: as the connection, so a process that ingests again and again (``--follow``)
#: creates them once.
_MACROS_MADE: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()


def ensure_macros(con: duckdb.DuckDBPyConnection, *, again: bool = False) -> None:
    """Create the parse SQL's temp macros on ``con`` unless this process already
    did (``again``: create them anyway, e.g. after the caller's transaction
    that created them was rolled back)."""
    if again or con not in _MACROS_MADE:
        con.execute(MACROS_SQL)
        _MACROS_MADE.add(con)


#: What :meth:`BatchLoader.parse` counts in one statement: flagged lines, lines
#: of each record kind (valid or not), and iter lines no template took.
_COUNTED = ("flagged", "meta", "iter", "queue", "event", "sys", "iter_general", "general")
_COUNTS_SQL = ("SELECT count(*) FILTER (WHERE flag), count(*) FILTER (WHERE kind = 'meta'), "
               "count(*) FILTER (WHERE kind = 'iter'), count(*) FILTER (WHERE kind = 'queue'), "
               "count(*) FILTER (WHERE kind = 'event'), count(*) FILTER (WHERE kind = 'sys'), "
               "count(*) FILTER (WHERE kind = 'iter' AND tpl IS NULL), "
               "count(*) FILTER (WHERE tpl IS NULL) FROM _tlog_p")
#: The meta segment's figures bound as lists by ``fid`` when a batch is
#: :attr:`BatchLoader._joinless` (name, position in a segment tuple).
_SEG_LISTS = (("rank", 3), ("stage", 4), ("worker", 5), ("host", 6), ("pid", 7),
              ("world_size", 8), ("clock_wall", 9), ("clock_mono", 10))
#: Rows per Arrow record batch of the lines table handed to DuckDB. DuckDB
#: scans an Arrow table one record batch per task, and the lines table comes
#: as one batch, so stage A ran on one core. Measured (225,000 lines, DuckDB's
#: 2 threads): the template pass 210 -> 149 ms, its LIKE test 74 -> 39 ms, the
#: typed parse 111 -> 57 ms. tlog's choice of size (well above DuckDB's
#: 2,048-row vectors, small enough to give every thread work).
SCAN_CHUNK_ROWS = 16_384
#: The lines of the batch that passed no template in the template pass: the
#: full stage A parses only these (each line is parsed on its own).
_REST_LINES = ("(SELECT l.* FROM _tlog_lines l SEMI JOIN (SELECT fid, line FROM _tlog_p "
               "WHERE tpl IS NULL) r ON l.fid = r.fid AND l.line = r.line)")


#: How DuckDB (2.0.1) begins its error when Python code that it ran for the
#: lines stream raised: reading the stream, or counting its rows while planning.
_STREAM_FAILED = "registered as '_tlog_lines' failed: "


def _wraps_interrupt(exc: duckdb.Error) -> bool:
    """Whether ``exc`` is DuckDB's wrapping of a ``KeyboardInterrupt`` raised in
    Python code a statement ran for the lines stream (a
    :class:`~tlog.ingest.sources.LinesStream`'s generator, or the count of its
    rows while planning): after :data:`_STREAM_FAILED` comes
    ``KeyboardInterrupt: `` or a Python traceback whose last line is
    ``KeyboardInterrupt`` (DuckDB 2.0.1; both seen). DuckDB runs that code on
    the statement's own thread too, where Python raises a Ctrl-C: taken as an
    ordinary failure, the template pass fell back to the full one and the
    ingest (and ``--follow``) went on (measured: 3 of 1,000 Ctrl-Cs at random
    times of a small ingest with a catch inside the generator only, which this
    check makes needless). ``test_a_ctrl_c_while_duckdb_waits_for_lines_ends_the_ingest``
    raises one inside the generator for real, so a DuckDB that words it
    otherwise fails that test."""
    text = str(exc)
    at = text.find(_STREAM_FAILED)
    if at < 0:
        return False
    rest = text[at + len(_STREAM_FAILED):].rstrip()
    return rest.startswith("KeyboardInterrupt") or rest.endswith("\nKeyboardInterrupt")


class BatchLoader:
    """Loads batches of one run (one instance per ingest of a run).

    Stage A runs in two passes: the lines that pass a template through a short
    statement (:func:`~tlog.ingest.parse_sql.fast_only_sql`), then, only when
    some passed none, the full statement over just those. DuckDB parses, binds
    and plans every statement at every execution, and the full one's size made
    that the largest fixed cost of a small batch. Statements that would read
    nothing are not run (:attr:`counts`): a batch of a few template lines (a
    ``--follow`` poll) runs about half the statements of one that has every
    kind of line and rejects."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str,
                 phase_kinds: dict[str, str], *, check_all: bool = False,
                 new_run: bool = False) -> None:
        self.con = con
        self.run_id = run_id
        self.phase_kinds = phase_kinds
        # new_run: the database holds nothing of the run (no layouts, no
        # iterations), so neither is looked up before this loader stores some
        self.layouts = LayoutBook(con, run_id, new_run=new_run)
        self.check_all = check_all   # tests: send every line through stage B
        self.errors_left = MAX_ERRORS
        self.ranged_segments = False
        #: Lines of each kind in the batch being loaded (:meth:`parse`): a
        #: statement with nothing to read is not run (each costs 1-5 ms of
        #: parsing, binding and planning, whatever its rows).
        self.counts: dict[str, int] = {}
        #: Lists bound as parameters (:meth:`_run`, :meth:`_joinless`), per batch.
        self._lists: dict[str, list[Any]] = {}
        #: Whether ``_tlog_p`` is the template pass's view (else a table).
        self.parsed_view = False
        #: Whether the run holds iterations already (then duplicates are looked up).
        self.run_has_iterations = False
        self._new_run = new_run
        #: Whether a batch of this loader stored workers (before it, a new run has none).
        self._workers_stored = False

    # -- the batch ---------------------------------------------------------------------------
    def parse(self, lines: LinesStream, templates: list[Template]) -> list[Template]:
        """Stages A and B into temp tables (no transaction needed: nothing
        persistent changes, so a failed attempt can be retried). Returns the
        templates in use. The template pass reads ``lines`` as its record
        batches are made; the whole table serves every later pass."""
        con = self.con
        if self.check_all:
            templates = []
        try:
            self.parsed_view = False   # the last batch's view went in its load()
            general = None             # no template: the full pass reads every line
            if templates:
                con.register("_tlog_lines", lines.reader())
                general = self._template_pass(templates)
                con.unregister("_tlog_lines")
            con.register("_tlog_lines", lines.result()[0])
            if general is None:
                if templates and not self.check_all:   # it failed: it may have left some
                    self._drop_parsed()
                self._full_pass(templates, "_tlog_lines", "_tlog_p")
            elif general:
                self._full_pass(templates, _REST_LINES, "_tlog_p_rest")
                # the view of the template pass becomes a table (same rows, order)
                con.execute(f"CREATE OR REPLACE TEMP TABLE _tlog_p_all AS SELECT * FROM _tlog_p; "
                            f"DROP VIEW _tlog_p; DROP TABLE {FAST_TABLE}; "
                            f"ALTER TABLE _tlog_p_all RENAME TO _tlog_p")
                self.parsed_view = False
                con.execute("DELETE FROM _tlog_p WHERE tpl IS NULL; "
                            "INSERT INTO _tlog_p BY NAME SELECT * FROM _tlog_p_rest; "
                            "DROP TABLE _tlog_p_rest")
            if general != 0:
                row = con.execute(_COUNTS_SQL).fetchall()[0]
                self.counts = dict(zip(_COUNTED, (int(n or 0) for n in row), strict=True))
            if self.counts["flagged"]:
                ensure_macros(con)
                con.execute(f"SET disabled_optimizers = '{EXACT_DISABLED_OPTIMIZERS}'")
                try:
                    con.execute(EXACT_SQL)
                finally:
                    con.execute("RESET disabled_optimizers")
                self._too_deep()
            else:
                con.execute(EMPTY_B_SQL)
        finally:
            con.unregister("_tlog_lines")
        return templates

    def _template_pass(self, templates: list[Template]) -> int | None:
        """Stage A of the lines that pass a template
        (:func:`~tlog.ingest.parse_sql.fast_only_sql`) -> ``_tlog_p``; returns
        how many lines passed none (their rows are placeholders: ``tpl`` NULL),
        or None when it did not run (no templates, ``check_all``) or failed (a
        line that passed a LIKE is not JSON after all): then the full stage A
        runs over every line. When it returns 0, :attr:`counts` is final."""
        if not templates or self.check_all:
            return None
        try:
            self.con.execute(fast_only_sql(templates))
        except duckdb.Error as exc:
            if _wraps_interrupt(exc):
                raise KeyboardInterrupt from None
            return None
        self.parsed_view = True
        row = self.con.execute(_COUNTS_SQL).fetchall()[0]
        self.counts = dict(zip(_COUNTED, (int(n or 0) for n in row), strict=True))
        return self.counts["general"]

    def _full_pass(self, templates: list[Template], source: str, target: str) -> None:
        """The full stage A (:func:`~tlog.ingest.parse_sql.screen_sql`) over
        ``source`` -> ``target``: templates, general parse and screens."""
        con = self.con
        # made here, not per batch: a batch of template lines alone (a small run,
        # a --follow poll) never runs the statements that use them
        ensure_macros(con)
        try:
            con.execute(screen_sql(templates, check_all=self.check_all, source=source,
                                   target=target))
        except duckdb.CatalogException:
            # the macros went with a rolled-back transaction of the caller's, or
            # an earlier ingest that failed left the template pass's view
            ensure_macros(con, again=True)
            if target == "_tlog_p":
                self._drop_parsed()
            con.execute(screen_sql(templates, check_all=self.check_all, source=source,
                                   target=target))
        except duckdb.Error:
            if not templates:
                raise
            con.execute(screen_sql(templates, check_all=self.check_all, safe=True,
                                   source=source, target=target))

    def _drop_parsed(self) -> None:
        """Drop ``_tlog_p`` (a view over :data:`FAST_TABLE` after a template
        pass, else a table) and :data:`FAST_TABLE` left by a failed pass or by
        an earlier batch that did not reach :meth:`load` (outside a
        transaction: a failed DROP of the wrong kind would abort one). Only on
        those paths: each statement costs a --follow poll about a millisecond."""
        for kind in ("VIEW", "TABLE"):
            try:
                self.con.execute(f"DROP {kind} IF EXISTS _tlog_p")
            except duckdb.CatalogException:
                pass
        self.con.execute(f"DROP TABLE IF EXISTS {FAST_TABLE}")
        self.parsed_view = False

    def _too_deep(self) -> None:
        """Reject the flagged lines nested more than :data:`MAX_DEPTH` deep
        (``too_large``): only lines with more than that many ``[``/``{`` are
        measured, in Python, outside strings."""
        con = self.con
        rows = con.execute(f"""
            SELECT fid, line, raw FROM _tlog_p WHERE flag AND strlen(raw) - strlen(
                replace(replace(raw, '[', ''), '{{', '')) > {MAX_DEPTH}""").fetchall()
        deep = [(fid, line, depth) for fid, line, raw in rows
                if (depth := nesting_depth(raw)) > MAX_DEPTH]
        if not deep:
            return
        cols = list(zip(*deep, strict=True))
        con.register("_tlog_deep", pa.table({"fid": pa.array(cols[0], pa.int32()),
                                             "line": pa.array(cols[1], pa.int64()),
                                             "depth": pa.array(cols[2], pa.int64())}))
        try:
            con.execute(f"""
                UPDATE _tlog_b SET code = 'too_large', extra = NULL,
                    reason = 'nested ' || format('{{:,}}', d.depth) || ' levels deep (limit '
                             || {MAX_DEPTH} || ')',
                    raw = left(rtrim(p.raw, chr(13) || chr(10)), {RAW_KEEP})
                FROM _tlog_deep d, _tlog_p p
                WHERE _tlog_b.fid = d.fid AND _tlog_b.line = d.line
                  AND p.fid = d.fid AND p.line = d.line""")
        finally:
            con.unregister("_tlog_deep")

    def load(self, files: list[BatchFile], bad_lines: list,
             templates: list[Template]) -> BatchResult:
        """Load one parsed batch (:meth:`parse`) inside the caller's transaction."""
        con = self.con
        res = BatchResult()
        by_fid = {f.fid: f for f in files}
        try:
            self._files_table(files)
            self._rejects(res, by_fid, bad_lines)
            self._meta(res, files)
            parts = self._layouts(res, templates)
            self._iterations(res, parts)
            self._queues_events(res)
            self._sys(res)
            self._workers()
        finally:
            try:
                con.execute(f"DROP {'VIEW' if self.parsed_view else 'TABLE'} IF EXISTS _tlog_p; "
                            f"DROP TABLE IF EXISTS {FAST_TABLE}; DROP TABLE IF EXISTS _tlog_b; "
                            "DROP TABLE IF EXISTS _tlog_skip; DROP TABLE IF EXISTS _tlog_seg_t; "
                            "DROP TABLE IF EXISTS _tlog_combo_t; DROP TABLE IF EXISTS _tlog_files_t")
            except duckdb.Error:
                pass  # an aborted transaction: the caller rolls back
        return res

    def _run(self, sql: str) -> duckdb.DuckDBPyConnection:
        """Execute ``sql`` with ``$run`` and the lists of :meth:`_joinless`
        (``$paths``, ``$seg_rank``, ...) bound where it uses them."""
        params = {name: value for name, value in (("run", self.run_id), *self._lists.items())
                  if f"${name}" in sql}
        return self.con.execute(sql, params or None)

    def _files_table(self, files: list[BatchFile]) -> None:
        """The batch's file paths: the list ``$paths`` (by ``fid``), and the
        temp table ``_tlog_files_t`` where a statement joins it: for the
        rejects of flagged lines, or once :meth:`_meta` finds the batch not
        :attr:`_joinless` (each temp table costs a small batch about a ms)."""
        paths: list[str | None] = [None] * (max((f.fid for f in files), default=-1) + 1)
        for f in files:
            paths[f.fid] = f.rel
        self._lists = {"paths": paths}
        self._files = files
        self._files_made = False
        if self.counts.get("flagged", 1):
            self._make_files_table()

    def _make_files_table(self) -> None:
        if not self._files_made:
            _temp_table(self.con, "_tlog_files_t", pa.table({
                "fid": pa.array([f.fid for f in self._files], pa.int32()),
                "path": pa.array([f.rel for f in self._files], pa.string())}))
            self._files_made = True

    def _note(self, res: BatchResult, rows: list[tuple[str, int, str]]) -> None:
        for file, line, reason in rows[:self.errors_left]:
            res.errors.append({"file": file, "line": int(line), "reason": reason})
        self.errors_left = max(0, self.errors_left - len(rows))

    def _rejects(self, res: BatchResult, by_fid: dict[int, BatchFile], bad_lines: list) -> None:
        con = self.con
        if self.counts.get("flagged", 1):   # only a flagged line gets a reason code
            self._rejected_in_sql(res)
        if bad_lines:
            bad_lines = sorted(bad_lines, key=lambda b: (b.fid, b.line))
            rows = [(by_fid[b.fid].rel, b.line, b.reason) for b in bad_lines]
            con.executemany("INSERT INTO rejects (run_id, file, line, reason, raw, code) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            [(self.run_id, f, ln, r, b.raw[:RAW_KEEP], b.code)
                             for (f, ln, r), b in zip(rows, bad_lines, strict=True)])
            res.rejected.update(Counter(b.code for b in bad_lines))
            self._note(res, rows)

    def _rejected_in_sql(self, res: BatchResult) -> None:
        """Store the lines stage B rejected (``_tlog_b.code``) in ``rejects``."""
        con = self.con
        con.execute("""
            INSERT INTO rejects (run_id, file, line, reason, raw, code)
            SELECT $run, f.path, b.line, b.reason, b.raw, b.code
            FROM _tlog_b b JOIN _tlog_files_t f USING (fid)
            WHERE b.code IS NOT NULL""", {"run": self.run_id})
        for code, n in con.execute("SELECT code, count(*) FROM _tlog_b WHERE code IS NOT NULL "
                                   "GROUP BY code").fetchall():
            res.rejected[code] += n
        if self.errors_left:
            self._note(res, con.execute(
                "SELECT f.path, b.line, b.reason FROM _tlog_b b JOIN _tlog_files_t f USING (fid) "
                "WHERE b.code IS NOT NULL ORDER BY b.fid, b.line LIMIT ?",
                [self.errors_left]).fetchall())

    # -- meta defaults -----------------------------------------------------------------------
    def _meta(self, res: BatchResult, files: list[BatchFile]) -> None:
        """Cut each file into segments of constant meta defaults -> ``_tlog_seg_t``
        (or, one segment per file, lists by ``fid``: :attr:`_joinless`)."""
        con = self.con
        # nothing flagged: _tlog_b is empty, so no join (a small batch's planning)
        flagged = self.counts.get("flagged", 1)
        rows = [] if not self.counts.get("meta", 1) else con.execute(f"""
            SELECT p.fid, p.line, p.rank, p.stage, p.worker, p.host, p.pid, p.world_size,
                   p.clock::VARCHAR, {'b.extra::VARCHAR' if flagged else 'NULL'},
                   p.machine::VARCHAR
            FROM _tlog_p p {'LEFT JOIN _tlog_b b USING (fid, line)' if flagged else ''}
            WHERE p.kind = 'meta' {'AND (NOT p.flag OR (b.code IS NULL AND NOT b.blank))'
                                   if flagged else ''}
            ORDER BY p.fid, p.line""").fetchall()
        res.loaded["meta"] += len(rows)
        by_fid: dict[int, list[tuple]] = {}
        for row in rows:
            by_fid.setdefault(row[0], []).append(row)
        segs: list[tuple] = []
        machines: list[tuple] = []
        for f in files:
            meta = dict(f.meta)
            lo = 0
            for (_, line, rank, stage, worker, host, pid, world, clock, extra,
                 machine) in by_fid.get(f.fid, []):
                if line > 1 or lo:
                    segs.append(self._seg(f.fid, lo, line, meta))
                new = {"rank": rank, "stage": stage, "worker": worker, "host": host, "pid": pid,
                       "world_size": world}
                if clock:
                    c = json.loads(clock)
                    new["clock_wall"], new["clock_mono"] = c.get("wall"), c.get("mono")
                meta.update({k: v for k, v in new.items() if v is not None})
                if extra:
                    meta.setdefault("extra", {}).update(json.loads(extra))
                if machine:
                    machines.append(self._machine_row(f, meta, json.loads(machine)))
                lo = line
            segs.append(self._seg(f.fid, lo, 2**62, meta))
            f.meta_out = meta
        self._machines(machines)
        self.ranged_segments = len(segs) > len(files)
        if not self.ranged_segments:   # one segment per file: looked up by fid (_joinless)
            n = max((seg[0] for seg in segs), default=-1) + 1
            for col, at in _SEG_LISTS:
                values: list[Any] = [None] * n
                for seg in segs:
                    values[seg[0]] = seg[at]
                self._lists[f"seg_{col}"] = values
            for col in ("clock_wall", "clock_mono"):   # as the table's DOUBLE column holds them
                self._lists[f"seg_{col}"] = [None if v is None else float(v)
                                             for v in self._lists[f"seg_{col}"]]
            sids: list[int | None] = [None] * n
            for sid, seg in enumerate(segs):
                sids[seg[0]] = sid
            self._lists["seg_sid"] = sids
        if self._joinless:     # every statement reads the lists above: no table
            return
        self._make_files_table()
        cols = list(zip(*segs, strict=True)) or [[] for _ in range(11)]
        types = (pa.int32(), pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.string(),
                 pa.string(), pa.int64(), pa.int64(), pa.float64(), pa.float64())
        names = ("fid", "lo", "hi", "rank", "stage", "worker", "host", "pid", "world_size",
                 "clock_wall", "clock_mono")
        _temp_table(con, "_tlog_seg_t", pa.table(
            [pa.array(range(len(segs)), pa.int32()),
             *(pa.array(c, t) for c, t in zip(cols, types, strict=True))],
            names=["sid", *names]))

    @staticmethod
    def _machine_row(f: BatchFile, meta: dict[str, Any], machine: dict[str, Any]) -> tuple:
        """A ``machines`` row: the worker the meta defaults name (else
        ``<stage>-<rank>``, the format's default) and the keys of ``machine``."""
        stage = meta.get("stage") or "main"
        worker = meta.get("worker") or f"{stage}-{meta.get('rank') or 0}"
        return (worker, *(machine.get(k) for k in MACHINE_FIELDS), f.rel)

    def _machines(self, rows: list[tuple]) -> None:
        """Insert the ``machines`` rows of this batch: one per worker of the run,
        the first described (a later ``machine`` of the same worker is ignored)."""
        if not rows:
            return
        cols = list(zip(*rows, strict=True))
        types = {"ncpu": pa.int32(), "mem_total": pa.int64(), "gpu_count": pa.int32()}
        names = ["worker", *MACHINE_FIELDS, "file"]
        _temp_table(self.con, "_tlog_machines_t", pa.table(
            [pa.array(range(len(rows)), pa.int32()),
             *(pa.array(c, types.get(n, pa.string())) for c, n in zip(cols, names, strict=True))],
            names=["seq", *names]))
        listed = ", ".join(names)
        self.con.execute(f"""
            INSERT INTO machines (run_id, {listed})
            SELECT $run, {listed} FROM (SELECT *, row_number() OVER (
                PARTITION BY worker ORDER BY seq) AS k FROM _tlog_machines_t) m
            WHERE k = 1 AND NOT EXISTS (SELECT 1 FROM machines o WHERE o.run_id = $run
                                        AND o.worker = m.worker)""", {"run": self.run_id})
        self.con.execute("DROP TABLE _tlog_machines_t")

    @staticmethod
    def _seg(fid: int, lo: int, hi: int, meta: dict[str, Any]) -> tuple:
        return (fid, lo, hi, meta.get("rank"), meta.get("stage"), meta.get("worker"),
                meta.get("host"), meta.get("pid"), meta.get("world_size"),
                meta.get("clock_wall"), meta.get("clock_mono"))

    # -- layouts -----------------------------------------------------------------------------
    def _layout(self, res: BatchResult, kp: list[str], kg: list[str],
                kinds: dict[str, Any]) -> dict[str, Any]:
        """Layout of one (phase names, gpu names, kinds): names in record order,
        then gpu-only names; categories by kinds > phase_kinds > the name rules."""
        in_kp = {n: i for i, n in enumerate(kp)}
        in_kg = {n: i for i, n in enumerate(kg)}
        gpu_only = [k for k in kg if k not in in_kp]
        names = tuple(kp + gpu_only)
        cats, givens = [], []
        for name in names:
            given = kinds.get(name)
            if given is not None and given not in PHASE_CATEGORIES:
                warning = (f"kinds: {given!r} for phase {name!r} is not a category (ignored; "
                           f"use one of {', '.join(sorted(PHASE_CATEGORIES))})")
                if warning not in res.warnings:
                    res.warnings.append(warning)
                given = None
            givens.append(given)
            cats.append(given or self.phase_kinds.get(name) or categorize(name))
        layout = self.layouts.get(names, tuple(givens), tuple(cats)) if names else None
        return {"layout": layout,
                "names": names, "kp": kp, "kg": kg,
                "host_pos": [in_kp.get(n) for n in names],
                "gpu_pos": [in_kg.get(n) for n in names]}

    def _layouts(self, res: BatchResult, templates: list[Template]) -> dict[str, Any]:
        """Layouts of the template lines and of every distinct (phase names, gpu
        names, kinds) of the other loadable iter lines -> ``_tlog_combo_t``."""
        con = self.con
        tpl = {i: self._layout(res, list(t.phases), list(t.gpu), dict(t.kinds))
               for i, t in enumerate(templates) if t.kind == "iter"}
        rows = [] if not self.counts.get("iter_general", 1) else con.execute("""
            SELECT DISTINCT p.kp, p.kg, p.kinds::VARCHAR
            FROM _tlog_p p LEFT JOIN _tlog_b b USING (fid, line)
            WHERE p.kind = 'iter' AND p.tpl IS NULL
              AND (NOT p.flag OR (b.code IS NULL AND NOT b.blank))""").fetchall()
        combos = []
        for i, (kp, kg, kinds_text) in enumerate(rows):
            c = self._layout(res, list(kp or []), list(kg or []),
                             json.loads(kinds_text) if kinds_text else {})
            c.update(combo=i, kg=list(kg) if kg else None, kinds=kinds_text)
            combos.append(c)
        if combos:
            table = pa.table({
                "combo": pa.array([c["combo"] for c in combos], pa.int32()),
                "kp": pa.array([c["kp"] for c in combos], pa.list_(pa.string())),
                "kg": pa.array([c["kg"] for c in combos], pa.list_(pa.string())),
                "kinds": pa.array([c["kinds"] for c in combos], pa.string()),
                "layout": pa.array([c["layout"] for c in combos], pa.int32()),
            })
            con.register("_tlog_combo", table)
            try:
                con.execute("CREATE OR REPLACE TEMP TABLE _tlog_combo_t AS "
                            "SELECT * FROM _tlog_combo")
            finally:
                con.unregister("_tlog_combo")
        self.layouts.flush(con)
        return {"templates": tpl, "combos": combos, "positions": fast_positions(templates)}

    @staticmethod
    def _struct_list(struct: str, pos: list[int | None], keys: list[str] | None,
                     index: dict[str, int]) -> str:
        """SQL list of the values of ``struct`` in layout order: ``pos[i]`` is the
        index in ``keys`` of the layout's i-th name (None: not in this record),
        ``index`` the 1-based position of each name in ``struct``."""
        items = ", ".join(struct_at(struct, index[keys[q]]) if q is not None and keys else "NULL"
                          for q in pos)
        return f"[{items}]::DOUBLE[]"

    def _general_values(self, combos: list[dict[str, Any]], col: str, pos_key: str) -> str:
        """SQL for the list of values of ``col`` (``phases`` or ``gpu``) in layout
        order, for lines of the general path (by their combo ``c.combo``)."""
        src = "kp" if col == "phases" else "kg"
        all_names = sorted({n for c in combos for n in (c[src] or [])})
        if not all_names or not any(q is not None for c in combos for q in c[pos_key]):
            return "NULL::DOUBLE[]"
        lowered = {n.lower() for n in all_names}
        if (len(all_names) <= MAX_STRUCT_NAMES and len(combos) <= MAX_STRUCT_COMBOS
                and len(lowered) == len(all_names)):
            struct = json.dumps(dict.fromkeys(all_names, "DOUBLE"))
            index = {n: i + 1 for i, n in enumerate(all_names)}
            cases = [f"WHEN {c['combo']} THEN {self._struct_list('s', c[pos_key], c[src], index)}"
                     for c in combos if any(q is not None for q in c[pos_key])]
            return (f"(SELECT CASE c.combo {' '.join(cases)} END "
                    f"FROM (SELECT json_transform(p.{col}, {sql_str(struct)}) AS s))")
        # any number of names: a MAP, looked up by the layout's names
        return (f"(SELECT CASE WHEN m IS NULL THEN NULL ELSE list_transform(l.names, "
                f"lambda n: m[n]) END FROM (SELECT json_transform(p.{col}, "
                f"'\"MAP(VARCHAR, DOUBLE)\"') AS m))")

    # -- iterations --------------------------------------------------------------------------
    @property
    def _joinless(self) -> bool:
        """Whether a line's meta segment and file are known from its ``fid``
        alone and no line was flagged: then the statements below read them
        from lists bound as parameters instead of joining ``_tlog_seg_t``,
        ``_tlog_files_t`` and ``_tlog_b``. Why: DuckDB inserts on one thread
        when the statement has a join (its batch insert needs every source
        to keep the order; measured, 225,000 rows into ``iterations``:
        a serial "Insert" against a parallel "Batch Insert")."""
        return not self.ranged_segments and not self.counts.get("flagged", 1)

    def _s(self, col: str) -> str:
        """SQL of the meta segment's ``col`` (rank, stage, worker, sid) of line ``p``."""
        if not self._joinless:
            return f"s.{col}"
        sql_type = "VARCHAR" if col in ("stage", "worker") else "BIGINT"
        return f"list_extract($seg_{col}::{sql_type}[], p.fid + 1)"

    def _path(self) -> str:
        """SQL of the file path of line ``p`` (with ``files=True`` in :meth:`_effective`)."""
        return "list_extract($paths::VARCHAR[], p.fid + 1)" if self._joinless else "f.path"

    def _extra(self) -> str:
        """SQL of the unknown fields of line ``p`` (stage B's, of a flagged line)."""
        return "NULL::JSON" if self._joinless else "b.extra"

    def _effective(self, kind: str | tuple[str, ...], joins: str = "", *,
                   files: bool = False) -> str:
        """FROM clause of the loadable lines of ``kind`` (one or several) with
        their meta segment (``files``: and their file ``f``); see :meth:`_joinless`."""
        kinds = (kind,) if isinstance(kind, str) else kind
        which = "p.kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"
        if self._joinless:
            return f"""
            FROM _tlog_p p
            {joins}
            WHERE {which}"""
        seg = ("s.fid = p.fid AND p.line >= s.lo AND p.line < s.hi" if self.ranged_segments
               else "s.fid = p.fid")
        file_join = "JOIN _tlog_files_t f ON f.fid = p.fid" if files else ""
        return f"""
            FROM _tlog_p p
            LEFT JOIN _tlog_b b ON b.fid = p.fid AND b.line = p.line
            LEFT JOIN _tlog_seg_t s ON {seg}
            {joins} {file_join}
            WHERE {which} AND (NOT p.flag OR (b.code IS NULL AND NOT b.blank))"""

    @property
    def _keys(self) -> str:
        """``rank``, ``stage``, ``worker`` of line ``p``: its own, else its segment's."""
        rank, stage, worker = self._s("rank"), self._s("stage"), self._s("worker")
        return f"""
            coalesce(p.rank, {rank}, 0)::INTEGER AS rank,
            coalesce(p.stage, {stage}, 'main') AS stage,
            coalesce(p.worker,
                     CASE WHEN (p.stage IS NULL OR p.stage = {stage})
                           AND (p.rank IS NULL OR p.rank = {rank}) THEN {worker} END,
                     coalesce(p.stage, {stage}, 'main') || '-'
                         || coalesce(p.rank, {rank}, 0)::VARCHAR) AS worker"""

    def _iterations(self, res: BatchResult, parts: dict[str, Any]) -> None:
        con = self.con
        if not self.counts.get("iter", 1):
            return
        tpl, combos, positions = parts["templates"], parts["combos"], parts["positions"]
        joins = ""
        if combos:
            joins = ("LEFT JOIN _tlog_combo_t c ON p.tpl IS NULL AND c.kp IS NOT DISTINCT FROM p.kp "
                     "AND c.kg IS NOT DISTINCT FROM p.kg "
                     "AND c.kinds IS NOT DISTINCT FROM p.kinds::VARCHAR")
            if (len(combos) > MAX_STRUCT_COMBOS
                    or len({n for c in combos for n in c["names"]}) > MAX_STRUCT_NAMES):
                joins += (" LEFT JOIN (SELECT layout, list(phase ORDER BY seq) AS names "
                          "FROM phase_layouts WHERE run_id = $run GROUP BY layout) l "
                          "ON l.layout = c.layout")
        general = {"layout": "c.layout" if combos else "NULL::INTEGER",
                   "host": self._general_values(combos, "phases", "host_pos") if combos
                   else "NULL::DOUBLE[]",
                   "gpu": self._general_values(combos, "gpu", "gpu_pos") if combos
                   else "NULL::DOUBLE[]"}

        def by_template(what: str) -> str:
            cases = []
            for i, t in tpl.items():
                if what == "layout":
                    value = "NULL" if t["layout"] is None else str(t["layout"])
                elif what == "host":
                    value = self._struct_list("p.fph", t["host_pos"], t["kp"],
                                              positions["phases"])
                else:
                    value = (self._struct_list("p.fgpu", t["gpu_pos"], t["kg"], positions["gpu"])
                             if t["kg"] else "NULL::DOUBLE[]")
                cases.append(f"WHEN {i} THEN {value}")
            if not cases:
                return general[what]
            return (f"CASE WHEN p.tpl IS NOT NULL THEN CASE p.tpl {' '.join(cases)} END "
                    f"ELSE {general[what]} END")

        frm = self._effective("iter", joins)
        # Distinct hashes of the keys: as many as rows proves the batch has no
        # duplicate key (equal keys hash equal); fewer (a duplicate, or rarely
        # a collision) takes the exact row_number() pass below. One BIGINT to
        # count instead of grouping by four columns: about 0.1 s less per
        # 300,000 rows.
        n, n_hashes, min_ts, ranks = self._run(f"""
            SELECT count(*), count(DISTINCT hash(rank, stage, worker, iter)), min(ts),
                   list(DISTINCT rank) FROM (SELECT {self._keys}, p.iter, p.ts {frm})
            """).fetchall()[0]
        if not n:
            return
        keyed = f"SELECT p.fid, p.line, {self._keys}, p.iter {frm}"
        skip_parts = []
        if n > n_hashes:
            skip_parts.append(f"""SELECT fid, line FROM (SELECT fid, line, row_number() OVER (
                PARTITION BY rank, stage, worker, iter ORDER BY fid, line) AS k FROM ({keyed}))
                WHERE k > 1""")
        # once the run holds iterations it keeps some (a rewritten file's are
        # deleted and reloaded; looking up duplicates in vain is only slower)
        self.run_has_iterations = self.run_has_iterations or (not self._new_run and bool(
            con.execute("SELECT count(*) FROM (SELECT 1 FROM iterations WHERE run_id = ? "
                        "LIMIT 1)", [self.run_id]).fetchall()[0][0]))
        if self.run_has_iterations:
            skip_parts.append(f"""SELECT fid, line FROM ({keyed}) e WHERE EXISTS (
                SELECT 1 FROM iterations i WHERE i.run_id = $run AND i.rank = e.rank
                AND i.stage = e.stage AND i.worker = e.worker AND i.iter = e.iter)""")
        skip = ""
        skipped = 0
        if skip_parts:
            self._run("CREATE OR REPLACE TEMP TABLE _tlog_skip AS " + " UNION ".join(skip_parts))
            skipped = int(con.execute("SELECT count(*) FROM _tlog_skip").fetchall()[0][0])
            if skipped:
                res.duplicates += skipped
                skip = ("AND NOT EXISTS (SELECT 1 FROM _tlog_skip k "
                        "WHERE k.fid = p.fid AND k.line = p.line)")
        self._run(f"""
            INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, cpu, tokens, samples,
                mem_allocated, mem_reserved, mem_alloc_retries, mem_device_allocs, file, line,
                extra, layout, phase_host_s, phase_gpu_s)
            SELECT $run, {self._keys}, p.iter, p.ts, p.dur, p.cpu, p.tokens, p.samples,
                p.m.allocated, p.m.reserved, p.m.alloc_retries, p.m.device_allocs, {self._path()},
                p.line, {self._extra()}, {by_template('layout')}, {by_template('host')},
                {by_template('gpu')}
            {self._effective('iter', joins, files=True)} {skip}
            """)
        res.loaded["iter"] += int(n) - skipped
        self.run_has_iterations = True
        res.min_ts = min_ts
        res.ranks.update(int(r) for r in ranks or [])

    def _queues_events(self, res: BatchResult) -> None:
        if self.counts.get("queue", 1):
            self._queues(res)
        if not self.counts.get("event", 1):
            return
        n = self._run(f"""
            INSERT INTO events (run_id, rank, stage, worker, name, ts, dur, file, line, extra)
            SELECT $run, {self._keys}, p.name, p.ts, coalesce(p.dur, 0), {self._path()}, p.line,
                {self._extra()}
            {self._effective('event', files=True)}
            """).fetchall()[0][0]
        res.loaded["event"] += int(n)

    def _queues(self, res: BatchResult) -> None:
        n = self._run(f"""
            INSERT INTO queue_samples (run_id, rank, stage, worker, name, ts, depth, capacity,
                                       file, line, extra)
            SELECT $run, {self._keys}, p.name, p.ts, p.depth, p.capacity, {self._path()}, p.line,
                {self._extra()}
            {self._effective('queue', files=True)}
            """).fetchall()[0][0]
        res.loaded["queue"] += int(n)

    def _sys(self, res: BatchResult) -> None:
        """``sys`` records -> ``sys_samples`` (docs/FORMAT.md ``sys``; every such
        line was checked in stage B, so the casts below cannot fail)."""
        if not self.counts.get("sys", 1):
            return
        cuda = json.dumps(dict.fromkeys(CUDA_FIELDS, "BIGINT"))
        gpu = json.dumps({k: "BIGINT" if k in GPU_INT_FIELDS else "DOUBLE" for k in GPU_FIELDS})
        n = self._run(f"""
            INSERT INTO sys_samples (run_id, worker, ts, iter, cpu_s, rss_bytes, ncpu, load1,
                threads, running, cpu_wait_s, cuda_allocated, cuda_reserved, cuda_retries, cuda_limit,
                gpu_util, gpu_mem_used, gpu_mem_total, gpu_temp_c, gpu_sm_clock_mhz,
                gpu_sm_clock_max_mhz, gpu_power_w, gpu_throttle, file, line, extra)
            SELECT $run, worker, ts, iter, cpu, rss, ncpu, load1, threads, running, cpu_wait,
                c.allocated, c.reserved, c.retries, c."limit", g.util, g.mem_used, g.mem_total,
                g.temp, g.sm_clock, g.sm_clock_max, g.power, g.throttle, file, line, extra
            FROM (SELECT {self._keys}, p.ts, p.iter, p.cpu, p.rss, p.ncpu, p.load1, p.threads,
                         p.running, p.cpu_wait, json_transform(p.cuda, {sql_str(cuda)}) AS c,
                         json_transform(p.gpu, {sql_str(gpu)}) AS g, {self._path()} AS file,
                         p.line, {self._extra()} AS extra
                  {self._effective('sys', files=True)})
            """).fetchall()[0][0]
        if n:   # the key only when some were: the report's counts stay as they were
            res.loaded["sys"] += int(n)

    def _workers(self) -> None:
        """One ``workers`` row per new (rank, stage, worker) of the run (one scan
        of the batch; the first record by (file, line) gives the meta segment)."""
        if not any(self.counts.get(k, 1) for k in ("iter", "queue", "event")):
            return
        keyed = (f"SELECT {self._keys}, {self._s('sid')} AS sid, p.fid, "
                 f"(p.fid::BIGINT << 40) + p.line AS pos "
                 f"{self._effective(('iter', 'queue', 'event'))}")
        # a new run has no workers stored before this loader's first batch
        known = "" if self._new_run and not self._workers_stored else """
            WHERE NOT EXISTS (SELECT 1 FROM workers o WHERE o.run_id = $run AND o.rank = w.rank
                              AND o.stage = w.stage AND o.worker = w.worker)"""
        if self._joinless:     # one segment per file: its figures by fid, from the lists
            seg = {c: f"list_extract($seg_{c}::{t}[], w.fid + 1)" for c, t in (
                ("host", "VARCHAR"), ("pid", "BIGINT"), ("world_size", "BIGINT"),
                ("clock_wall", "DOUBLE"), ("clock_mono", "DOUBLE"))}
            path, joins = "list_extract($paths::VARCHAR[], w.fid + 1)", ""
        else:
            seg = {c: f"s.{c}" for c in ("host", "pid", "world_size", "clock_wall",
                                         "clock_mono")}
            path = "f.path"
            joins = ("JOIN _tlog_seg_t s ON s.sid = w.sid "
                     "JOIN _tlog_files_t f ON f.fid = w.fid")
        self._run(f"""
            INSERT INTO workers (run_id, rank, stage, worker, host, pid, world_size, clock_wall,
                                 clock_mono, file)
            SELECT $run, w.rank, w.stage, w.worker, {seg['host']}, {seg['pid']},
                   {seg['world_size']}, {seg['clock_wall']}, {seg['clock_mono']}, {path}
            FROM (SELECT rank, stage, worker, arg_min(sid, pos) AS sid, arg_min(fid, pos) AS fid
                  FROM ({keyed}) GROUP BY rank, stage, worker) w
            {joins}
            {known}
            """)
        self._workers_stored = True
