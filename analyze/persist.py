"""The diagnosis, stored: one truth for ``tlog diagnose``, ``tlog runs`` and the stored queries.

:func:`ensure_attribution` makes sure the database holds, for every run asked
about, what :func:`tlog.analyze.diagnose` computes for it, in four tables
(DDL: ``tlog.ingest.db.ATTRIBUTION_TABLES``; docs/DATABASE.md "Stored
diagnosis"):

- ``attribution``: one row per (run, rank, stage, worker, iter): seconds per
  category after the device-backlog walk and the collective split
  (``analyze.frames.iteration_frame``), the time base ``base_s``, and the
  ``steady`` / ``excluded`` / ``warmup`` / ``in_event`` / ``attempt`` flags and
  ``pos`` (position in the worker) the steady state was judged from;
- ``attribution_phases``: per (run, worker, phase, category) attributed seconds
  over the steady iterations (``analyze.frames.phase_frame``);
- ``attribution_stages``: each stage's place in diagnose's pipeline order
  (stages without a steady iteration last, by name);
- ``attribution_runs``: per run the key it was computed for, the run's
  throughput, verdict and the whole ``tlog diagnose --json``.

**When it is recomputed.** A run's rows are fresh while its
``attribution_runs.data_key`` equals :func:`data_keys`' digest of what
diagnosis reads (files, iterations, phase layouts and categories, events,
queue samples, workers, the ``runs`` row) and ``analysis_version`` equals
:data:`ANALYSIS_VERSION`. Ingesting, appending, rewriting, recategorizing or
forgetting changes the digest, so the next reader recomputes the run; a run
no longer in the database loses its rows.

**Read-only connections** (every reading command opens the database
read-only) cannot store anything: stale runs are diagnosed in memory into
temporary tables, and temporary views of the same four names (which DuckDB
resolves before the database's own tables) show the stored rows of fresh runs
together with them, for this connection only. ``tlog ingest`` stores the
rows of the runs it loads (a writable connection), so readers find them fresh.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb
import numpy as np
import polars as pl
from tlog.analyze.frames import phase_frame
from tlog.analyze.steady import (
    EXCLUDED_ATTEMPT,
    EXCLUDED_WARMUP,
    disruptive_events,
    overlaps_events,
)
from tlog.analyze.verdict import Diagnosis, diagnose
from tlog.ingest.db import ATTRIBUTION_TABLES, SCHEMA_VERSION, schema_version
from tlog.ingest.errors import RunNotFoundError

#: Version of the analysis whose results the tables hold. Bump it whenever a
#: change to analyze/ changes any stored figure (attribution, steady state,
#: pipeline order, verdict): every run is then recomputed on its next read.
ANALYSIS_VERSION = 1

#: The stored-diagnosis tables, in the order they are written.
TABLES = ("attribution", "attribution_phases", "attribution_stages", "attribution_runs")

_ITER_COLS = ("run_id", "rank", "stage", "worker", "iter", "ts", "dur", "tokens", "samples",
              "base_s", "starvation_s", "backpressure_s", "compute_s", "sync_s",
              "unaccounted_s", "gpu_s", "pos", "steady", "excluded", "warmup", "in_event",
              "attempt")
_PHASE_COLS = ("run_id", "rank", "stage", "worker", "phase", "parent", "category",
               "iterations", "host_s", "gpu_s", "starvation_s", "backpressure_s", "compute_s",
               "sync_s", "attributed_s")
_RUN_COLS = ("run_id", "data_key", "analysis_version", "computed_at", "iterations", "steady",
             "iters_per_s", "tokens_per_s", "samples_per_s", "verdict", "confidence",
             "diagnosis")

# What diagnosis reads, digested per run (one query over all runs; a scan of
# the iterations' scalar columns, never of the phase lists). Sums of hashes
# (HUGEINT), not of floats: exact, so the same in any order of a parallel scan.
_KEY_SQL = """
WITH ids AS (SELECT run_id FROM runs UNION SELECT DISTINCT run_id FROM iterations),
r AS (SELECT run_id, concat_ws('|', name, source, started, tags::VARCHAR, config::VARCHAR,
                                phase_kinds::VARCHAR, last_ingested) AS t FROM runs),
f AS (SELECT run_id, string_agg(concat_ws(':', path, size, "offset", lines, head_hash, mtime,
                                          ingested_at), '|' ORDER BY path) AS t
      FROM files GROUP BY run_id),
i AS (SELECT run_id, concat_ws(':', count(*), sum(hash(rank, stage, worker, iter, ts, dur,
                                                         layout, tokens, samples, cpu)))
             AS t
      FROM iterations GROUP BY run_id),
l AS (SELECT run_id, string_agg(concat_ws(':', layout, seq, phase, category), '|'
                                ORDER BY layout, seq) AS t
      FROM phase_layouts GROUP BY run_id),
e AS (SELECT run_id, concat_ws(':', count(*), sum(hash(rank, stage, worker, name, ts, dur)))
             AS t FROM events GROUP BY run_id),
q AS (SELECT run_id, concat_ws(':', count(*), sum(hash(rank, stage, worker, name, ts, depth,
                                                       capacity))) AS t
      FROM queue_samples GROUP BY run_id),
w AS (SELECT run_id, string_agg(concat_ws(':', rank, stage, worker, host), '|'
                                ORDER BY rank, stage, worker, host) AS t
      FROM workers GROUP BY run_id)
SELECT ids.run_id, md5(concat_ws('#', r.t, f.t, i.t, l.t, e.t, q.t, w.t))
FROM ids LEFT JOIN r USING (run_id) LEFT JOIN f USING (run_id) LEFT JOIN i USING (run_id)
LEFT JOIN l USING (run_id) LEFT JOIN e USING (run_id) LEFT JOIN q USING (run_id)
LEFT JOIN w USING (run_id)
"""


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


def data_keys(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """``{run_id: digest}`` of what diagnosis reads of each run (hex md5).

    The digest changes when a file is ingested, appended to, rewritten or
    forgotten (``files``), when iterations, events, queue samples or workers
    change, when phases are recategorized (``phase_layouts``) and when the
    ``runs`` row changes (tags decide ``host_only``). Runs are those with a
    ``runs`` row or iterations.
    """
    return dict(con.execute(_KEY_SQL).fetchall())


def _read_only(con: duckdb.DuckDBPyConnection) -> bool:
    rows = con.execute("SELECT readonly FROM duckdb_databases() "
                       "WHERE database_name = current_database()").fetchall()
    return bool(rows and rows[0][0])


def _has_tables(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database itself holds the tables (schema v5 or later)."""
    return schema_version(con) >= SCHEMA_VERSION


def _stored_keys(con: duckdb.DuckDBPyConnection, *, main: bool) -> dict[str, tuple[str, int]]:
    src = f"{_main_prefix(con)}attribution_runs" if main else "attribution_runs"
    return {r[0]: (r[1], r[2]) for r in
            con.execute(f"SELECT run_id, data_key, analysis_version FROM {src}").fetchall()}


def _main_prefix(con: duckdb.DuckDBPyConnection) -> str:
    name = con.execute("SELECT current_database()").fetchall()[0][0]
    return '"' + str(name).replace('"', '""') + '".main.'


def _temp_exists(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary "
                            "AND table_name = '_tlog_new_attribution_runs'").fetchall()[0][0])


def ensure_attribution(con: duckdb.DuckDBPyConnection,
                       run_ids: Iterable[str] | None = None) -> AttributionState:
    """Make the stored diagnosis of ``run_ids`` (None: every run) fresh.

    Each stale run (no rows, another ``data_key`` or ``analysis_version``) is
    diagnosed (:func:`tlog.analyze.diagnose`) and its rows replace the old
    ones; rows of runs the database no longer holds are dropped. On a
    writable connection this is one transaction in the database; on a
    read-only one the rows go to temporary tables that this connection's
    queries see under the tables' own names (module docstring).

    Cost: one digest query over all runs (:func:`data_keys`, a scan of the
    iterations' scalar columns) when nothing is stale, plus one diagnosis
    per stale run.

    Returns:
        :class:`AttributionState`.
    """
    keys = data_keys(con)
    wanted = sorted(keys) if run_ids is None else sorted(set(run_ids) & set(keys))
    writable = not _read_only(con)
    if writable and not _has_tables(con):
        con.execute(ATTRIBUTION_TABLES)   # a database created by another code path
    in_main = _has_tables(con) or writable
    main_rows = _stored_keys(con, main=True) if in_main else {}
    want_key = {r: (keys[r], ANALYSIS_VERSION) for r in keys}
    temp = (not writable) and _temp_exists(con)
    stored = {**main_rows, **_stored_keys(con, main=False)} if temp else main_rows
    stale = [r for r in wanted if stored.get(r) != want_key[r]]
    gone = sorted(r for r in main_rows if r not in keys)
    state = AttributionState(runs=wanted, computed=stale, stored=writable, removed=gone)
    if not stale and not gone:
        return state
    if not writable and temp and not stale:
        return state      # the temporary views already hide the database's stale rows
    frames = {t: [] for t in TABLES}
    for run_id in stale:
        for t, frame in rows_of(con, run_id, keys[run_id]).items():
            frames[t].append(frame)
    if writable:
        _store(con, stale + gone, frames)
    else:
        _store_temp(con, stale, frames, keys, in_main)
    return state


def rows_of(con: duckdb.DuckDBPyConnection, run_id: str, data_key: str
            ) -> dict[str, pl.DataFrame]:
    """The stored-diagnosis rows of one run, by table name (module docstring).

    A run with a ``runs`` row and no iterations gets an ``attribution_runs``
    row only (``verdict`` "no iterations", ``diagnosis`` NULL).
    """
    now = datetime.now(UTC).replace(tzinfo=None)
    try:
        diag = diagnose(con, run_id)
    except RunNotFoundError:
        run = pl.DataFrame([{"run_id": run_id, "data_key": data_key,
                             "analysis_version": ANALYSIS_VERSION, "computed_at": now,
                             "iterations": 0, "steady": 0, "iters_per_s": None,
                             "tokens_per_s": None, "samples_per_s": None,
                             "verdict": "no iterations", "confidence": None,
                             "diagnosis": None}],
                           schema=_run_schema())
        return {"attribution": _empty_iters(), "attribution_phases": _empty_phases(),
                "attribution_stages": _empty_stages(), "attribution_runs": run}
    return diagnosis_rows(diag, data_key, now)


def _run_schema() -> dict[str, pl.DataType]:
    return {"run_id": pl.String, "data_key": pl.String, "analysis_version": pl.Int32,
            "computed_at": pl.Datetime("us"), "iterations": pl.Int64, "steady": pl.Int64,
            "iters_per_s": pl.Float64, "tokens_per_s": pl.Float64, "samples_per_s": pl.Float64,
            "verdict": pl.String, "confidence": pl.String, "diagnosis": pl.String}


def _empty_iters() -> pl.DataFrame:
    return pl.DataFrame(schema={c: t for c, t in _iter_schema().items()})


def _iter_schema() -> dict[str, pl.DataType]:
    f, b = pl.Float64, pl.Boolean
    return {"run_id": pl.String, "rank": pl.Int32, "stage": pl.String, "worker": pl.String,
            "iter": pl.Int64, "ts": f, "dur": f, "tokens": pl.Int64, "samples": pl.Int64,
            "base_s": f, "starvation_s": f, "backpressure_s": f, "compute_s": f, "sync_s": f,
            "unaccounted_s": f, "gpu_s": f, "pos": pl.Int64, "steady": b,
            "excluded": pl.String, "warmup": b, "in_event": b, "attempt": b}


def _empty_phases() -> pl.DataFrame:
    f = pl.Float64
    return pl.DataFrame(schema={"run_id": pl.String, "rank": pl.Int32, "stage": pl.String,
                                "worker": pl.String, "phase": pl.String, "parent": pl.String,
                                "category": pl.String, "iterations": pl.Int64, "host_s": f,
                                "gpu_s": f, "starvation_s": f, "backpressure_s": f,
                                "compute_s": f, "sync_s": f, "attributed_s": f})


def _empty_stages() -> pl.DataFrame:
    return pl.DataFrame(schema={"run_id": pl.String, "stage": pl.String, "pos": pl.Int32})


def diagnosis_rows(diag: Diagnosis, data_key: str, computed_at: datetime
                   ) -> dict[str, pl.DataFrame]:
    """The stored-diagnosis rows of a :class:`Diagnosis` that keeps its
    ``analysis`` (as :func:`tlog.analyze.diagnose` returns it), by table name."""
    analysis = diag.analysis
    if analysis is None:
        msg = "diagnosis_rows needs a Diagnosis with its analysis (diagnose() keeps it)"
        raise ValueError(msg)
    data = analysis.data
    it = analysis.iterations
    ts = it["ts"].to_numpy().astype(np.float64)
    dur = it["dur"].to_numpy().astype(np.float64)
    in_event = overlaps_events(ts, dur, disruptive_events(data.events, ts, dur)[0])
    base = np.maximum(dur, it["phase_s"].to_numpy())
    frame = it.with_columns(
        run_id=pl.lit(data.run_id), base_s=pl.Series(base),
        in_event=pl.Series(in_event, dtype=pl.Boolean),
        excluded=pl.col("excluded").cast(pl.String),
        stage=pl.col("stage").cast(pl.String), worker=pl.col("worker").cast(pl.String),
    ).with_columns(
        warmup=(pl.col("excluded") == EXCLUDED_WARMUP).fill_null(False),
        attempt=(pl.col("excluded") == EXCLUDED_ATTEMPT).fill_null(False),
    )
    key = pl.col("wid").cast(pl.Int64) * (1 << 40) + pl.col("iter")
    if not frame.select(key.is_sorted()).item():
        frame = frame.sort("wid", "iter")
    frame = frame.with_columns(pos=(pl.int_range(pl.len()).over("wid") + 1).cast(pl.Int64))
    iters = frame.select([pl.col(c).cast(t) for c, t in _iter_schema().items()])
    phases = (phase_frame(analysis, steady_only=True)
              .select([pl.col(c).cast(t) for c, t in _empty_phases().schema.items()]))
    d = diag.to_dict()
    # diagnose's pipeline order; stages without a steady iteration follow, by name
    order = [s["stage"] for s in d["stages"]]
    order += sorted(set(data.workers["stage"].cast(pl.String).to_list()) - set(order))
    stages = pl.DataFrame({"run_id": [data.run_id] * len(order), "stage": order,
                           "pos": list(range(1, len(order) + 1))},
                          schema=_empty_stages().schema)
    tp = d["throughput"]
    run = pl.DataFrame([{"run_id": data.run_id, "data_key": data_key,
                         "analysis_version": ANALYSIS_VERSION, "computed_at": computed_at,
                         "iterations": d["iterations"]["total"],
                         "steady": d["iterations"]["steady"],
                         "iters_per_s": tp.get("iters_per_s"),
                         "tokens_per_s": tp.get("tokens_per_s"),
                         "samples_per_s": tp.get("samples_per_s"),
                         "verdict": d["verdict"], "confidence": d["confidence"],
                         "diagnosis": json.dumps(d, default=str)}], schema=_run_schema())
    return {"attribution": iters, "attribution_phases": phases, "attribution_stages": stages,
            "attribution_runs": run}


def _concat(frames: list[pl.DataFrame], table: str) -> pl.DataFrame:
    empty = {"attribution": _empty_iters, "attribution_phases": _empty_phases,
             "attribution_stages": _empty_stages,
             "attribution_runs": lambda: pl.DataFrame(schema=_run_schema())}[table]()
    return pl.concat([empty, *frames], how="vertical_relaxed") if frames else empty


def _cols(table: str) -> str:
    cols = {"attribution": _ITER_COLS, "attribution_phases": _PHASE_COLS,
            "attribution_stages": ("run_id", "stage", "pos"), "attribution_runs": _RUN_COLS}
    return ", ".join(cols[table])


def _store(con: duckdb.DuckDBPyConnection, drop: list[str],
           frames: dict[str, list[pl.DataFrame]]) -> None:
    """Replace the rows of runs ``drop`` with ``frames``, in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        ids = pl.DataFrame({"run_id": drop}, schema={"run_id": pl.String})
        con.register("_tlog_drop", ids.to_arrow())
        for table in TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM _tlog_drop)"
                        ).fetchall()
            new = _concat(frames[table], table)
            if new.height:
                con.register("_tlog_rows", new.to_arrow())
                con.execute(f"INSERT INTO {table} ({_cols(table)}) "
                            f"SELECT {_cols(table)} FROM _tlog_rows").fetchall()
                con.unregister("_tlog_rows")
        con.unregister("_tlog_drop")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _store_temp(con: duckdb.DuckDBPyConnection, stale: list[str],
                frames: dict[str, list[pl.DataFrame]], keys: dict[str, str],
                in_main: bool) -> None:
    """Read-only connection: rows into ``temp._tlog_new_<table>``, and temporary
    views ``<table>`` over the database's fresh rows plus those."""
    main = _main_prefix(con)
    for table in TABLES:
        tmp = f"_tlog_new_{table}"
        exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary AND "
                             "table_name = ?", [tmp]).fetchall()[0][0]
        if not exists:
            ddl = ATTRIBUTION_TABLES.split("CREATE TABLE IF NOT EXISTS ")
            body = next(p for p in ddl if p.startswith(table + " ("))
            body = body.split(";\n")[0].replace("PRIMARY KEY", "")
            con.execute(f"CREATE TEMP TABLE {tmp} {body[len(table):]}")
        if stale:
            ids = pl.DataFrame({"run_id": stale}, schema={"run_id": pl.String})
            con.register("_tlog_drop", ids.to_arrow())
            con.execute(f"DELETE FROM temp.{tmp} WHERE run_id IN "
                        f"(SELECT run_id FROM _tlog_drop)").fetchall()
            con.unregister("_tlog_drop")
        new = _concat(frames[table], table)
        if new.height:
            con.register("_tlog_rows", new.to_arrow())
            con.execute(f"INSERT INTO temp.{tmp} ({_cols(table)}) "
                        f"SELECT {_cols(table)} FROM _tlog_rows").fetchall()
            con.unregister("_tlog_rows")
    # Runs whose stored rows in the database are fresh (the rest come from temp).
    fresh = pl.DataFrame({"run_id": list(keys), "data_key": list(keys.values())},
                         schema={"run_id": pl.String, "data_key": pl.String})
    con.execute("CREATE OR REPLACE TEMP TABLE _tlog_keys (run_id VARCHAR, data_key VARCHAR)")
    con.register("_tlog_k", fresh.to_arrow())
    con.execute("INSERT INTO temp._tlog_keys SELECT * FROM _tlog_k").fetchall()
    con.unregister("_tlog_k")
    for table in TABLES:
        cols = _cols(table)
        temp_part = f"SELECT {cols} FROM temp._tlog_new_{table}"
        if in_main:
            sql = (f"SELECT {cols} FROM {main}{table} WHERE run_id IN ("
                   f"SELECT a.run_id FROM {main}attribution_runs AS a "
                   f"JOIN temp._tlog_keys AS k ON k.run_id = a.run_id "
                   f"AND k.data_key = a.data_key AND a.analysis_version = {ANALYSIS_VERSION} "
                   f"WHERE a.run_id NOT IN (SELECT run_id FROM temp._tlog_new_attribution_runs)"
                   f") UNION ALL {temp_part}")
        else:
            sql = temp_part
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS {sql}")
