"""``pipeline_bubble``: one finding per pipeline-parallel stage (``analyze.pp``): how
long each rank sits in the bubble (its send/recv waits), which rank limits the
schedule and what balancing the ranks' work would buy. docs/DIAGNOSIS.md
"Pipeline parallelism"."""

from __future__ import annotations

from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.text import ms, pct, speedup


def pp_clause(pp) -> str:
    """The words shared by the verdict and the finding for ``pp`` (a
    :class:`analyze.pp.PPStage`): the limiting rank, the most idle one, the gain."""
    lim, idle = pp.limiting, pp.most_idle
    text = (f"rank {lim.rank} limits the pipeline: its own work takes {ms(lim.own_s)} per "
            f"iteration")
    others = [r for r in pp.ranks if r.rank != lim.rank]
    if others:
        text += " vs " + ", ".join(f"{ms(r.own_s)} on rank {r.rank}" for r in others[:3])
    if idle.rank != lim.rank:
        text += (f"; rank {idle.rank} waits {pct(idle.bubble_share)} of its time on "
                 f"send/recv (the pipeline bubble, {ms(idle.wait_s)}/iter)")
    if pp.speedup_if_balanced is not None and pp.speedup_if_balanced > 1.005:
        text += (f"; balancing the ranks' work (moving layers to the lighter ranks) would "
                 f"make it up to {speedup(pp.speedup_if_balanced - 1)} faster")
    return text


class PipelineBubbleRule(Rule):
    """``pipeline_bubble``: per pipeline-parallel stage, the ranks' bubble shares and
    the limiting rank; severity by the balanced gain (``Thresholds.pp_balance_warn``,
    ``pp_balance_critical``)."""

    code = Code.PIPELINE_BUBBLE

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage in ``ctx.pipeline_parallel``."""
        out = []
        th = ctx.thresholds
        for pp in ctx.pipeline_parallel:
            gain = (pp.speedup_if_balanced or 1.0) - 1
            sev = (Severity.CRITICAL if gain >= th.pp_balance_critical else
                   Severity.WARNING if gain >= th.pp_balance_warn else Severity.INFO)
            bubbles = ", ".join(f"rank {r.rank} {pct(r.bubble_share)}" for r in pp.ranks)
            msg = (f"{pp.stage} runs as a {len(pp.ranks)}-rank pipeline (send/recv between "
                   f"ranks); time waiting on send/recv: {bubbles}; " + pp_clause(pp))
            out.append(Finding(self.code, sev, msg, {"stage": pp.stage, **pp.to_dict()}))
        return out
