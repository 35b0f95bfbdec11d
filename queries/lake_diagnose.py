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

import secrets
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
from tlog.queries.lake import META_DIR, LakeError, read_lake

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_KEYS = ("stage", "rank", "worker")
#: What one worker's walk sends back (one Arrow schema for both kinds of row):
#: kind 0 an iteration (``row``: its position in the driver's frame, ``m0``..``m5``,
#: ``has_gpu``), kind 1 a per-phase sum (``grp``, ``phase``, ``cat``, ``top``,
#: ``counted``, ``s0``..``s6``).
_OUT = pa.schema([
    ("kind", pa.int8()), ("row", pa.int64()),
    *[(f"m{k}", pa.float64()) for k in range(6)], ("has_gpu", pa.bool_()),
    ("grp", pa.int64()), ("phase", pa.string()), ("cat", pa.int64()), ("top", pa.int64()),
    ("counted", pa.int64()), *[(f"s{k}", pa.float64()) for k in range(len(PHASE_SUMS))],
])
_ITER_COLUMNS = ["row", *[f"m{k}" for k in range(6)], "has_gpu"]

_SPARK_TYPES = {pa.string(): "string", pa.int32(): "int", pa.int8(): "tinyint",
                pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean"}
_OUT_DDL = ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in _OUT)
#: Folder of a diagnosis' scratch files in the lake (under its ``_tlog``, which no
#: reader takes for data): where the driver and every executor can reach them.
SCRATCH_DIR = "scratch"


def _walk_worker(run_id: str, runs: pa.Table, layouts: pa.Table, n_groups: int):
    """The function each Spark task runs on one worker's rows (a closure: the run's
    ``runs`` row and phase layouts travel with it, a few KiB)."""

    def walk(rows: pa.Table) -> pa.Table:
        from tlog.ingest.db import connect

        scratch = Path(tempfile.mkdtemp(prefix="tlog-walk-"))
        try:
            con = connect(scratch / "w.duckdb")
            try:
                iterations = rows.drop_columns(["grp", "row"]).append_column(
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
        # each loaded iteration's group and driver row, by its iteration number
        r_iter = rows.column("iter").to_numpy()
        order = np.argsort(r_iter, kind="stable")
        at = order[np.searchsorted(r_iter[order], it["iter"].to_numpy())]
        group = rows.column("grp").to_numpy()[at]
        ra = attribute_run(data, group, n_groups)
        n, m = it.height, len(ra.phase_keys)
        none_n, none_m = pa.nulls(n, pa.int64()), pa.nulls(m, pa.float64())
        cols: dict[str, Any] = {
            "kind": pa.array(np.r_[np.zeros(n, np.int8), np.ones(m, np.int8)]),
            "row": pa.concat_arrays([pa.array(rows.column("row").to_numpy()[at]),
                                     pa.nulls(m, pa.int64())]),
            **{f"m{k}": pa.concat_arrays([pa.array(ra.iteration[k]), none_m])
               for k in range(6)},
            "has_gpu": pa.concat_arrays([pa.array(ra.iteration_has_gpu), pa.nulls(m, pa.bool_())]),
            "grp": pa.concat_arrays([none_n, pa.array(ra.phase_keys[:, 0].astype(np.int64))]),
            "phase": pa.concat_arrays([pa.nulls(n, pa.string()), pa.array(
                [data.phase_names[p] for p in ra.phase_keys[:, 1]], pa.string())]),
            **{name: pa.concat_arrays([none_n, pa.array(ra.phase_keys[:, c].astype(np.int64))])
               for c, name in ((2, "cat"), (3, "top"), (4, "counted"))},
            **{f"s{k}": pa.concat_arrays([pa.nulls(n, pa.float64()),
                                          pa.array(ra.phase_sums[:, k].astype(np.float64))])
               for k in range(len(PHASE_SUMS))},
        }
        return pa.Table.from_pydict(cols, schema=_OUT)

    return walk


def spark_walk(spark: SparkSession, lake_dir: str | Path, run_id: str):
    """A walk for :func:`tlog.analyze.frames.attribute_data` that runs each worker's
    device-backlog walk on Spark over the lake's ``iterations`` files of ``run_id``
    (module docstring, step 2) and assembles the :class:`RunAttribution` the local
    walk would give.

    Nothing of a row's size passes through the driver's JVM: each iteration's group
    goes to the executors as a Parquet file, and the walk's output comes back as
    Parquet files that the driver reads batch by batch into its arrays (its memory:
    the arrays, 49 bytes an iteration, and one batch). Both lie in a scratch folder
    under the lake's ``_tlog`` (:data:`SCRATCH_DIR`), removed when the walk ends."""

    def walk(data: RunData, group: np.ndarray, n_groups: int) -> RunAttribution:
        snap = read_lake(lake_dir)
        base = snap.directory
        man = snap.manifests[run_id]["tables"]

        def lake_table(name: str) -> pa.Table:
            return pq.read_table(base / man[name]["file"]).append_column(
                "run_id", pa.array([run_id] * man[name]["rows"], pa.string()))

        it = data.iterations
        scratch = base / META_DIR / SCRATCH_DIR / f"diagnose-{secrets.token_hex(8)}"
        scratch.mkdir(parents=True)
        try:
            pq.write_table(pa.table({
                "stage": it["stage"].cast(pl.String).to_arrow(),
                "rank": it["rank"].to_arrow().cast(pa.int32()),
                "worker": it["worker"].cast(pl.String).to_arrow(),
                "iter": it["iter"].to_arrow().cast(pa.int64()),
                "grp": pa.array(group.astype(np.int64)),
                "row": pa.array(np.arange(it.height, dtype=np.int64))}), scratch / "groups.parquet")
            rows = (spark.read.parquet(str(base / man["iterations"]["file"]))
                    .join(spark.read.parquet(str(scratch / "groups.parquet")),
                          on=[*_KEYS, "iter"], how="inner"))
            fn = _walk_worker(run_id, lake_table("runs"), lake_table("phase_layouts"), n_groups)
            rows.groupBy(*_KEYS).applyInArrow(fn, schema=_OUT_DDL).write.parquet(
                str(scratch / "walked"))
            return _read_walked(scratch / "walked", data, run_id)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    return walk


def _read_walked(folder: Path, data: RunData, run_id: str) -> RunAttribution:
    """The :class:`RunAttribution` from the walk's Parquet output in ``folder``, read
    a batch at a time into the driver's arrays. Raises :class:`LakeError` when the
    walk did not give every loaded iteration exactly once (the run's files changed
    while it was diagnosed)."""
    height = data.iterations.height
    m = np.zeros((6, height))
    has = np.zeros(height, dtype=bool)
    seen = np.zeros(height, dtype=bool)
    sums: list[pa.RecordBatch] = []
    walked = 0
    dataset = pq.ParquetDataset(str(folder))  # Spark's _SUCCESS and .crc files are skipped
    for fragment in dataset.fragments:
        for batch in fragment.to_batches():
            is_iter = batch.column("kind").to_numpy() == 0
            its = batch
            if not is_iter.all():
                sums.append(batch.filter(pa.array(~is_iter)))
                its = batch.filter(pa.array(is_iter))
            pos = its.column("row").to_numpy()
            for k in range(6):
                m[k, pos] = its.column(f"m{k}").to_numpy()
            has[pos] = its.column("has_gpu").to_numpy(zero_copy_only=False)
            seen[pos] = True
            walked += len(pos)
    if walked != height or not seen.all():
        msg = (f"the lake's iterations of run {run_id!r} changed while it was diagnosed "
               f"({walked} walked, {height} loaded): diagnose it again")
        raise LakeError(msg)
    ph = (pl.DataFrame(pl.from_arrow(pa.Table.from_batches(sums))) if sums
          else pl.DataFrame(schema={"grp": pl.Int64}))
    pid = {name: i for i, name in enumerate(data.phase_names)}
    phase_keys = np.column_stack([
        ph["grp"].to_numpy(), np.array([pid[p] for p in ph["phase"].to_list()]),
        ph["cat"].to_numpy(), ph["top"].to_numpy(), ph["counted"].to_numpy(),
    ]).astype(np.int64) if ph.height else np.empty((0, 5), dtype=np.int64)
    phase_sums = (np.column_stack([ph[f"s{k}"].to_numpy() for k in range(len(PHASE_SUMS))])
                  if ph.height else np.empty((0, len(PHASE_SUMS))))
    return RunAttribution(iteration=m, iteration_has_gpu=has, phase_keys=phase_keys,
                          phase_sums=phase_sums)


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
