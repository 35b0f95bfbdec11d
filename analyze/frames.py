"""The attributed frames of a run: the public tables charts and comparisons read.

:func:`attribute` ``(con, run_id) -> RunAnalysis`` loads and attributes a run
(``diagnose`` starts with it: ``Diagnosis.analysis`` is the same object). Two
frames of it, stable names and columns (docs/DIAGNOSIS.md "Frames"):

:meth:`RunAnalysis.iteration_frame` -- one row per iteration:
    ``run_id, rank, stage, worker, iter, ts, dur, cpu, tokens, samples,
    steady, excluded, starvation_s, backpressure_s, compute_s, sync_s,
    unaccounted_s, gpu_s`` -- seconds per category after the device-backlog
    walk (``analyze.attribution``); the five category columns sum to
    ``max(dur, sum of top-level phases)``. ``steady`` is False for warm-up,
    event-overlapping iterations and those of a restarted stage's attempts
    not judged, ``excluded`` says which.

:meth:`RunAnalysis.phase_frame` -- one row per (worker, phase, category):
    ``run_id, stage, rank, worker, phase, parent, category, iterations,
    host_s, gpu_s, starvation_s, backpressure_s, compute_s, sync_s,
    attributed_s, seconds_per_iter`` -- totals over the worker's steady
    iterations (all iterations with ``steady_only=False``). ``category`` is the
    host-rule category; a sync phase's drained part appears as compute on the
    phases whose device work it waited for. ``seconds_per_iter`` divides
    ``attributed_s`` by the worker's steady iteration count (not by the
    iterations that had the phase). Child phases (``parent`` set) carry host
    seconds in their own category and are not part of any total.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
from tlog.analyze.attribution import RunAttribution, attribute_run
from tlog.analyze.load import BACKPRESSURE, COMPUTE, STARVATION, SYNC, RunData, load_run
from tlog.analyze.lockstep import LockstepResult, locate_lockstep, measure_waits, pp_stages
from tlog.analyze.steady import (
    StageAttempts,
    exclude_attempts,
    find_attempts,
    steady_flags,
    worker_slices,
)

from dflash_runtime.format import CATEGORIES

#: Steady iterations of each worker are split into this many equal parts, in
#: ``iter`` order, for trends (``drift``): the first and the last are compared.
PARTS = 3

_PHASE_VALUES = ("host_s", "gpu_s", "starvation_s", "backpressure_s", "compute_s", "sync_s")


@dataclass
class RunAnalysis:
    """A loaded and attributed run: the inputs of every verdict.

    Attributes:
        data: the loaded run (:class:`analyze.load.RunData`).
        iterations: the attributed iteration frame (:meth:`iteration_frame`
            columns, plus ``wid``, ``src``, ``layout``, ``part``
            (0..PARTS-1 for steady rows, null otherwise), ``phase_s``, ``mem_*``).
        phases: steady totals of top-level phases per (worker, phase,
            category, part): ``wid, pid, cat, part, n, host_s, gpu_s, gpu_n,
            starvation_s, backpressure_s, compute_s, sync_s`` (``n`` counts
            the iterations that had the phase).
        all_phases: the same for every phase (``top`` 0 for a child) and every
            iteration (``part`` null: warm-up or event).
        slices: ``(wid, start, end)`` of each worker's rows in :attr:`iterations`
            (a worker's rows are contiguous, in ``iter`` order).
        lockstep: where the ranks of each stage wait for each other
            (:class:`analyze.lockstep.LockstepResult`); its inferred waits are
            already carved into ``sync_s`` of both frames. Only the judged
            attempt's workers of a restarted stage are matched.
        attempts: the restarted stages and the attempt each is judged on
            (:func:`analyze.steady.find_attempts`; empty without restarts).
        pp_stages: the pipeline-parallel stages (:func:`analyze.lockstep.pp_stages`:
            every rank logged point-to-point waits); no rank alignment is
            inferred for them (``analyze.pp``).
    """

    data: RunData
    iterations: pl.DataFrame
    phases: pl.DataFrame
    all_phases: pl.DataFrame
    slices: list[tuple[int, int, int]]
    lockstep: LockstepResult | None = None
    attempts: list[StageAttempts] = field(default_factory=list)
    pp_stages: frozenset[str] = frozenset()
    _steady: pl.DataFrame | None = None
    #: ``analyze.system.steady_samples``'s result, computed once
    _steady_samples: pl.DataFrame | None = None

    @property
    def steady(self) -> pl.DataFrame:
        """The steady-state rows of :attr:`iterations` (computed once)."""
        if self._steady is None:
            self._steady = self.iterations.filter("steady")
        return self._steady

    def iteration_frame(self) -> pl.DataFrame:
        """Per-iteration seconds by category after device-aware attribution.

        Columns (one row per iteration, sorted by stage, rank, worker, iter):
        ``run_id, rank, stage, worker, iter, ts`` (epoch s), ``dur, cpu`` (s),
        ``tokens, samples``, ``steady`` (bool), ``excluded`` (``warmup``/``event``/
        ``attempt``/null), ``starvation_s, backpressure_s, compute_s, sync_s,
        unaccounted_s`` (s), ``gpu_s`` (device seconds of top-level phases, null
        when unmeasured).
        """
        return _iteration_frame(self)

    def phase_frame(self, *, steady_only: bool = True) -> pl.DataFrame:
        """Attributed seconds per (worker, phase, category), over the steady
        iterations (every iteration with ``steady_only=False``); columns in
        the module docstring."""
        return _phase_frame(self, steady_only=steady_only)


def _parts(steady: np.ndarray, slices: list[tuple[int, int, int]]) -> np.ndarray:
    """Part (0..PARTS-1) of each steady iteration within its worker, -1 otherwise."""
    part = np.full(len(steady), -1, dtype=np.int8)
    for _, a, b in slices:
        m = steady[a:b]
        c = np.cumsum(m)
        total = int(c[-1]) if len(c) else 0
        if total:
            part[a:b] = np.where(m, (c - 1) * PARTS // total, -1)
    return part


def attribute(con: duckdb.DuckDBPyConnection, run_id: str, *,
              keep_device_times: bool = False, since: float | None = None) -> RunAnalysis:
    """Load, mark the steady state of, and attribute one run: the one way to
    the attributed frames (:meth:`RunAnalysis.iteration_frame`,
    :meth:`RunAnalysis.phase_frame`); ``tlog.analyze.diagnose`` starts here.

    Args:
        con: an open tlog database (read-only is enough).
        run_id: the run's id.
        keep_device_times: keep the per-phase device times in
            ``result.data.times`` after attribution (default: freed as the
            walk passes them, memory at scale; the frames hold
            every figure either way).
        since: only a window of the run, from this epoch second on
            (:func:`tlog.analyze.load.load_run`; ``tlog watch``).

    Raises:
        RunNotFoundError: no such run, or it holds no iterations (in the window).
    """
    data = load_run(con, run_id, lazy_device_times=not keep_device_times, since=since)
    try:
        return attribute_data(data, release=not keep_device_times)
    finally:
        data.close_device_times()


#: The per-worker walk of :func:`attribute_data`: ``(data, group, n_groups) ->
#: RunAttribution`` as :func:`tlog.analyze.attribution.attribute_run` (which runs
#: it in this process; tlog.queries.lake_diagnose runs it on Spark, worker by worker).
Walk = Callable[[RunData, np.ndarray, int], RunAttribution]


def attribute_data(data: RunData, *, release: bool = False, walk: Walk | None = None
                   ) -> RunAnalysis:
    """:func:`attribute` for a loaded :class:`RunData`: the steady state, the
    restarted stages' attempts and the ranks' lockstep (across workers), the
    device-backlog walk (``walk``, worker by worker; default
    :func:`tlog.analyze.attribution.attribute_run` here), then the collective
    waits carved into sync (across ranks).

    With ``release`` the per-phase device times are freed once attributed
    (:meth:`RunData.release_device_times`, memory at scale); ``walk``
    must then free them as ``attribute_run(..., release=True)`` does, or not read them."""
    flags = steady_flags(data.iterations, data.events, data.workers)
    attempts = find_attempts(data.iterations, data.workers, flags["steady"].to_numpy())
    flags = exclude_attempts(flags, data.iterations, attempts)
    it = pl.concat([data.iterations, flags], how="horizontal")
    slices = worker_slices(it["wid"].to_numpy())
    part = _parts(it["steady"].to_numpy(), slices)
    it = it.with_columns(part=pl.Series(part, dtype=pl.Int8))
    it = it.with_columns(pl.when(pl.col("part") >= 0).then("part").alias("part"))
    slots = PARTS + 1  # the last slot holds the iterations left out of the steady state
    # Collective waits found from rank alignment (analyze.lockstep), located before
    # the walk: it reads the host phase times, which the walk then frees as it
    # passes them (memory at scale). The ranks of one attempt ran
    # together; those of another attempt never did.
    left_out = {w for a in attempts for w in a.left_out}
    kept = [sl for sl in slices if sl[0] not in left_out]
    pp = pp_stages(data, it, kept)
    pending = locate_lockstep(data, it, kept, skip=pp)
    # int32: worker x part ids are small (40 MiB less at 10M iterations)
    group = it["wid"].to_numpy().astype(np.int32) * np.int32(slots) + np.where(part < 0, PARTS, part)
    if walk is None:
        ra = attribute_run(data, group, data.workers.height * slots, release=release)
    else:
        ra = walk(data, group, data.workers.height * slots)
    # DuckDB's scan of the device lists ends here (its memory limit restored).
    data.close_device_times()
    del group
    if release:
        data.release_device_times()
        data.release_host_times()
    m = ra.iteration
    unaccounted = it["dur"].to_numpy() - m[4]
    np.maximum(unaccounted, 0.0, out=unaccounted)
    # The columns are views of ``m`` (no copies: memory at scale);
    # gpu_s is null where no phase of the iteration had a device time.
    has = pa.py_buffer(np.packbits(ra.iteration_has_gpu, bitorder="little"))
    gpu_s = pa.Array.from_buffers(pa.float64(), it.height, [has, pa.py_buffer(m[5])])
    it = it.with_columns(
        starvation_s=pl.Series(m[0]), backpressure_s=pl.Series(m[1]),
        compute_s=pl.Series(m[2]), sync_s=pl.Series(m[3]),
        unaccounted_s=pl.Series(unaccounted), phase_s=pl.Series(m[4]),
        gpu_s=pl.Series(gpu_s),
    )
    del unaccounted, gpu_s, has
    keys, sums = ra.phase_keys, ra.phase_sums
    host = sums[:, 1]
    own = host - sums[:, 6]          # less what carved children took (analyze.attribution)
    cat = keys[:, 2]
    top = keys[:, 3] == 1
    part = keys[:, 0] % slots
    all_phases = pl.DataFrame({
        "wid": (keys[:, 0] // slots).astype(np.int32),
        "pid": keys[:, 1].astype(np.int32),
        "cat": cat.astype(np.int8),
        "top": top,
        "counted": keys[:, 4] == 1,
        "part": pl.Series(np.where(part == PARTS, -1, part).astype(np.int8)),
        "n": sums[:, 0].astype(np.int64),
        "host_s": host,
        "gpu_s": sums[:, 2],
        "gpu_n": sums[:, 3].astype(np.int64),
        "starvation_s": np.where(cat == STARVATION, own, 0.0),
        "backpressure_s": np.where(cat == BACKPRESSURE, own, 0.0),
        "compute_s": np.where(cat == COMPUTE, own, 0.0) + sums[:, 4],
        "sync_s": np.where(cat == SYNC, own - sums[:, 5], 0.0),
    }).with_columns(pl.when(pl.col("part") >= 0).then("part").otherwise(None).alias("part"))
    # The same (worker, phase, category, part) may come from several layouts.
    all_phases = (all_phases.group_by("wid", "pid", "cat", "top", "counted", "part")
                  .agg(pl.col("n", "gpu_n").sum(), pl.col(*_PHASE_VALUES).sum())
                  .sort("wid", "pid", "cat", "part"))
    # The inferred collective waits: carved out of the phase that holds them (or
    # out of unaccounted time) into sync.
    lock = measure_waits(pending, data, it, all_phases)
    if lock.carves:
        it, all_phases = _carve_waits(it, all_phases, lock)
    phases = (all_phases.filter(pl.col("counted") & pl.col("part").is_not_null())
              .drop("top", "counted"))
    return RunAnalysis(data=data, iterations=it, phases=phases, all_phases=all_phases,
                       slices=slices, lockstep=lock, attempts=attempts, pp_stages=pp)


def _carve_waits(it: pl.DataFrame, all_phases: pl.DataFrame, lock: LockstepResult
                 ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Move the inferred collective waits (``lock.carves``) from the phase that
    holds them (its compute) or from unaccounted time into sync, in the
    iteration frame and in the per-phase sums."""
    n = it.height
    w_phase = np.zeros(n)
    w_end = np.zeros(n)
    per_phase = []
    wid = it["wid"].to_numpy()
    part = it["part"].fill_null(-1).to_numpy()
    for rows, pid, w in lock.carves:
        if pid < 0:
            np.add.at(w_end, rows, w)
            continue
        np.add.at(w_phase, rows, w)
        per_phase.append(pl.DataFrame({"wid": wid[rows], "part": part[rows],
                                       "pid": np.full(len(rows), pid, dtype=np.int32),
                                       "w": w}))
    it = it.with_columns(
        compute_s=pl.col("compute_s") - pl.Series(w_phase),
        unaccounted_s=pl.col("unaccounted_s") - pl.Series(w_end),
        sync_s=pl.col("sync_s") + pl.Series(w_phase + w_end))
    if not per_phase:
        return it, all_phases
    sums = (pl.concat(per_phase).filter(pl.col("w") > 0)
            .with_columns(pl.when(pl.col("part") >= 0).then(pl.col("part").cast(pl.Int8))
                          .alias("part"), pl.col("wid").cast(pl.Int32))
            .group_by("wid", "pid", "part").agg(pl.col("w").sum())
            .with_columns(cat=pl.lit(COMPUTE, dtype=pl.Int8)))
    all_phases = (all_phases.join(sums, on=["wid", "pid", "cat", "part"], how="left",
                                  nulls_equal=True)
                  .with_columns(pl.col("w").fill_null(0.0))
                  .with_columns(compute_s=pl.col("compute_s") - pl.col("w"),
                                sync_s=pl.col("sync_s") + pl.col("w"))
                  .drop("w"))
    return it, all_phases


_ITER_COLUMNS = ("run_id", "rank", "stage", "worker", "iter", "ts", "dur", "cpu", "tokens",
                 "samples", "steady", "excluded", "starvation_s", "backpressure_s", "compute_s",
                 "sync_s", "unaccounted_s", "gpu_s")


def _iteration_frame(analysis: RunAnalysis) -> pl.DataFrame:
    """:meth:`RunAnalysis.iteration_frame`."""
    it = analysis.iterations
    key = pl.col("wid").cast(pl.Int64) * (1 << 40) + pl.col("iter")
    if not it.select(key.is_sorted()).item():
        it = it.sort("wid", "iter")  # workers are numbered in (stage, rank, worker) order
    return it.with_columns(pl.col("stage", "worker", "excluded").cast(pl.String),
                           run_id=pl.lit(analysis.data.run_id)).select(_ITER_COLUMNS)


_PHASE_COLUMNS = ("run_id", "stage", "rank", "worker", "phase", "parent", "category",
                  "iterations", "host_s", "gpu_s", "starvation_s", "backpressure_s",
                  "compute_s", "sync_s", "attributed_s", "seconds_per_iter")


def _phase_frame(analysis: RunAnalysis, *, steady_only: bool) -> pl.DataFrame:
    """:meth:`RunAnalysis.phase_frame`."""
    data = analysis.data
    stats = analysis.all_phases
    its = analysis.iterations
    if steady_only:
        stats = stats.filter(pl.col("part").is_not_null())
        its = its.filter("steady")
    counts = its.group_by("wid").agg(steady_n=pl.len())
    names = pl.DataFrame({"pid": np.arange(len(data.phase_names), dtype=np.int32),
                          "phase": pl.Series(data.phase_names, dtype=pl.String)})
    cats = pl.DataFrame({"cat": np.arange(len(CATEGORIES), dtype=np.int8),
                         "category": list(CATEGORIES)})
    out = (stats.group_by("wid", "pid", "cat", "top")
           .agg(pl.col("n").sum().alias("iterations"), pl.col("gpu_n").sum(),
                *[pl.col(c).sum() for c in _PHASE_VALUES])
           .join(names, on="pid").join(cats, on="cat")
           .join(data.workers, on="wid").join(counts, on="wid", how="left")
           .with_columns(
               parent=pl.when(pl.col("top")).then(pl.lit(None, dtype=pl.String))
               .otherwise(pl.col("phase").str.replace(r"/[^/]*$", "")),
               gpu_s=pl.when(pl.col("gpu_n") > 0).then("gpu_s").otherwise(None),
               attributed_s=pl.sum_horizontal("starvation_s", "backpressure_s", "compute_s",
                                              "sync_s"))
           .with_columns(seconds_per_iter=pl.col("attributed_s") / pl.col("steady_n")))
    return (out.with_columns(run_id=pl.lit(data.run_id)).select(_PHASE_COLUMNS)
            .sort(["stage", "rank", "worker", "attributed_s", "phase"],
                  descending=[False, False, False, True, False]))
