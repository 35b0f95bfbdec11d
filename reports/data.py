"""What a report reads: analyze's results for one run, gathered in one object.

Reports never attribute time themselves. Everything here comes from
:mod:`analyze` (the diagnosis, the attributed per-iteration and per-phase
frames, the run's queue samples and events) except one thin query,
:func:`phase_distribution`, for the per-iteration spread (p50/p95) of the top
phases' host time, which analyze's frames (totals per worker) do not carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from dflash_runtime.format import CATEGORIES

#: Columns of :attr:`RunReportData.iterations` that the charts read.
ITERATION_COLUMNS = (
    "stage",
    "rank",
    "worker",
    "iter",
    "ts",
    "dur",
    "steady",
    *(f"{c}_s" for c in CATEGORIES),
)

#: Columns of :attr:`RunReportData.system` (analyze's ``RunData.system.samples``, plus
#: ``stage`` from the worker's iterations and ``cpu_pct``).
SYSTEM_COLUMNS = ("stage", "worker", "ts", "iter", "cpu_pct", "ncpu", "rss_bytes", "gpu_util",
                  "cuda_allocated", "gpu_mem_used")



def empty_system() -> pl.DataFrame:
    """An empty :attr:`RunReportData.system` frame (its columns and types)."""
    return pl.DataFrame(schema={
        "stage": pl.String, "worker": pl.String, "ts": pl.Float64, "iter": pl.Int64,
        "cpu_pct": pl.Float64, "ncpu": pl.Int32, "rss_bytes": pl.Int64, "gpu_util": pl.Float64,
        "cuda_allocated": pl.Int64, "gpu_mem_used": pl.Int64})


#: Columns of :attr:`RunReportData.phases`.
PHASE_COLUMNS = ("stage", "rank", "worker", "phase", "parent", "category", "seconds_per_iter")


@dataclass
class RunReportData:
    """Everything a run report shows, from :mod:`analyze`.

    Attributes:
        run_id: the run.
        run: the ``runs`` row (``name``, ``started`` epoch s, ``world_size``,
            ``tags`` dict, ``source``, ``root``; missing ones ``None``).
        diagnosis: ``analyze.diagnose(...).to_dict()`` (the JSON of
            ``tlog diagnose --json``).
        iterations: attributed seconds per iteration (:data:`ITERATION_COLUMNS`;
            seconds, ``steady`` bool).
        phases: steady seconds per iteration of each phase on each worker
            (:data:`PHASE_COLUMNS`; ``parent`` null for top-level phases).
        phase_stats: per stage and top phase, host seconds per iteration in
            which the phase ran: ``stage, phase, category, mean_s, p50_s,
            p95_s, iterations`` (steady iterations only), in the diagnosis's
            order.
        queues: queue depth samples: ``name, ts`` (epoch s), ``depth, capacity``.
        events: ``name, ts`` (epoch s), ``dur`` (s).
        notes: remarks from loading (rows left out, ...).
        system: the run's system samples (:data:`SYSTEM_COLUMNS`): ``cpu_pct``
            (percent of one core since the worker's previous sample), ``ncpu``,
            ``rss_bytes``, ``gpu_util`` (percent), ``cuda_allocated``,
            ``gpu_mem_used`` (bytes), of the workers that have iterations (their
            ``stage``); empty when the run has none.
    """

    run_id: str
    run: dict[str, Any]
    diagnosis: dict[str, Any]
    iterations: pl.DataFrame
    phases: pl.DataFrame
    phase_stats: pl.DataFrame
    queues: pl.DataFrame
    events: pl.DataFrame
    notes: list[str] = field(default_factory=list)
    system: pl.DataFrame = field(default_factory=empty_system)

    @property
    def t0(self) -> float:
        """The run's start (epoch s): manifest ``started``, else the first iteration."""
        started = self.run.get("started")
        first = float(self.iterations["ts"].min()) if self.iterations.height else None
        if started is not None and (first is None or started <= first + 3600):
            return float(started)
        return first if first is not None else 0.0


_PHASE_STATS_SQL = """
SELECT p.stage, p.phase, any_value(p.category) AS category,
       avg(p.host_s) AS mean_s,
       quantile_cont(p.host_s, 0.5) AS p50_s,
       quantile_cont(p.host_s, 0.95) AS p95_s,
       count(*) AS iterations
FROM phases AS p
JOIN _tlog_report_wanted AS w USING (stage, phase)
ANTI JOIN _tlog_report_left_out AS o USING (rank, stage, worker, iter)
WHERE p.run_id = $run AND p.host_s IS NOT NULL
GROUP BY p.stage, p.phase
"""


def phase_distribution(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    iterations: pl.DataFrame,
    wanted: pl.DataFrame,
    left_out: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Per-iteration host time of the ``wanted`` phases: mean, p50, p95 (thin query).

    Args:
        con: the tlog database.
        run_id: the run.
        iterations: the attributed iteration frame (its ``steady`` rows are used).
        wanted: ``stage, phase`` pairs, in the order to keep.
        left_out: ``rank, stage, worker, iter`` of iterations analyze left out
            of ``iterations`` (``RunData.left_out``: impossible values), also
            left out here.

    Returns:
        ``stage, phase, category, mean_s, p50_s, p95_s, iterations`` in the
        order of ``wanted`` (pairs never seen are left out). Statistics are
        over the steady iterations in which the phase ran; p50/p95 are
        DuckDB's ``quantile_cont`` (linear interpolation).
    """
    empty = pl.DataFrame(
        schema={
            "stage": pl.String,
            "phase": pl.String,
            "category": pl.String,
            "mean_s": pl.Float64,
            "p50_s": pl.Float64,
            "p95_s": pl.Float64,
            "iterations": pl.Int64,
        }
    )
    if wanted.height == 0 or iterations.height == 0:
        return empty
    # The left-out iterations (warm-up, events) are few: an anti-join with them
    # is 2-3x faster than a join with the steady ones at 1M iterations.
    keys = ("rank", "stage", "worker", "iter")
    not_steady = iterations.filter(~pl.col("steady")).select(keys)
    if left_out is not None and left_out.height:
        not_steady = pl.concat([not_steady, left_out.select(keys).cast(not_steady.schema)])
    left_out = not_steady
    order = wanted.select("stage", "phase").with_row_index("_order")
    # A cursor of its own: the registered frames stay private to this query and
    # an unfinished result on the caller's connection is left alone.
    cur = con.cursor()
    try:
        cur.register("_tlog_report_left_out", left_out.to_arrow())
        cur.register("_tlog_report_wanted", order.to_arrow())
        got = pl.from_arrow(cur.sql(_PHASE_STATS_SQL, params={"run": run_id}).to_arrow_table())
    finally:
        cur.close()
    if not isinstance(got, pl.DataFrame) or got.height == 0:
        return empty
    return (
        got.join(order, on=["stage", "phase"])
        .sort("_order")
        .drop("_order")
        .select(empty.columns)
        .cast(empty.schema)
    )  # type: ignore[arg-type]


def top_phase_pairs(
    diagnosis: dict[str, Any], phases: pl.DataFrame, *, fallback: int = 5
) -> pl.DataFrame:
    """The phases to chart per stage: the diagnosis's ``top_phases``, in its order.

    A stage the diagnosis lists no top phases for (or a diagnosis without
    stages) gets its ``fallback`` largest top-level phases by steady seconds
    per iteration from analyze's phase frame. Returns ``stage, phase``.
    """
    pairs: list[tuple[str, str]] = []
    listed: set[str] = set()
    for stage in diagnosis.get("stages") or []:
        for top in stage.get("top_phases") or []:
            if top.get("phase") is not None:
                pairs.append((stage.get("stage"), top["phase"]))
                listed.add(stage.get("stage"))
    if phases.height:
        ranked = (
            phases.filter(pl.col("parent").is_null())
            .group_by("stage", "phase")
            .agg(pl.col("seconds_per_iter").mean().alias("_s"))
            .sort("stage", "_s", "phase", descending=[False, True, False])
        )
        for stage in ranked["stage"].unique(maintain_order=True).to_list():
            if stage not in listed:
                pairs += [
                    (stage, p)
                    for p in ranked.filter(pl.col("stage") == stage)["phase"].head(fallback)
                ]
    return pl.DataFrame(
        {"stage": [s for s, _ in pairs], "phase": [p for _, p in pairs]},
        schema={"stage": pl.String, "phase": pl.String},
    )


def system_samples(samples: pl.DataFrame, iterations: pl.DataFrame) -> pl.DataFrame:
    """The run's system samples for the system panel (:data:`SYSTEM_COLUMNS`).

    Args:
        samples: analyze's ``RunData.system.samples`` (``sys_samples`` rows).
        iterations: the attributed iteration frame: a worker's ``stage`` is the
            one of its iterations (samples of workers without iterations are
            left out).
    """
    from tlog.analyze.system import cpu_percent

    stages = iterations.select("worker", "stage").unique(subset="worker", keep="first")
    empty = empty_system()
    if samples.height == 0 or stages.height == 0:
        return empty
    got = cpu_percent(samples).join(
        stages.with_columns(pl.col("worker").cast(pl.String), pl.col("stage").cast(pl.String)),
        on="worker", how="inner")
    return got.select(SYSTEM_COLUMNS).cast(empty.schema)  # type: ignore[arg-type]


def load_report_data(
    con: duckdb.DuckDBPyConnection, run_id: str, *, diagnosis: Any | None = None
) -> RunReportData:
    """Gather a run's report data from :mod:`analyze` (one analysis pass) and one thin query.

    Args:
        con: the tlog database (read-only is enough).
        run_id: the run.
        diagnosis: an ``analyze.Diagnosis`` of this run already made (with its
            ``analysis``), e.g. by ``tlog demo``: reused instead of analysing again.

    Raises:
        RunNotFoundError: no such run, or it holds no iterations (from analyze).
    """
    from tlog.analyze import diagnose

    if diagnosis is None or diagnosis.analysis is None or diagnosis.run_id != run_id:
        diagnosis = diagnose(con, run_id)
    analysis = diagnosis.analysis
    diagnosis = diagnosis.to_dict()   # the report page reads the JSON form
    iterations = analysis.iteration_frame().select(ITERATION_COLUMNS)
    phases = analysis.phase_frame().select(PHASE_COLUMNS)
    data = analysis.data
    stats = phase_distribution(
        con, run_id, iterations, top_phase_pairs(diagnosis, phases), data.left_out
    )
    return RunReportData(
        run_id=run_id,
        run=dict(data.run),
        diagnosis=diagnosis,
        iterations=iterations,
        phases=phases,
        phase_stats=stats,
        queues=data.queues.select("name", "ts", "depth", "capacity"),
        events=data.events.select("name", "ts", "dur"),
        notes=list(dict.fromkeys([*data.notes, *(diagnosis.get("notes") or [])])),
        system=system_samples(data.system.samples, iterations),
    )
