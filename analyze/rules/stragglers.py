"""``straggler``: one finding per lagging worker (``analyze.stragglers`` finds
them; its severity follows the gain if fixed, ``Straggler.severity``).
docs/DIAGNOSIS.md section 8."""

from __future__ import annotations

from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.lockstep import INFERRED_WORDS
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.rules.machine import lacked_cpu, shared_cores_note
from tlog.analyze.text import ms, pct, speedup, times

#: Stages of at least this many lockstep ranks have a straggler's cost told in
#: ranks (``ranks x gain / (1 + gain)``: the share of the group's time it wastes).
#: Source: tlog's choice (below, a fraction of a rank says little).
COST_IN_RANKS_FROM = 8


def in_straggler_phase(phase: str | None) -> str:
    """Where a compute straggler's excess lies, for the texts: ``", most in
    backward"``, or for the straggler's untimed time (``analyze.load.UNACCOUNTED_PHASE``)
    ``", most in time no phase covers (untimed code)"``; "" without a phase."""
    if not phase:
        return ""
    if phase == UNACCOUNTED_PHASE:
        return ", most in time no phase covers (untimed code)"
    return f", most in {phase}"


class StragglerRule(Rule):
    """``straggler``: what the worker does slowly, where its peers wait for it,
    and what fixing it would buy (said from ``Thresholds.gain_worth_saying``;
    called rough where its stage's ranks waited for a core,
    :func:`analyze.rules.machine.lacked_cpu`, evidence
    ``ranks_lacked_cpu_share``)."""

    code = Code.STRAGGLER

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per straggler in ``ctx.stragglers``, in their order."""
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
            if s.gain_if_fixed is not None and s.gain_if_fixed > ctx.thresholds.gain_worth_saying:
                msg += f"; at its peers' pace the pipeline would be {speedup(s.gain_if_fixed)} faster"
                ranks = next((st.workers for st in ctx.stages if st.stage == s.stage), 0)
                if s.excess_over_noise is not None and ranks >= COST_IN_RANKS_FROM:
                    lost = ranks * s.gain_if_fixed / (1 + s.gain_if_fixed)
                    msg += f" (it costs the time of {lost:.0f} of the stage's {ranks} ranks)"
                    evidence["ranks_lost"] = lost
                if s.stage in lacked:
                    msg += shared_cores_note(lacked[s.stage])
                    evidence["ranks_lacked_cpu_share"] = lacked[s.stage]
            elif s.gain_if_fixed is not None:
                msg += "; bringing it to its peers' pace would not speed the pipeline up"
            out.append(Finding(self.code, sev, msg, evidence))
        return out
