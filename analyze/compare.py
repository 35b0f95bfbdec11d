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
  (its seconds minus those of its children that lie inside them: a carved
  child, of another category, is already out), each child by its own, so the
  contributors of a stage add up exactly to its gap and ``share_of_gap`` sums
  to 1 per stage. The candidate's bottleneck stage comes first, then the other
  stages by the size of their gap; within a stage, contributors are sorted by
  how much of the gap they explain (largest share first).
- **Did the machine change?** ``environment``
  (``analyze.environment.compare_environments``): the hosts, CPUs, GPUs,
  drivers and the load of the two runs; when every compute phase moved
  together with the load (judged by the thread's run-queue delay where
  recorded) and more work explains little of it, the change is likely
  contention, and the sentence names the load instead of a phase.
- **What else changed?** ``settings`` (:func:`setting_changes`): the tags
  and config values that differ between the runs' ``run.json``.

:func:`compare_to_best` compares against the default baseline
(``analyze.baseline.pick_baseline``); the statistics are
``analyze.statistics``'s, the sentence ``analyze.compare_text``'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np
import polars as pl
from tlog.analyze.baseline import pick_baseline
from tlog.analyze.compare_text import comparison_sentence
from tlog.analyze.environment import Environment, compare_environments
from tlog.analyze.history import RunSummary, run_rows
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.statistics import (
    CONFIDENCE,
    MIN_BATCH_ITERS,
    MIN_BATCHES,
    batch_means,
    welch_interval,
)
from tlog.analyze.system import run_queue_share, steady_samples
from tlog.analyze.text import signed_ms, signed_pct
from tlog.analyze.verdict import Diagnosis, diagnose
from tlog.ingest.errors import UsageError

from dflash_runtime.format import CATEGORIES

#: Smallest change of the bottleneck stage's mean iteration time, relative to
#: the baseline, that counts as a real change even when the interval excludes
#: 0. Source: tlog's choice, the same two-part rule as asv's ``asv compare``
#: (a statistically significant change beyond a factor), with a finer factor
#: than asv's default 10% because a training run averages thousands of
#: iterations; run-to-run differences on a shared machine stay below it.
MIN_RELATIVE_CHANGE = 0.02

_CAT_COLS = [f"{c}_s" for c in CATEGORIES]


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
    frame = diag.analysis.iteration_frame().filter(pl.col("steady"))
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
    phases = diag.analysis.phase_frame(steady_only=True)
    if phases.height:
        cat = (phases.group_by("stage", "phase", "category").agg(pl.col("host_s").sum())
               .sort("host_s", "category", descending=[True, False])
               .group_by("stage", "phase", maintain_order=True).first()
               .select("stage", "phase", "category"))
        per = (phases.group_by("stage", "phase")
               .agg(pl.col("parent").first(), total=pl.col("attributed_s").sum())
               .join(cat, on=["stage", "phase"], how="left"))
        # A carved child (a direct child of a top-level phase, of another
        # category: docs/DIAGNOSIS.md section 1, ``attribution.carved_children``)
        # is already out of its parent's attributed seconds; only the other
        # children's seconds lie inside their parent's and are taken out of it.
        parent_cat = per.select("stage", parent="phase", parent_category="category")
        kids = (per.filter(pl.col("parent").is_not_null())
                .join(parent_cat, on=["stage", "parent"], how="left")
                .with_columns(carved=~pl.col("parent").str.contains("/", literal=True)
                              & (pl.col("category") != pl.col("parent_category")).fill_null(False))
                .group_by("stage", "parent")
                .agg(children=pl.col("total").filter(~pl.col("carved")).sum())
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
        environment: the two runs' machines and load compared
            (:class:`tlog.analyze.environment.Environment`): what differed, and
            whether the change is likely contention rather than the change
            under test.
        settings: the tags and config values that differ between the runs'
            ``run.json`` (:func:`setting_changes`), e.g. ``"config.hidden 256 -> 1024"``.
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
    environment: Environment | None = None
    settings: list[str] = field(default_factory=list)
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``baseline``, ``candidate`` (run ids), ``throughput_ratio``,
        ``unit``, ``significant``, ``significance``, ``contributors``, ``stages``,
        ``runs``, ``baseline_choice``, ``verdict``, ``environment``, ``settings``."""
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
            "environment": self.environment.to_dict() if self.environment is not None else None,
            "settings": self.settings,
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
    row.iterations = {"total": diag.iterations.total, "steady": diag.iterations.steady}
    row.throughput = diag.throughput.to_dict()
    row.bottleneck = ({"stage": diag.bottleneck.stage, "category": diag.bottleneck.category,
                       "phase": diag.bottleneck.phase, "share": diag.bottleneck.share}
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
    unit, ratio = throughput_ratio(d_base.throughput.to_dict(), d_cand.throughput.to_dict())

    it_base, it_cand = steady_iterations(d_base), steady_iterations(d_cand)
    bn = d_cand.bottleneck or d_base.bottleneck
    bn_stage = bn.stage if bn is not None else None
    sig = significance(it_base, it_cand, bn_stage, confidence=confidence)

    stages = _stage_changes(it_base, it_cand, bn_stage)
    contributors = _contributors(phase_seconds(d_base), phase_seconds(d_cand), stages)
    out = Comparison(baseline=baseline, candidate=candidate,
                     runs={"baseline": _summary_of(con, baseline, d_base),
                           "candidate": _summary_of(con, candidate, d_cand)},
                     unit=unit, throughput_ratio=ratio, significant=sig.significant,
                     significance=sig, stages=stages, contributors=contributors,
                     diagnoses={"baseline": d_base, "candidate": d_cand})
    gap = next((st.delta_s_per_iter for st in stages if st.stage == bn_stage), None)
    out.environment = compare_environments(
        d_base.system, d_cand.system, contributors, bn_stage, gap, MIN_RELATIVE_CHANGE,
        (_cpu_and_wall(d_base, bn_stage), _cpu_and_wall(d_cand, bn_stage)))
    out.settings = setting_changes(con, baseline, candidate)
    out.verdict = comparison_sentence(out)
    return out


#: Tags that describe the machine, not the code or configuration (the
#: environment comparison covers the machine).
_MACHINE_TAGS = frozenset({"host"})


def setting_changes(con: duckdb.DuckDBPyConnection, baseline: str, candidate: str) -> list[str]:
    """The tags and config values that differ between two runs' ``run.json``
    (``runs.tags``, ``runs.config``): ``"<key> <baseline> -> <candidate>"``,
    config keys as ``config.<key>`` (nested objects flattened with dots), a
    value one run lacks as ``(none)``; tags first, each part sorted. The
    ``host`` tag is left to the environment. Empty when either run has no
    ``run.json`` (a run without one names no settings to compare).
    """
    rows = dict(con.execute(
        "SELECT run_id, [tags::VARCHAR, config::VARCHAR] FROM runs WHERE run_id IN (?, ?)",
        [baseline, candidate]).fetchall())
    if baseline not in rows or candidate not in rows:
        return []
    import json

    def flat(text: str | None, prefix: str) -> dict[str, Any]:
        try:
            obj = json.loads(text) if text else {}
        except ValueError:
            return {}
        out: dict[str, Any] = {}

        def walk(o: Any, key: str) -> None:
            if isinstance(o, dict) and o:
                for k, v in o.items():
                    walk(v, f"{key}.{k}" if key else str(k))
            else:
                out[key] = o
        walk(obj if isinstance(obj, dict) else {}, prefix)
        return out

    out = []
    for k, prefix in ((0, ""), (1, "config")):
        a, b = flat(rows[baseline][k], prefix), flat(rows[candidate][k], prefix)
        for key in sorted(set(a) | set(b)):
            if key in _MACHINE_TAGS or a.get(key) == b.get(key):
                continue
            out.append(f"{key} {_setting(a, key)} -> {_setting(b, key)}")
    return out


def _setting(values: dict[str, Any], key: str) -> str:
    return "(none)" if key not in values else str(values[key])


def top_contributors(c: Comparison, n: int) -> tuple[list[Contributor], int]:
    """The ``n`` contributors that moved most (largest ``|delta_s_per_iter|``,
    whatever their stage), in the comparison's order, and how many that moved
    were left out. ``ValueError`` for ``n`` under 1."""
    if n < 1:
        msg = f"n must be at least 1, got {n}"
        raise ValueError(msg)
    moved = [(k, x) for k, x in enumerate(c.contributors) if abs(x.delta_s_per_iter) > 0]
    keep = sorted(moved, key=lambda kx: (-abs(kx[1].delta_s_per_iter), kx[0]))[:n]
    return [x for _, x in sorted(keep, key=lambda kx: kx[0])], len(moved) - len(keep)


def _cpu_and_wall(diag: Diagnosis, stage: str | None
                  ) -> tuple[float, float, float | None] | None:
    """``stage``'s thread CPU seconds, wall seconds and run-queue wait seconds
    per steady iteration, over the iterations that carry ``cpu``; None
    without them. The wait is the mean over the stage's workers of their
    run-queue share of wall time (``analyze.system.run_queue_share``) times
    the wall seconds; None where no worker's samples carry ``cpu_wait_s``."""
    if stage is None or diag.analysis is None:
        return None
    it = diag.analysis.steady.filter((pl.col("stage") == stage) & pl.col("cpu").is_not_null())
    if it.height == 0:
        return None
    wall = float(it["dur"].mean())  # type: ignore[arg-type]
    s = steady_samples(diag.analysis).filter(pl.col("stage") == stage)
    shares = [q for _, g in s.group_by("wid") if (q := run_queue_share(g)) is not None]
    wait = float(np.mean(shares)) * wall if shares else None
    return float(it["cpu"].mean()), wall, wait  # type: ignore[arg-type]


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


def compare_to_best(con: duckdb.DuckDBPyConnection, candidate: str, *,
                    match: Sequence[str] | None = None,
                    confidence: float = CONFIDENCE) -> Comparison:
    """:func:`compare` against :func:`pick_baseline`'s run; ``baseline_choice`` says how."""
    baseline, choice = pick_baseline(con, candidate, match=match)
    out = compare(con, baseline, candidate, confidence=confidence)
    out.baseline_choice = choice
    return out
