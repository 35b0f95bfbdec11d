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
  contributing most seconds to that category (none for unaccounted). A
  starvation verdict is followed upstream while the producer starves too
  (at least HIGH_SHARE), to the stage that waits on the external input; a
  backpressure verdict downstream likewise.
- **What-if** (pipeline model, :class:`PipelineModel`): the pipeline's
  rate is the minimum over stages of the stage's rate. Busy time is
  everything but the waits caused by other logged stages: starvation counts
  as busy only in the first stage (it waits on an unlogged source, e.g. a
  data loader, whose cost it bears), backpressure only in the last. Workers
  of an independent stage each run at ``items / busy`` and their rates add
  up; workers in lockstep (``analyze.lockstep`` found where they wait for each
  other; the :data:`LOCKSTEP_TOLERANCE` guess only where its alignment test
  could not run, :func:`pipeline_model`) share one cycle
  ``max(own work) + min(sync)``, so removing a collective's wait gains only the collective's own cost, and
  a straggler's own work sets the pace. Items are tokens when every stage
  reports tokens, else samples, else iterations. Removing or halving a phase
  removes or halves its attributed busy seconds on every worker of its stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl
from tlog.analyze.frames import PARTS, RunAnalysis
from tlog.analyze.gaps import BETWEEN_COLUMN
from tlog.analyze.load import BACKPRESSURE, COMPUTE, STARVATION, SYNC
from tlog.analyze.lockstep import matched_rows

from dflash_runtime.format import CATEGORIES

#: A loss category taking at least this share of a stage's time decides the
#: bottleneck category. Source: XProf's input-pipeline analyzer calls a step
#: "highly input-bound" when input takes >= 20% of step time; TraceML's
#: critical level is 20% too.
HIGH_SHARE = 0.20
#: A share at or above this is worth a finding (info). Source: XProf calls
#: >= 5% input time "moderately input-bound".
MODERATE_SHARE = 0.05
#: Slack for comparing a share with a threshold: shares are sums of float
#: seconds, so a share of exactly 20% may come out as 0.19999999999999998.
EPS = 1e-9
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
    #: seconds between iterations (outside ``rec.iteration()``), counted in
    #: ``category_s["unaccounted"]`` (``analyze.gaps``)
    between_s: float = 0.0

    @property
    def between_share_of_unaccounted(self) -> float:
        """Share of the stage's unaccounted seconds that lay between iterations (0..1)."""
        un = self.category_s.get("unaccounted", 0.0)
        return min(self.between_s / un, 1.0) if un > 0 else 0.0

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


def _column(it: pl.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 values (nulls as 0) and validity of a column."""
    col = it[name]
    valid = col.is_not_null().to_numpy()
    return col.fill_null(0).to_numpy().astype(np.float64, copy=False), valid


def worker_table(analysis: RunAnalysis) -> pl.DataFrame:
    """Per-worker steady figures (workers with steady iterations only).

    Columns: wid, stage, rank, worker, n (steady iterations), seconds (time
    base), dur, starvation_s .. unaccounted_s, tokens, samples, tokens_n,
    samples_n (iterations reporting them), cpu, cpu_dur (dur where cpu is
    known), gpu, gpu_n, first_ts, between_s (seconds between iterations, inside
    dur and unaccounted_s: analyze.gaps), iters_per_s, tokens_per_s, samples_per_s
    (null without the unit), and ``compute_med``, the median compute seconds
    per iteration (for stragglers). Computed with numpy over each worker's
    contiguous rows (``RunAnalysis.slices``).
    """
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    dur = it["dur"].to_numpy()
    base = np.maximum(dur, it["phase_s"].to_numpy())
    cats = {c: it[c].to_numpy() for c in _CAT_COLS}
    tokens, tokens_ok = _column(it, "tokens")
    samples, samples_ok = _column(it, "samples")
    cpu, cpu_ok = _column(it, "cpu")
    gpu, gpu_ok = _column(it, "gpu_s")
    ts = it["ts"].to_numpy()
    between = it[BETWEEN_COLUMN].to_numpy() if BETWEEN_COLUMN in it.columns else None
    rows = []
    for wid, a, b in analysis.slices:
        m = steady[a:b]
        n = int(m.sum())
        if n == 0:
            continue

        sel = slice(a, b) if n == b - a else np.flatnonzero(m) + a

        def pick(x: np.ndarray, sel: slice | np.ndarray = sel) -> np.ndarray:
            return x[sel]

        d = pick(dur)
        row = {"wid": wid, "n": n, "seconds": float(pick(base).sum()), "dur": float(d.sum())}
        for c, x in cats.items():
            row[c] = float(pick(x).sum())
        row["tokens"], row["tokens_n"] = float(pick(tokens).sum()), int(pick(tokens_ok).sum())
        row["samples"], row["samples_n"] = float(pick(samples).sum()), int(pick(samples_ok).sum())
        cpu_mask = pick(cpu_ok)
        row["cpu"], row["cpu_dur"] = float(pick(cpu).sum()), float(d[cpu_mask].sum())
        row["gpu"], row["gpu_n"] = float(pick(gpu).sum()), int(pick(gpu_ok).sum())
        row["first_ts"] = float(pick(ts).min())
        row["between_s"] = (float(pick(between).sum(dtype=np.float64)) if between is not None
                            else 0.0)
        row["compute_med"] = float(np.median(pick(cats["compute_s"])))
        total = row["dur"]
        row["iters_per_s"] = n / total if total > 0 else None
        row["tokens_per_s"] = row["tokens"] / total if total > 0 and row["tokens_n"] else None
        row["samples_per_s"] = (row["samples"] / total if total > 0 and row["samples_n"]
                                else None)
        rows.append(row)
    ints = {"wid": pl.Int32, "n": pl.Int64, "tokens_n": pl.Int64, "samples_n": pl.Int64,
            "gpu_n": pl.Int64}
    floats = ("seconds", "dur", *_CAT_COLS, "tokens", "samples", "cpu", "cpu_dur", "gpu",
              "first_ts", "between_s", "compute_med", "iters_per_s", "tokens_per_s", "samples_per_s")
    schema = {**ints, **{c: pl.Float64 for c in floats}}
    frame = (pl.DataFrame(rows, schema_overrides=schema) if rows
             else pl.DataFrame(schema=schema))
    return (analysis.data.workers.join(frame, on="wid", how="inner")
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
                        first_ts=float(w["first_ts"].min()), phase_s=ps,
                        between_s=float(w["between_s"].sum()))
        # waiting_s_per_iter: the sync seconds of a phase of another category (a
        # collective wait found inside it, docs/DIAGNOSIS.md section 1), part of
        # seconds_per_iter
        st.top_phases = [
            {"phase": r["phase"], "category": r["category"],
             "seconds_per_iter": r["total_s"] / n if n else 0.0,
             "share": r["total_s"] / seconds if seconds else 0.0,
             "waiting_s_per_iter": (r["sync_s"] / n if n and r["category"] != "sync"
                                    else 0.0)}
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
    seen_from: str | None = None   # the stage that waits least, when the wait was followed
                                   # upstream (starvation) or downstream (backpressure)


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
    category = loss if shares[loss] >= HIGH_SHARE - EPS else "compute"
    waited_on = None
    if category in ("starvation", "backpressure"):
        # Follow the wait to its source: a starved stage whose producer starves too
        # waits, through it, on the input upstream of every logged stage (and a held
        # stage whose consumer is held too, on the sink downstream of them all).
        step = -1 if category == "starvation" else 1
        i = stages.index(best)
        while 0 <= i + step < len(stages) and \
                stages[i + step].shares[category] >= HIGH_SHARE - EPS:
            i += step
        if stages[i] is not best:
            waited_on, best = best.stage, stages[i]
            shares = best.shares
    runner_up = ranked[1].stage if len(ranked) > 1 else None
    if waited_on is not None:
        # which stage waits least no longer matters: both wait on the same source
        margin = runner_up = None
    phase, secs = best.top_phase(category)
    return Bottleneck(stage=best.stage, category=category, phase=phase, share=shares[category],
                      phase_share=secs / best.seconds if best.seconds else 0.0, margin=margin,
                      runner_up=runner_up, seen_from=waited_on)


#: Workers of a stage whose mean iteration times agree within this move in
#: lockstep (a collective evens them out; DESIGN.md "Stragglers"). Source:
#: tlog's choice; ranks of one all-reduce group agree to well under 1%.
LOCKSTEP_TOLERANCE = 0.05


@dataclass
class PipelineModel:
    """Per-iteration work of every worker and the rates the stages allow.

    ``workers`` has one row per worker: wid, stage, items (per iteration),
    own_s (busy seconds per iteration that are not sync), sync_s (sync
    seconds per iteration), means over its steady iterations. ``lockstep``
    names the stages whose workers move together (a collective); ``steps``
    holds, for each of them, the per-iteration ``(own, sync)`` matrices
    (workers x iterations steady on every worker, matched by ``iter``, rows in
    :meth:`arrays` order). A lockstep stage's cycle is the **lockstep model**
    (:func:`lockstep_cycle`): each iteration proceeds at its slowest rank's
    pace, ``max_r own + min_r sync`` (the last rank to arrive waits least: that
    wait is the collective itself). Other stages' workers run independently
    at ``items / (own + sync)``.
    """

    unit: str                              # "tokens", "samples" or "iterations"
    rates: dict[str, float]                # items/s each stage could sustain
    throughput: float                      # min over stages
    limiting_stage: str
    lockstep: set[str]
    order: list[str]
    workers: pl.DataFrame
    counts: pl.DataFrame                   # wid, n: steady iterations per worker
    steps: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    #: per lockstep stage, the parts of ``own`` a straggler fix can change
    #: (:func:`fix_gain`): ``{"compute": ..., "input": ...}`` seconds, each
    #: (workers, iterations) as ``steps``; "input" is 0 where starvation is a
    #: wait on a logged stage (not in ``own``).
    parts: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def stage_rate(self, stage: str, own: np.ndarray, sync: np.ndarray,
                   items: np.ndarray) -> float:
        """Rate of ``stage`` for the given per-worker own/sync seconds (means per
        iteration) and items. For a lockstep stage with per-iteration matrices,
        each worker's change from its mean now shifts its row of them (exact for a
        phase of constant length; removing a phase removes its mean)."""
        if stage in self.lockstep:
            if stage in self.steps:
                _, base_own, base_sync, _ = self.arrays(stage)
                o, y = self.steps[stage]
                cycle = lockstep_cycle(o + (own - base_own)[:, None],
                                       y + (sync - base_sync)[:, None])
            else:
                cycle = float(own.max() + sync.min())
            return float(items.sum()) / cycle if cycle > 0 else float("inf")
        busy = own + sync
        return float(np.sum(np.where(busy > 0, items / np.where(busy > 0, busy, 1.0), 0.0)))

    def throughput_with(self, stage: str, own: np.ndarray, sync: np.ndarray) -> float:
        """Pipeline throughput if ``stage``'s workers had these own/sync seconds."""
        return self.limit_with(stage, own, sync)[0]

    def limit_with(self, stage: str, own: np.ndarray, sync: np.ndarray) -> tuple[float, str]:
        """``(throughput, limiting stage)`` if ``stage``'s workers had these own/sync
        seconds: the slowest stage then (ties: the earliest in pipeline order)."""
        w = self.workers.filter(pl.col("stage") == stage)
        return self._limit(stage, self.stage_rate(stage, own, sync, w["items"].to_numpy()))

    def _limit(self, stage: str, rate: float) -> tuple[float, str]:
        rates = dict(self.rates)
        rates[stage] = rate
        limit = min(rates, key=lambda s: (rates[s], self.order.index(s)))
        return rates[limit], limit

    def arrays(self, stage: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(wid, own_s, sync_s, items) of ``stage``'s workers."""
        w = self.workers.filter(pl.col("stage") == stage)
        return (w["wid"].to_numpy(), w["own_s"].to_numpy(), w["sync_s"].to_numpy(),
                w["items"].to_numpy())


def lockstep_cycle(own: np.ndarray, sync: np.ndarray) -> float:
    """Mean cycle of a lockstep stage: ``mean_i(max_r own[r, i] + min_r sync[r, i])``
    (seconds). ``own``, ``sync``: (workers, iterations) seconds. docs/DIAGNOSIS.md
    section 5: the one definition every lockstep gain uses."""
    if own.shape[1] == 0:
        return float(own.max(initial=0.0) + sync.min(initial=0.0))
    return float((own.max(axis=0) + sync.min(axis=0)).mean())


def _busy_expr(first: str, last: str) -> pl.Expr:
    """Busy seconds other than sync: compute, unaccounted, and the waits on
    unlogged neighbours (starvation of the first stage, backpressure of the last)."""
    return (pl.col("compute_s") + pl.col("unaccounted_s")
            + pl.when(pl.col("stage") == first).then(pl.col("starvation_s")).otherwise(0.0)
            + pl.when(pl.col("stage") == last).then(pl.col("backpressure_s")).otherwise(0.0))


def lockstep_steps(analysis: RunAnalysis, wids: list[int], first: str, last: str
                   ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """Per-iteration ``(own, sync, parts)`` seconds, (len(wids), n), of the
    iterations steady on every worker of ``wids``, matched by ``iter``; None
    with none. ``parts``: the ``compute`` (compute + unaccounted) and ``input``
    (starvation counted in ``own``) parts of ``own`` (:attr:`PipelineModel.parts`)."""
    bounds = {wid: (a, b) for wid, a, b in analysis.slices}
    if any(w not in bounds for w in wids):
        return None
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    iters = it["iter"].to_numpy()
    keep = [np.flatnonzero(steady[a:b]) + a for a, b in (bounds[w] for w in wids)]
    common, idx = matched_rows([iters[k] for k in keep])
    if len(common) == 0:
        return None
    rows = np.stack([k[i] for k, i in zip(keep, idx, strict=True)])
    stage = str(it["stage"][int(rows[0, 0])])
    compute = it["compute_s"].to_numpy()[rows] + it["unaccounted_s"].to_numpy()[rows]
    own = compute
    starved = np.zeros_like(compute)
    if stage == first:
        starved = it["starvation_s"].to_numpy()[rows]
        own = own + starved
    if stage == last:
        own = own + it["backpressure_s"].to_numpy()[rows]
    return own, it["sync_s"].to_numpy()[rows], {"compute": compute, "input": starved}


def pipeline_model(stages: list[StageStats], workers: pl.DataFrame,
                   analysis: RunAnalysis | None = None) -> PipelineModel | None:
    """The pipeline model of the module docstring, or None without steady data.

    A stage is in lockstep when ``analysis.lockstep`` found where its ranks
    wait for each other, or when it is pipeline-parallel (``analysis.pp_stages``). When the alignment test ran on the stage
    (``LockstepResult.tested``) and found nothing, its workers are independent.
    Only when the test could not run (too few iterations logged by every rank,
    a worker without phases, or no ``analysis``) are the workers taken as
    lockstep when their mean iteration times agree within
    :data:`LOCKSTEP_TOLERANCE` and they have sync time.
    """
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
    found = analysis.lockstep if analysis is not None else None
    lockstep = set()
    for stage in names:
        w = per.filter(pl.col("stage") == stage)
        if w.height < 2:
            continue
        if found is not None and found.of(stage) is not None:
            lockstep.add(stage)
        elif analysis is not None and stage in analysis.pp_stages:
            lockstep.add(stage)  # pipeline ranks finish each step together (analyze.pp)
        elif found is not None and stage in found.tested:
            continue    # the alignment test ran and found none: independent workers
        elif float(w["sync_s"].sum()) > 0:
            lo, hi = float(w["mean_dur"].min()), float(w["mean_dur"].max())
            if lo > 0 and hi / lo - 1 <= LOCKSTEP_TOLERANCE:
                lockstep.add(stage)
    model = PipelineModel(unit=unit, rates={}, throughput=0.0, limiting_stage=first,
                          lockstep=lockstep, order=names, workers=per.drop("mean_dur"),
                          counts=workers.select("wid", "n"))
    if analysis is not None:
        for stage in lockstep:
            wids = per.filter(pl.col("stage") == stage)["wid"].to_list()
            steps = lockstep_steps(analysis, wids, first, last)
            if steps is not None:
                model.steps[stage] = steps[:2]
                model.parts[stage] = steps[2]
    for stage in names:
        _, own, sync, its = model.arrays(stage)
        if len(own):
            model.rates[stage] = model.stage_rate(stage, own, sync, its)
    if not model.rates:
        return None
    model.limiting_stage = min(model.rates, key=lambda s: (model.rates[s], names.index(s)))
    model.throughput = model.rates[model.limiting_stage]
    return model


def _free_rates(own: np.ndarray, sync: np.ndarray, items: np.ndarray) -> np.ndarray:
    """:meth:`PipelineModel.stage_rate` of a stage whose workers run independently,
    for each row of ``own``/``sync`` (cases x workers, seconds per iteration), after
    a phase is taken out: a worker left with no busy time but with items to give
    no longer limits the stage (an infinite rate; the other stages then do).
    ``stage_rate`` itself, which builds the measured model, still counts such a
    worker as adding nothing (a measured worker with items and no busy time:
    its rate is unknown, and an infinite one would leave the run no throughput)."""
    busy = own + sync
    freed = (busy <= 0) & (items > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(busy > 0, items / np.where(busy > 0, busy, 1.0), 0.0)
    return np.where(freed.any(axis=1), np.inf, np.sum(rate, axis=1))


def what_if(analysis: RunAnalysis, stages: list[StageStats], model: PipelineModel | None
            ) -> list[dict]:
    """Top phases by pipeline throughput gain if removed (and if halved).

    Returns:
        Up to :data:`TOP_WHAT_IF` dicts ``{stage, phase, seconds_per_iter,
        throughput_gain, throughput_gain_halved, speedup, speedup_halved,
        limited_by, limited_by_halved}``; a gain is a fraction (0.25 = 25% more
        throughput), ``speedup`` the same as the throughput multiplier (1.25, what
        every text prints: ``1 + gain``); ``limited_by`` is the
        stage that limits the pipeline after the change (another stage when it
        caps the gain, e.g. several phases of the drafter all giving 1.08x
        because the target then limits). Phases with no gain are left out.
    """
    if model is None or not np.isfinite(model.throughput) or model.throughput <= 0:
        return []
    first, last = model.order[0], model.order[-1]
    ph = analysis.phases.join(analysis.data.workers.select("wid", "stage"), on="wid")
    own_part = (pl.col("compute_s")
                + pl.when(pl.col("stage") == first).then(pl.col("starvation_s")).otherwise(0.0)
                + pl.when(pl.col("stage") == last).then(pl.col("backpressure_s")).otherwise(0.0))
    counts = model.counts
    per = (ph.group_by("stage", "pid", "wid").agg(own=own_part.sum(), sync=pl.col("sync_s").sum())
           .join(counts, on="wid")
           .with_columns(pl.col("own") / pl.col("n"), pl.col("sync") / pl.col("n"))
           .filter((pl.col("own") > 0) | (pl.col("sync") > 0)))
    out = []
    # One stage at a time, every phase at once: a (phases x workers) matrix of
    # the seconds each phase takes from each worker (a run whose phase names
    # carry a step number has thousands of phases: no per-phase frame work).
    for (stage,), grp in per.group_by("stage"):
        wid, own, sync, items = model.arrays(stage)
        pids, row = np.unique(grp["pid"].to_numpy(), return_inverse=True)
        pos = {w: i for i, w in enumerate(wid.tolist())}
        col = np.array([pos.get(w, -1) for w in grp["wid"].to_list()], dtype=np.int64)
        ok = col >= 0
        d_own = np.zeros((len(pids), len(wid)))
        d_sync = np.zeros((len(pids), len(wid)))
        d_own[row[ok], col[ok]] = grp["own"].to_numpy()[ok]
        d_sync[row[ok], col[ok]] = grp["sync"].to_numpy()[ok]
        if stage in model.lockstep:
            rates = [model.stage_rate(stage, own - d_own[i], sync - d_sync[i], items)
                     for i in range(len(pids))]
            rates_half = [model.stage_rate(stage, own - d_own[i] / 2, sync - d_sync[i] / 2,
                                           items) for i in range(len(pids))]
        else:
            rates = _free_rates(own - d_own, sync - d_sync, items)
            rates_half = _free_rates(own - d_own / 2, sync - d_sync / 2, items)
        for i, pid in enumerate(pids.tolist()):
            full, limit = model._limit(stage, float(rates[i]))
            half, limit_half = model._limit(stage, float(rates_half[i]))
            gain = full / model.throughput - 1
            # no gain, or none to name: the phase was all the busy time of the only
            # stage, so nothing would limit the pipeline after it
            if not (gain > 1e-9 and np.isfinite(gain)):
                continue
            out.append({"stage": stage, "phase": analysis.data.phase_names[pid],
                        "seconds_per_iter": float((d_own[i] + d_sync[i]).mean()),
                        "throughput_gain": gain,
                        "throughput_gain_halved": half / model.throughput - 1,
                        "speedup": full / model.throughput,
                        "speedup_halved": half / model.throughput,
                        "limited_by": limit, "limited_by_halved": limit_half})
    out.sort(key=lambda d: (-round(d["throughput_gain"], 9), -d["seconds_per_iter"],
                            d["stage"], d["phase"]))
    return out[:TOP_WHAT_IF]


def fix_gain(model: PipelineModel | None, stage: str, wid: int,
             kind: str = "compute") -> float | None:
    """Pipeline throughput gain (a fraction) if straggler ``wid`` of ``stage``
    were brought back in line with its peers in what makes it a straggler.

    ``kind`` "compute" (its compute) or "input" (its starvation). In a
    lockstep stage with per-iteration matrices, each iteration loses the
    straggler's excess in that part over the peers' median of the same
    iteration (nothing where it is not above it), and the lockstep model
    (:func:`lockstep_cycle`) gives the new cycle: ``sum(old cycles) /
    sum(new cycles)`` for the stage. Only the excess goes: a rank whose loader
    is slow keeps its own compute, which may be slower than its peers' too
    (tests/ddp: an input straggler's forward ran 46 ms against its peer's 41;
    replacing all its work by the peer's promised 1.81x where removing the
    whole injected sleep gives at most 1.59x). Elsewhere (independent
    workers) its own seconds per iteration become the peers' median."""
    if model is None or not model.throughput > 0:
        return None
    wids, own, sync, items = model.arrays(stage)
    if wid not in wids.tolist() or len(wids) < 2:
        return None
    i = wids.tolist().index(wid)
    if stage in model.lockstep and stage in model.steps:
        o, y = model.steps[stage]
        part = model.parts.get(stage, {}).get(kind)
        fixed = o.copy()
        if part is None:
            fixed[i] = np.minimum(o[i], np.median(np.delete(o, i, axis=0), axis=0))
        else:
            excess = part[i] - np.median(np.delete(part, i, axis=0), axis=0)
            fixed[i] = o[i] - np.maximum(excess, 0.0)
        cycle = lockstep_cycle(fixed, y)
        rate = float(items.sum()) / cycle if cycle > 0 else float("inf")
        return model._limit(stage, rate)[0] / model.throughput - 1
    peers = np.delete(own, i)
    fixed = own.copy()
    fixed[i] = min(own[i], float(np.median(peers)))
    return model.throughput_with(stage, fixed, sync) / model.throughput - 1


def part_medians(analysis: RunAnalysis) -> pl.DataFrame:
    """Median and mean iteration time of each stage's first and last steady part
    (``PARTS`` parts per worker): stage, part, median_dur, mean_dur, n."""
    it = analysis.iterations
    part = it["part"].fill_null(-1).to_numpy()
    dur = it["dur"].to_numpy()
    stage_of = dict(zip(analysis.data.workers["wid"].to_list(),
                        analysis.data.workers["stage"].to_list(), strict=True))
    pieces: dict[tuple[str, int], list[np.ndarray]] = {}
    for wid, a, b in analysis.slices:
        for p in (0, PARTS - 1):
            pieces.setdefault((stage_of[wid], p), []).append(dur[a:b][part[a:b] == p])
    rows = []
    for (stage, p), chunks in sorted(pieces.items()):
        d = np.concatenate(chunks)
        if len(d):
            rows.append({"stage": stage, "part": p, "median_dur": float(np.median(d)),
                         "mean_dur": float(d.mean()), "n": len(d)})
    return pl.DataFrame(rows, schema={"stage": pl.String, "part": pl.Int64,
                                      "median_dur": pl.Float64, "mean_dur": pl.Float64,
                                      "n": pl.Int64})
