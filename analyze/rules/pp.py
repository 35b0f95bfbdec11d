"""``pipeline_bubble``: one finding per pipeline-parallel stage (``analyze.pp``): how
long each rank sits in the bubble (its send/recv waits), which rank limits the
schedule and what balancing the ranks' work would buy. docs/DIAGNOSIS.md
"Pipeline parallelism"."""

from __future__ import annotations

from dataclasses import dataclass

from tlog.analyze.findings import Code, Finding, Headline, Severity
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.text import ms, pct, speedup


@dataclass(frozen=True)
class PipelinePolicy:
    """The limits of the ``pipeline_bubble`` finding."""

    #: ``pipeline_bubble``'s severity follows the gain of balancing the ranks of a
    #: pipeline-parallel stage: ``warning`` from this gain (a fraction), ``info``
    #: below. Source: tlog's choice, XProf's 5% "moderately", as a straggler's.
    balance_warn: float = 0.05
    #: ... ``critical`` from this gain. Source: NVIDIA Resiliency Extension flags a
    #: rank under 0.75 of the reference; a pipeline held to 0.75 of its balanced
    #: pace runs 1/0.75 = 1.33x faster balanced (as ``straggler``).
    balance_critical: float = 1 / 0.75 - 1
    #: A balancing gain (fraction) worth a sentence. Source: tlog's choice, as
    #: ``StragglerPolicy.gain_worth_saying``.
    gain_worth_saying: float = 0.005


def pp_clause(pp, worth: float = PipelinePolicy.gain_worth_saying) -> str:
    """The finding's words for ``pp`` (a :class:`analyze.pp.PPStage`): the
    limiting rank, the most idle one, the gain (from ``worth``)."""
    lim, idle = pp.limiting, pp.most_idle
    text = (f"rank {lim.rank} limits the pipeline: its own work takes {ms(lim.own_s)} per "
            f"iteration")
    others = [r for r in pp.ranks if r.rank != lim.rank]
    if others:
        text += " vs " + ", ".join(f"{ms(r.own_s)} on rank {r.rank}" for r in others[:3])
    if idle.rank != lim.rank:
        text += (f"; rank {idle.rank} waits {pct(idle.bubble_share)} of its time on "
                 f"send/recv (the pipeline bubble, {ms(idle.wait_s)}/iter)")
    if pp.speedup_if_balanced is not None and pp.speedup_if_balanced > 1 + worth:
        text += (f"; balancing the ranks' work (moving layers to the lighter ranks) would "
                 f"make it up to {speedup(pp.speedup_if_balanced - 1)} faster")
    return text


def _headline(ctx: RuleContext, pp, worth: float) -> Headline:
    """The verdict when the bottleneck stage is pipeline-parallel: its limiting rank."""
    where = f"stage {pp.stage}" if len(ctx.stages) > 1 else pp.stage
    lim = pp.limiting
    others = [r for r in pp.ranks if r.rank != lim.rank]
    gain = None
    if pp.speedup_if_balanced is not None and pp.speedup_if_balanced > 1 + worth:
        balanced = speedup(pp.speedup_if_balanced - 1)
        gain = (f"; with the ranks' work balanced: up to {balanced} faster", 1)
    return Headline.of(
        f"Bottleneck: {where} is a pipeline-parallel schedule - rank {lim.rank} limits the "
        f"pipeline", (f": its own work takes {ms(lim.own_s)} per iteration", 3),
        (" vs " + ", ".join(f"{ms(r.own_s)} on rank {r.rank}" for r in others[:2]), 4)
        if others else None, gain)


class PipelineBubbleRule(Rule):
    """``pipeline_bubble``: per pipeline-parallel stage, the ranks' bubble shares and
    the limiting rank; severity by the balanced gain (``PipelinePolicy.balance_warn``,
    ``balance_critical``). When the bottleneck stage is pipeline-parallel
    (``analyze.rules.cause``), its finding carries the verdict's headline and,
    as its gain, the gain of balancing the ranks."""

    code = Code.PIPELINE_BUBBLE

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage in ``ctx.pipeline_parallel``."""
        out = []
        th = ctx.policies.pipeline
        cause = ctx.cause
        for pp in ctx.pipeline_parallel:
            gain = (pp.speedup_if_balanced or 1.0) - 1
            sev = (Severity.CRITICAL if gain >= th.balance_critical else
                   Severity.WARNING if gain >= th.balance_warn else Severity.INFO)
            bubbles = ", ".join(f"rank {r.rank} {pct(r.bubble_share)}" for r in pp.ranks)
            msg = (f"{pp.stage} runs as a {len(pp.ranks)}-rank pipeline (send/recv between "
                   f"ranks); time waiting on send/recv: {bubbles}; "
                   + pp_clause(pp, th.gain_worth_saying))
            found = Finding(self.code, sev, msg, {"stage": pp.stage, **pp.to_dict()})
            if cause is not None and cause.kind == "pipeline_parallel" and cause.stage == pp.stage:
                found.headline = _headline(ctx, pp, th.gain_worth_saying)
                found.gain = gain if pp.speedup_if_balanced is not None else None
            out.append(found)
        return out
