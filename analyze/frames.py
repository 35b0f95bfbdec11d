"""The attributed frames of a run: the public tables charts and comparisons read.

Two frames, stable names and columns (docs/DIAGNOSIS.md "Frames"):

:func:`attributed_iterations` -- one row per iteration:
    ``run_id, rank, stage, worker, iter, ts, dur, cpu, tokens, samples,
    steady, excluded, starvation_s, backpressure_s, compute_s, sync_s,
    unaccounted_s, gpu_s`` -- seconds per category after the device-backlog
    walk (``analyze.attribution``); the five category columns sum to
    ``max(dur, sum of top-level phases)``. ``steady`` is False for warm-up and
    event-overlapping iterations, ``excluded`` says which.

:func:`attributed_phases` -- one row per (worker, phase, category):
    ``run_id, stage, rank, worker, phase, parent, category, iterations,
    host_s, gpu_s, starvation_s, backpressure_s, compute_s, sync_s,
    attributed_s, seconds_per_iter`` -- totals over the worker's steady
    iterations (all iterations with ``steady_only=False``). ``category`` is the
    host-rule category; a sync phase's drained part appears as compute on the
    phases whose device work it waited for. ``seconds_per_iter`` divides
    ``attributed_s`` by the worker's steady iteration count (not by the
    iterations that had the phase). Child phases (``parent`` set) carry host
    seconds in their own category and are not part of any total.

Both come from :func:`analyze_run`, which diagnose uses too.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from analyze.attribution import PhaseAttribution, attribute_phases, iteration_seconds
from analyze.load import RunData, load_run
from analyze.steady import steady_flags
from ingest.categories import CATEGORIES

#: Steady iterations of each worker are split into this many equal parts, in
#: ``iter`` order, for trends (``drift``): the first and the last are compared.
PARTS = 3

_PHASE_VALUES = ("host_s", "gpu_s", "starvation_s", "backpressure_s", "compute_s", "sync_s")


@dataclass
class RunAnalysis:
    """A loaded and attributed run: the inputs of every verdict.

    Attributes:
        data: the loaded run (:class:`analyze.load.RunData`).
        iterations: the attributed iteration frame (:func:`attributed_iterations`
            columns, plus ``wid``, ``ix``, ``part`` (0..PARTS-1 for steady rows,
            null otherwise), ``phase_s``, ``mem_*``).
        phases: per (worker, phase, category, part) steady totals: ``wid, pid,
            cat, part, n, host_s, gpu_s, starvation_s, backpressure_s,
            compute_s, sync_s`` (``part`` as above; ``n`` counts phase rows).
        attribution: the per-row attribution of the top-level phases.
    """

    data: RunData
    iterations: pl.DataFrame
    phases: pl.DataFrame
    attribution: PhaseAttribution


def _parts(iterations: pl.DataFrame) -> pl.Series:
    """Part (0..PARTS-1) of each steady iteration within its worker, null otherwise."""
    return (iterations.select(
        pl.when(pl.col("steady"))
        .then((pl.col("steady").cast(pl.Int64).cum_sum().over("wid") - 1) * PARTS
              // pl.col("steady").cast(pl.Int64).sum().over("wid"))
        .otherwise(None).cast(pl.Int8).alias("part"))
        .to_series())


def analyze_run(con: duckdb.DuckDBPyConnection, run_id: str) -> RunAnalysis:
    """Load, attribute and mark the steady state of one run.

    Raises:
        RunNotFoundError: no such run, or it holds no iterations.
    """
    return analyze_data(load_run(con, run_id))


def analyze_data(data: RunData) -> RunAnalysis:
    """:func:`analyze_run` for an already loaded :class:`RunData`."""
    attr = attribute_phases(data.phases)
    secs = iteration_seconds(data, attr)
    flags = steady_flags(data.iterations, data.events)
    it = pl.concat([data.iterations, flags, secs], how="horizontal")
    it = it.with_columns(part=_parts(it))

    n_phase_names = max(len(data.phase_names), 1)
    rows = data.phases
    part_it = it["part"].fill_null(-1).to_numpy().astype(np.int64)
    wid_it = it["wid"].to_numpy().astype(np.int64)
    if len(rows):
        part = part_it[rows.ix]
        keep = part >= 0
        code = ((wid_it[rows.ix] * n_phase_names + rows.pid) * 4 + rows.cat) * PARTS + part
        code = code[keep]
        values = {
            "host_s": rows.host, "gpu_s": rows.gpu, "starvation_s": attr.starvation,
            "backpressure_s": attr.backpressure, "compute_s": attr.compute, "sync_s": attr.sync,
        }
        size = int(code.max()) + 1 if len(code) else 0
        n = np.bincount(code, minlength=size)
        present = np.flatnonzero(n)
        cols = {name: np.bincount(code, weights=v[keep], minlength=size)[present]
                for name, v in values.items()}
        gpu_n = np.bincount(code, weights=rows.has_gpu[keep].astype(np.float64),
                            minlength=size)[present]
        phases = pl.DataFrame({
            "wid": (present // (PARTS * 4 * n_phase_names)).astype(np.int32),
            "pid": ((present // (PARTS * 4)) % n_phase_names).astype(np.int32),
            "cat": ((present // PARTS) % 4).astype(np.int8),
            "part": (present % PARTS).astype(np.int8),
            "n": n[present].astype(np.int64),
            **cols,
            "gpu_n": gpu_n.astype(np.int64),
        })
    else:
        phases = pl.DataFrame(schema={"wid": pl.Int32, "pid": pl.Int32, "cat": pl.Int8,
                                      "part": pl.Int8, "n": pl.Int64,
                                      **{c: pl.Float64 for c in _PHASE_VALUES},
                                      "gpu_n": pl.Int64})
    return RunAnalysis(data=data, iterations=it, phases=phases, attribution=attr)


_ITER_COLUMNS = ("run_id", "rank", "stage", "worker", "iter", "ts", "dur", "cpu", "tokens",
                 "samples", "steady", "excluded", "starvation_s", "backpressure_s", "compute_s",
                 "sync_s", "unaccounted_s", "gpu_s")


def iteration_frame(analysis: RunAnalysis) -> pl.DataFrame:
    """The public per-iteration frame of an analysed run (module docstring)."""
    return (analysis.iterations.with_columns(run_id=pl.lit(analysis.data.run_id))
            .select(_ITER_COLUMNS))


def phase_frame(analysis: RunAnalysis, *, steady_only: bool = True) -> pl.DataFrame:
    """The public per-phase frame of an analysed run (module docstring)."""
    data = analysis.data
    if steady_only:
        stats = analysis.phases
        counts = (analysis.iterations.filter("steady").group_by("wid").agg(steady_n=pl.len()))
    else:
        whole = _whole_run_phase_totals(analysis)
        stats = whole
        counts = analysis.iterations.group_by("wid").agg(steady_n=pl.len())
    names = pl.DataFrame({"pid": np.arange(len(data.phase_names), dtype=np.int32),
                          "phase": pl.Series(data.phase_names, dtype=pl.String)})
    cats = pl.DataFrame({"cat": np.arange(len(CATEGORIES), dtype=np.int8),
                         "category": list(CATEGORIES)})
    top = (stats.group_by("wid", "pid", "cat")
           .agg(pl.col("n").sum().alias("iterations"), *[pl.col(c).sum() for c in _PHASE_VALUES],
                pl.col("gpu_n").sum())
           .join(names, on="pid").join(cats, on="cat")
           .join(data.workers, on="wid").join(counts, on="wid", how="left")
           .with_columns(parent=pl.lit(None, dtype=pl.String),
                         gpu_s=pl.when(pl.col("gpu_n") > 0).then("gpu_s").otherwise(None),
                         attributed_s=pl.sum_horizontal("starvation_s", "backpressure_s",
                                                        "compute_s", "sync_s")))
    top = top.with_columns(seconds_per_iter=pl.col("attributed_s") / pl.col("steady_n"))
    child = _child_frame(analysis, steady_only=steady_only, counts=counts)
    out = pl.concat([top.select(_PHASE_COLUMNS[1:]), child.select(_PHASE_COLUMNS[1:])],
                    how="vertical_relaxed")
    return (out.with_columns(run_id=pl.lit(data.run_id)).select(_PHASE_COLUMNS)
            .sort("stage", "rank", "worker", pl.col("attributed_s"), descending=[False, False,
                                                                                  False, True]))


_PHASE_COLUMNS = ("run_id", "stage", "rank", "worker", "phase", "parent", "category",
                  "iterations", "host_s", "gpu_s", "starvation_s", "backpressure_s",
                  "compute_s", "sync_s", "attributed_s", "seconds_per_iter")


def _whole_run_phase_totals(analysis: RunAnalysis) -> pl.DataFrame:
    rows, attr = analysis.data.phases, analysis.attribution
    wid_it = analysis.iterations["wid"].to_numpy()
    return pl.DataFrame({
        "wid": wid_it[rows.ix].astype(np.int32), "pid": rows.pid, "cat": rows.cat,
        "n": np.ones(len(rows), dtype=np.int64), "host_s": rows.host, "gpu_s": rows.gpu,
        "starvation_s": attr.starvation, "backpressure_s": attr.backpressure,
        "compute_s": attr.compute, "sync_s": attr.sync,
        "gpu_n": rows.has_gpu.astype(np.int64),
    })


def _child_frame(analysis: RunAnalysis, *, steady_only: bool, counts: pl.DataFrame
                 ) -> pl.DataFrame:
    ch = analysis.data.children
    it = analysis.iterations.select("ix", "wid", "steady")
    ch = ch.join(it, on="ix", how="inner")
    if steady_only:
        ch = ch.filter("steady")
    out = (ch.group_by("wid", "phase", "parent", "category")
           .agg(iterations=pl.len(), host_s=pl.col("host_s").sum(),
                gpu_s=pl.col("gpu_s").sum(), gpu_n=pl.col("gpu_s").count())
           .with_columns(gpu_s=pl.when(pl.col("gpu_n") > 0).then("gpu_s").otherwise(None)))
    for cat in ("starvation", "backpressure", "compute", "sync"):
        out = out.with_columns(pl.when(pl.col("category") == cat).then("host_s")
                               .otherwise(0.0).alias(f"{cat}_s"))
    return (out.with_columns(attributed_s=pl.col("host_s"))
            .join(analysis.data.workers, on="wid").join(counts, on="wid", how="left")
            .with_columns(seconds_per_iter=pl.col("attributed_s") / pl.col("steady_n"),
                          iterations=pl.col("iterations").cast(pl.Int64)))


def attributed_iterations(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per-iteration seconds by category after device-aware attribution.

    Columns (one row per iteration, sorted by stage, rank, worker, iter):
    ``run_id, rank, stage, worker, iter, ts`` (epoch s), ``dur, cpu`` (s),
    ``tokens, samples``, ``steady`` (bool), ``excluded`` (``warmup``/``event``/
    null), ``starvation_s, backpressure_s, compute_s, sync_s, unaccounted_s``
    (s), ``gpu_s`` (device seconds of top-level phases, null when unmeasured).

    Raises:
        RunNotFoundError: no such run.
    """
    return iteration_frame(analyze_run(con, run_id))


def attributed_phases(con: duckdb.DuckDBPyConnection, run_id: str, *,
                      steady_only: bool = True) -> pl.DataFrame:
    """Per (worker, phase, category) attributed seconds (module docstring).

    Raises:
        RunNotFoundError: no such run.
    """
    return phase_frame(analyze_run(con, run_id), steady_only=steady_only)
