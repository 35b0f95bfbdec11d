"""Findings on where a stage's time goes: ``starvation``, ``backpressure``,
``sync_bound``, ``unaccounted`` (per stage, in pipeline order) and
``compute_bound`` (the bottleneck stage). docs/DIAGNOSIS.md section 7.

Severity: ``critical`` when the category is the verdict's bottleneck,
``warning`` at ``analyze.pipeline.HIGH_SHARE`` (20%) or more, ``info`` at
``analyze.pipeline.MODERATE_SHARE`` (5%) or more (:func:`share_severity`);
``unaccounted`` warns from ``Thresholds.unaccounted_warn``.
"""

from __future__ import annotations

from typing import Any

from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.gaps import BETWEEN_MOSTLY, between_words
from tlog.analyze.lockstep import INFERRED_WORDS
from tlog.analyze.pipeline import EPS, StageStats
from tlog.analyze.rules.base import ItemRule, Rule, RuleContext, share_severity
from tlog.analyze.text import in_phase, ms, pct


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
        return [Finding(self.code, sev, msg, ev)]

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
    """``unaccounted``: time no phase covers, from ``Thresholds.unaccounted_warn``
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
        if not (is_bn or un >= ctx.thresholds.unaccounted_warn - EPS):
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
            return [Finding(self.code, sev,
                            f"{pct(un)} of {st.stage}'s time ({ms(per_iter)} per iteration) "
                            f"is in no phase, {pct(between)} of it between iterations "
                            f"(outside rec.iteration()): {words}", ev)]
        return [Finding(self.code, sev,
                        f"{pct(un)} of {st.stage}'s time ({ms(per_iter)} per iteration) "
                        f"is in no phase: timers missing, or Python overhead between phases",
                        ev)]


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
        return [Finding(self.code, Severity.INFO,
                        f"{st.stage} is compute-bound ({pct(st.shares['compute'])} compute); "
                        f"its largest phase is {phase} at {pct(bn.phase_share)} "
                        f"({ms(per_iter)} per iteration)",
                        {"stage": st.stage, "share": st.shares["compute"], "phase": phase,
                         "phase_share": bn.phase_share, "phase_seconds_per_iter": per_iter})]
