"""The pipeline model: stages, their time shares, throughput, the bottleneck, what-if.

DESIGN.md ("Verdict"). Every figure is over steady-state iterations
(``analyze.steady``) and **time-weighted**: a share is a sum of seconds over a
sum of seconds, never a mean of per-iteration ratios.

- **Stage time base**: the sum over the stage's iterations of
  ``max(dur, sum of top-level phases)`` (``dur`` unless timers overlap), so
  the five category shares of a stage sum to 1.
- **Pipeline order**: stages that hand output on (have a backpressure phase,
  a queue put) come first, then by when their first iteration started, then
  by name. The last stage in that order is the pipeline's output.
- **Throughput**: ``iters_per_s`` is a per-worker step rate (a worker's
  steady iterations over its steady seconds, averaged over the stage's
  workers: what a training loop's it/s shows); ``tokens_per_s`` and
  ``samples_per_s`` are stage totals (the sum of the workers' rates). The
  run's figures are those of the last stage that reports the unit.
- **Bottleneck stage**: the stage whose workers wait least (lowest
  starvation + backpressure share). Its category is the largest loss
  category (starvation, backpressure, sync, unaccounted) when that takes at
  least :data:`HIGH_SHARE` of its time, else compute; the phase is the one
  contributing most seconds to that category (none for unaccounted).
- **What-if** (pipeline model, :class:`PipelineModel`): the pipeline's
  rate is the minimum over stages of the stage's rate. Busy time is
  everything but the waits caused by other logged stages: starvation counts
  as busy only in the first stage (it waits on an unlogged source, e.g. a
  data loader, whose cost it bears), backpressure only in the last. Workers
  of an independent stage each run at ``items / busy`` and their rates add
  up; workers in lockstep (a collective evens their iteration times, see
  :data:`LOCKSTEP_TOLERANCE`) share one cycle ``max(own work) + min(sync)``,
  so removing a collective's wait gains only the collective's own cost, and
  a straggler's own work sets the pace. Items are tokens when every stage
  reports tokens, else samples, else iterations. Removing or halving a phase
  removes or halves its attributed busy seconds on every worker of its stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from analyze.frames import PARTS, RunAnalysis
from analyze.load import BACKPRESSURE, COMPUTE, STARVATION, SYNC
from ingest.categories import CATEGORIES

#: A loss category taking at least this share of a stage's time decides the
#: bottleneck category. Source: XProf's input-pipeline analyzer calls a step
#: "highly input-bound" when input takes >= 20% of step time; TraceML's
#: critical level is 20% too.
HIGH_SHARE = 0.20
#: A share at or above this is worth a finding (info). Source: XProf calls
#: >= 5% input time "moderately input-bound".
MODERATE_SHARE = 0.05
#: Loss categories, in the order ties are broken.
LOSS_CATEGORIES = ("starvation", "backpressure", "sync", "unaccounted")
#: How many phases each stage lists in ``top_phases``; how many what-ifs.
TOP_PHASES = 5
TOP_WHAT_IF = 3

_CAT_COLS = tuple(f"{c}_s" for c in CATEGORIES)
_CODE_COL = {STARVATION: "starvation_s", BACKPRESSURE: "backpressure_s", COMPUTE: "compute_s",
             SYNC: "sync_s"}


@dataclass
class StageStats:
    """Steady-state figures of one stage (all seconds are totals over steady iterations)."""

    stage: str
    workers: int
    iterations: int
    seconds: float                   # time base (sum of max(dur, phases))
    category_s: dict[str, float]     # seconds per category
    iters_per_s: float | None
    tokens_per_s: float | None
    samples_per_s: float | None
    first_ts: float
    top_phases: list[dict] = field(default_factory=list)
    phase_s: pl.DataFrame | None = None   # per phase: phase, category seconds (steady totals)

    @property
    def shares(self) -> dict[str, float]:
        """Share of the stage's time in each category (sums to 1)."""
        if self.seconds <= 0:
            return {c: 0.0 for c in CATEGORIES}
        return {c: self.category_s[c] / self.seconds for c in CATEGORIES}

    @property
    def wait_share(self) -> float:
        """Starvation + backpressure share."""
        s = self.shares
        return s["starvation"] + s["backpressure"]

    def top_phase(self, category: str) -> tuple[str | None, float]:
        """The phase with the most seconds in ``category`` and those seconds."""
        if category == "unaccounted" or self.phase_s is None or self.phase_s.height == 0:
            return None, 0.0
        col = f"{category}_s"
        best = self.phase_s.sort([col, "phase"], descending=[True, False]).row(0, named=True)
        if best[col] <= 0:
            return None, 0.0
        return best["phase"], float(best[col])


def _rate(num: pl.Expr, den: pl.Expr) -> pl.Expr:
    return pl.when(den > 0).then(num / den).otherwise(None)


def worker_table(analysis: RunAnalysis) -> pl.DataFrame:
    """Per-worker steady figures: wid, stage, rank, worker, n, seconds, dur, the
    category seconds, tokens, samples, cpu, cpu_dur (dur where cpu is known),
    gpu, first_ts, per-worker rates, and the medians per iteration of compute,
    starvation, sync and dur (``*_med``, for stragglers)."""
    it = analysis.steady
    base = pl.max_horizontal(pl.col("dur"), pl.col("phase_s"))
    return (it.group_by("wid", "stage", "rank", "worker")
            .agg(n=pl.len(), seconds=base.sum(), dur=pl.col("dur").sum(),
                 **{c: pl.col(c).sum() for c in _CAT_COLS},
                 tokens=pl.col("tokens").sum(), samples=pl.col("samples").sum(),
                 tokens_n=pl.col("tokens").count(), samples_n=pl.col("samples").count(),
                 cpu=pl.col("cpu").sum(), cpu_dur=pl.col("dur").filter(pl.col("cpu").is_not_null()).sum(),
                 gpu=pl.col("gpu_s").sum(), gpu_n=pl.col("gpu_s").count(),
                 first_ts=pl.col("ts").min(),
                 compute_med=pl.col("compute_s").median(),
                 starvation_med=pl.col("starvation_s").median(),
                 sync_med=pl.col("sync_s").median(), dur_med=pl.col("dur").median())
            .with_columns(iters_per_s=_rate(pl.col("n").cast(pl.Float64), pl.col("dur")),
                          tokens_per_s=pl.when(pl.col("tokens_n") > 0)
                          .then(_rate(pl.col("tokens").cast(pl.Float64), pl.col("dur"))),
                          samples_per_s=pl.when(pl.col("samples_n") > 0)
                          .then(_rate(pl.col("samples").cast(pl.Float64), pl.col("dur"))))
            .sort("stage", "rank", "worker"))


def stage_phase_seconds(analysis: RunAnalysis) -> pl.DataFrame:
    """Steady attributed seconds per (stage, phase): stage, phase, category (the
    host category with the most seconds), starvation_s .. sync_s, total_s, gpu_s."""
    names = pl.DataFrame({"pid": np.arange(len(analysis.data.phase_names), dtype=np.int32),
                          "phase": pl.Series(analysis.data.phase_names, dtype=pl.String)})
    ph = analysis.phases.join(analysis.data.workers.select("wid", "stage"), on="wid")
    cat_names = pl.DataFrame({"cat": np.arange(4, dtype=np.int8),
                              "category": list(CATEGORIES[:4])})
    host_cat = (ph.group_by("stage", "pid", "cat").agg(pl.col("host_s").sum())
                .sort("host_s", descending=True).group_by("stage", "pid", maintain_order=True)
                .first().join(cat_names, on="cat").select("stage", "pid", "category"))
    cols = ["starvation_s", "backpressure_s", "compute_s", "sync_s"]
    return (ph.group_by("stage", "pid")
            .agg(*[pl.col(c).sum() for c in cols], pl.col("host_s").sum(), pl.col("gpu_s").sum())
            .join(host_cat, on=["stage", "pid"]).join(names, on="pid")
            .with_columns(total_s=pl.sum_horizontal(*cols))
            .select("stage", "phase", "category", *cols, "total_s", "host_s", "gpu_s")
            .sort("stage", "total_s", descending=[False, True]))


def stage_stats(analysis: RunAnalysis, workers: pl.DataFrame, phase_s: pl.DataFrame
                ) -> list[StageStats]:
    """One :class:`StageStats` per stage, in pipeline order (module docstring)."""
    stages: list[StageStats] = []
    for (stage,), w in workers.group_by("stage", maintain_order=True):
        seconds = float(w["seconds"].sum())
        cat_s = {c: float(w[f"{c}_s"].sum()) for c in CATEGORIES}
        n = int(w["n"].sum())
        ips = w["iters_per_s"].drop_nulls()
        tps = w["tokens_per_s"].drop_nulls()
        sps = w["samples_per_s"].drop_nulls()
        ps = phase_s.filter(pl.col("stage") == stage)
        st = StageStats(stage=stage, workers=w.height, iterations=n, seconds=seconds,
                        category_s=cat_s,
                        iters_per_s=float(ips.mean()) if len(ips) else None,
                        tokens_per_s=float(tps.sum()) if len(tps) else None,
                        samples_per_s=float(sps.sum()) if len(sps) else None,
                        first_ts=float(w["first_ts"].min()), phase_s=ps)
        st.top_phases = [
            {"phase": r["phase"], "category": r["category"],
             "seconds_per_iter": r["total_s"] / n if n else 0.0,
             "share": r["total_s"] / seconds if seconds else 0.0}
            for r in ps.head(TOP_PHASES).iter_rows(named=True)
        ]
        stages.append(st)
    return order_stages(stages)


def order_stages(stages: list[StageStats]) -> list[StageStats]:
    """Pipeline order: stages with a backpressure phase first, then by start time, then name."""
    def key(s: StageStats) -> tuple:
        has_put = s.phase_s is not None and s.phase_s.height > 0 and \
            bool((s.phase_s["backpressure_s"] > 0).any())
        return (0 if has_put else 1, s.first_ts, s.stage)
    return sorted(stages, key=key)


@dataclass
class Bottleneck:
    """Which stage limits the run, in what category, through which phase."""

    stage: str
    category: str
    phase: str | None
    share: float                   # the category's share of the stage's time
    phase_share: float             # the phase's share (of the stage) in that category
    margin: float | None           # wait share gap to the next stage (None: one stage)
    runner_up: str | None


def find_bottleneck(stages: list[StageStats]) -> Bottleneck | None:
    """Apply DESIGN.md's bottleneck rule (module docstring) to ``stages``."""
    live = [s for s in stages if s.iterations > 0 and s.seconds > 0]
    if not live:
        return None
    ranked = sorted(live, key=lambda s: (round(s.wait_share, 12), stages.index(s)))
    best = ranked[0]
    margin = ranked[1].wait_share - best.wait_share if len(ranked) > 1 else None
    shares = best.shares
    loss = max(LOSS_CATEGORIES, key=lambda c: (shares[c], -LOSS_CATEGORIES.index(c)))
    category = loss if shares[loss] >= HIGH_SHARE else "compute"
    phase, secs = best.top_phase(category)
    return Bottleneck(stage=best.stage, category=category, phase=phase, share=shares[category],
                      phase_share=secs / best.seconds if best.seconds else 0.0, margin=margin,
                      runner_up=ranked[1].stage if len(ranked) > 1 else None)


#: Workers of a stage whose mean iteration times agree within this move in
#: lockstep (a collective evens them out; DESIGN.md "Stragglers"). Source:
#: tlog's choice; ranks of one all-reduce group agree to well under 1%.
LOCKSTEP_TOLERANCE = 0.05


@dataclass
class PipelineModel:
    """Per-iteration work of every worker and the rates the stages allow.

    ``workers`` has one row per worker: wid, stage, items (per iteration),
    own_s (busy seconds per iteration that are not sync), sync_s (sync
    seconds per iteration). ``lockstep`` names the stages whose workers move
    together (a collective): their cycle is ``max(own) + min(sync)`` (the
    last rank to arrive waits least: that wait is the collective itself);
    other stages' workers run independently at ``items / (own + sync)``.
    """

    unit: str                              # "tokens", "samples" or "iterations"
    rates: dict[str, float]                # items/s each stage could sustain
    throughput: float                      # min over stages
    limiting_stage: str
    lockstep: set[str]
    order: list[str]
    workers: pl.DataFrame

    def stage_rate(self, stage: str, own: np.ndarray, sync: np.ndarray,
                   items: np.ndarray) -> float:
        """Rate of ``stage`` for the given per-worker own/sync seconds and items."""
        if stage in self.lockstep:
            cycle = float(own.max() + sync.min())
            return float(items.sum()) / cycle if cycle > 0 else float("inf")
        busy = own + sync
        return float(np.sum(np.where(busy > 0, items / np.where(busy > 0, busy, 1.0), 0.0)))

    def throughput_with(self, stage: str, own: np.ndarray, sync: np.ndarray) -> float:
        """Pipeline throughput if ``stage``'s workers had these own/sync seconds."""
        w = self.workers.filter(pl.col("stage") == stage)
        rate = self.stage_rate(stage, own, sync, w["items"].to_numpy())
        return min([rate] + [r for s, r in self.rates.items() if s != stage])

    def arrays(self, stage: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(wid, own_s, sync_s, items) of ``stage``'s workers."""
        w = self.workers.filter(pl.col("stage") == stage)
        return (w["wid"].to_numpy(), w["own_s"].to_numpy(), w["sync_s"].to_numpy(),
                w["items"].to_numpy())


def _busy_expr(first: str, last: str) -> pl.Expr:
    """Busy seconds other than sync: compute, unaccounted, and the waits on
    unlogged neighbours (starvation of the first stage, backpressure of the last)."""
    return (pl.col("compute_s") + pl.col("unaccounted_s")
            + pl.when(pl.col("stage") == first).then(pl.col("starvation_s")).otherwise(0.0)
            + pl.when(pl.col("stage") == last).then(pl.col("backpressure_s")).otherwise(0.0))


def pipeline_model(stages: list[StageStats], workers: pl.DataFrame) -> PipelineModel | None:
    """The pipeline model of the module docstring, or None without steady data."""
    workers = workers.filter(pl.col("n") > 0)
    if not stages or workers.height == 0:
        return None
    names = [s.stage for s in stages]
    first, last = names[0], names[-1]
    if all((workers.filter(pl.col("stage") == s)["tokens_n"] > 0).all() for s in names):
        unit, items = "tokens", pl.col("tokens").cast(pl.Float64)
    elif all((workers.filter(pl.col("stage") == s)["samples_n"] > 0).all() for s in names):
        unit, items = "samples", pl.col("samples").cast(pl.Float64)
    else:
        unit, items = "iterations", pl.col("n").cast(pl.Float64)
    n = pl.col("n").cast(pl.Float64)
    per = workers.select("wid", "stage", items=items / n, own_s=_busy_expr(first, last) / n,
                         sync_s=pl.col("sync_s") / n, mean_dur=pl.col("dur") / n)
    lockstep = set()
    for stage in names:
        w = per.filter(pl.col("stage") == stage)
        if w.height >= 2 and float(w["sync_s"].sum()) > 0:
            lo, hi = float(w["mean_dur"].min()), float(w["mean_dur"].max())
            if lo > 0 and hi / lo - 1 <= LOCKSTEP_TOLERANCE:
                lockstep.add(stage)
    model = PipelineModel(unit=unit, rates={}, throughput=0.0, limiting_stage=first,
                          lockstep=lockstep, order=names, workers=per.drop("mean_dur"))
    for stage in names:
        _, own, sync, its = model.arrays(stage)
        if len(own):
            model.rates[stage] = model.stage_rate(stage, own, sync, its)
    if not model.rates:
        return None
    model.limiting_stage = min(model.rates, key=lambda s: (model.rates[s], names.index(s)))
    model.throughput = model.rates[model.limiting_stage]
    return model


def what_if(analysis: RunAnalysis, stages: list[StageStats], model: PipelineModel | None
            ) -> list[dict]:
    """Top phases by pipeline throughput gain if removed (and if halved).

    Returns:
        Up to :data:`TOP_WHAT_IF` dicts ``{stage, phase, seconds_per_iter,
        throughput_gain, throughput_gain_halved}``; a gain is a fraction
        (0.25 = 25% more throughput). Phases with no gain are left out.
    """
    if model is None or not np.isfinite(model.throughput) or model.throughput <= 0:
        return []
    first, last = model.order[0], model.order[-1]
    ph = analysis.phases.join(analysis.data.workers.select("wid", "stage"), on="wid")
    own_part = (pl.col("compute_s")
                + pl.when(pl.col("stage") == first).then(pl.col("starvation_s")).otherwise(0.0)
                + pl.when(pl.col("stage") == last).then(pl.col("backpressure_s")).otherwise(0.0))
    counts = analysis.steady.group_by("wid").agg(n=pl.len())
    per = (ph.group_by("stage", "pid", "wid").agg(own=own_part.sum(), sync=pl.col("sync_s").sum())
           .join(counts, on="wid")
           .with_columns(pl.col("own") / pl.col("n"), pl.col("sync") / pl.col("n"))
           .filter((pl.col("own") > 0) | (pl.col("sync") > 0)))
    out = []
    for (stage, pid), grp in per.group_by("stage", "pid"):
        wid, own, sync, _ = model.arrays(stage)
        pos = {w: i for i, w in enumerate(wid.tolist())}
        d_own = np.zeros(len(wid))
        d_sync = np.zeros(len(wid))
        for r in grp.iter_rows(named=True):
            if r["wid"] in pos:
                d_own[pos[r["wid"]]] = r["own"]
                d_sync[pos[r["wid"]]] = r["sync"]
        full = model.throughput_with(stage, own - d_own, sync - d_sync)
        half = model.throughput_with(stage, own - d_own / 2, sync - d_sync / 2)
        gain = full / model.throughput - 1
        if not gain > 1e-9:
            continue
        out.append({"stage": stage, "phase": analysis.data.phase_names[pid],
                    "seconds_per_iter": float((d_own + d_sync).mean()),
                    "throughput_gain": gain,
                    "throughput_gain_halved": half / model.throughput - 1})
    out.sort(key=lambda d: (-round(d["throughput_gain"], 9), -d["seconds_per_iter"],
                            d["stage"], d["phase"]))
    return out[:TOP_WHAT_IF]


def fix_gain(model: PipelineModel | None, stage: str, wid: int) -> float | None:
    """Pipeline throughput gain if worker ``wid`` of ``stage`` did its own work
    as fast as the median of its peers (a straggler brought back in line)."""
    if model is None or not model.throughput > 0:
        return None
    wids, own, sync, _ = model.arrays(stage)
    if wid not in wids.tolist() or len(wids) < 2:
        return None
    i = wids.tolist().index(wid)
    peers = np.delete(own, i)
    fixed = own.copy()
    fixed[i] = min(own[i], float(np.median(peers)))
    return model.throughput_with(stage, fixed, sync) / model.throughput - 1


def part_medians(analysis: RunAnalysis) -> pl.DataFrame:
    """Median and mean iteration time of each stage's first and last steady part
    (``PARTS`` parts per worker): stage, part, median_dur, mean_dur, n."""
    return (analysis.steady.filter(pl.col("part").is_in([0, PARTS - 1]))
            .group_by("stage", "part")
            .agg(median_dur=pl.col("dur").median(), mean_dur=pl.col("dur").mean(), n=pl.len())
            .sort("stage", "part"))
