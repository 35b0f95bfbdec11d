"""The typed parts of a :class:`~tlog.analyze.verdict.Diagnosis`.

Every result of ``tlog diagnose`` is a frozen dataclass with named fields
(units in each docstring); ``to_dict()`` gives its JSON form, the keys and
order of ``tlog diagnose --json`` (docs/DIAGNOSIS.md "JSON"). Shares are
fractions of a stage's (or the run's) steady wall time, 0..1; seconds are
per steady iteration where the name says ``per_iter``.

Stragglers and lockstep groups are :class:`tlog.analyze.stragglers.Straggler`
and :class:`tlog.analyze.lockstep.Lockstep`, already typed where they are
found. Standard library only: importing this module loads no polars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tlog.analyze.lockstep import Lockstep

#: The five categories every share is split into, in the JSON's order
#: (docs/DIAGNOSIS.md section 1; ``tlog.ingest.categories.CATEGORIES``).
_CATEGORIES = ("starvation", "backpressure", "compute", "sync", "unaccounted")


@dataclass(frozen=True)
class IterationCounts:
    """How many iterations the run logged and which were judged.

    Attributes:
        total: iterations logged (all workers).
        steady: the steady-state ones every figure is computed from.
        excluded: ``total - steady``.
        warmup: excluded as warm-up (docs/DIAGNOSIS.md section 3).
        event: excluded because a disruptive event overlapped them.
        attempt: excluded as an earlier attempt of a restarted stage.
    """

    total: int
    steady: int
    excluded: int
    warmup: int
    event: int
    attempt: int

    def to_dict(self) -> dict[str, int]:
        """``{"total", "steady", "excluded", "warmup", "event", "attempt"}``."""
        return {"total": self.total, "steady": self.steady, "excluded": self.excluded,
                "warmup": self.warmup, "event": self.event, "attempt": self.attempt}


@dataclass(frozen=True)
class Throughput:
    """Steady throughput; None where the logs did not report the unit.

    Attributes:
        iters_per_s: iterations per second (of one worker's loop; a stage's
            workers summed).
        tokens_per_s: tokens per second (the ``tokens`` field of iterations).
        samples_per_s: samples per second (the ``samples`` field).
    """

    iters_per_s: float | None
    tokens_per_s: float | None
    samples_per_s: float | None

    def to_dict(self) -> dict[str, float | None]:
        """``{"iters_per_s", "tokens_per_s", "samples_per_s"}``."""
        return {"iters_per_s": self.iters_per_s, "tokens_per_s": self.tokens_per_s,
                "samples_per_s": self.samples_per_s}

    @classmethod
    def from_mapping(cls, m: Mapping[str, float | None]) -> Throughput:
        """From a ``{"iters_per_s", "tokens_per_s", "samples_per_s"}`` mapping."""
        return cls(m.get("iters_per_s"), m.get("tokens_per_s"), m.get("samples_per_s"))


@dataclass(frozen=True)
class CategoryShares:
    """Share of steady wall time in each category (fractions summing to 1;
    docs/DIAGNOSIS.md section 1 defines them).

    Attributes:
        starvation: waiting for input (an empty queue, a data loader).
        backpressure: blocked handing output on (a full queue).
        compute: doing the work (host, and device time drained by waits).
        sync: waiting for peers (collectives, device synchronisation).
        unaccounted: in no logged phase.
    """

    starvation: float
    backpressure: float
    compute: float
    sync: float
    unaccounted: float

    def __getitem__(self, category: str) -> float:
        """The share of ``category`` by name (``shares["sync"]``)."""
        if category not in _CATEGORIES:
            raise KeyError(category)
        return float(getattr(self, category))

    def to_dict(self) -> dict[str, float]:
        """``{category: share}`` in the order starvation, backpressure, compute,
        sync, unaccounted."""
        return {c: getattr(self, c) for c in _CATEGORIES}

    @classmethod
    def from_mapping(cls, m: Mapping[str, float]) -> CategoryShares:
        """From a ``{category: share}`` mapping holding all five."""
        return cls(**{c: m[c] for c in _CATEGORIES})


@dataclass(frozen=True)
class TopPhase:
    """One of a stage's largest phases (steady state).

    Attributes:
        phase: the phase name, as logged.
        category: its category (``CategoryShares`` field names).
        seconds_per_iter: its attributed seconds per steady iteration (mean
            over the stage's workers).
        share: those seconds as a share of the stage's time.
        waiting_s_per_iter: the part of ``seconds_per_iter`` that is a wait for
            peers found inside it (a collective, docs/DIAGNOSIS.md section 1);
            0 for a sync phase (all of it is).
    """

    phase: str
    category: str
    seconds_per_iter: float
    share: float
    waiting_s_per_iter: float

    def to_dict(self) -> dict[str, Any]:
        """``{"phase", "category", "seconds_per_iter", "share", "waiting_s_per_iter"}``."""
        return {"phase": self.phase, "category": self.category,
                "seconds_per_iter": self.seconds_per_iter, "share": self.share,
                "waiting_s_per_iter": self.waiting_s_per_iter}


@dataclass(frozen=True)
class StageResult:
    """The steady-state figures of one pipeline stage.

    Attributes:
        stage: the stage name, as logged.
        workers: its workers (processes or threads that logged iterations).
        ranks: their ranks, ascending.
        iterations: its steady iterations (all workers).
        seconds: its time base, seconds: the sum over steady iterations of
            ``max(dur, sum of top-level phases)``.
        throughput: its steady throughput.
        categories: its category shares.
        wait_share: starvation + backpressure share.
        top_phases: its largest phases, largest first (at most
            ``tlog.analyze.pipeline.TOP_PHASES``).
        lockstep: where its ranks wait for each other, or None.
    """

    stage: str
    workers: int
    ranks: tuple[int, ...]
    iterations: int
    seconds: float
    throughput: Throughput
    categories: CategoryShares
    wait_share: float
    top_phases: tuple[TopPhase, ...]
    lockstep: Lockstep | None

    def to_dict(self) -> dict[str, Any]:
        """A ``stages`` item of ``tlog diagnose --json``."""
        return {"stage": self.stage, "workers": self.workers, "ranks": list(self.ranks),
                "iterations": self.iterations, "seconds": self.seconds,
                "throughput": self.throughput.to_dict(),
                "categories": self.categories.to_dict(), "wait_share": self.wait_share,
                "top_phases": [p.to_dict() for p in self.top_phases],
                "lockstep": self.lockstep.to_dict() if self.lockstep is not None else None}


@dataclass(frozen=True)
class LeadingStraggler:
    """The straggler the verdict leads with (the cause; the bottleneck's
    category is its symptom, docs/DIAGNOSIS.md section 8).

    Attributes:
        rank: its rank.
        worker: its worker name.
        kind: ``"compute"`` (its own work is slow) or ``"input"`` (it waits
            longer for data).
        phase: the phase that makes the difference, or None.
        speedup_if_fixed: the pipeline's throughput multiplier if it worked at
            its peers' pace (1.25: 25% faster), or None when not computable.
    """

    rank: int
    worker: str
    kind: str
    phase: str | None
    speedup_if_fixed: float | None

    def to_dict(self) -> dict[str, Any]:
        """``{"rank", "worker", "kind", "phase", "speedup_if_fixed"}``."""
        return {"rank": self.rank, "worker": self.worker, "kind": self.kind,
                "phase": self.phase, "speedup_if_fixed": self.speedup_if_fixed}


@dataclass(frozen=True)
class BottleneckResult:
    """What limits the run (docs/DIAGNOSIS.md section 5, "Bottleneck").

    Attributes:
        stage: the stage that waits least (the limiting one).
        category: its dominant loss category, or ``"compute"``.
        phase: the phase holding most of that category, or None.
        share: the category's share of the stage's time.
        phase_share: the phase's share of the stage's time.
        margin: the wait-share gap to the next stage (None with one stage).
        runner_up: that next stage, or None.
        seen_from: the stage where the wait was seen when it was followed
            upstream (starvation) or downstream (backpressure), else None.
        confidence: ``"high"``, ``"medium"`` or ``"low"`` (the Diagnosis's).
        straggler: the straggler the verdict leads with, or None.
        cause: the finding code the verdict leads with as the stage's cause
            when it is not the category itself: ``"cpu_contention"`` (the
            stage's thread lacked a CPU: its "compute" is partly waiting for
            a core), else None.
        rank: in a pipeline-parallel stage (``analyze.pp``), the rank that limits
            its schedule; else None.
    """

    stage: str
    category: str
    phase: str | None
    share: float
    phase_share: float
    margin: float | None
    runner_up: str | None
    seen_from: str | None
    confidence: str
    straggler: LeadingStraggler | None
    cause: str | None = None
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``bottleneck`` object of ``tlog diagnose --json``."""
        return {"stage": self.stage, "category": self.category, "phase": self.phase,
                "share": self.share, "phase_share": self.phase_share, "margin": self.margin,
                "runner_up": self.runner_up, "seen_from": self.seen_from,
                "confidence": self.confidence,
                "straggler": self.straggler.to_dict() if self.straggler is not None else None,
                "cause": self.cause, "rank": self.rank}


@dataclass(frozen=True)
class WhatIf:
    """The pipeline model's answer to "what if this phase took no time (or half)?"
    (docs/DIAGNOSIS.md section 7).

    Attributes:
        stage: the phase's stage.
        phase: the phase.
        seconds_per_iter: its seconds per steady iteration (mean over workers).
        throughput_gain: pipeline throughput gain if removed (a fraction:
            new / old - 1).
        throughput_gain_halved: the same if halved.
        speedup: ``1 + throughput_gain``.
        speedup_halved: ``1 + throughput_gain_halved``.
        limited_by: the stage that limits the pipeline after the removal.
        limited_by_halved: the same after halving.
    """

    stage: str
    phase: str
    seconds_per_iter: float
    throughput_gain: float
    throughput_gain_halved: float
    speedup: float
    speedup_halved: float
    limited_by: str | None
    limited_by_halved: str | None

    def to_dict(self) -> dict[str, Any]:
        """A ``what_if`` item of ``tlog diagnose --json``."""
        return {"stage": self.stage, "phase": self.phase,
                "seconds_per_iter": self.seconds_per_iter,
                "throughput_gain": self.throughput_gain,
                "throughput_gain_halved": self.throughput_gain_halved,
                "speedup": self.speedup, "speedup_halved": self.speedup_halved,
                "limited_by": self.limited_by, "limited_by_halved": self.limited_by_halved}


@dataclass(frozen=True)
class QueueState:
    """One logged queue's depth over the steady window.

    Attributes:
        name: the queue name, as logged.
        samples: depth samples read.
        mean_depth: their mean (items).
        capacity: its capacity (items), or None when not logged.
        empty_share: share of the steady time it sat empty (its consumers
            waited in ``get``) when ``weighted``, else of samples at depth 0.
        full_share: share of the steady time it sat full (its producers waited
            in ``put``) when ``weighted``, else of samples at capacity (0
            without a capacity).
        state: ``"empty"`` (consumer starved by its producer), ``"full"``
            (producer held by its consumer) or ``"mixed"``
            (``QueuePolicy.time_share``, ``state_share``).
        weighted: the shares are time-weighted, from the get/put waits
            (``analyze.rules.queues.queue_waits``).
    """

    name: str
    samples: int
    mean_depth: float
    capacity: int | None
    empty_share: float
    full_share: float
    state: str
    weighted: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A ``queues`` item of ``tlog diagnose --json``."""
        return {"name": self.name, "samples": self.samples, "mean_depth": self.mean_depth,
                "capacity": self.capacity, "empty_share": self.empty_share,
                "full_share": self.full_share, "state": self.state, "weighted": self.weighted}


@dataclass(frozen=True)
class PipelineSummary:
    """The pipeline model of a run (docs/DIAGNOSIS.md section 6).

    Attributes:
        order: the stages, upstream first.
        unit: what throughput counts: ``"tokens"``, ``"samples"`` or ``"iterations"``.
        model_throughput: the pipeline's modelled throughput, ``unit`` per second.
        limiting_stage: the stage whose rate is lowest.
        stage_rates: ``unit`` per second each stage could sustain.
        lockstep: the stages whose ranks move together (a collective), sorted.
    """

    order: tuple[str, ...]
    unit: str
    model_throughput: float
    limiting_stage: str
    stage_rates: Mapping[str, float]
    lockstep: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The ``pipeline`` object of ``tlog diagnose --json``."""
        return {"order": list(self.order), "unit": self.unit,
                "model_throughput": self.model_throughput,
                "limiting_stage": self.limiting_stage, "stage_rates": dict(self.stage_rates),
                "lockstep": list(self.lockstep)}


@dataclass(frozen=True)
class MachineInfo:
    """The machine a run ran on (the ``machines`` rows, docs/DATABASE.md).

    Several hosts or models: a text field lists the distinct values, sorted,
    joined by ``", "``; a count is the smallest seen. None where not recorded.

    Attributes:
        host: host name(s).
        cpu_model: CPU model name(s).
        ncpu: CPU cores usable by the process (its affinity).
        mem_total: the machine's memory (bytes).
        gpu_name: GPU model name(s).
        gpu_count: GPUs visible.
        driver: NVIDIA driver version(s).
        cuda: CUDA version(s) torch was built with.
    """

    host: str | None
    cpu_model: str | None
    ncpu: int | None
    mem_total: int | None
    gpu_name: str | None
    gpu_count: int | None
    driver: str | None
    cuda: str | None

    def kind(self) -> tuple[str | None, int | None, str | None]:
        """What makes two machines the same kind for a comparison:
        ``(cpu_model, ncpu, gpu_name)``."""
        return (self.cpu_model, self.ncpu, self.gpu_name)

    def to_dict(self) -> dict[str, Any]:
        """``{"host", "cpu_model", "ncpu", "mem_total", "gpu_name", "gpu_count",
        "driver", "cuda"}``."""
        return {"host": self.host, "cpu_model": self.cpu_model, "ncpu": self.ncpu,
                "mem_total": self.mem_total, "gpu_name": self.gpu_name,
                "gpu_count": self.gpu_count, "driver": self.driver, "cuda": self.cuda}


@dataclass(frozen=True)
class SystemSummary:
    """The run's environment and load over its steady state
    (``tlog.analyze.system.system_summary``). None where not recorded.

    Attributes:
        machine: the machine (:class:`MachineInfo`), or None (no ``meta``
            machine record).
        samples: system samples in the steady windows (``sys`` records).
        ncpu: CPU cores usable by the process (smallest sampled).
        load1: median one-minute load average of the machine.
        running: median count of the process's threads runnable at a sample.
        process_cpu_cores: the process's CPU use over its steady window, in
            cores (CPU seconds per second; median over workers).
        on_cpu_share: the recording thread's CPU time over its compute time
            (lowest over workers; from the iterations' ``cpu``: 1.0 is a thread
            that always had a core).
        run_queue_share: the share of its wall time the recording thread
            waited runnable for a CPU (the scheduler's run-queue delay,
            ``sys_samples.cpu_wait_s``; highest over workers; None where not
            recorded: before the field, or not Linux).
        rss_bytes: median resident set size (bytes).
        gpu_util: median GPU utilisation (percent, NVML).
        gpu_sm_clock_mhz: median SM clock (MHz).
        gpu_sm_clock_max_mhz: median maximum SM clock (MHz).
        throttled_share: share of samples with an NVML slowdown reason set
            (``tlog.analyze.system.THROTTLE_REASONS``).
    """

    machine: MachineInfo | None
    samples: int
    ncpu: int | None
    load1: float | None
    running: float | None
    process_cpu_cores: float | None
    on_cpu_share: float | None
    rss_bytes: float | None
    gpu_util: float | None
    gpu_sm_clock_mhz: float | None
    gpu_sm_clock_max_mhz: float | None
    throttled_share: float | None
    run_queue_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``system`` object of ``tlog diagnose --json``."""
        return {"machine": self.machine.to_dict() if self.machine is not None else None,
                "samples": self.samples, "ncpu": self.ncpu, "load1": self.load1,
                "running": self.running, "process_cpu_cores": self.process_cpu_cores,
                "on_cpu_share": self.on_cpu_share, "run_queue_share": self.run_queue_share,
                "rss_bytes": self.rss_bytes,
                "gpu_util": self.gpu_util, "gpu_sm_clock_mhz": self.gpu_sm_clock_mhz,
                "gpu_sm_clock_max_mhz": self.gpu_sm_clock_max_mhz,
                "throttled_share": self.throttled_share}
