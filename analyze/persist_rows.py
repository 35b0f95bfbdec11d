"""The computing half of :mod:`tlog.analyze.persist`: one run's stored-diagnosis
rows from :func:`tlog.analyze.diagnose`, and writing them (to the database, or
to temporary tables of a read-only connection). Imported by
:func:`tlog.analyze.persist.ensure_attribution` only when a run is stale.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import duckdb
import numpy as np
import polars as pl
from tlog.analyze import persist
from tlog.analyze.persist import TABLES, main_prefix
from tlog.analyze.steady import (
    EXCLUDED_ATTEMPT,
    EXCLUDED_WARMUP,
    disruptive_events,
    overlaps_events,
)
from tlog.analyze.verdict import Diagnosis, diagnose
from tlog.ingest.db import ATTRIBUTION_TABLES
from tlog.ingest.errors import RunNotFoundError

#: Columns of each table, in DDL order.
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
                             "analysis_version": persist.analysis_key(), "computed_at": now,
                             "iterations": 0, "steady": 0, "iters_per_s": None,
                             "tokens_per_s": None, "samples_per_s": None,
                             "verdict": "no iterations", "confidence": None,
                             "diagnosis": None}],
                           schema=_run_schema())
        return {"attribution": _empty_iters(), "attribution_phases": _empty_phases(),
                "attribution_stages": _empty_stages(), "attribution_runs": run}
    return diagnosis_rows(diag, data_key, now)


def _run_schema() -> dict[str, pl.DataType]:
    return {"run_id": pl.String, "data_key": pl.String, "analysis_version": pl.String,
            "computed_at": pl.Datetime("us"), "iterations": pl.Int64, "steady": pl.Int64,
            "iters_per_s": pl.Float64, "tokens_per_s": pl.Float64, "samples_per_s": pl.Float64,
            "verdict": pl.String, "confidence": pl.String, "diagnosis": pl.String}


def _empty_iters() -> pl.DataFrame:
    return pl.DataFrame(schema={c: t for c, t in _iter_schema().items()})


def _iter_schema() -> dict[str, pl.DataType]:
    f, b = pl.Float64, pl.Boolean
    # the text columns as Categorical: one code per row, not a string (memory at scale)
    cat = pl.Categorical
    return {"run_id": cat, "rank": pl.Int32, "stage": cat, "worker": cat,
            "iter": pl.Int64, "ts": f, "dur": f, "tokens": pl.Int64, "samples": pl.Int64,
            "base_s": f, "starvation_s": f, "backpressure_s": f, "compute_s": f, "sync_s": f,
            "unaccounted_s": f, "gpu_s": f, "pos": pl.Int64, "steady": b,
            "excluded": cat, "warmup": b, "in_event": b, "attempt": b}


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
        run_id=pl.lit(data.run_id, dtype=pl.Categorical), base_s=pl.Series(base),
        in_event=pl.Series(in_event, dtype=pl.Boolean),
        warmup=(pl.col("excluded") == EXCLUDED_WARMUP).fill_null(False),
        attempt=(pl.col("excluded") == EXCLUDED_ATTEMPT).fill_null(False),
    )
    key = pl.col("wid").cast(pl.Int64) * (1 << 40) + pl.col("iter")
    if not frame.select(key.is_sorted()).item():
        frame = frame.sort("wid", "iter")
    frame = frame.with_columns(pos=(pl.int_range(pl.len()).over("wid") + 1).cast(pl.Int64))
    iters = frame.select([pl.col(c).cast(t) for c, t in _iter_schema().items()])
    phases = (analysis.phase_frame(steady_only=True)
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
                         "analysis_version": persist.analysis_key(), "computed_at": computed_at,
                         "iterations": d["iterations"]["total"],
                         "steady": d["iterations"]["steady"],
                         "iters_per_s": tp.get("iters_per_s"),
                         "tokens_per_s": tp.get("tokens_per_s"),
                         "samples_per_s": tp.get("samples_per_s"),
                         "verdict": d["verdict"], "confidence": d["confidence"],
                         "diagnosis": json.dumps(_finite(d), default=str, allow_nan=False)}],
                       schema=_run_schema())
    return {"attribution": iters, "attribution_phases": phases, "attribution_stages": stages,
            "attribution_runs": run}


def _finite(value):
    """``value`` with NaN and infinities as None, as ``tlog diagnose --json``
    prints them (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _concat(frames: list[pl.DataFrame], table: str) -> pl.DataFrame:
    empty = {"attribution": _empty_iters, "attribution_phases": _empty_phases,
             "attribution_stages": _empty_stages,
             "attribution_runs": lambda: pl.DataFrame(schema=_run_schema())}[table]()
    return pl.concat([empty, *frames], how="vertical_relaxed") if frames else empty


def _cols(table: str) -> str:
    cols = {"attribution": _ITER_COLS, "attribution_phases": _PHASE_COLS,
            "attribution_stages": ("run_id", "stage", "pos"), "attribution_runs": _RUN_COLS}
    return ", ".join(cols[table])


def _replace_rows(con: duckdb.DuckDBPyConnection, target: str, table: str,
                  run_ids: list[str], new: pl.DataFrame) -> None:
    """Delete the rows of ``run_ids`` from ``target`` (``table``'s columns: the
    table itself or its temporary copy) and insert ``new``."""
    if len(run_ids) == 1:
        con.execute(f"DELETE FROM {target} WHERE run_id = ?", run_ids).fetchall()
    elif run_ids:
        ids = pl.DataFrame({"run_id": run_ids}, schema={"run_id": pl.String})
        con.register("_tlog_drop", ids.to_arrow())
        con.execute(f"DELETE FROM {target} WHERE run_id IN "
                    f"(SELECT run_id FROM _tlog_drop)").fetchall()
        con.unregister("_tlog_drop")
    if new.height:
        con.register("_tlog_rows", new.to_arrow())
        con.execute(f"INSERT INTO {target} ({_cols(table)}) "
                    f"SELECT {_cols(table)} FROM _tlog_rows").fetchall()
        con.unregister("_tlog_rows")


def store(con: duckdb.DuckDBPyConnection, drop: list[str],
           frames: dict[str, list[pl.DataFrame]]) -> None:
    """Replace the rows of runs ``drop`` with ``frames`` (lists of frames by table
    name, as :func:`rows_of` gives them), in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        for table in TABLES:
            _replace_rows(con, table, table, drop, _concat(frames[table], table))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def store_temp(con: duckdb.DuckDBPyConnection, stale: list[str],
                frames: dict[str, list[pl.DataFrame]], keys: dict[str, str],
                in_main: bool) -> None:
    """Read-only connection: rows of the ``stale`` runs into
    ``temp._tlog_new_<table>``, and temporary views ``<table>`` over the
    database's rows of runs whose ``data_key`` matches ``keys`` (``in_main``:
    the database has the tables) plus those."""
    main = main_prefix(con)
    for table in TABLES:
        tmp = f"_tlog_new_{table}"
        exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary AND "
                             "table_name = ?", [tmp]).fetchall()[0][0]
        if not exists:
            ddl = ATTRIBUTION_TABLES.split("CREATE TABLE IF NOT EXISTS ")
            body = next(p for p in ddl if p.startswith(table + " ("))
            body = body.split(";\n")[0].replace("PRIMARY KEY", "")
            con.execute(f"CREATE TEMP TABLE {tmp} {body[len(table):]}")
        _replace_rows(con, f"temp.{tmp}", table, stale, _concat(frames[table], table))
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
                   f"AND k.data_key = a.data_key "
                   f"AND a.analysis_version::VARCHAR = '{persist.analysis_key()}' "
                   f"WHERE a.run_id NOT IN (SELECT run_id FROM temp._tlog_new_attribution_runs)"
                   f") UNION ALL {temp_part}")
        else:
            sql = temp_part
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS {sql}")
