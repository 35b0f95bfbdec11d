"""Findings on where a stage's time goes: ``starvation``, ``backpressure``,
``sync_bound``, ``unaccounted`` (per stage, in pipeline order) and
``compute_bound`` (the bottleneck stage). docs/DIAGNOSIS.md section 7.

Severity: ``critical`` when the category is the verdict's bottleneck,
``warning`` at ``analyze.pipeline.HIGH_SHARE`` (20%) or more, ``info`` at
``analyze.pipeline.MODERATE_SHARE`` (5%) or more (:func:`share_severity`);
``unaccounted`` warns from ``CategoryPolicy.unaccounted_warn``.

When the bottleneck's cause is its category (``analyze.rules.cause``), the
bottleneck category's finding carries the verdict's headline and, as its
gain, the what-if gain of removing the bottleneck phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tlog.analyze.findings import Code, Finding, Headline, Severity, and_list
from tlog.analyze.gaps import BETWEEN_MOSTLY, between_short_words, between_words
from tlog.analyze.lockstep import INFERRED_WORDS
from tlog.analyze.pipeline import EPS, StageStats
from tlog.analyze.rules.base import ItemRule, Rule, RuleContext, share_severity
from tlog.analyze.text import in_phase, ms, pct, phase_label, speedup


@dataclass(frozen=True)
class CategoryPolicy:
    """The limits of the category findings. The share levels of ``starvation``,
    ``backpressure`` and ``sync_bound`` (``warning`` from
    ``analyze.pipeline.HIGH_SHARE`` 20%, ``info`` from ``MODERATE_SHARE`` 5%)
    are the bottleneck's own and stay there: a finding and the verdict judge a
    share alike."""

    #: Unaccounted time (no phase covers it) worth a warning: 10% of a stage's
    #: time. Source: TraceML warns at 10%; below that it is Python glue.
    unaccounted_warn: float = 0.10


def _is_cause(ctx: RuleContext, st: StageStats, category: str) -> bool:
    """Whether the bottleneck is ``st``'s ``category`` and nothing else is its cause."""
    bn, cause = ctx.bottleneck, ctx.cause
    return (bn is not None and bn.stage == st.stage and bn.category == category
            and cause is not None and cause.kind == "category")


def _where(ctx: RuleContext, stage: str) -> str:
    return f"stage {stage}" if len(ctx.stages) > 1 else stage


def _phase_parts(ctx: RuleContext, st: StageStats) -> tuple[tuple[str, int] | None, ...]:
    """The bottleneck phase's words for a headline after the category's share:
    where (``" in X"``, or ``", 27% in X"`` when other phases hold a printed
    share too; never left out: the gain's "it"), its time per iteration, and
    the gain of removing it (none for a sync wait beside a straggler of the
    stage: the wait is the peers', for it)."""
    bn = ctx.bottleneck
    if not bn.phase:
        return (None, None, None)
    label = phase_label(bn.phase)
    per_iter = bn.phase_share * st.seconds / st.iterations if st.iterations else 0.0
    where = (f" in {label}" if pct(bn.phase_share) == pct(bn.share)
             else f", {pct(bn.phase_share)} in {label}")
    gain = ctx.gain_of(bn.stage, bn.phase)
    if gain is None or (bn.category == "sync" and _lagging(ctx, bn.stage)):
        removing = None
    else:
        removing = (f"; without it: {speedup(gain)} faster", 1)
    return ((where, 0), (f" ({ms(per_iter)}/iter)", 4), removing)


def _lagging(ctx: RuleContext, stage: str) -> list[int]:
    """The ranks of ``stage``'s stragglers worth a warning or more, most valuable first."""
    return [s.rank for s in ctx.stragglers if s.stage == stage and s.severity != "info"]


def _stragglers_part(ctx: RuleContext, stage: str) -> tuple[str, int] | None:
    """``"; rank 1 is a straggler"``: the stage's stragglers worth a warning that
    do not lead (their finding tells what they do and what fixing them buys)."""
    ranks = _lagging(ctx, stage)
    if not ranks:
        return None
    if len(ranks) == 1:
        return (f"; rank {ranks[0]} is a straggler", 2)
    return (f"; ranks {and_list(ranks)} are stragglers", 2)


def _headline(ctx: RuleContext, st: StageStats, evidence: dict[str, Any]) -> Headline:
    """The verdict when the bottleneck's category is its cause (``evidence``: its
    finding's; ``unaccounted``'s ``run_queue_share`` says what time between
    iterations is)."""
    bn = ctx.bottleneck
    where = _where(ctx, bn.stage)
    at, per_iter, removing = _phase_parts(ctx, st)
    lag = _stragglers_part(ctx, bn.stage)
    if bn.category == "starvation":
        return Headline.of(f"Bottleneck: input - {bn.stage} waits for data {pct(bn.share)} of "
                           f"its time", at, per_iter, removing, lag)
    if bn.category == "backpressure":
        return Headline.of(f"Bottleneck: output - {bn.stage} is blocked handing output on "
                           f"{pct(bn.share)} of its time", at, per_iter, removing, lag)
    if bn.category == "sync":
        found = ctx.lockstep.of(bn.stage) if ctx.lockstep is not None else None
        inferred = found is not None and found.inferred_in(bn.phase)
        return Headline.of(
            f"Bottleneck: {where} is sync-bound - {pct(bn.share)} of its time waiting",
            at, per_iter, (f" (a collective wait {INFERRED_WORDS})", 3) if inferred else None,
            None if ctx.exact_sync else (" (an upper bound: no device times)", 3), removing,
            lag)
    if bn.category == "compute":
        takes = None if not bn.phase else (
            f"; {phase_label(bn.phase)} takes {pct(bn.phase_share)} of its time", 0)
        return Headline.of(f"Bottleneck: {where} is compute-bound", takes, per_iter, removing,
                           lag)
    text = f"Bottleneck: {where} - {pct(bn.share)} of its time is in no phase"
    if st.between_share_of_unaccounted >= BETWEEN_MOSTLY:
        words = between_short_words(evidence.get("run_queue_share"),
                                    st.between_s / st.seconds if st.seconds else 0.0)
        return Headline.of(text + ", most of it between iterations", (f": {words}", 2), lag)
    return Headline.of(text, (" (missing timers or Python overhead between phases)", 2), lag)


def _lead(ctx: RuleContext, st: StageStats, finding: Finding) -> Finding:
    """``finding`` with the verdict's headline and gain when its category is the cause."""
    bn = ctx.bottleneck
    finding.headline = _headline(ctx, st, finding.evidence)
    finding.gain = ctx.gain_of(bn.stage, bn.phase) if bn.phase else None
    return finding


class _CategoryShareRule(ItemRule):
    """A waiting category's share of each stage's time, with its largest phase."""

    over = "stages"
    #: the attribution category (``dflash_runtime.format``) this rule reports
    category: str

    def items(self, ctx: RuleContext) -> list[StageStats]:
        """The stages, in pipeline order."""
        return ctx.stages

    def evaluate_item(self, ctx: RuleContext, st: StageStats) -> list[Finding]:
        """A finding when the stage's share of the category earns a severity."""
        share = st.shares[self.category]
        bn = ctx.bottleneck
        is_bn = bn is not None and bn.stage == st.stage and bn.category == self.category
        sev = share_severity(share, is_bn)
        if sev is None:
            return []
        phase, secs = st.top_phase(self.category)
        per_iter = secs / st.iterations if st.iterations else 0.0
        ev: dict[str, Any] = {"stage": st.stage, "share": share, "phase": phase,
                              "phase_seconds_per_iter": per_iter,
                              "phase_share": secs / st.seconds if st.seconds else 0.0}
        where = in_phase(phase, ev["phase_share"], share, per_iter, " per iteration")
        msg = self.message(ctx, st, share, where, ev)
        found = Finding(self.code, sev, msg, ev)
        return [_lead(ctx, st, found) if _is_cause(ctx, st, self.category) else found]

    def message(self, ctx: RuleContext, st: StageStats, share: float, where: str,
                ev: dict[str, Any]) -> str:
        """The finding's line (may add evidence to ``ev``)."""
        raise NotImplementedError


def _waiting_queues(ctx: RuleContext, ev: dict[str, Any]) -> None:
    related = [q for q in ctx.queues if q.get("state") in ("empty", "full")]
    if related:
        ev["queues"] = related


class StarvationRule(_CategoryShareRule):
    """``starvation``: a stage waits for input (its producer, or an unlogged source)."""

    code = Code.STARVATION
    category = "starvation"

    def message(self, ctx: RuleContext, st: StageStats, share: float, where: str,
                ev: dict[str, Any]) -> str:
        """``"<stage> waits for input 41% of its time ...: starved by ..."``."""
        names = ctx.stage_names
        idx = names.index(st.stage)
        source = (f"its producer {names[idx - 1]}" if idx > 0
                  else "its input (data loader or other unlogged source)")
        _waiting_queues(ctx, ev)
        return f"{st.stage} waits for input {pct(share)} of its time{where}: starved by {source}"


class BackpressureRule(_CategoryShareRule):
    """``backpressure``: a stage is blocked handing its output on."""

    code = Code.BACKPRESSURE
    category = "backpressure"

    def message(self, ctx: RuleContext, st: StageStats, share: float, where: str,
                ev: dict[str, Any]) -> str:
        """``"<stage> is blocked handing output on 30% of its time ...: held by ..."``."""
        names = ctx.stage_names
        idx = names.index(st.stage)
        sink = (f"its consumer {names[idx + 1]}" if idx + 1 < len(names)
                else "an unlogged consumer")
        _waiting_queues(ctx, ev)
        return f"{st.stage} is blocked handing output on {pct(share)} of its time{where}: held by {sink}"


class SyncBoundRule(_CategoryShareRule):
    """``sync_bound``: a stage waits in sync phases (collectives, synchronize).

    A sync share that holds a collective wait inferred from rank alignment
    (``analyze.lockstep``) says so, with the wait per rank in the evidence;
    without exact sync (no device times on a GPU run) the share is an upper bound."""

    code = Code.SYNC_BOUND
    category = "sync"

    def message(self, ctx: RuleContext, st: StageStats, share: float, where: str,
                ev: dict[str, Any]) -> str:
        """``"<stage> spends 25% of its time in sync waits ..."``."""
        bound = ("" if ctx.exact_sync else
                 " (an upper bound: without device times it can hide queued GPU work)")
        found = ctx.lockstep.of(st.stage) if ctx.lockstep is not None else None
        if found is not None and found.inferred_in(found.phase):
            bound = (f" (the ranks' wait for each other at the collective in "
                     f"{found.where}, {INFERRED_WORDS})" + bound)
            ev["lockstep"] = found.to_dict()
        ev["upper_bound"] = not ctx.exact_sync
        return f"{st.stage} spends {pct(share)} of its time in sync waits{where}{bound}"


class UnaccountedRule(ItemRule):
    """``unaccounted``: time no phase covers, from ``CategoryPolicy.unaccounted_warn``
    of a stage's time (warning), or the bottleneck (critical)."""

    code = Code.UNACCOUNTED
    over = "stages"

    def items(self, ctx: RuleContext) -> list[StageStats]:
        """The stages, in pipeline order."""
        return ctx.stages

    def evaluate_item(self, ctx: RuleContext, st: StageStats) -> list[Finding]:
        """A finding for a stage with that much unaccounted time."""
        un = st.shares["unaccounted"]
        bn = ctx.bottleneck
        is_bn = bn is not None and bn.stage == st.stage and bn.category == "unaccounted"
        if not (is_bn or un >= ctx.policies.categories.unaccounted_warn - EPS):
            return []
        sev = Severity.CRITICAL if is_bn else Severity.WARNING
        per_iter = st.category_s["unaccounted"] / st.iterations if st.iterations else 0.0
        between = st.between_share_of_unaccounted
        from tlog.analyze.rules.machine import cpu_waits

        queued = [c["run_queue"] for c in cpu_waits(ctx)
                  if c["w"]["stage"] == st.stage and c["run_queue"] is not None]
        core = max(queued) if queued else None
        ev = {"stage": st.stage, "share": un, "seconds_per_iter": per_iter,
              "between_iterations_share": between, "run_queue_share": core}
        if between >= BETWEEN_MOSTLY:
            words = between_words(core, st.between_s / st.seconds if st.seconds else 0.0)
            found = Finding(self.code, sev,
                            f"{pct(un)} of {st.stage}'s time ({ms(per_iter)} per iteration) "
                            f"is in no phase, {pct(between)} of it between iterations "
                            f"(outside rec.iteration()): {words}", ev)
        else:
            found = Finding(self.code, sev,
                            f"{pct(un)} of {st.stage}'s time ({ms(per_iter)} per iteration) "
                            f"is in no phase: timers missing, or Python overhead between phases",
                            ev)
        return [_lead(ctx, st, found) if _is_cause(ctx, st, "unaccounted") else found]


class ComputeBoundRule(Rule):
    """``compute_bound`` (info): the bottleneck is compute; names its largest phase."""

    code = Code.COMPUTE_BOUND

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding when the verdict's category is compute."""
        bn = ctx.bottleneck
        if bn is None or bn.category != "compute":
            return []
        st = next(s for s in ctx.stages if s.stage == bn.stage)
        phase, secs = st.top_phase("compute")
        per_iter = secs / st.iterations if st.iterations else 0.0
        found = Finding(self.code, Severity.INFO,
                        f"{st.stage} is compute-bound ({pct(st.shares['compute'])} compute); "
                        f"its largest phase is {phase} at {pct(bn.phase_share)} "
                        f"({ms(per_iter)} per iteration)",
                        {"stage": st.stage, "share": st.shares["compute"], "phase": phase,
                         "phase_share": bn.phase_share, "phase_seconds_per_iter": per_iter})
        return [_lead(ctx, st, found) if _is_cause(ctx, st, "compute") else found]
