"""``straggler``: one finding per stage and kind of lagging worker
(``analyze.stragglers`` finds them; its severity follows the gain if fixed,
``Straggler.severity``; several ranks of a stage are one finding listing
them). The leading straggler (:func:`leading_straggler`) carries the
verdict's headline. docs/DIAGNOSIS.md section 8."""

from __future__ import annotations

from dataclasses import dataclass

from tlog.analyze.findings import Code, Finding, Headline, Severity, and_list, merge_ranks
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.lockstep import INFERRED_WORDS
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.rules.machine import SHARED_CORES_WORDS, lacked_cpu, shared_cores_note
from tlog.analyze.stragglers import Straggler
from tlog.analyze.text import ms, pct, speedup, times


@dataclass(frozen=True)
class StragglerPolicy:
    """The limits of the ``straggler`` finding and of when a straggler leads the
    verdict (which ranks are stragglers is ``analyze.stragglers``')."""

    #: A throughput gain (fraction) below this is not worth a sentence: half a
    #: percent is within run-to-run noise on a shared machine. Source: tlog's choice.
    gain_worth_saying: float = 0.005
    #: Stages of at least this many lockstep ranks have a straggler's cost told in
    #: ranks (``ranks x gain / (1 + gain)``: the share of the group's time it
    #: wastes). Source: tlog's choice (below, a fraction of a rank says little).
    cost_in_ranks_from: int = 8


def in_straggler_phase(phase: str | None) -> str:
    """Where a compute straggler's excess lies, for the texts: ``", most in
    backward"``, or for the straggler's untimed time (``analyze.load.UNACCOUNTED_PHASE``)
    ``", most in time no phase covers (untimed code)"``; "" without a phase."""
    if not phase:
        return ""
    if phase == UNACCOUNTED_PHASE:
        return ", most in time no phase covers (untimed code)"
    return f", most in {phase}"


def leading_straggler(ctx: RuleContext) -> Straggler | None:
    """The straggler the verdict leads with, or None: the first straggler of the
    bottleneck stage (``ctx.stragglers``, most valuable first) worth at least a
    warning, when :func:`leads` says its fix is the cause."""
    bn = ctx.bottleneck
    if bn is None:
        return None
    lag = [s for s in ctx.stragglers if s.stage == bn.stage and s.severity != "info"]
    return lag[0] if lag and leads(lag[0], ctx.gain_of(bn.stage, bn.phase)) else None


def leads(s: Straggler, phase_gain: float | None) -> bool:
    """Whether straggler ``s`` leads the verdict: it is critical (its fix is
    worth at least 1/0.75 - 1, NVRx's level), or its fix is worth at least
    removing the bottleneck phase outright (``phase_gain``; then the stage's
    category is its symptom, e.g. the peers' sync wait for it). Source: tlog's
    choice (the verdict line follows the gain)."""
    if s.gain_if_fixed is None:
        return False
    if s.severity == "critical":
        return True
    return phase_gain is None or s.gain_if_fixed >= phase_gain


def _figure(ev: dict) -> str:
    """A straggler's figure in a merged finding's list: ``1.30x`` (compute) or
    ``+40 ms`` (input)."""
    own, peers = ev.get("own_s"), ev.get("peers_s")
    if ev.get("kind") == "compute":
        return times(ev["own_over_peers"]) if ev.get("own_over_peers") is not None else "?"
    return f"+{ms(own - peers)}" if own is not None and peers is not None else "?"


def _headline(ctx: RuleContext, s: Straggler, named: list[int],
              lacked: dict[str, float]) -> Headline:
    """The verdict when straggler ``s`` leads; ``named`` the ranks of its finding
    worth at least a warning (``s`` first)."""
    where = f"stage {s.stage}" if len(ctx.stages) > 1 else s.stage
    noun = "straggler" if s.kind == "compute" else "input straggler"
    if len(named) == 1:
        who = f"Bottleneck: rank {s.rank} of {where} is {'a' if s.kind == 'compute' else 'an'} {noun}"
        subject = " - its compute is" if s.kind == "compute" else " - it waits"
    else:
        who = f"Bottleneck: ranks {and_list(named)} of {where} are {noun}s"
        subject = f" - rank {s.rank}'s compute is" if s.kind == "compute" else \
            f" - rank {s.rank} waits"
    if s.kind == "compute":
        what = (f"{subject} {times(1 + s.slowdown)} its peers'", 3)
        where_in = (in_straggler_phase(s.phase), 4)
    else:
        what = (f"{subject} {ms(s.own_s - s.peers_s)} more per iteration", 3)
        where_in = (f" in {s.phase}" if s.phase else "", 4)
    gain = None
    rough = None
    if s.gain_if_fixed is not None and s.gain_if_fixed > ctx.policies.stragglers.gain_worth_saying:
        gain = (f"; at its peers' pace: {speedup(s.gain_if_fixed)} faster", 1)
        if s.stage in lacked:
            rough = (f" ({SHARED_CORES_WORDS})", 2)
    return Headline.of(who, what, where_in, gain, rough)


class StragglerRule(Rule):
    """``straggler``: what the worker does slowly, where its peers wait for it,
    and what fixing it would buy (said from ``StragglerPolicy.gain_worth_saying``;
    called rough where its stage's ranks waited for a core,
    :func:`analyze.rules.machine.lacked_cpu`, evidence
    ``ranks_lacked_cpu_share``). Several ranks of a stage (of one kind) are one
    finding listing them (``analyze.findings.merge_ranks``). The gain is the
    fix's ``gain_if_fixed`` where worth saying; the finding of the leading
    straggler (``analyze.rules.cause``) carries the verdict's headline."""

    code = Code.STRAGGLER

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage and kind in ``ctx.stragglers``, in their order."""
        policy = ctx.policies.stragglers
        out = []
        lacked = lacked_cpu(ctx) if ctx.stragglers else {}
        for s in ctx.stragglers:
            sev = Severity(s.severity)
            evidence = s.to_dict()
            if s.kind == "compute":
                msg = (f"rank {s.rank} of {s.stage} computes {times(1 + s.slowdown)} its peers' time "
                       f"({ms(s.own_s)} vs {ms(s.peers_s)} per iteration)")
                if s.phase:
                    msg += in_straggler_phase(s.phase) + f" (+{ms(s.phase_excess_s)})"
                if s.excess_over_noise is not None and s.excess_over_noise != float("inf"):
                    msg += (f"; {s.excess_over_noise:.1f}x the step-to-step noise "
                            f"across ranks")
            else:
                msg = (f"rank {s.rank} of {s.stage} waits for input {ms(s.own_s - s.peers_s)} longer "
                       f"per iteration than its peers ({pct(s.slowdown)} of an iteration)")
                if s.phase:
                    msg += f", in {s.phase}"
            if s.peers_extra_sync_s > 0:
                if s.wait_method is not None:
                    where = f" in {s.wait_phase}" if s.wait_phase else " at the end of the iteration"
                    how = f" ({INFERRED_WORDS})" if s.wait_method == "inferred" else ""
                    msg += (f"; its peers wait {ms(s.peers_extra_sync_s)} longer for it at the "
                            f"collective{where}{how}")
                else:
                    msg += f"; its peers wait {ms(s.peers_extra_sync_s)} longer in sync phases for it"
            gain = None
            if s.gain_if_fixed is not None and s.gain_if_fixed > policy.gain_worth_saying:
                gain = s.gain_if_fixed
                msg += f"; at its peers' pace the pipeline would be {speedup(s.gain_if_fixed)} faster"
                ranks = next((st.workers for st in ctx.stages if st.stage == s.stage), 0)
                if s.excess_over_noise is not None and ranks >= policy.cost_in_ranks_from:
                    lost = ranks * s.gain_if_fixed / (1 + s.gain_if_fixed)
                    msg += f" (it costs the time of {lost:.0f} of the stage's {ranks} ranks)"
                    evidence["ranks_lost"] = lost
                if s.stage in lacked:
                    msg += shared_cores_note(lacked[s.stage])
                    evidence["ranks_lacked_cpu_share"] = lacked[s.stage]
            elif s.gain_if_fixed is not None:
                msg += "; bringing it to its peers' pace would not speed the pipeline up"
            out.append(Finding(self.code, sev, msg, evidence, gain=gain))
        merged = merge_ranks(out, by=("stage", "kind"), figure=_figure)
        cause = ctx.cause
        lead = cause.straggler if cause is not None and cause.kind == "straggler" else None
        for f in merged:
            each = f.evidence.get("per_rank", [f.evidence])
            if lead is not None and any((e["stage"], e["kind"], e["worker"])
                                        == (lead.stage, lead.kind, lead.worker) for e in each):
                named = [lead.rank] + [e["rank"] for e in each
                                       if e["severity"] != "info" and e["worker"] != lead.worker]
                f.headline = _headline(ctx, lead, named, lacked)
                f.gain = lead.gain_if_fixed
        return merged
