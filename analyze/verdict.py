"""The diagnosis of one run: :func:`diagnose` and its :class:`Diagnosis`.

``diagnose(con, run_id)`` loads and attributes the run (``analyze.frames``),
takes the steady state (``analyze.steady``), builds the per-stage figures and
the pipeline model (``analyze.pipeline``), finds stragglers
(``analyze.stragglers``) and the findings (``analyze.findings``), and writes
the verdict sentence. :meth:`Diagnosis.to_dict` is the JSON of
``tlog diagnose --json`` (docs/DIAGNOSIS.md "JSON").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import numpy as np
import polars as pl
from tlog.analyze.findings import Code, Finding
from tlog.analyze.frames import RunAnalysis, attribute
from tlog.analyze.gaps import BETWEEN_MOSTLY, between_words
from tlog.analyze.lockstep import INFERRED_WORDS, LockstepResult
from tlog.analyze.pipeline import (
    HIGH_SHARE,
    Bottleneck,
    StageStats,
    find_bottleneck,
    fix_gain,
    pipeline_model,
    stage_phase_seconds,
    stage_stats,
    what_if,
    worker_table,
)
from tlog.analyze.pp import PPStage, pipeline_parallel
from tlog.analyze.results import (
    BottleneckResult,
    CategoryShares,
    IterationCounts,
    LeadingStraggler,
    PipelineSummary,
    QueueState,
    StageResult,
    SystemSummary,
    Throughput,
    TopPhase,
    WhatIf,
)
from tlog.analyze.rules import (
    DEFAULT_RULES,
    DEFAULT_THRESHOLDS,
    Rule,
    RuleContext,
    Thresholds,
    evaluate_rules,
    in_straggler_phase,
    plugin_rules,
    queue_states,
    queue_waits,
)
from tlog.analyze.rules.machine import SHARED_CORES_WORDS, contention_advice, contention_words
from tlog.analyze.rules.pp import pp_clause
from tlog.analyze.steady import disruptive_events
from tlog.analyze.stragglers import Straggler, find_stragglers
from tlog.analyze.system import system_summary
from tlog.analyze.text import in_phase, ms, pct, phase_label, speedup, times

from dflash_runtime.format import CATEGORIES

#: A bottleneck stage that waits less than the next stage by under this many
#: points of share is a close call (confidence "medium"). Source: tlog's choice.
CLOSE_MARGIN = 0.05
#: A bottleneck category share within this of HIGH_SHARE is a close call.
CLOSE_TO_THRESHOLD = 0.03


@dataclass(frozen=True)
class Diagnosis:
    """Where one run's time went and what limits it (the ``tlog diagnose`` result).

    Every field is typed (``tlog.analyze.results``; units in each class);
    :meth:`to_dict` gives the stable JSON of ``tlog diagnose --json``;
    :meth:`stage_table` the stages as a polars frame; in a notebook the
    object shows itself as an HTML summary (:meth:`_repr_html_`).
    :attr:`analysis` keeps the attributed frames
    (:meth:`~tlog.analyze.frames.RunAnalysis.iteration_frame`,
    :meth:`~tlog.analyze.frames.RunAnalysis.phase_frame`) for charts and is
    not part of the JSON.

    Attributes:
        run_id: the run's id.
        iterations: how many iterations were logged and judged.
        throughput: the run's steady throughput (its output stage's).
        categories: the run's category shares (all stages' time together).
        stages: per-stage figures, in pipeline order (upstream first).
        bottleneck: what limits the run, or None (no steady iterations).
        stragglers: lagging workers, the one whose fix is worth most first.
        findings: the findings, most severe first (``tlog.analyze.findings``).
        what_if: the largest phases' removal gains, largest first.
        device_times: whether device (GPU) times were recorded.
        verdict: the one-line verdict, starting ``Bottleneck:``.
        confidence: ``"high"``, ``"medium"`` or ``"low"``.
        confidence_reasons: why it is not high.
        queues: each logged queue's state over the steady window.
        pipeline: the pipeline model, or None (no steady iterations).
        notes: what the reader should know about the data (left-out workers,
            inferred waits, span-marker events, ...).
        host_only: no device times and the tags say the run had no GPU
            (:func:`host_only`): its sync shares are exact, not upper bounds.
        timers_synced: no device times and every figure comes from a
            framework's timer log (:func:`timers_synced`), whose timers
            synchronise the device: its sync shares are exact too.
        system: the machine and its load over the steady state
            (:class:`~tlog.analyze.results.SystemSummary`; counts and medians
            are None where the run recorded no system samples).
        pipeline_parallel: the pipeline-parallel stages (:class:`~tlog.analyze.pp.PPStage`:
            each rank's bubble share, the limiting rank, the gain of balancing).
    """

    run_id: str
    iterations: IterationCounts
    throughput: Throughput
    categories: CategoryShares
    stages: tuple[StageResult, ...]
    bottleneck: BottleneckResult | None
    stragglers: tuple[Straggler, ...]
    findings: tuple[Finding, ...]
    what_if: tuple[WhatIf, ...]
    device_times: bool
    verdict: str
    confidence: str
    confidence_reasons: tuple[str, ...]
    queues: tuple[QueueState, ...]
    pipeline: PipelineSummary | None
    notes: tuple[str, ...] = ()
    host_only: bool = False
    system: SystemSummary | None = None
    timers_synced: bool = False
    pipeline_parallel: tuple[PPStage, ...] = ()
    analysis: RunAnalysis | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``tlog diagnose --json`` (keys documented in docs/DIAGNOSIS.md)."""
        return {
            "run_id": self.run_id,
            "verdict": self.verdict,
            "confidence": self.confidence,
            "confidence_reasons": list(self.confidence_reasons),
            "iterations": self.iterations.to_dict(),
            "throughput": self.throughput.to_dict(),
            "categories": self.categories.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "bottleneck": self.bottleneck.to_dict() if self.bottleneck else None,
            "stragglers": [s.to_dict() for s in self.stragglers],
            "findings": [f.to_dict() for f in self.findings],
            "what_if": [w.to_dict() for w in self.what_if],
            "device_times": self.device_times,
            "host_only": self.host_only,
            "timers_synced": self.timers_synced,
            "queues": [q.to_dict() for q in self.queues],
            "pipeline": self.pipeline.to_dict() if self.pipeline else None,
            "notes": list(self.notes),
            "system": self.system.to_dict() if self.system is not None else None,
            "pipeline_parallel": [p.to_dict() for p in self.pipeline_parallel],
        }

    def stage_table(self) -> pl.DataFrame:
        """The stages as a frame, one row per stage in pipeline order.

        Columns: ``stage`` (str), ``workers``, ``iterations`` (int),
        ``seconds`` (float, the stage's steady time base),
        ``iters_per_s``, ``tokens_per_s``, ``samples_per_s`` (float, null
        when not reported), one share column per category (``starvation``,
        ``backpressure``, ``compute``, ``sync``, ``unaccounted``: fractions
        of the stage's time), ``wait_share`` and ``bottleneck`` (bool: the
        limiting stage).
        """
        limiting = self.bottleneck.stage if self.bottleneck is not None else None
        rows = [{"stage": s.stage, "workers": s.workers, "iterations": s.iterations,
                 "seconds": s.seconds, **s.throughput.to_dict(), **s.categories.to_dict(),
                 "wait_share": s.wait_share, "bottleneck": s.stage == limiting}
                for s in self.stages]
        schema = {"stage": pl.String, "workers": pl.Int64, "iterations": pl.Int64,
                  "seconds": pl.Float64, "iters_per_s": pl.Float64,
                  "tokens_per_s": pl.Float64, "samples_per_s": pl.Float64,
                  **{c: pl.Float64 for c in CATEGORIES}, "wait_share": pl.Float64,
                  "bottleneck": pl.Boolean}
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(
            schema=schema)

    def _repr_html_(self) -> str:
        """An HTML summary for notebooks: verdict, stages, findings (every
        name from the logs escaped: ``tlog.analyze.html_repr``)."""
        from tlog.analyze.html_repr import diagnosis_html

        return diagnosis_html(self)


def _stage_result(st: StageStats, workers: pl.DataFrame,
                  lock: LockstepResult | None) -> StageResult:
    w = workers.filter(pl.col("stage") == st.stage)
    return StageResult(
        stage=st.stage, workers=st.workers, ranks=tuple(sorted(set(w["rank"].to_list()))),
        iterations=st.iterations, seconds=st.seconds,
        throughput=Throughput(st.iters_per_s, st.tokens_per_s, st.samples_per_s),
        categories=CategoryShares.from_mapping(st.shares), wait_share=st.wait_share,
        top_phases=tuple(TopPhase(**p) for p in st.top_phases),
        lockstep=lock.of(st.stage) if lock is not None else None)


def _run_throughput(stages: list[StageStats]) -> Throughput:
    """The run's throughput: per unit, the last (most downstream) stage that reports it."""
    out: dict[str, float | None] = {"iters_per_s": None, "tokens_per_s": None,
                                    "samples_per_s": None}
    for key in out:
        for st in reversed(stages):
            value = getattr(st, key)
            if value is not None:
                out[key] = value
                break
    return Throughput.from_mapping(out)


def _steady_windows(analysis: RunAnalysis) -> list[tuple[float, float]]:
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    if not steady.any():
        return []
    ts = it["ts"].to_numpy()
    dur = it["dur"].to_numpy()
    # Masked reductions in blocks, not copies of whole columns (memory at scale).
    first, last, block = np.inf, -np.inf, 1 << 17
    for a in range(0, len(ts), block):
        m = steady[a:a + block]
        first = min(first, float(np.min(ts[a:a + block], where=m, initial=np.inf)))
        last = max(last, float(np.max(ts[a:a + block] + dur[a:a + block], where=m,
                                      initial=-np.inf)))
    return [(first, last)]


def _confidence(bn: Bottleneck | None, short: bool, device_times: bool,
                steady: int, min_steady: int, intervals: int | None = None,
                fewest: int | None = None) -> tuple[str, list[str]]:
    reasons = []
    if steady == 0:
        return "low", ["no steady-state iterations"]
    if short and intervals is not None and intervals < min_steady and (
            fewest is None or fewest >= min_steady):
        reasons.append(f"it rests on {intervals} logged interval"
                       f"{'s' if intervals != 1 else ''} of the timer log on some worker "
                       f"(each repeated for its iterations), fewer than {min_steady}")
    elif short:
        reasons.append(f"fewer than {min_steady} steady iterations on some worker")
    if bn is not None:
        if bn.margin is not None and bn.margin < CLOSE_MARGIN:
            reasons.append(f"{bn.runner_up} waits almost as little as {bn.stage} "
                           f"({pct(bn.margin)} apart)")
        if abs(bn.share - HIGH_SHARE) < CLOSE_TO_THRESHOLD and bn.category != "compute":
            reasons.append(f"the {bn.category} share {pct(bn.share)} is close to the "
                           f"{pct(HIGH_SHARE)} threshold")
        if bn.category == "sync" and not device_times:
            reasons.append("sync is an upper bound without device times")
    level = "low" if short else ("medium" if reasons else "high")
    return level, reasons


def leading_straggler(bn: Bottleneck | None, stragglers: list[Straggler],
                      what_ifs: list[dict]) -> Straggler | None:
    """The straggler that leads the verdict, or None: the first straggler of the
    bottleneck stage worth at least a warning, when :func:`_leads` says its fix
    is the cause (docs/DIAGNOSIS.md section 8). ``stragglers`` most valuable first."""
    if bn is None:
        return None
    lag = [s for s in stragglers if s.stage == bn.stage and s.severity != "info"]
    gain = next((w for w in what_ifs if w["stage"] == bn.stage and w["phase"] == bn.phase), None)
    return lag[0] if lag and _leads(lag[0], gain) else None


def _leads(s: Straggler, gain: dict | None) -> bool:
    """Whether straggler ``s`` leads the verdict: it is critical (its fix is
    worth at least 1/0.75 - 1, NVRx's level), or its fix is worth at least
    removing the bottleneck phase outright (then the stage's category is its
    symptom, e.g. the peers' sync wait for it). Source: tlog's choice (the
    verdict line follows the gain)."""
    if s.gain_if_fixed is None:
        return False
    if s.severity == "critical":
        return True
    return gain is None or s.gain_if_fixed >= gain["throughput_gain"]


def _straggler_clause(s: Straggler, th: Thresholds = DEFAULT_THRESHOLDS,
                      lacked: Mapping[str, float] | None = None) -> str:
    """What straggler ``s`` does slowly, where its peers wait for it and what
    fixing it would buy (the verdict's words after "rank R is a straggler: ");
    the gain is called rough where its stage is in ``lacked``
    (:func:`analyze.rules.machine.lacked_cpu`)."""
    if s.kind == "compute":
        text = (f"its compute takes {times(1 + s.slowdown)} its peers' time "
                f"({ms(s.own_s)} vs {ms(s.peers_s)} per iteration)"
                + in_straggler_phase(s.phase))
    else:
        text = (f"it waits {ms(s.own_s - s.peers_s)} more per iteration"
                f"{(' in ' + s.phase) if s.phase else ''}")
    if s.wait_method is not None and s.peers_extra_sync_s > 0:
        text += (f"; its peers wait {ms(s.peers_extra_sync_s)} per iteration for it"
                 + (f" in {s.wait_phase}" if s.wait_phase else " after the last phase")
                 + (f" ({INFERRED_WORDS})" if s.wait_method == "inferred" else ""))
    if s.gain_if_fixed is not None and s.gain_if_fixed > th.gain_worth_saying:
        text += f"; at its peers' pace the pipeline would be {speedup(s.gain_if_fixed)} faster"
        if lacked and s.stage in lacked:
            text += f" ({SHARED_CORES_WORDS})"
    return text


def _straggler_noun(s: Straggler) -> str:
    return "a straggler" if s.kind == "compute" else "an input straggler"


def leading_contention(findings: Sequence[Finding]) -> Finding | None:
    """The ``cpu_contention`` finding the verdict leads with, or None: the first
    whose evidence says it explains the bottleneck stage's largest loss
    (``analyze.rules.machine.contention``'s ``leads``: measured run-queue
    delay, never a guess)."""
    return next((f for f in findings if f.code == Code.CPU_CONTENTION
                  and f.evidence.get("leads")), None)


def core_wait_stages(findings: Sequence[Finding]) -> dict[str, float]:
    """Stage -> the largest measured run-queue share of its workers, from the
    ``unaccounted`` findings' evidence (``run_queue_share``, set by the rule
    from :func:`analyze.rules.machine.cpu_waits`); stages without it absent."""
    return {f.evidence["stage"]: f.evidence["run_queue_share"] for f in findings
            if f.code == Code.UNACCOUNTED and f.evidence.get("run_queue_share") is not None}


def lacked_cpu_stages(findings: Sequence[Finding]) -> dict[str, float]:
    """Stage -> run-queue share, for the stages whose straggler finding called its gain
    rough (evidence ``ranks_lacked_cpu_share``, set by the ``straggler`` rule from
    :func:`analyze.rules.machine.lacked_cpu`): the verdict says so too, from the same
    figures."""
    return {f.evidence["stage"]: f.evidence["ranks_lacked_cpu_share"] for f in findings
            if f.code == Code.STRAGGLER and "ranks_lacked_cpu_share" in f.evidence}


def _contention_text(where: str, found: Finding) -> str:
    """The verdict when the bottleneck stage's thread lacked a CPU."""
    ev = found.evidence
    who = where if ev.get("worker") is None else f"{where} (rank {ev['rank']})"
    return (f"Bottleneck: {who} lacks CPU - its thread waited runnable for a core "
            f"{pct(ev['contention_share'])} of its time ({ms(ev['contention_s_per_iter'])}/iter, "
            f"the scheduler's run-queue delay) with {contention_words(ev)}: {contention_advice(ev)}")


def verdict_sentence(bn: Bottleneck | None, stages: list[StageStats],
                     stragglers: list[Straggler], what_ifs: list[dict], device_times: bool,
                     confidence: str, lock: LockstepResult | None = None,
                     thresholds: Thresholds = DEFAULT_THRESHOLDS,
                     contention: Finding | None = None,
                     lacked: Mapping[str, float] | None = None,
                     pp: Sequence[PPStage] = (),
                     core_wait: Mapping[str, float] | None = None) -> str:
    """The one-line verdict, starting ``Bottleneck:`` (docs/DIAGNOSIS.md "Verdict").

    A straggler is named when its fix is worth at least a warning
    (``Straggler.severity``); a sync share or a peers' wait that rests on the
    inferred collective wait says so ("inferred from rank alignment").
    ``contention``, the :func:`leading_contention` finding, leads the verdict
    unless a straggler does: the stage's compute time is then partly a wait
    for a core, and its largest phase follows as the symptom. ``lacked``
    (stage -> share, :func:`lacked_cpu_stages`): a straggler's
    gain in such a stage is called rough. ``pp``: the pipeline-parallel stages
    (``analyze.pp``); when the bottleneck stage is one, its limiting rank leads
    (docs/DIAGNOSIS.md "Pipeline parallelism"). ``core_wait`` (stage -> the
    largest measured run-queue share of its workers, :func:`core_wait_stages`):
    time between iterations is a wait for a core, not a loader's, where it
    is at least that time (:func:`analyze.gaps.between_words`)."""
    if bn is None:
        steady = sum(s.iterations for s in stages)
        if steady:
            return (f"Bottleneck: unknown - the {steady} steady-state iterations last no time "
                    f"(dur 0): nothing to judge.")
        return "Bottleneck: unknown - no steady-state iterations to judge."
    st = next(s for s in stages if s.stage == bn.stage)
    found = lock.of(bn.stage) if lock is not None else None
    inferred = found is not None and found.inferred_in(bn.phase)
    per_iter = bn.phase_share * st.seconds / st.iterations if st.iterations else 0.0
    multi = len(stages) > 1
    where = f"stage {bn.stage}" if multi else bn.stage
    if bn.category == "compute":
        text = f"Bottleneck: {where} is compute-bound"
        if bn.phase:
            text += f"; {bn.phase} takes {pct(bn.phase_share)} of its time ({ms(per_iter)}/iter)"
    elif bn.category == "starvation":
        text = (f"Bottleneck: input - {bn.stage} waits for data {pct(bn.share)} of its time"
                + in_phase(bn.phase, bn.phase_share, bn.share, per_iter)
                + ("; the source upstream of every logged stage limits the run" if multi
                   else "; the data source limits the loop"))
    elif bn.category == "backpressure":
        text = (f"Bottleneck: output - {bn.stage} is blocked handing output on "
                f"{pct(bn.share)} of its time" + in_phase(bn.phase, bn.phase_share, bn.share,
                                                          per_iter)
                + "; a consumer downstream of every logged stage limits the run")
    elif bn.category == "sync":
        text = (f"Bottleneck: {where} is sync-bound - {pct(bn.share)} of its time waiting"
                + in_phase(bn.phase, bn.phase_share, bn.share, per_iter)
                + (f" (a collective wait {INFERRED_WORDS})" if inferred else "")
                + ("" if device_times else " (an upper bound: no device times)"))
    elif st.between_share_of_unaccounted >= BETWEEN_MOSTLY:
        words = between_words((core_wait or {}).get(bn.stage),
                              st.between_s / st.seconds if st.seconds else 0.0)
        text = (f"Bottleneck: {where} - {pct(bn.share)} of its time is in no phase, most of "
                f"it between iterations (outside rec.iteration()): {words}")
    else:
        text = (f"Bottleneck: {where} - {pct(bn.share)} of its time is in no phase "
                f"(missing timers or Python overhead between phases)")
    staged = next((p for p in pp if p.stage == bn.stage), None)
    if staged is not None:
        text = f"Bottleneck: {where} is a pipeline-parallel schedule - " + pp_clause(staged)
        if contention is not None:
            text += "; " + _contention_text(where, contention).removeprefix("Bottleneck: ")
        return _ended(text, confidence)
    lag = [s for s in stragglers if s.stage == bn.stage and s.severity != "info"]
    gain = next((w for w in what_ifs if w["stage"] == bn.stage and w["phase"] == bn.phase), None)
    lead = leading_straggler(bn, stragglers, what_ifs)
    if lead is not None:
        # The straggler is the cause and its fix is worth most: it leads, and the
        # stage's category (often sync: the peers' wait for it) follows as the symptom.
        s = lead
        text = (f"Bottleneck: rank {s.rank} of {where} is {_straggler_noun(s)} - "
                + _straggler_clause(s, thresholds, lacked))
        if bn.category == "sync":
            text += (f"; {bn.stage} spends {pct(bn.share)} of its time waiting"
                     + in_phase(bn.phase, bn.phase_share, bn.share, per_iter)
                     + (f" ({INFERRED_WORDS})" if inferred else "")
                     + ("" if device_times else " (an upper bound: no device times)"))
        return _ended(text, confidence)
    if contention is not None:
        text = _contention_text(where, contention)
        if bn.phase and bn.category == "compute":
            text += (f"; {bn.phase} takes {pct(bn.phase_share)} of its time "
                     f"({ms(per_iter)}/iter), slowed with it")
        return _ended(text, confidence)
    if lag:
        s = lag[0]
        text += (f". Rank {s.rank} is {_straggler_noun(s)}: "
                 + _straggler_clause(s, thresholds, lacked))
    if gain is not None and not (lag and bn.category == "sync"):
        text += (f". Removing {phase_label(bn.phase)} would make the pipeline "
                 f"{speedup(gain['throughput_gain'])} faster")
    return _ended(text, confidence)


def _ended(text: str, confidence: str) -> str:
    """The verdict's last words: a full stop and the confidence when not high."""
    return text + "." + (f" (confidence: {confidence})" if confidence != "high" else "")


def diagnose(con: duckdb.DuckDBPyConnection, run_id: str, *,
             thresholds: Thresholds | None = None,
             rules: Sequence[Rule] | None = None, since: float | None = None) -> Diagnosis:
    """Diagnose one run (DESIGN.md "Verdict"; every rule in docs/DIAGNOSIS.md).

    Args:
        con: an open tlog database (read-only is enough).
        run_id: the run's id (``tlog runs`` lists them).
        thresholds: the findings' limits (``analyze.rules.Thresholds``; its
            defaults when None).
        rules: the finding rules to run, in report order; None runs
            ``analyze.rules.DEFAULT_RULES`` and then the installed plugins'
            (``tlog.rules`` entry points).
        since: diagnose only a window of the run, the iterations from this
            epoch second on (``tlog watch``: a growing run's recent state at a
            cost that does not grow with the run); a note says so. Never stored.

    Returns:
        The :class:`Diagnosis`; ``.to_dict()`` is the ``--json`` output.

    Raises:
        RunNotFoundError: no such run, or it holds no iterations (in the window).
    """
    return diagnose_attributed(attribute(con, run_id, since=since), thresholds=thresholds,
                                rules=rules)


def host_only(run: dict[str, Any]) -> bool:
    """Whether the run's tags say it ran without a GPU: ``device`` is ``cpu``
    (the reference pipeline's tag), or its ``torch`` is a CPU-only build
    (``2.13.0+cpu``, the shim's tag). Then no device work can hide in a sync
    wait: sync shares are exact, not upper bounds (DESIGN.md "Attribution")."""
    tags = run.get("tags") or {}
    return (str(tags.get("device", "")).lower() == "cpu"
            or str(tags.get("torch", "")).endswith("+cpu"))


def timers_synced(run: dict[str, Any]) -> bool:
    """Whether every file of the run is a Megatron-LM or DeepSpeed timer log
    (``runs.source`` is ``timer_log``: docs/TIMER_LOGS.md). Their timers
    synchronise the device: Megatron-LM's ``Timer.start``/``stop``
    (megatron/core/timers.py) call ``torch.cuda.synchronize()``, DeepSpeed's
    ``SynchronizedWallClockTimer`` synchronises (before 2023) or times CUDA
    events on the stream (deepspeed/utils/timer.py). So no queued device
    compute hides in a timer's sync figure: sync shares are exact, and tlog's
    advice to record phases with a stream does not apply."""
    return run.get("source") == "timer_log"


def logged_intervals(analysis: RunAnalysis, left_out: set[int] | frozenset[int] = frozenset()
                     ) -> list[int]:
    """Per counted worker of an averaged timer log (``RunData.intervals``: a
    logged interval's figure repeated for each of its iterations), how many
    logged intervals its steady iterations come from: each is one observation
    of the run, however many iterations it stands for. Workers without logged
    intervals are not counted; ``[]`` for runs without averaged timer logs.
    Source: the frameworks print one figure per ``--log-interval``
    (Megatron-LM ``training_log``, GPT-NeoX, NeMo 2's ``ProgressPrinter``) or
    per ``steps_per_print`` (DeepSpeed's pipeline engine)."""
    ends_by_worker = analysis.data.intervals
    if not ends_by_worker:
        return []
    names = dict(analysis.data.workers.select("wid", "worker").iter_rows())
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    iters = it["iter"].to_numpy()
    out = []
    for wid, a, b in analysis.slices:
        ends = ends_by_worker.get(names.get(wid, ""))
        if not ends or wid in left_out:
            continue
        mine = iters[a:b][steady[a:b]]
        out.append(len(np.unique(np.searchsorted(np.asarray(ends), mine))))
    return out


def diagnose_attributed(analysis: RunAnalysis, *, thresholds: Thresholds | None = None,
                         rules: Sequence[Rule] | None = None) -> Diagnosis:
    """:func:`diagnose` for an attributed run (:func:`tlog.analyze.frames.attribute`, or
    :func:`tlog.analyze.frames.attribute_data` with a walk of its own: the Spark diagnosis)."""
    th = thresholds if thresholds is not None else DEFAULT_THRESHOLDS
    if rules is None:
        rules = (*DEFAULT_RULES, *plugin_rules())
    data = analysis.data
    it = analysis.iterations
    total = it.height
    steady_n = int(it["steady"].sum())
    warm = int((it["excluded"] == "warmup").sum())
    event = int((it["excluded"] == "event").sum())
    attempt = int((it["excluded"] == "attempt").sum())
    left_out = {w for a in analysis.attempts for w in a.left_out}
    workers = worker_table(analysis)
    phase_s = stage_phase_seconds(analysis)
    stages = stage_stats(analysis, workers, phase_s)
    bn = find_bottleneck(stages)
    device_times = data.device_times
    on_host = not device_times and host_only(data.run)
    synced = not device_times and not on_host and timers_synced(data.run)
    exact_sync = device_times or on_host or synced   # else sync shares are upper bounds
    model = pipeline_model(stages, workers, analysis)
    ifs = what_if(analysis, stages, model)
    notes = list(data.notes) + [a.note() for a in analysis.attempts]
    lock = analysis.lockstep
    if lock is not None:
        notes += lock.notes
    stragglers = [replace(s, gain_if_fixed=fix_gain(model, s.stage, s.wid, s.kind))
                  for s in find_stragglers(analysis, workers,
                                           model.lockstep if model else None, notes,
                                           model=model)]
    # The straggler whose fix is worth most first (the verdict names the first).
    stragglers.sort(key=lambda s: (-(s.gain_if_fixed if s.gain_if_fixed is not None else -1.0),
                                   -s.slowdown, s.stage, s.rank))
    queue_names = (data.queues["name"].unique().to_list() if data.queues.height else [])
    queues = queue_states(data.queues, _steady_windows(analysis), th.queue_state_share,
                          queue_waits(analysis, queue_names), th.queue_time_share)
    pp = pipeline_parallel(analysis, workers, model)

    per_worker_steady = pl.Series(
        [int(it["steady"][a:b].sum()) for w, a, b in analysis.slices if w not in left_out]
        or [0])
    intervals = logged_intervals(analysis, left_out)
    ctx = RuleContext(analysis=analysis, stages=stages, bottleneck=bn, workers=workers,
                      stragglers=stragglers, queues=queues, lockstep=lock,
                      exact_sync=exact_sync, steady_iterations=steady_n,
                      min_steady_per_worker=int(per_worker_steady.min()) if total else 0,
                      thresholds=th, pipeline_parallel=pp,
                      min_intervals_per_worker=min(intervals) if intervals else None)
    short = ctx.short
    findings = evaluate_rules(ctx, rules)
    it_ts, it_dur = it["ts"].to_numpy(), it["dur"].to_numpy()
    for ev in disruptive_events(data.events, it_ts, it_dur)[1].iter_rows(named=True):
        notes.append(f"event {ev['name']!r} ({ms(ev['dur'])}) spans most of the run: "
                     f"taken as a span marker, nothing left out for it")
    confidence, reasons = _confidence(bn, short, exact_sync, steady_n, th.min_steady_iters,
                                      ctx.min_intervals_per_worker, ctx.min_steady_per_worker)
    lead = leading_straggler(bn, stragglers, ifs)
    crowded = leading_contention(findings) if lead is None else None
    verdict = verdict_sentence(bn, stages, stragglers, ifs, exact_sync, confidence, lock, th,
                               contention=crowded, lacked=lacked_cpu_stages(findings), pp=pp,
                               core_wait=core_wait_stages(findings))
    if crowded is not None:
        # the verdict's cause first among the findings
        findings.sort(key=lambda f: 0 if f is crowded else 1)
    if lead is not None:
        # the verdict's cause first among the findings, its symptoms after it
        findings.sort(key=lambda f: 0 if (f.code == Code.STRAGGLER
                                          and f.evidence.get("worker") == lead.worker
                                          and f.evidence.get("stage") == lead.stage
                                          and f.evidence.get("kind") == lead.kind) else 1)
    for found in (lock.stages if lock is not None else []):
        if found.phase is not None and found.inferred_in(found.phase):
            notes.append(
                f"stage {found.stage}: the ranks' wait for each other in {found.phase} is "
                f"{INFERRED_WORDS}; the collective's own time, which every rank pays alike, "
                f"stays in {found.phase}. For DDP, rec.watch_ddp(model) measures the whole "
                f"exposed wait (docs/RUNTIME.md)")

    base = sum(s.seconds for s in stages)
    categories = CategoryShares.from_mapping(
        {c: (sum(s.category_s[c] for s in stages) / base if base else 0.0) for c in CATEGORIES})
    bottleneck = None
    if bn is not None:
        # the straggler the verdict leads with (the cause; the category is its symptom)
        leading = None if lead is None else LeadingStraggler(
            rank=lead.rank, worker=lead.worker, kind=lead.kind, phase=lead.phase,
            speedup_if_fixed=lead.speedup_if_fixed)
        bottleneck = BottleneckResult(
            stage=bn.stage, category=bn.category, phase=bn.phase, share=bn.share,
            phase_share=bn.phase_share, margin=bn.margin, runner_up=bn.runner_up,
            seen_from=bn.seen_from, confidence=confidence, straggler=leading,
            cause=Code.CPU_CONTENTION.value if crowded is not None else None,
            rank=next((p.limiting_rank for p in pp if p.stage == bn.stage), None))
    pipeline = None
    if model is not None:
        pipeline = PipelineSummary(
            order=tuple(s.stage for s in stages), unit=model.unit,
            model_throughput=model.throughput, limiting_stage=model.limiting_stage,
            stage_rates=dict(model.rates), lockstep=tuple(sorted(model.lockstep)))
    return Diagnosis(
        run_id=data.run_id,
        iterations=IterationCounts(total=total, steady=steady_n, excluded=total - steady_n,
                                   warmup=warm, event=event, attempt=attempt),
        throughput=_run_throughput(stages),
        categories=categories,
        stages=tuple(_stage_result(s, workers, lock) for s in stages),
        bottleneck=bottleneck,
        stragglers=tuple(stragglers),
        findings=tuple(findings),
        what_if=tuple(WhatIf(**w) for w in ifs),
        device_times=device_times, host_only=on_host, timers_synced=synced,
        verdict=verdict,
        confidence=confidence,
        confidence_reasons=tuple(reasons),
        queues=tuple(QueueState(**q) for q in queues),
        pipeline=pipeline,
        notes=tuple(notes),
        system=system_summary(analysis, workers),
        pipeline_parallel=tuple(pp),
        analysis=analysis,
    )
