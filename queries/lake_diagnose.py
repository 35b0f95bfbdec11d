"""``tlog diagnose`` of a run in a lake, its per-worker attribution on Spark.

:func:`diagnose_on_spark` splits :func:`tlog.analyze.diagnose` where the work
divides by worker:

1. **Across workers, on the driver** (tlog's own code, unchanged): the run's
   scalars and host phase times are loaded from the lake
   (:func:`tlog.analyze.load.load_run` over DuckDB views of its files; device
   times are never read here), then its steady state, the restarted stages'
   attempts and the ranks' lockstep are found, giving each iteration its
   group (worker x part of the steady state, :func:`tlog.analyze.frames.attribute_data`).
2. **Per worker, on Spark**: the run's ``iterations`` rows, phase-time lists
   included, are read by Spark from the lake's Parquet files, joined with their
   groups and grouped by worker (``groupBy(stage, rank, worker).applyInArrow``);
   each group loads its worker's rows into a scratch tlog database in the
   task and runs tlog's device-backlog walk
   (:func:`tlog.analyze.attribution.attribute_run`) on them: the per-iteration
   seconds by category and the per-phase sums come back, device times never
   leave the executors.
3. **Across ranks, on the driver**: the collective waits are carved into
   sync, and the stragglers, bottleneck, findings and verdict are those of
   :func:`tlog.analyze.verdict.diagnose_attributed`.

The walk of one worker depends on that worker's rows only, so the result equals
the local diagnosis (tests/lake/test_lake_spark.py: the same verdict and
figures on a 4-rank run; sums of the same seconds in another order agree to
1e-9 relative).

On a cluster every executor needs tlog installed (``pip install tlog``, the
same version as the driver) and must read the lake's folder at the same path.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from tlog.analyze.attribution import PHASE_SUMS, RunAttribution, attribute_run
from tlog.analyze.frames import attribute_data
from tlog.analyze.load import RunData, load_run
from tlog.analyze.verdict import Diagnosis, diagnose_attributed
from tlog.ingest.db import SCHEMA_VERSION
from tlog.ingest.errors import RunNotFoundError
from tlog.queries.lake import LakeError, read_lake

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_KEYS = ("stage", "rank", "worker")
#: What one worker's walk sends back (one Arrow schema for both kinds of row):
#: kind 0 an iteration (``iter``, ``m0``..``m5``, ``has_gpu``), kind 1 a per-phase
#: sum (``grp``, ``phase``, ``cat``, ``top``, ``counted``, ``s0``..``s6``).
_OUT = pa.schema([
    ("stage", pa.string()), ("rank", pa.int32()), ("worker", pa.string()),
    ("kind", pa.int8()), ("iter", pa.int64()),
    *[(f"m{k}", pa.float64()) for k in range(6)], ("has_gpu", pa.bool_()),
    ("grp", pa.int64()), ("phase", pa.string()), ("cat", pa.int64()), ("top", pa.int64()),
    ("counted", pa.int64()), *[(f"s{k}", pa.float64()) for k in range(len(PHASE_SUMS))],
])

_SPARK_TYPES = {pa.string(): "string", pa.int32(): "int", pa.int8(): "tinyint",
                pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean"}
_OUT_DDL = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in _OUT)


def _walk_worker(run_id: str, runs: pa.Table, layouts: pa.Table, n_groups: int):
    """The function each Spark task runs on one worker's rows (a closure: the run's
    ``runs`` row and phase layouts travel with it, a few KiB)."""

    def walk(rows: pa.Table) -> pa.Table:
        from tlog.ingest.db import connect

        scratch = Path(tempfile.mkdtemp(prefix="tlog-walk-"))
        try:
            con = connect(scratch / "w.duckdb")
            try:
                iterations = rows.drop_columns(["grp"]).append_column(
                    "run_id", pa.array([run_id] * rows.num_rows, pa.string()))
                con.register("_runs", runs)
                con.register("_layouts", layouts)
                con.register("_its", iterations)
                con.execute("INSERT INTO runs BY NAME SELECT * FROM _runs")
                con.execute("INSERT INTO phase_layouts BY NAME SELECT * FROM _layouts")
                con.execute("INSERT INTO iterations BY NAME SELECT * FROM _its")
                data = load_run(con, run_id)
            finally:
                con.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        it = data.iterations
        grp_of = dict(zip(rows.column("iter").to_pylist(), rows.column("grp").to_pylist(),
                          strict=True))
        group = np.array([grp_of[i] for i in it["iter"].to_list()], dtype=np.int64)
        ra = attribute_run(data, group, n_groups)
        n, m = it.height, len(ra.phase_keys)
        stage = str(it["stage"][0]) if n else str(rows.column("stage")[0])
        rank = int(it["rank"][0]) if n else int(rows.column("rank")[0].as_py())
        worker = str(it["worker"][0]) if n else str(rows.column("worker")[0])
        cols: dict[str, Any] = {
            "stage": [stage] * (n + m), "rank": [rank] * (n + m), "worker": [worker] * (n + m),
            "kind": [0] * n + [1] * m,
            "iter": [*it["iter"].to_list(), *[None] * m],
            **{f"m{k}": [*ra.iteration[k].tolist(), *[None] * m] for k in range(6)},
            "has_gpu": [*ra.iteration_has_gpu.tolist(), *[None] * m],
            "grp": [None] * n + ra.phase_keys[:, 0].tolist(),
            "phase": [None] * n + [data.phase_names[p] for p in ra.phase_keys[:, 1]],
            "cat": [None] * n + ra.phase_keys[:, 2].tolist(),
            "top": [None] * n + ra.phase_keys[:, 3].tolist(),
            "counted": [None] * n + ra.phase_keys[:, 4].tolist(),
            **{f"s{k}": [None] * n + ra.phase_sums[:, k].tolist()
               for k in range(len(PHASE_SUMS))},
        }
        return pa.Table.from_pydict(cols, schema=_OUT)

    return walk


def spark_walk(spark: SparkSession, lake_dir: str | Path, run_id: str):
    """A walk for :func:`tlog.analyze.frames.attribute_data` that runs each worker's
    device-backlog walk on Spark over the lake's ``iterations`` files of ``run_id``
    (module docstring, step 2) and assembles the :class:`RunAttribution` the local
    walk would give."""

    def walk(data: RunData, group: np.ndarray, n_groups: int) -> RunAttribution:
        snap = read_lake(lake_dir)
        base = snap.directory
        man = snap.manifests[run_id]["tables"]

        def lake_table(name: str) -> pa.Table:
            return pq.read_table(base / man[name]["file"]).append_column(
                "run_id", pa.array([run_id] * man[name]["rows"], pa.string()))

        it = data.iterations
        keys = pa.table({"stage": it["stage"].cast(pl.String).to_arrow(),
                         "rank": it["rank"].to_arrow().cast(pa.int32()),
                         "worker": it["worker"].cast(pl.String).to_arrow(),
                         "iter": it["iter"].to_arrow().cast(pa.int64()),
                         "grp": pa.array(group.astype(np.int64))})
        rows = (spark.read.parquet(str(base / man["iterations"]["file"]))
                .join(spark.createDataFrame(keys), on=[*_KEYS, "iter"], how="inner"))
        fn = _walk_worker(run_id, lake_table("runs"), lake_table("phase_layouts"), n_groups)
        out = pl.DataFrame(pl.from_arrow(
            rows.groupBy(*_KEYS).applyInArrow(fn, schema=_OUT_DDL).toArrow()))
        # back in the driver's row order (stage, rank, worker, iter)
        order = pl.DataFrame({"stage": it["stage"].cast(pl.String), "rank": it["rank"],
                              "worker": it["worker"].cast(pl.String), "iter": it["iter"]}
                             ).with_row_index("row")
        its = out.filter(pl.col("kind") == 0).join(order, on=[*_KEYS, "iter"], how="inner")
        if its.height != it.height:
            msg = (f"the lake's iterations of run {run_id!r} changed while it was diagnosed "
                   f"({its.height} walked, {it.height} loaded): diagnose it again")
            raise LakeError(msg)
        pos = its["row"].to_numpy()
        m = np.zeros((6, it.height))
        has = np.zeros(it.height, dtype=bool)
        for k in range(6):
            m[k, pos] = its[f"m{k}"].to_numpy()
        has[pos] = its["has_gpu"].to_numpy()
        ph = out.filter(pl.col("kind") == 1)
        pid = {name: i for i, name in enumerate(data.phase_names)}
        phase_keys = np.column_stack([
            ph["grp"].to_numpy(), np.array([pid[p] for p in ph["phase"].to_list()]),
            ph["cat"].to_numpy(), ph["top"].to_numpy(), ph["counted"].to_numpy(),
        ]).astype(np.int64) if ph.height else np.empty((0, 5), dtype=np.int64)
        phase_sums = (np.column_stack([ph[f"s{k}"].to_numpy() for k in range(len(PHASE_SUMS))])
                      if ph.height else np.empty((0, len(PHASE_SUMS))))
        return RunAttribution(iteration=m, iteration_has_gpu=has, phase_keys=phase_keys,
                              phase_sums=phase_sums)

    return walk


def diagnose_on_spark(spark: SparkSession, lake_dir: str | Path, run_id: str) -> Diagnosis:
    """Diagnose run ``run_id`` of a lake, its per-worker attribution on Spark
    (module docstring); the :class:`~tlog.analyze.verdict.Diagnosis` equals
    ``tlog diagnose``'s of the same run.

    Raises:
        LakeError: no lake there (tlog.queries.lake.read_lake).
        RunNotFoundError: the lake has no such run.
        LakeError: the run's files changed while it was diagnosed (a publish).
    """
    from tlog.queries.lake_sql import duckdb_lake

    snap = read_lake(lake_dir)
    if run_id not in snap.manifests:
        raise RunNotFoundError(f"no run {run_id!r} in the lake {snap.directory}: "
                               f"'tlog publish' adds runs to it")
    con = duckdb_lake(snap)
    try:
        con.execute(f"CREATE TABLE tlog_schema AS SELECT {SCHEMA_VERSION} AS version")
        data = load_run(con, run_id, lazy_device_times=True)
        try:
            analysis = attribute_data(data, walk=spark_walk(spark, lake_dir, run_id))
        finally:
            data.close_device_times()
    finally:
        con.close()
    return diagnose_attributed(analysis)
