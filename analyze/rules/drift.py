"""``drift``: a stage's steady iteration time trends over the run.
docs/DIAGNOSIS.md section 7."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.frames import PARTS, RunAnalysis
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.pipeline import EPS, part_medians
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.statistics import block_medians as medians_of_blocks
from tlog.analyze.statistics import kendall_trend
from tlog.analyze.text import ms, pct


@dataclass(frozen=True)
class DriftPolicy:
    """The limits of the ``drift`` finding; its trend test also judges
    ``memory_growth`` and ``allocator_thrash``'s kept memory."""

    #: Steady iteration time change (median of the last third vs the first) that
    #: is drift. Source: TraceML's 10% warning level for step-time regressions.
    threshold: float = 0.10
    #: Fewest steady iterations per worker to judge drift. Source: tlog's choice
    #: (10 per third).
    min_iters: int = 30
    #: The trend test runs on this many consecutive blocks of each worker's
    #: steady iterations (their medians): a block median shrugs off single slow
    #: iterations, and blocks make neighbouring iterations' shared noise (a busy
    #: machine for a few seconds) one value instead of many correlated ones.
    #: Source: tlog's choice, the batch-means idea of analyze.statistics (Law & Kelton).
    blocks: int = 8
    #: Two-sided p-value under which the block medians have a trend (exact
    #: Mann-Kendall test: Kendall's tau against block order). Source: tlog's choice;
    #: 1% keeps a noisy run's chance of a false drift finding at 1 in 100 per stage.
    p: float = 0.01
    #: Kendall's tau from which a significant drift is consistent enough for a
    #: warning: 90% of block pairs ordered the same way ((1 + tau) / 2 >= 0.9).
    #: A run that steps once (a neighbour's job starts at 60% of it) orders only
    #: the pairs across the step and stays below it (info at most).
    #: Source: tlog's choice.
    consistent: float = 0.80


def block_medians(analysis: RunAnalysis, wids: list[int], blocks: int = DriftPolicy.blocks
                  ) -> np.ndarray:
    """Median iteration time of each of ``blocks`` consecutive blocks of steady
    iterations per worker (block ``b`` holds positions ``p`` with
    ``p * blocks // n == b``), then the median over ``wids`` per block: shape (blocks,)."""
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    dur = it["dur"].to_numpy()
    per_worker = []
    for wid, a, b in analysis.slices:
        if wid not in wids:
            continue
        d = dur[a:b][steady[a:b]]
        if len(d) < blocks:
            continue
        per_worker.append(medians_of_blocks(d, blocks))
    if not per_worker:
        return np.zeros(0)
    return np.median(np.array(per_worker), axis=0)


class DriftRule(Rule):
    """``drift``: a stage's steady iteration time trends over the run.

    The size is the change of the median iteration time from the first third
    to the last (more than ``DriftPolicy.threshold``, with
    ``DriftPolicy.min_iters`` steady iterations per worker); the trend must be
    significant: Kendall's tau of the ``DriftPolicy.blocks`` block medians
    (:func:`block_medians`) against their order, exact p under ``DriftPolicy.p``
    (``analyze.statistics.kendall_trend``; a single slow stretch, e.g.
    another job on a shared machine at the end, moves the thirds but not the
    order of the blocks). ``warning`` when the trend is also consistent (tau
    at least ``DriftPolicy.consistent``), else ``info``. Names the phase whose
    seconds per iteration changed most that way.
    """

    code = Code.DRIFT

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per drifting stage, in pipeline order."""
        analysis, workers, th = ctx.analysis, ctx.workers, ctx.policies.drift
        counts = workers.select("stage", "n")
        out = []
        meds = part_medians(analysis)
        last = PARTS - 1
        for stage in ctx.stage_names:
            c = counts.filter(pl.col("stage") == stage)
            if c.height == 0 or int(c["n"].min()) < th.min_iters:
                continue
            m = meds.filter(pl.col("stage") == stage)
            first_med = float(m.filter(pl.col("part") == 0)["median_dur"].item())
            last_med = float(m.filter(pl.col("part") == last)["median_dur"].item())
            if first_med <= 0:
                continue
            change = last_med / first_med - 1
            if abs(change) <= th.threshold:
                continue
            wids = workers.filter(pl.col("stage") == stage)["wid"].to_list()
            blocks = block_medians(analysis, wids, th.blocks)
            tau, p = kendall_trend(blocks)
            if not (p < th.p and tau * change > 0):
                continue   # no trend: a slow stretch or noise moved the thirds
            consistent = abs(tau) >= th.consistent - EPS
            phase, delta = _phase_change(analysis, stage, growing=change > 0)
            word = "slower" if change > 0 else "faster"
            how = "steadily" if consistent else "with a trend, unevenly"
            msg = (f"{stage} gets {pct(abs(change))} {word} over the run, {how} "
                   f"({ms(first_med)} -> {ms(last_med)} median per iteration; Kendall's tau "
                   f"{tau:.2f} over {len(blocks)} blocks, p {p:.1g})")
            if phase:
                msg += f"; {phase} changes most ({'+' if delta >= 0 else ''}{ms(delta)} per iteration)"
            out.append(Finding(self.code, Severity.WARNING if consistent else Severity.INFO, msg,
                               {"stage": stage, "change": change, "first_median_s": first_med,
                                "last_median_s": last_med, "phase": phase,
                                "phase_change_s": delta, "tau": tau, "p_value": p,
                                "block_medians_s": [float(x) for x in blocks]}))
        return out


def _phase_change(analysis: RunAnalysis, stage: str, *, growing: bool) -> tuple[str | None, float]:
    last = PARTS - 1
    wids = analysis.data.workers.filter(pl.col("stage") == stage)["wid"]
    sub = analysis.steady.filter(pl.col("wid").is_in(wids.to_list())
                                 & pl.col("part").is_in([0, last]))
    n = sub.group_by("part").agg(n=pl.len())
    n_first = n.filter(pl.col("part") == 0)["n"].sum()
    n_last = n.filter(pl.col("part") == last)["n"].sum()
    ph = analysis.phases.filter(pl.col("wid").is_in(wids.to_list()))
    tot = pl.sum_horizontal("starvation_s", "backpressure_s", "compute_s", "sync_s")
    per = (ph.group_by("pid").agg(
        first=tot.filter(pl.col("part") == 0).sum() / max(n_first, 1),
        last=tot.filter(pl.col("part") == last).sum() / max(n_last, 1))
        .with_columns(delta=pl.col("last") - pl.col("first")))
    # Unaccounted time can drift too: compare it as a pseudo-phase.
    un = sub
    un_first = float(un.filter(pl.col("part") == 0)["unaccounted_s"].mean() or 0.0)
    un_last = float(un.filter(pl.col("part") == last)["unaccounted_s"].mean() or 0.0)
    if per.height == 0:
        return None, 0.0
    per = per.sort(["delta", "pid"], descending=[growing, False])
    top = per.row(0, named=True)
    un_delta = un_last - un_first
    if (growing and un_delta > top["delta"]) or (not growing and un_delta < top["delta"]):
        return UNACCOUNTED_PHASE, un_delta
    if (growing and top["delta"] <= 0) or (not growing and top["delta"] >= 0):
        return None, 0.0
    return analysis.data.phase_names[top["pid"]], float(top["delta"])
