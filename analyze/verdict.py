"""The diagnosis of one run: :func:`diagnose` and its :class:`Diagnosis`.

``diagnose(con, run_id)`` loads and attributes the run (``analyze.frames``),
takes the steady state (``analyze.steady``), builds the per-stage figures and
the pipeline model (``analyze.pipeline``), finds stragglers
(``analyze.stragglers``) and the findings (``analyze.rules``). The verdict is
the headline of the first finding that has one, in the findings' sort order
(``analyze.findings.finding_key``: severity, then gain): the rules decide what
leads, not this module. :meth:`Diagnosis.to_dict` is the JSON of
``tlog diagnose --json`` (docs/DIAGNOSIS.md "JSON").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import numpy as np
import polars as pl
from tlog.analyze.findings import HEADLINE_MAX, Code, Finding, lead_finding
from tlog.analyze.frames import RunAnalysis, attribute
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
    DEFAULT_POLICIES,
    DEFAULT_RULES,
    Policies,
    Rule,
    RuleContext,
    evaluate_rules,
    plugin_rules,
    queue_states,
    queue_waits,
)
from tlog.analyze.steady import disruptive_events
from tlog.analyze.stragglers import Straggler, find_stragglers
from tlog.analyze.system import system_summary
from tlog.analyze.text import ms, pct

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
        findings: the findings in ``tlog.analyze.findings.finding_key`` order
            (severity, then gain); several ranks of a stage are one finding.
        what_if: the largest phases' removal gains, largest first.
        device_times: whether device (GPU) times were recorded.
        verdict: the one-line verdict, starting ``Bottleneck:``: the headline of
            the first finding that has one, at most ``HEADLINE_MAX`` characters.
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


def verdict_sentence(bn: Bottleneck | None, stages: Sequence[StageStats],
                     findings: Sequence[Finding], confidence: str) -> str:
    """The one-line verdict, starting ``Bottleneck:``, of at most
    :data:`~tlog.analyze.findings.HEADLINE_MAX` characters: the headline of the
    first finding with one (:func:`~tlog.analyze.findings.lead_finding`), a
    full stop, and the confidence when not high. Without a bottleneck it says
    why; a bottleneck no finding leads (a ``rules=`` list without the category
    rules) gets its stage, category and share."""
    end = "." + (f" (confidence: {confidence})" if confidence != "high" else "")
    if bn is None:
        steady = sum(s.iterations for s in stages)
        if steady:
            return (f"Bottleneck: unknown - the {steady} steady-state iterations last no time "
                    f"(dur 0): nothing to judge.")
        return "Bottleneck: unknown - no steady-state iterations to judge."
    lead = lead_finding(findings)
    if lead is None or lead.headline is None:
        return f"Bottleneck: {bn.stage} - {bn.category} {pct(bn.share)} of its time{end}"
    return lead.headline.text(HEADLINE_MAX - len(end)) + end


def diagnose(con: duckdb.DuckDBPyConnection, run_id: str, *,
             policies: Policies | None = None,
             rules: Sequence[Rule] | None = None, since: float | None = None) -> Diagnosis:
    """Diagnose one run (DESIGN.md "Verdict"; every rule in docs/DIAGNOSIS.md).

    Args:
        con: an open tlog database (read-only is enough).
        run_id: the run's id (``tlog runs`` lists them).
        policies: the findings' limits, one frozen policy per family of rules
            (``analyze.rules.Policies``; its defaults when None).
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
    return diagnose_attributed(attribute(con, run_id, since=since), policies=policies,
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


def diagnose_attributed(analysis: RunAnalysis, *, policies: Policies | None = None,
                         rules: Sequence[Rule] | None = None) -> Diagnosis:
    """:func:`diagnose` for an attributed run (:func:`tlog.analyze.frames.attribute`, or
    :func:`tlog.analyze.frames.attribute_data` with a walk of its own: the Spark diagnosis)."""
    policy = policies if policies is not None else DEFAULT_POLICIES
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
    # The straggler whose fix is worth most first (the one that may lead the verdict).
    stragglers.sort(key=lambda s: (-(s.gain_if_fixed if s.gain_if_fixed is not None else -1.0),
                                   -s.slowdown, s.stage, s.rank))
    queue_names = (data.queues["name"].unique().to_list() if data.queues.height else [])
    queues = queue_states(data.queues, _steady_windows(analysis), policy.queues.state_share,
                          queue_waits(analysis, queue_names), policy.queues.time_share)
    pp = pipeline_parallel(analysis, workers, model)

    per_worker_steady = pl.Series(
        [int(it["steady"][a:b].sum()) for w, a, b in analysis.slices if w not in left_out]
        or [0])
    intervals = logged_intervals(analysis, left_out)
    ctx = RuleContext(analysis=analysis, stages=stages, bottleneck=bn, workers=workers,
                      stragglers=stragglers, queues=queues, lockstep=lock,
                      exact_sync=exact_sync, steady_iterations=steady_n,
                      min_steady_per_worker=int(per_worker_steady.min()) if total else 0,
                      policies=policy, pipeline_parallel=pp,
                      min_intervals_per_worker=min(intervals) if intervals else None,
                      what_if=ifs)
    short = ctx.short
    findings = evaluate_rules(ctx, rules)
    it_ts, it_dur = it["ts"].to_numpy(), it["dur"].to_numpy()
    for ev in disruptive_events(data.events, it_ts, it_dur)[1].iter_rows(named=True):
        notes.append(f"event {ev['name']!r} ({ms(ev['dur'])}) spans most of the run: "
                     f"taken as a span marker, nothing left out for it")
    confidence, reasons = _confidence(bn, short, exact_sync, steady_n,
                                      policy.coverage.min_steady_iters,
                                      ctx.min_intervals_per_worker, ctx.min_steady_per_worker)
    verdict = verdict_sentence(bn, stages, findings, confidence)
    # what the verdict leads with, as the JSON's bottleneck says it
    led = lead_finding(findings)
    cause = ctx.cause
    lead = cause.straggler if cause is not None and led is not None \
        and led.code == Code.STRAGGLER else None
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
            cause=Code.CPU_CONTENTION.value if led is not None
            and led.code == Code.CPU_CONTENTION else None,
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
