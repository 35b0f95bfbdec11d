"""Explain a throughput change between two runs (``tlog compare``).

:func:`compare` diagnoses both runs (:func:`analyze.diagnose`) and answers:

- **How much faster or slower?** ``throughput_ratio`` = candidate / baseline,
  in tokens/s when both runs count tokens, else samples/s, else iterations/s
  (each run's figure is that of ``tlog diagnose``: its output stage, steady
  state only).
- **Is it real?** ``significant``: the change in mean steady iteration time of
  the candidate's bottleneck stage is beyond run-to-run noise. Method
  (:func:`significance`): each run's steady iterations of that stage are cut
  into :data:`MAX_BATCHES` contiguous batches per worker (fewer for short
  runs, at least :data:`MIN_BATCH_ITERS` iterations each); a batch's value is
  the mean iteration time over the batch's iterations of every worker. The
  batch means of the two runs go into a Welch t interval for the difference of
  means at :data:`CONFIDENCE` (95%). Batch means, not single iterations,
  because iteration times are autocorrelated (drift, periodic stalls, a slow
  phase of the data): treating thousands of iterations as independent would
  call every tiny drift significant (the method of non-overlapping batch
  means, Law & Kelton, *Simulation Modeling and Analysis*, ch. 9). The change
  is significant when the interval excludes 0 **and** the change is at least
  :data:`MIN_RELATIVE_CHANGE` (2%) of the baseline's iteration time.
- **What moved?** ``contributors``: for every stage and phase, the change in
  seconds per steady iteration (candidate minus baseline) and its share of
  the stage's gap. A stage's time per iteration is that of ``tlog diagnose``:
  each iteration counts ``max(dur, sum of top-level phases)``, split into the
  attributed seconds of its top-level phases (after the device-backlog walk)
  plus ``unaccounted``. A phase with children is listed by its *self* time
  (its seconds minus its children's), each child by its own, so the
  contributors of a stage add up exactly to its gap and ``share_of_gap`` sums
  to 1 per stage. The candidate's bottleneck stage comes first, then the other
  stages by the size of their gap; within a stage, contributors are sorted by
  how much of the gap they explain (largest share first).

:func:`pick_baseline` chooses the default baseline: the best earlier run (by
``started``) whose tags match the candidate's (the high-water mark).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl
from tlog.analyze.frames import iteration_frame, phase_frame
from tlog.analyze.history import RunSummary, run_rows, summarize
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.text import pct, signed_ms, signed_pct
from tlog.analyze.verdict import Diagnosis, diagnose
from tlog.ingest.categories import CATEGORIES
from tlog.ingest.errors import RunNotFoundError, TlogError, UsageError

#: Confidence level of the interval on the change in iteration time.
CONFIDENCE = 0.95
#: Batches per run for the batch-means interval (Law & Kelton recommend 10 to
#: 30 batches; 10 keeps each batch long enough to average out periodic stalls).
MAX_BATCHES = 10
#: Fewest iterations per batch; with fewer batches than MIN_BATCHES a run is
#: too short to judge (significant is then False, with the reason).
MIN_BATCH_ITERS = 3
MIN_BATCHES = 4
#: Smallest change of the bottleneck stage's mean iteration time, relative to
#: the baseline, that counts as a real change even when the interval excludes
#: 0. Source: tlog's choice, the same two-part rule as asv's ``asv compare``
#: (a statistically significant change beyond a factor), with a finer factor
#: than asv's default 10% because a training run averages thousands of
#: iterations; run-to-run differences on a shared machine stay below it.
MIN_RELATIVE_CHANGE = 0.02

_CAT_COLS = [f"{c}_s" for c in CATEGORIES]


class NoBaselineError(TlogError):
    """No earlier run matches the candidate's tags, so there is no default baseline."""


# --- statistics ------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
          + a * math.log(x) + b * math.log1p(-x))
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function with ``df`` (> 0, may be fractional) degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on
    :func:`t_cdf`; |error| < 1e-9). ``t_quantile(0.975, 10)`` is 2.2281."""
    if not 0.0 < p < 1.0:
        msg = f"p must be in (0, 1), got {p}"
        raise ValueError(msg)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return 0.5 * (lo + hi)


@dataclass
class WelchInterval:
    """Welch's t interval for ``mean(b) - mean(a)``."""

    mean_a: float
    mean_b: float
    delta: float
    low: float
    high: float
    df: float
    n_a: int
    n_b: int


def welch_interval(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE) -> WelchInterval:
    """Welch's (unequal variances) t interval for ``mean(b) - mean(a)``.

    Degrees of freedom by Welch-Satterthwaite. Needs at least 2 values per sample.
    When both samples have no spread the interval is the point ``delta``.

    Raises:
        ValueError: a sample has fewer than 2 values.
    """
    n_a, n_b = len(a), len(b)
    if n_a < 2 or n_b < 2:
        msg = "each sample needs at least 2 values"
        raise ValueError(msg)
    ma, mb = float(np.mean(a)), float(np.mean(b))
    va, vb = float(np.var(a, ddof=1)) / n_a, float(np.var(b, ddof=1)) / n_b
    delta = mb - ma
    se2 = va + vb
    if se2 <= 0.0:
        return WelchInterval(ma, mb, delta, delta, delta, math.inf, n_a, n_b)
    df = se2 * se2 / ((va * va) / (n_a - 1) + (vb * vb) / (n_b - 1))
    half = t_quantile(0.5 + confidence / 2.0, df) * math.sqrt(se2)
    return WelchInterval(ma, mb, delta, delta - half, delta + half, df, n_a, n_b)


def batch_means(frame: pl.DataFrame) -> np.ndarray:
    """Batch means of a stage's steady iteration times (module docstring).

    Args:
        frame: steady iterations of one stage: ``worker``, ``rank``, ``iter``,
            ``base_s`` (seconds per iteration).

    Returns:
        One mean per batch (seconds); empty when a worker has fewer than
        ``MIN_BATCHES * MIN_BATCH_ITERS`` steady iterations.
    """
    if frame.height == 0:
        return np.array([])
    groups = [g.sort("iter")["base_s"].to_numpy()
              for _, g in frame.group_by("rank", "worker", maintain_order=True)]
    shortest = min(len(g) for g in groups)
    k = min(MAX_BATCHES, shortest // MIN_BATCH_ITERS)
    if k < MIN_BATCHES:
        return np.array([])
    sums = np.zeros(k)
    counts = np.zeros(k)
    for g in groups:
        for j, part in enumerate(np.array_split(g, k)):
            sums[j] += part.sum()
            counts[j] += len(part)
    return sums / counts


@dataclass
class Significance:
    """Is the change in the bottleneck stage's iteration time beyond noise?

    Attributes:
        significant: the verdict (interval excludes 0 and the change is at
            least ``min_relative_change``).
        method: ``"welch_t_batch_means"``.
        confidence: the interval's confidence level.
        stage: the stage tested (the candidate's bottleneck stage).
        baseline_s_per_iter, candidate_s_per_iter: mean steady seconds per
            iteration of that stage (over batch means).
        delta_s_per_iter: candidate minus baseline (s).
        ci_low, ci_high: the interval on ``delta_s_per_iter`` (s).
        relative_change: ``delta / baseline`` (0.1 = 10% slower iterations).
        batches: ``[baseline, candidate]`` batch counts.
        df: Welch-Satterthwaite degrees of freedom.
        min_relative_change: the practical threshold applied.
        reason: one sentence saying why.
    """

    significant: bool
    method: str
    confidence: float
    stage: str | None
    baseline_s_per_iter: float | None
    candidate_s_per_iter: float | None
    delta_s_per_iter: float | None
    ci_low: float | None
    ci_high: float | None
    relative_change: float | None
    batches: list[int]
    df: float | None
    min_relative_change: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form (infinite df as None)."""
        out = asdict(self)
        if out["df"] is not None and not math.isfinite(out["df"]):
            out["df"] = None
        return out


def significance(base: pl.DataFrame, cand: pl.DataFrame, stage: str | None, *,
                 confidence: float = CONFIDENCE) -> Significance:
    """Judge the change of ``stage``'s steady iteration time (module docstring).

    Args:
        base, cand: steady iterations of each run (``stage``, ``rank``,
            ``worker``, ``iter``, ``base_s``).
        stage: the stage to test.
    """
    def empty(reason: str) -> Significance:
        return Significance(False, "welch_t_batch_means", confidence, stage, None, None, None,
                            None, None, None, [0, 0], None, MIN_RELATIVE_CHANGE, reason)

    if stage is None:
        return empty("no bottleneck stage to test (no steady iterations)")
    rows_a, rows_b = base.filter(pl.col("stage") == stage), cand.filter(pl.col("stage") == stage)
    if rows_a.height == 0 or rows_b.height == 0:
        have_a, have_b = (set(f["stage"].unique().to_list()) for f in (base, cand))
        if have_a and have_b and not have_a & have_b:
            return empty(f"not a change to test: the runs share no stage (baseline: "
                         f"{', '.join(sorted(have_a))}; candidate: {', '.join(sorted(have_b))})")
        which = "baseline" if rows_a.height == 0 else "candidate"
        return empty(f"the {which} has no steady iterations of stage {stage} to compare")
    a, b = batch_means(rows_a), batch_means(rows_b)
    if len(a) == 0 or len(b) == 0:
        which = "baseline" if len(a) == 0 else "candidate"
        return empty(f"the {which} has too few steady iterations of stage {stage} to judge "
                     f"(want {MIN_BATCHES * MIN_BATCH_ITERS} per worker)")
    w = welch_interval(a, b, confidence)
    rel = w.delta / w.mean_a if w.mean_a > 0 else None
    excludes_zero = w.low > 0 or w.high < 0
    big_enough = rel is not None and abs(rel) >= MIN_RELATIVE_CHANGE
    level = f"{confidence:.0%}"
    span = f"[{signed_ms(w.low)}, {signed_ms(w.high)}]"
    if not excludes_zero:
        reason = (f"within run-to-run noise: the {level} interval of the change in {stage}'s "
                  f"time per iteration, {span}, includes 0")
    elif not big_enough:
        reason = (f"statistically detectable but small: {stage}'s time per iteration changed "
                  f"{signed_pct(rel)}, under the {MIN_RELATIVE_CHANGE:.0%} threshold ({level} interval "
                  f"{span})")
    else:
        reason = (f"beyond run-to-run noise: {stage}'s time per iteration changed {signed_pct(rel)} "
                  f"({level} interval {span})")
    return Significance(excludes_zero and big_enough, "welch_t_batch_means", confidence, stage,
                        w.mean_a, w.mean_b, w.delta, w.low, w.high, rel, [w.n_a, w.n_b], w.df,
                        MIN_RELATIVE_CHANGE, reason)


# --- per-stage, per-phase seconds -------------------------------------------------

def steady_iterations(diag: Diagnosis) -> pl.DataFrame:
    """Steady iterations of a diagnosed run: stage, rank, worker, iter, base_s, and
    the five category seconds (``base_s`` is their sum: ``max(dur, phases)``)."""
    frame = iteration_frame(diag.analysis).filter(pl.col("steady"))
    return frame.select("stage", "rank", "worker", "iter", *_CAT_COLS,
                        base_s=pl.sum_horizontal(*_CAT_COLS))


def phase_seconds(diag: Diagnosis) -> pl.DataFrame:
    """Seconds per steady iteration of each stage's phases, additive per stage.

    Columns: ``stage``, ``phase``, ``parent``, ``category``, ``scope``
    (``phase``; ``self`` for a phase with children, whose children's seconds
    are taken out; ``child``; ``unaccounted``), ``s_per_iter``. Per stage,
    ``s_per_iter`` sums to the stage's seconds per steady iteration.
    """
    steady = steady_iterations(diag)
    counts = steady.group_by("stage").agg(n=pl.len(), unaccounted=pl.col("unaccounted_s").sum())
    phases = phase_frame(diag.analysis, steady_only=True)
    if phases.height:
        cat = (phases.group_by("stage", "phase", "category").agg(pl.col("host_s").sum())
               .sort("host_s", "category", descending=[True, False])
               .group_by("stage", "phase", maintain_order=True).first()
               .select("stage", "phase", "category"))
        per = (phases.group_by("stage", "phase")
               .agg(pl.col("parent").first(), total=pl.col("attributed_s").sum())
               .join(cat, on=["stage", "phase"], how="left"))
        kids = (per.filter(pl.col("parent").is_not_null())
                .group_by("stage", "parent").agg(children=pl.col("total").sum())
                .rename({"parent": "phase"}))
        per = (per.join(kids, on=["stage", "phase"], how="left")
               .with_columns(own=pl.col("total") - pl.col("children").fill_null(0.0),
                             scope=pl.when(pl.col("parent").is_not_null()).then(pl.lit("child"))
                             .when(pl.col("children").is_not_null()).then(pl.lit("self"))
                             .otherwise(pl.lit("phase"))))
    else:
        per = pl.DataFrame(schema={"stage": pl.String, "phase": pl.String, "parent": pl.String,
                                   "category": pl.String, "own": pl.Float64, "scope": pl.String})
    unacc = counts.select("stage", phase=pl.lit(UNACCOUNTED_PHASE), parent=pl.lit(None, pl.String),
                          category=pl.lit("unaccounted"), own=pl.col("unaccounted"),
                          scope=pl.lit("unaccounted"))
    out = pl.concat([per.select("stage", "phase", "parent", "category", "own", "scope"), unacc],
                    how="vertical_relaxed")
    return (out.join(counts.select("stage", "n"), on="stage", how="inner")
            .select("stage", "phase", "parent", "category", "scope",
                    s_per_iter=pl.col("own") / pl.col("n")))


# --- the comparison ---------------------------------------------------------------

@dataclass
class Contributor:
    """One stage and phase's part in the throughput change.

    ``delta_s_per_iter`` is candidate minus baseline seconds per steady
    iteration of the stage (positive: the candidate spends longer);
    ``share_of_gap`` is ``delta / stage gap`` (None when the stage's time
    changed by less than :data:`MIN_RELATIVE_CHANGE` of the baseline's: the
    share of a gap within noise means nothing).
    """

    stage: str
    phase: str
    category: str
    scope: str
    baseline_s_per_iter: float
    candidate_s_per_iter: float
    delta_s_per_iter: float
    share_of_gap: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass
class StageChange:
    """A stage's seconds per steady iteration in both runs, and its gap."""

    stage: str
    baseline_s_per_iter: float | None
    candidate_s_per_iter: float | None
    delta_s_per_iter: float | None
    bottleneck: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass
class Comparison:
    """The answer of :func:`compare` (``tlog compare --json`` is :meth:`to_dict`).

    Attributes:
        baseline, candidate: the run ids.
        runs: ``{"baseline": RunSummary, "candidate": RunSummary}``.
        unit: the throughput unit compared (``tokens/s``, ``samples/s`` or ``iterations/s``).
        throughput_ratio: candidate / baseline throughput (None when not comparable).
        significant: the change is beyond run-to-run noise (:class:`Significance`).
        significance: how that was judged.
        stages: per stage, seconds per iteration in both runs (bottleneck first).
        contributors: per stage and phase, in the order of the module docstring.
        baseline_choice: how the baseline was picked (None when given).
        verdict: one sentence.
    """

    baseline: str
    candidate: str
    runs: dict[str, RunSummary]
    unit: str | None
    throughput_ratio: float | None
    significant: bool
    significance: Significance
    stages: list[StageChange]
    contributors: list[Contributor]
    baseline_choice: dict[str, Any] | None = None
    verdict: str = ""
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``baseline``, ``candidate`` (run ids), ``throughput_ratio``,
        ``unit``, ``significant``, ``significance``, ``contributors``, ``stages``,
        ``runs``, ``baseline_choice``, ``verdict``."""
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "unit": self.unit,
            "throughput_ratio": self.throughput_ratio,
            "significant": self.significant,
            "significance": self.significance.to_dict(),
            "contributors": [c.to_dict() for c in self.contributors],
            "stages": [s.to_dict() for s in self.stages],
            "runs": {k: v.to_dict() for k, v in self.runs.items()},
            "baseline_choice": self.baseline_choice,
            "verdict": self.verdict,
        }


_UNITS = (("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s"),
          ("iters_per_s", "iterations/s"))


def throughput_ratio(base: dict[str, float | None], cand: dict[str, float | None]
                     ) -> tuple[str | None, float | None]:
    """The unit both runs report (tokens, else samples, else iterations per second)
    and candidate / baseline in it; ``(None, None)`` when they share none."""
    for key, unit in _UNITS:
        b, c = base.get(key), cand.get(key)
        if b is not None and c is not None:
            return unit, (c / b if b > 0 else None)
    return None, None


def _summary_of(con: duckdb.DuckDBPyConnection, run_id: str, diag: Diagnosis) -> RunSummary:
    rows = [r for r in run_rows(con) if r.run_id == run_id]
    row = rows[0] if rows else RunSummary(run_id=run_id, name=None, source=None, started=None,
                                          tags={})
    row.iterations = {"total": diag.iterations["total"], "steady": diag.iterations["steady"]}
    row.throughput = {k: diag.throughput.get(k) for k in ("iters_per_s", "tokens_per_s",
                                                          "samples_per_s")}
    row.bottleneck = ({k: diag.bottleneck.get(k) for k in ("stage", "category", "phase", "share")}
                      if diag.bottleneck else None)
    row.verdict, row.confidence = diag.verdict, diag.confidence
    return row


def compare(con: duckdb.DuckDBPyConnection, baseline: str, candidate: str, *,
            confidence: float = CONFIDENCE) -> Comparison:
    """Explain the throughput change from ``baseline`` to ``candidate`` (module docstring).

    Args:
        con: an open tlog database (read-only is enough).
        baseline, candidate: run ids.
        confidence: confidence level of the significance interval.

    Raises:
        RunNotFoundError: either run is not in the database.
        UsageError: the two ids are the same run.
    """
    if baseline == candidate:
        msg = f"baseline and candidate are the same run ({baseline!r}): compare two runs"
        raise UsageError(msg)
    d_base = diagnose(con, baseline)
    d_cand = diagnose(con, candidate)
    unit, ratio = throughput_ratio(d_base.throughput, d_cand.throughput)

    it_base, it_cand = steady_iterations(d_base), steady_iterations(d_cand)
    bn_stage = (d_cand.bottleneck or d_base.bottleneck or {}).get("stage")
    sig = significance(it_base, it_cand, bn_stage, confidence=confidence)

    stages = _stage_changes(it_base, it_cand, bn_stage)
    contributors = _contributors(phase_seconds(d_base), phase_seconds(d_cand), stages)
    out = Comparison(baseline=baseline, candidate=candidate,
                     runs={"baseline": _summary_of(con, baseline, d_base),
                           "candidate": _summary_of(con, candidate, d_cand)},
                     unit=unit, throughput_ratio=ratio, significant=sig.significant,
                     significance=sig, stages=stages, contributors=contributors,
                     diagnoses={"baseline": d_base, "candidate": d_cand})
    out.verdict = comparison_sentence(out)
    return out


def _stage_changes(it_base: pl.DataFrame, it_cand: pl.DataFrame, bn_stage: str | None
                   ) -> list[StageChange]:
    def means(frame: pl.DataFrame) -> dict[str, float]:
        return {r["stage"]: r["m"] for r in frame.group_by("stage").agg(
            m=pl.col("base_s").mean()).iter_rows(named=True)}
    mb, mc = means(it_base), means(it_cand)
    out = []
    for stage in sorted(set(mb) | set(mc)):
        b, c = mb.get(stage), mc.get(stage)
        delta = (c or 0.0) - (b or 0.0) if (b is not None or c is not None) else None
        out.append(StageChange(stage, b, c, delta, stage == bn_stage))
    out.sort(key=lambda s: (not s.bottleneck, -abs(s.delta_s_per_iter or 0.0), s.stage))
    return out


#: Gaps smaller than this (seconds per iteration) have no meaningful shares.
_TINY_GAP = 1e-12


def _contributors(base: pl.DataFrame, cand: pl.DataFrame, stages: list[StageChange]
                  ) -> list[Contributor]:
    keys = ["stage", "phase"]
    both = (base.rename({"s_per_iter": "b", "category": "cat_b", "scope": "scope_b"})
            .drop("parent")
            .join(cand.rename({"s_per_iter": "c", "category": "cat_c", "scope": "scope_c"})
                  .drop("parent"), on=keys, how="full", coalesce=True))
    order = {s.stage: k for k, s in enumerate(stages)}
    # A stage whose time moved by less than MIN_RELATIVE_CHANGE has no gap to share out:
    # shares of a gap within noise (say +0.02 ms) are meaningless ratios like 300%.
    gaps = {s.stage: (s.delta_s_per_iter if s.delta_s_per_iter is not None and abs(
        s.delta_s_per_iter) >= MIN_RELATIVE_CHANGE * (s.baseline_s_per_iter or 0.0) else None)
        for s in stages}
    out: list[Contributor] = []
    for r in both.iter_rows(named=True):
        b, c = r["b"] or 0.0, r["c"] or 0.0
        delta = c - b
        gap = gaps.get(r["stage"])
        share = delta / gap if gap is not None and abs(gap) > _TINY_GAP else None
        out.append(Contributor(stage=r["stage"], phase=r["phase"],
                               category=r["cat_c"] or r["cat_b"], scope=r["scope_c"] or r["scope_b"],
                               baseline_s_per_iter=b, candidate_s_per_iter=c,
                               delta_s_per_iter=delta, share_of_gap=share))

    def key(x: Contributor) -> tuple:
        gap = gaps.get(x.stage) or 0.0
        explains = x.delta_s_per_iter * (1.0 if gap >= 0 else -1.0)
        return (order.get(x.stage, len(order)), round(-explains if abs(gap) > _TINY_GAP
                else -abs(x.delta_s_per_iter), 15), x.phase)
    out.sort(key=key)
    return out


def comparison_sentence(c: Comparison) -> str:
    """One sentence: how much faster or slower, whether it is real, what moved most."""
    base, cand = c.baseline, c.candidate
    if c.throughput_ratio is None:
        head = f"{cand} vs {base}: throughput not comparable (no unit both runs report)"
    else:
        change = c.throughput_ratio - 1.0
        if abs(change) < 0.0005:
            head = f"{cand} is about as fast as {base} ({c.unit} ratio {c.throughput_ratio:.3f})"
        else:
            how = "faster" if change > 0 else "slower"
            head = (f"{cand} is {pct(abs(change))} {how} than {base} "
                    f"({c.unit} ratio {c.throughput_ratio:.3f})")
    head += "; " + c.significance.reason
    top = next((x for x in c.contributors if x.share_of_gap is not None
                and x.delta_s_per_iter != 0), None)
    if c.significant and top is not None:
        head += (f". Most of the gap: {top.stage} {top.phase} "
                 f"{signed_ms(top.delta_s_per_iter)}/iter "
                 f"({pct(top.share_of_gap)} of the stage's change)")
    return head + "."


# --- the default baseline ---------------------------------------------------------

#: Tags that name *the change under test* or where it ran, not the configuration:
#: a default baseline is looked for across them (the high-water mark of a config is
#: usually set by another commit, branch or node). The shim writes ``git_sha``,
#: ``git_branch``, ``host``, ``python`` and ``torch`` (dflash_runtime.manifest);
#: the rest are common spellings. ``--match`` can still name any of them.
IDENTITY_TAGS: frozenset[str] = frozenset({
    "git_sha", "git_commit", "git_branch", "sha", "commit", "branch",
    "host", "hostname", "node", "python", "torch", "date", "user",
})

def _kinds_of_run(con: duckdb.DuckDBPyConnection) -> dict[str, tuple]:
    """What makes two runs the same program, per run: its source (``jsonl`` or
    ``kineto``), the stages it has iterations of, and its top-level phase names."""
    stages = dict(con.execute("SELECT run_id, list(DISTINCT stage ORDER BY stage) "
                              "FROM iterations GROUP BY run_id").fetchall())
    phases = dict(con.execute("SELECT run_id, list(DISTINCT phase ORDER BY phase) "
                              "FROM phase_layouts WHERE parent IS NULL "
                              "GROUP BY run_id").fetchall())
    sources = dict(con.execute("SELECT run_id, source FROM runs").fetchall())
    return {r: (sources.get(r) or "jsonl", tuple(stages.get(r) or ()), tuple(phases.get(r) or ()))
            for r in set(stages) | set(sources)}


def _tag_text(value: Any) -> str:
    """A tag value as ``tlog runs --tag`` reads it (``->>``): a string as is,
    anything else as its JSON text (``true``, ``8``, ``8.0``)."""
    return value if isinstance(value, str) else json.dumps(value)


def pick_baseline(con: duckdb.DuckDBPyConnection, candidate: str, *,
                  match: Sequence[str] | None = None) -> tuple[str, dict[str, Any]]:
    """The best earlier run of the same kind as the candidate (its high-water mark).

    Earlier: ``started`` before the candidate's. Of the same kind: the same
    source and stages (a run of another pipeline is never a default
    baseline), and matching tags: on the keys in ``match``, each of which both
    runs must have with equal values (as ``tlog runs --tag`` reads them);
    without ``match``, on every tag key the two runs share except
    :data:`IDENTITY_TAGS` (commit, branch, host, versions: what a comparison
    looks across), at least one of them. A candidate with no such tags (the
    shim's bare run.json, a profiler trace) matches runs with the same
    top-level phase names instead: the same program.
    Best: highest steady tokens/s; runs without tokens come after, by
    samples/s, then by iterations/s (each from ``tlog diagnose``).

    Returns:
        ``(run_id, choice)`` where ``choice`` says how: ``match`` (keys or
        ``"shared"``), ``candidates`` (ids considered), ``throughput``.

    Raises:
        RunNotFoundError: the candidate is not in the database.
        UsageError: ``match`` names a tag the candidate does not have.
        NoBaselineError: no earlier run matches (the message says what blocked
            each kind of run and which ``--match`` keys would admit one).
    """
    rows = {r.run_id: r for r in run_rows(con)}
    me = rows.get(candidate)
    if me is None:
        msg = f"no run {candidate!r} in the database: 'tlog runs' lists the run ids"
        raise RunNotFoundError(msg)
    keys = [k for k in (match or []) if k]
    missing = [k for k in keys if k not in me.tags]
    if missing:
        have = ", ".join(sorted(me.tags)) or "none"
        msg = f"run {candidate!r} has no tag {missing[0]!r} to match on (its tags: {have})"
        raise UsageError(msg)
    if me.started is None:
        msg = f"run {candidate!r} has no start time, so no run is earlier; name a baseline"
        raise NoBaselineError(msg)
    own = [k for k in me.tags if k not in IDENTITY_TAGS]

    def differing(other: RunSummary) -> list[str]:
        """The match keys on which ``other`` differs from the candidate (or lacks)."""
        use = keys or [k for k in own if k in other.tags]
        if not keys and own and not use:
            return list(own)         # shares no tag at all: another experiment
        return [k for k in use if k not in other.tags
                or _tag_text(other.tags[k]) != _tag_text(me.tags[k])]

    kinds = _kinds_of_run(con)
    source, stages, phases = kinds.get(candidate, ("jsonl", (), ()))
    by_phases = not keys and not own
    before = [r for r in rows.values()
              if r.run_id != candidate and r.started is not None and r.started < me.started]
    alike = [r for r in before if kinds.get(r.run_id, ("", (), ()))[:2] == (source, stages)
             and (not by_phases or kinds[r.run_id][2] == phases)]
    earlier = [r for r in alike if not differing(r)]
    scored = [summarize(con, r) for r in earlier]
    scored = [r for r in scored if r.iterations["steady"] > 0]
    if not scored:
        raise NoBaselineError(_no_baseline_message(candidate, me.tags, keys, before, alike,
                                                   earlier, differing, list(stages), by_phases))
    best = max(scored, key=lambda r: (r.rank_key, -(r.started or 0.0)))
    choice = {"auto": True, "match": keys or ("phases" if by_phases else "shared"),
              "candidates": [r.run_id for r in scored], "throughput": dict(best.throughput)}
    return best.run_id, choice


def _no_baseline_message(candidate: str, tags: dict[str, Any], keys: list[str],
                         before: list[RunSummary], alike: list[RunSummary],
                         matched: list[RunSummary], differing: Any,
                         stages: list[str], by_phases: bool) -> str:
    """One line saying why no earlier run is a baseline: none earlier, none
    with the same stages, or which match keys blocked them (with the
    candidate's and the earlier runs' values) and which keys would admit one."""
    name_one = f"tlog compare BASELINE {candidate}"
    if not before:
        return f"no earlier run matches {candidate!r}: no run started before it; name one: {name_one}"
    if not alike:
        what = "source, stages and phases" if by_phases else "source and stages"
        extra = ("; it has no configuration tags to match on, so only the same program "
                 "(its phase names) is looked for" if by_phases else "")
        return (f"no earlier run matches {candidate!r}: none has its {what} "
                f"(stages {', '.join(stages) or 'none'}){extra}; name one: {name_one}")
    if matched:
        ids = ", ".join(r.run_id for r in matched)
        return (f"no earlier run matches {candidate!r}: the matching runs ({ids}) have no "
                f"steady-state iterations; name one: {name_one}")
    values: dict[str, set[str]] = {}
    for r in alike:
        for k in differing(r):
            values.setdefault(k, set()).add(_tag_text(r.tags[k]) if k in r.tags else "(none)")
    blocking = sorted(values)
    on = ", ".join(keys) if keys else "the tags they share"
    why = "; ".join(f"{k} ({candidate}: {_tag_text(tags[k])}; earlier: "
                    f"{', '.join(sorted(values[k]))})" for k in blocking)
    # each key on which some earlier run of its kind agrees: --match it to admit that run
    admits = {k: [r.run_id for r in alike if k in r.tags
                  and _tag_text(r.tags[k]) == _tag_text(tags[k])]
              for k in sorted(tags) if k not in keys and k not in IDENTITY_TAGS}
    usable = [(k, ids) for k, ids in admits.items() if ids]
    hint = ("; ".join(f"--match {k} admits {', '.join(ids[:3])}"
                      + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
                      for k, ids in usable[:3]) + ", or name one" if usable else
            "it is the first run of its kind; name one")
    return f"no earlier run matches {candidate!r} on {on}: earlier runs differ on {why}; {hint}: {name_one}"


def compare_to_best(con: duckdb.DuckDBPyConnection, candidate: str, *,
                    match: Sequence[str] | None = None,
                    confidence: float = CONFIDENCE) -> Comparison:
    """:func:`compare` against :func:`pick_baseline`'s run; ``baseline_choice`` says how."""
    baseline, choice = pick_baseline(con, candidate, match=match)
    out = compare(con, baseline, candidate, confidence=confidence)
    out.baseline_choice = choice
    return out
