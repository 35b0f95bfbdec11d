"""The diagnosis, stored: one truth for ``tlog diagnose``, ``tlog runs`` and the stored queries.

:func:`ensure_attribution` makes sure the database holds, for every run asked
about, what :func:`tlog.analyze.diagnose` computes for it, in four tables
(DDL: ``tlog.ingest.db.ATTRIBUTION_TABLES``; docs/DATABASE.md "Stored
diagnosis"):

- ``attribution``: one row per (run, rank, stage, worker, iter): seconds per
  category after the device-backlog walk and the collective split
  (``RunAnalysis.iteration_frame``), the time base ``base_s``, and the
  ``steady`` / ``excluded`` / ``warmup`` / ``in_event`` / ``attempt`` flags and
  ``pos`` (position in the worker) the steady state was judged from;
- ``attribution_phases``: per (run, worker, phase, category) attributed seconds
  over the steady iterations (``RunAnalysis.phase_frame``);
- ``attribution_stages``: each stage's place in diagnose's pipeline order
  (stages without a steady iteration last, by name);
- ``attribution_runs``: per run the key it was computed for, the run's
  throughput, verdict and the whole ``tlog diagnose --json``.

**When it is recomputed.** A run's rows are fresh while its
``attribution_runs.data_key`` equals :func:`data_keys`' digest of what
diagnosis reads (files, iterations, phase layouts and categories, events,
queue samples, workers, system samples and machines, the ``runs`` row; and
the rule plugins installed)
and ``analysis_version`` equals :func:`analysis_key`, a digest of the analysis
code itself (every module of this package, the rules and their policies'
values included). Ingesting, appending, rewriting, recategorizing or
forgetting changes the first, and any change to the analysis the second, so
the next reader recomputes the run; a run no longer in the database loses
its rows.

**Read-only connections** (every reading command opens the database
read-only) cannot store anything: stale runs are diagnosed in memory into
temporary tables, and temporary views of the same four names (which DuckDB
resolves before the database's own tables) show the stored rows of fresh runs
together with them, for this connection only. ``tlog ingest`` stores the
rows of the runs it loads (a writable connection), so readers find them fresh.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import duckdb
from tlog.analyze.plugins import rule_set_key
from tlog.ingest.db import ATTRIBUTION_TABLES, SCHEMA_VERSION, schema_version

#: Characters of the analysis digest kept (hex): 64 bits, no collision between
#: two versions of tlog in practice. Source: tlog's choice.
KEY_CHARS = 16


def code_digest(root: Path) -> str:
    """A digest of the Python source under ``root``: every ``*.py`` file, by its
    path relative to ``root`` and its bytes, in path order (sha256, the first
    :data:`KEY_CHARS` hex characters). Any edit changes it, a comment too
    (then the stored runs are recomputed once: cheaper than parsing the code
    at every read)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:KEY_CHARS]


@cache
def analysis_key() -> str:
    """The version of the analysis whose results the tables hold: the
    :func:`code_digest` of this package (``tlog.analyze``: attribution,
    steady state, pipeline order, the rules and their policies, whose default
    values are in that code, and the verdict). A change to any of them changes
    it, so every stored run is recomputed on its next read; nothing is bumped
    by hand. Read once per process, as files, not imported: a reader of fresh
    rows loads no analysis (docs/DATABASE.md "When it is recomputed" gives its cost)."""
    return code_digest(Path(__file__).resolve().parent)

#: The stored-diagnosis tables, in the order they are written.
TABLES = ("attribution", "attribution_phases", "attribution_stages", "attribution_runs")
#: Most stale runs whose small tables one statement reads for their diagnoses
#: (:func:`tlog.analyze.load.group_reads`). Source: tlog's choice (a group of
#: :data:`tlog.api.STORE_GROUP_RUNS` runs of ``tlog ingest DIR DIR ...``).
READ_GROUP_RUNS = 64

# What diagnosis reads, digested per run: one part per table, each a small
# aggregate of that table alone, put together in one UNION ALL (planning a join
# of the parts cost twice as much, and the digest is taken at every ingest).
# Sums of hashes (HUGEINT), not of floats: exact, so the same in any order of a
# parallel scan; a scan of the iterations' scalar columns, never of the phase
# lists. ``{w}`` selects the runs (one ``run_id = $id`` lets DuckDB skip the
# row groups of other runs).
_KEY_SQL = """
SELECT run_id, md5(string_agg(k || '=' || t, '#' ORDER BY k)) FROM (
  SELECT run_id, 1 AS k, concat_ws('|', name, source, started, tags::VARCHAR, config::VARCHAR,
                                   phase_kinds::VARCHAR) AS t FROM runs WHERE {w}
  UNION ALL SELECT run_id, 2, string_agg(concat_ws(':', path, size, "offset", lines, head_hash,
                                                  mtime), '|' ORDER BY path)
  FROM files WHERE {w} GROUP BY run_id
  UNION ALL SELECT run_id, 3, concat_ws(':', count(*), sum(hash(rank, stage, worker, iter, ts,
                                        dur, layout, tokens, samples, cpu)))
  FROM iterations WHERE {w} GROUP BY run_id
  UNION ALL SELECT run_id, 4, string_agg(concat_ws(':', layout, seq, phase, category), '|'
                                         ORDER BY layout, seq)
  FROM phase_layouts WHERE {w} GROUP BY run_id
  UNION ALL SELECT run_id, 5, concat_ws(':', count(*), sum(hash(rank, stage, worker, name, ts,
                                                               dur)))
  FROM events WHERE {w} GROUP BY run_id
  UNION ALL SELECT run_id, 6, concat_ws(':', count(*), sum(hash(rank, stage, worker, name, ts,
                                                               depth, capacity)))
  FROM queue_samples WHERE {w} GROUP BY run_id
  UNION ALL SELECT run_id, 7, string_agg(concat_ws(':', rank, stage, worker, host), '|'
                                         ORDER BY rank, stage, worker, host)
  FROM workers WHERE {w} GROUP BY run_id
  {v6}
) GROUP BY run_id HAVING bool_or(k IN (1, 3))
"""

#: The digest's parts for the tables of schema v6 (the machine's samples): left
#: out of a database from before them opened read-only (not migrated). Every
#: column analysis reads (``tlog.analyze.system.SAMPLE_SCHEMA``).
_V6_PARTS = """
  UNION ALL SELECT run_id, 8, concat_ws(':', count(*), sum(hash(
          worker, ts, iter, cpu_s, rss_bytes, ncpu, load1, threads, running, cuda_allocated,
          cuda_reserved, cuda_retries, cuda_limit, gpu_util, gpu_mem_used, gpu_mem_total,
          gpu_temp_c, gpu_sm_clock_mhz, gpu_sm_clock_max_mhz, gpu_power_w, gpu_throttle)))
  FROM sys_samples WHERE {w} GROUP BY run_id
  UNION ALL SELECT run_id, 9, string_agg(concat_ws(':', worker, host, cpu_model, ncpu,
          mem_total, gpu_name, gpu_count, driver, cuda), '|' ORDER BY worker, host)
  FROM machines WHERE {w} GROUP BY run_id"""
#: The schema version that added ``sys_samples`` and ``machines``.
_V6 = 6


@dataclass
class AttributionState:
    """What :func:`ensure_attribution` found and did.

    Attributes:
        runs: the runs asked about that the database holds.
        computed: the runs diagnosed now (stale or never stored).
        stored: True when the computed rows were written to the database;
            False on a read-only connection (they live in temporary tables of
            that connection; ``tlog ingest RUN_DIR`` on the run stores them).
        removed: runs whose stored rows were dropped (forgotten runs).
    """

    runs: list[str] = field(default_factory=list)
    computed: list[str] = field(default_factory=list)
    stored: bool = True
    removed: list[str] = field(default_factory=list)


def data_keys(con: duckdb.DuckDBPyConnection,
              run_ids: Iterable[str] | None = None, *,
              version: int | None = None) -> dict[str, str]:
    """``{run_id: digest}`` of what diagnosis reads of each run of ``run_ids``
    (None: every run) that the database holds (hex md5).

    The digest changes when a file is ingested, appended to, rewritten or
    forgotten (``files``), when iterations, events, queue samples, workers,
    system samples or machine rows change (the machine's findings read them), when phases are recategorized (``phase_layouts``) and when the
    ``runs`` row changes (tags decide ``host_only``); not when an ingest finds
    nothing new (the ingest times are left out). Runs are those with a
    ``runs`` row or iterations. ``version``: the database's schema version
    when the caller has read it (:func:`tlog.ingest.db.schema_version`).

    The set of rule plugins installed is folded in
    (:func:`tlog.analyze.plugins.rule_set_key`: entry-point names, targets and
    their distributions' versions): installing, upgrading or removing one
    changes every run's key, so the stored findings follow the rules
    diagnose runs. Without plugins the key is the data's digest alone.
    """
    ids = None if run_ids is None else sorted(set(run_ids))
    if ids == []:
        return {}
    if ids is None:
        where, params = "true", {}
    elif len(ids) == 1:
        where, params = "run_id = $id", {"id": ids[0]}
    else:
        where, params = "run_id IN (SELECT unnest($ids::VARCHAR[]))", {"ids": ids}
    if version is None:
        version = schema_version(con)
    # a database before schema v6 opened read-only (not migrated) has neither table
    v6 = _V6_PARTS.format(w=where) if version >= _V6 else ""
    keys = dict(con.execute(_KEY_SQL.format(w=where, v6=v6), params).fetchall())
    rules = rule_set_key()
    if not rules:
        return keys
    return {r: hashlib.md5(f"{k}#rules:{rules}".encode()).hexdigest() for r, k in keys.items()}


def _gone(con: duckdb.DuckDBPyConnection, keep: set[str]) -> list[str]:
    """The runs with stored rows that the database no longer holds (neither a
    ``runs`` row nor iterations), ``keep`` excepted (runs known present).
    Iterations are looked up only for runs without a ``runs`` row (ingest
    always writes one): no scan of every run's iterations, nor a read of every
    run's id, per call."""
    candidates = sorted(r[0] for r in con.execute(
        f"SELECT run_id FROM {main_prefix(con)}attribution_runs a "
        f"WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = a.run_id)").fetchall()
        if r[0] not in keep)
    if not candidates:
        return []
    left = {r[0] for r in con.execute(
        "SELECT DISTINCT run_id FROM iterations WHERE run_id IN "
        "(SELECT unnest($ids::VARCHAR[]))", {"ids": candidates}).fetchall()}
    return [r for r in candidates if r not in left]


_IN_MEMORY: ContextVar[bool] = ContextVar("tlog_diagnosis_in_memory", default=False)


@contextmanager
def diagnosed_in_memory() -> Iterator[None]:
    """Within the block (this thread or task), :func:`ensure_attribution` stores
    nothing in the database: stale runs are diagnosed into temporary tables,
    as on a read-only connection. ``tlog serve``'s readers run so, on cursors
    of its writable connection: a reader that stored would need the write lock
    and so wait for an ingest round."""
    token = _IN_MEMORY.set(True)
    try:
        yield
    finally:
        _IN_MEMORY.reset(token)


def _read_only(con: duckdb.DuckDBPyConnection) -> bool:
    if _IN_MEMORY.get():
        return True
    rows = con.execute("SELECT readonly FROM duckdb_databases() "
                       "WHERE database_name = current_database()").fetchall()
    return bool(rows and rows[0][0])


def _stored_keys(con: duckdb.DuckDBPyConnection, *, main: bool,
                 ids: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """``{run_id: (data_key, analysis_version)}`` of the stored runs (``ids``: of
    those only; None: all)."""
    src = f"{main_prefix(con)}attribution_runs" if main else "attribution_runs"
    sql = f"SELECT run_id, data_key, analysis_version FROM {src}"
    if ids is None:
        rows = con.execute(sql).fetchall()
    else:
        rows = con.execute(sql + " WHERE run_id IN (SELECT unnest($ids::VARCHAR[]))",
                           {"ids": ids}).fetchall()
    return {r[0]: (r[1], str(r[2])) for r in rows}


def main_prefix(con: duckdb.DuckDBPyConnection) -> str:
    """``"<database>".main.``: names the database's own table where a temporary
    view of the same name would otherwise be found first."""
    name = con.execute("SELECT current_database()").fetchall()[0][0]
    return '"' + str(name).replace('"', '""') + '".main.'


def _temp_exists(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary "
                            "AND table_name = '_tlog_new_attribution_runs'").fetchall()[0][0])


def stored_diagnosis(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """The stored ``tlog diagnose --json`` text of ``run_id`` (its
    ``attribution_runs.diagnosis``) when it is fresh: computed from the data
    the run holds now (:func:`data_keys`) by this analysis (:func:`analysis_key`);
    else None (stale, never stored, no iterations, no such run, or a database
    from before the stored diagnosis). Reads no frames: one digest query and
    one row, so a command that only prints the verdict loads no analysis."""
    keys = data_keys(con, [run_id])
    if run_id not in keys:
        return None
    try:
        rows = con.execute(f"SELECT data_key, analysis_version, diagnosis::VARCHAR FROM "
                           f"{main_prefix(con)}attribution_runs WHERE run_id = ?",
                           [run_id]).fetchall()
    except duckdb.CatalogException:
        return None
    if not rows or (rows[0][0], str(rows[0][1])) != (keys[run_id], analysis_key()):
        return None
    return rows[0][2]


def ensure_attribution(con: duckdb.DuckDBPyConnection,
                       run_ids: Iterable[str] | None = None) -> AttributionState:
    """Make the stored diagnosis of ``run_ids`` (None: every run) fresh.

    Each stale run (no rows, another ``data_key`` or ``analysis_version``) is
    diagnosed (:func:`tlog.analyze.diagnose`) and its rows replace the old
    ones; rows of runs the database no longer holds are dropped. On a
    writable connection this is one transaction in the database; on a
    read-only one the rows go to temporary tables that this connection's
    queries see under the tables' own names (module docstring).

    Cost: one digest query over the runs asked about (:func:`data_keys`, a
    scan of their iterations' scalar columns: about 0.05 s per 1M
    iterations) when nothing is stale, plus one diagnosis per stale run.

    Returns:
        :class:`AttributionState`.
    """
    version = schema_version(con)
    keys = data_keys(con, run_ids, version=version)
    wanted = sorted(keys)
    writable = not _read_only(con)
    # the database itself holds the tables from schema v5 on
    has_tables = version >= SCHEMA_VERSION
    if writable and not has_tables:
        con.execute(ATTRIBUTION_TABLES)   # a database created by another code path
    in_main = has_tables or writable
    only = None if run_ids is None else wanted      # every run's rows only when asked
    main_rows = _stored_keys(con, main=True, ids=only) if in_main else {}
    want_key = {r: (keys[r], analysis_key()) for r in keys}
    temp = (not writable) and _temp_exists(con)
    stored = {**main_rows, **_stored_keys(con, main=False, ids=only)} if temp else main_rows
    stale = [r for r in wanted if stored.get(r) != want_key[r]]
    gone = (sorted(r for r in main_rows if r not in keys) if run_ids is None
            else _gone(con, set(keys)) if in_main else [])
    state = AttributionState(runs=wanted, computed=stale, stored=writable, removed=gone)
    if not stale and not gone:
        return state
    if not writable and temp and not stale:
        return state      # the temporary views already hide the database's stale rows
    # the computing half (polars, the analysis) is imported only when needed, so a
    # reader of fresh rows (tlog runs) loads neither (docs/DESIGN.md start-up)
    from tlog.analyze.load import group_reads
    from tlog.analyze.persist_rows import rows_of, store, store_temp

    frames: dict[str, list] = {t: [] for t in TABLES}
    for k in range(0, len(stale), READ_GROUP_RUNS):
        part = stale[k:k + READ_GROUP_RUNS]
        # several runs: their small tables read at once (one run: as ever)
        with group_reads(con, part) if len(part) > 1 else contextlib.nullcontext():
            for run_id in part:
                for t, frame in rows_of(con, run_id, keys[run_id]).items():
                    frames[t].append(frame)
    if writable:   # rows to delete: only runs that have some (a new run has none)
        store(con, [r for r in stale if r in main_rows] + gone, frames)
    else:      # the views keep every fresh stored run: they need every run's key
        store_temp(con, stale, frames, keys if run_ids is None else data_keys(con), in_main)
    return state


