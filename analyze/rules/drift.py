"""``drift``: a stage's steady iteration time trends over the run.
docs/DIAGNOSIS.md section 7."""

from __future__ import annotations

import numpy as np
import polars as pl
from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.frames import PARTS, RunAnalysis
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.pipeline import EPS, part_medians
from tlog.analyze.rules.base import DEFAULT_THRESHOLDS, Rule, RuleContext
from tlog.analyze.statistics import block_medians as medians_of_blocks
from tlog.analyze.statistics import kendall_trend
from tlog.analyze.text import ms, pct


def block_medians(analysis: RunAnalysis, wids: list[int], blocks: int = DEFAULT_THRESHOLDS.drift_blocks
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
    to the last (more than ``Thresholds.drift_threshold``, with
    ``drift_min_iters`` steady iterations per worker); the trend must be
    significant: Kendall's tau of the ``drift_blocks`` block medians
    (:func:`block_medians`) against their order, exact p under ``drift_p``
    (``analyze.statistics.kendall_trend``; a single slow stretch, e.g.
    another job on a shared machine at the end, moves the thirds but not the
    order of the blocks). ``warning`` when the trend is also consistent (tau
    at least ``drift_consistent``), else ``info``. Names the phase whose
    seconds per iteration changed most that way.
    """

    code = Code.DRIFT

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per drifting stage, in pipeline order."""
        analysis, workers, th = ctx.analysis, ctx.workers, ctx.thresholds
        counts = workers.select("stage", "n")
        out = []
        meds = part_medians(analysis)
        last = PARTS - 1
        for stage in ctx.stage_names:
            c = counts.filter(pl.col("stage") == stage)
            if c.height == 0 or int(c["n"].min()) < th.drift_min_iters:
                continue
            m = meds.filter(pl.col("stage") == stage)
            first_med = float(m.filter(pl.col("part") == 0)["median_dur"].item())
            last_med = float(m.filter(pl.col("part") == last)["median_dur"].item())
            if first_med <= 0:
                continue
            change = last_med / first_med - 1
            if abs(change) <= th.drift_threshold:
                continue
            wids = workers.filter(pl.col("stage") == stage)["wid"].to_list()
            blocks = block_medians(analysis, wids, th.drift_blocks)
            tau, p = kendall_trend(blocks)
            if not (p < th.drift_p and tau * change > 0):
                continue   # no trend: a slow stretch or noise moved the thirds
            consistent = abs(tau) >= th.drift_consistent - EPS
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
