"""What every finding rule is made of: :class:`Thresholds`, :class:`RuleContext`,
:class:`Rule` (and :class:`ItemRule`), and :func:`evaluate_rules`.

A rule is one small object: a ``code`` (the finding code it reports) and
``evaluate(ctx) -> list[Finding]`` over a :class:`RuleContext`, the figures
diagnose has already computed (the attributed run, stage statistics,
bottleneck, stragglers, queues). Rules read their limits from
``ctx.thresholds``, one frozen :class:`Thresholds` that a caller can replace
(``diagnose(con, run, thresholds=Thresholds(drift_p=0.05))``).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import polars as pl
from tlog.analyze.findings import Finding, Severity, sort_findings
from tlog.analyze.frames import RunAnalysis
from tlog.analyze.lockstep import LockstepResult
from tlog.analyze.pipeline import EPS, HIGH_SHARE, MODERATE_SHARE, Bottleneck, StageStats
from tlog.analyze.stragglers import Straggler


@dataclass(frozen=True)
class Thresholds:
    """Every limit the findings rules apply, with its source (docs/DIAGNOSIS.md
    section 7). Shares and rates are fractions; override any with
    ``dataclasses.replace(Thresholds(), drift_p=0.05)`` or ``Thresholds(drift_p=0.05)``.

    The share levels of the category findings (``warning`` from
    ``analyze.pipeline.HIGH_SHARE`` 20%, ``info`` from ``MODERATE_SHARE`` 5%)
    are the bottleneck's own and stay there: a finding and the verdict judge a
    share alike.
    """

    #: Unaccounted time (no phase covers it) worth a warning: 10% of a stage's
    #: time. Source: TraceML warns at 10%; below that it is Python glue.
    unaccounted_warn: float = 0.10
    #: Fewest steady iterations per worker for a confident verdict. Source: tlog's
    #: choice: the median of 20 samples has a 95% confidence interval spanning
    #: the 6th..15th order statistics (binomial), about a quartile either way.
    min_steady_iters: int = 20
    #: Steady iteration time change (median of the last third vs the first) that
    #: is drift. Source: TraceML's 10% warning level for step-time regressions.
    drift_threshold: float = 0.10
    #: Fewest steady iterations per worker to judge drift (10 per third).
    drift_min_iters: int = 30
    #: The trend test of ``drift`` runs on this many consecutive blocks of each
    #: worker's steady iterations (their medians): a block median shrugs off single
    #: slow iterations, and blocks make neighbouring iterations' shared noise (a
    #: busy machine for a few seconds) one value instead of many correlated ones.
    #: Source: tlog's choice, the batch-means idea of analyze.statistics (Law & Kelton).
    drift_blocks: int = 8
    #: Two-sided p-value under which the block medians have a trend (exact
    #: Mann-Kendall test: Kendall's tau against block order). Source: tlog's choice;
    #: 1% keeps a noisy run's chance of a false drift finding at 1 in 100 per stage.
    drift_p: float = 0.01
    #: Kendall's tau from which a significant drift is consistent enough for a
    #: warning: 90% of block pairs ordered the same way ((1 + tau) / 2 >= 0.9).
    #: A run that steps once (a neighbour's job starts at 60% of it) orders only
    #: the pairs across the step and stays below it (info at most).
    #: Source: tlog's choice.
    drift_consistent: float = 0.80
    #: CPU time of the recording thread over its wall time at which the thread is
    #: busy (host-bound). Source: DESIGN.md "cpu near dur"; 90% leaves room for
    #: the GIL hand-offs and short blocking calls every loop has.
    host_bound_cpu_share: float = 0.90
    #: ... but only while the device is idle for a good part of the time: device
    #: seconds over wall seconds under this. A host thread spinning in
    #: ``cudaStreamSynchronize`` also burns CPU, with the device busy.
    host_bound_max_device_share: float = 0.80
    #: Device allocations (``mem.device_allocs``) per steady iteration that mean
    #: the caching allocator is not reusing its blocks. Source: PyTorch's CUDA
    #: caching allocator reuses cached blocks once shapes repeat, so a steady
    #: loop allocates ~0 new segments; one per 100 iterations is already a leak
    #: or a shape churn.
    device_alloc_rate: float = 0.01
    #: ``blocked_in_compute``: the recording thread is off the CPU in its compute
    #: phases, beyond what the run's best worker shows, for this share of its wall
    #: time. Source: tlog's choice, the 20% of HIGH_SHARE: blocked time that
    #: large, hidden in compute, could have been the verdict's category; thread
    #: CPU time also misses short scheduler delays and GIL hand-offs, a few
    #: percent in a busy loop.
    blocked_margin: float = 0.20
    #: ... a warning from this share (most of the "compute" then is not compute).
    #: Source: tlog's choice, twice ``blocked_margin``.
    blocked_warn: float = 0.40
    #: How many compute phases the ``blocked_in_compute`` message names.
    blocked_top_phases: int = 3
    #: A throughput gain (fraction) below this is not worth a sentence: half a
    #: percent is within run-to-run noise on a shared machine. Source: tlog's choice.
    gain_worth_saying: float = 0.005
    #: A queue is "always empty" / "always full" when this share of its samples
    #: are at depth 0 / at capacity. Source: tlog's choice (nine in ten).
    queue_state_share: float = 0.90
    #: A queue is "always empty" / "always full" when its consumers waited in
    #: ``get`` / its producers in ``put`` (the queue empty / full) this share of
    #: their steady time (``analyze.rules.queues.queue_waits``). Source: tlog's
    #: choice: more than half the time is the queue's usual state; time-weighted,
    #: so lower than the samples' nine in ten (a 68% starved consumer's queue).
    queue_time_share: float = 0.50
    #: ``memory_growth``: fewest memory readings (system samples, or the
    #: iterations' ``mem`` figures) in a worker's steady window to judge a trend:
    #: one per block of the trend test (``drift_blocks``). The trend itself is
    #: ``drift``'s: Kendall's tau of the block medians with an exact p under
    #: ``drift_p`` and tau at least ``drift_consistent`` (a leak orders every
    #: block pair). Source: tlog's choice.
    memory_min_samples: int = 8
    #: ``memory_growth``: smallest rise over the steady window (the Theil-Sen
    #: rate times the iterations it spans) worth a finding, in bytes. Source:
    #: tlog's choice, 64 MiB: above the noise of a Python process's heap and
    #: the caching allocator's 2 MiB/20 MiB segments, below any leak that
    #: ends a run (8 MiB per step is 64 MiB in 8 steps).
    memory_min_rise: int = 64 << 20
    #: ``memory_growth``: the rate over the second half of the window must be at
    #: least this share of the whole window's: memory that grew early and then
    #: levelled off (a warm-up, caches filling, a plateau) is not a leak.
    #: Source: tlog's choice (a leak's rate is constant: the ratio is ~1).
    memory_still_growing: float = 0.50
    #: ``cpu_contention``: share of a worker's wall time its recording thread was
    #: off the CPU inside compute phases, with more runnable threads than usable
    #: cores (or the load above them), from which the finding is made. Source:
    #: tlog's choice, ``blocked_margin`` (the two rules read the same figure;
    #: the system samples tell the cause).
    contention_margin: float = 0.20
    #: ``gpu_underused``: median GPU utilisation (NVML, percent of time a kernel
    #: ran) under which the device is underused. Source: tlog's choice: under
    #: half the time busy, the device waits for the host more than it works.
    gpu_underused_util: float = 50.0
    #: ``gpu_underused``: the host is busy when the process uses at least this
    #: many cores' worth of CPU (CPU seconds per second over the steady window)
    #: or its recording thread's CPU time is ``host_bound_cpu_share`` of its wall
    #: time. Source: tlog's choice, ``host_bound_cpu_share`` of one core: the
    #: training thread alone saturating its core.
    gpu_host_busy_cores: float = 0.90
    #: ``gpu_throttled``: share of the steady samples of a GPU at work (utilisation
    #: above 0) with an NVML slowdown reason (``analyze.system.THROTTLE_REASONS``),
    #: or busy (utilisation at least ``gpu_underused_util``) with an SM clock under
    #: ``gpu_clock_ratio`` of its maximum. Source: tlog's choice (one in ten).
    gpu_throttled_share: float = 0.10
    #: ``gpu_throttled``: an SM clock under this share of its maximum is slowed.
    #: Source: tlog's choice; boost clocks move a few percent with temperature
    #: and load without a slowdown reason.
    gpu_clock_ratio: float = 0.90
    #: An implicit sync call site (``.item()``, ``.cpu()``, ``synchronize``...
    #: caught by the shim) worth naming: it blocks the host this share of its
    #: stage's steady time. Source: tlog's choice: each site is one line to
    #: change, so 1% is worth a line of the report; below it, noise of a
    #: busy machine.
    implicit_sync_share: float = 0.01
    #: ``pipeline_bubble``'s severity follows the gain of balancing the ranks of a
    #: pipeline-parallel stage: ``warning`` from this gain (a fraction), ``info``
    #: below. Source: tlog's choice, XProf's 5% "moderately", as a straggler's.
    pp_balance_warn: float = 0.05
    #: ... ``critical`` from this gain. Source: NVIDIA Resiliency Extension flags a
    #: rank under 0.75 of the reference; a pipeline held to 0.75 of its balanced
    #: pace runs 1/0.75 = 1.33x faster balanced (as ``straggler``).
    pp_balance_critical: float = 1 / 0.75 - 1


#: The thresholds diagnose uses unless told otherwise.
DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class RuleContext:
    """What rules read: the figures diagnose has computed for one run.

    Attributes:
        analysis: the attributed run (``analyze.frames.RunAnalysis``: iterations,
            phases, steady flags, slices per worker).
        stages: per-stage statistics in pipeline order (``analyze.pipeline``).
        bottleneck: the verdict's bottleneck, or None (no steady time).
        workers: the worker table (``analyze.pipeline.worker_table``: one row
            per worker with ``wid``, ``stage``, ``rank``, ``worker``, ``n``,
            ``dur``, ``cpu``, ``cpu_dur``, ``gpu``, ``gpu_n``; seconds).
        stragglers: lagging workers with their fix's gain, most valuable first.
        queues: queue states in the steady window (:func:`analyze.rules.queues.queue_states`).
        lockstep: the collective-wait inference, or None.
        exact_sync: sync shares are exact (device times, or a run without a
            GPU); else they are upper bounds.
        steady_iterations: steady iterations of the run, all workers.
        min_steady_per_worker: fewest steady iterations of one counted worker.
        thresholds: the limits rules apply.
        pipeline_parallel: the pipeline-parallel stages
            (:class:`analyze.pp.PPStage`: bubbles, limiting rank, balanced gain).
        min_intervals_per_worker: for a run of averaged timer logs (Megatron-LM,
            GPT-NeoX, NeMo 2, DeepSpeed's pipeline engine: each logged interval's
            figure repeated for its iterations), the fewest logged intervals
            among one worker's steady iterations: one interval is one
            observation. None when every iteration is its own.
    """

    analysis: RunAnalysis
    stages: list[StageStats]
    bottleneck: Bottleneck | None
    workers: pl.DataFrame
    stragglers: list[Straggler]
    queues: list[dict[str, Any]]
    lockstep: LockstepResult | None
    exact_sync: bool
    steady_iterations: int
    min_steady_per_worker: int
    thresholds: Thresholds = DEFAULT_THRESHOLDS
    pipeline_parallel: Sequence[Any] = ()
    min_intervals_per_worker: int | None = None

    @property
    def stage_names(self) -> list[str]:
        """The stages in pipeline order."""
        return [s.stage for s in self.stages]

    @property
    def short(self) -> bool:
        """Too few steady iterations (or logged intervals, for averaged timer
        logs) for a confident verdict (``min_steady_iters``)."""
        return (self.steady_iterations == 0
                or self.min_steady_per_worker < self.thresholds.min_steady_iters
                or (self.min_intervals_per_worker is not None
                    and self.min_intervals_per_worker < self.thresholds.min_steady_iters))


class Rule(ABC):
    """One finding: ``code`` and :meth:`evaluate`. Subclass it for a new finding
    (docs/DESIGN.md "Where a change goes"); a plugin distribution exposes its
    rule class or instance under the ``tlog.rules`` entry-point group."""

    #: The finding code this rule reports (a :class:`analyze.findings.Code`
    #: for tlog's rules; a plugin's own string otherwise).
    code: ClassVar[str]

    @abstractmethod
    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """The findings of this rule for the run in ``ctx`` (empty when none)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r})"


class ItemRule(Rule):
    """A rule judged item by item (each stage, each queue): :meth:`items` and
    :meth:`evaluate_item`. Consecutive item rules over the same ``over`` report
    item by item in :func:`evaluate_rules` (a stage's starvation, backpressure,
    sync and unaccounted findings together, stages in pipeline order)."""

    #: Which items: rules with the same value are interleaved item by item.
    over: ClassVar[str]

    @abstractmethod
    def items(self, ctx: RuleContext) -> Sequence[Any]:
        """The items to judge, in report order."""

    @abstractmethod
    def evaluate_item(self, ctx: RuleContext, item: Any) -> list[Finding]:
        """The findings for one item."""

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """Every item's findings, in :meth:`items` order."""
        return [f for item in self.items(ctx) for f in self.evaluate_item(ctx, item)]


def share_severity(share: float, is_bottleneck: bool) -> str | None:
    """Severity of a category share: ``critical`` for the verdict's bottleneck,
    ``warning`` from ``HIGH_SHARE`` (20%), ``info`` from ``MODERATE_SHARE`` (5%),
    else None (analyze.pipeline's levels, the bottleneck's own)."""
    if is_bottleneck:
        return Severity.CRITICAL
    if share >= HIGH_SHARE - EPS:
        return Severity.WARNING
    if share >= MODERATE_SHARE - EPS:
        return Severity.INFO
    return None


def evaluate_rules(ctx: RuleContext, rules: Sequence[Rule]) -> list[Finding]:
    """Every rule's findings, most severe first (:func:`analyze.findings.sort_findings`),
    stable otherwise: rules in ``rules`` order, a run of consecutive
    :class:`ItemRule` over the same items item by item.

    A plugin's rule (one defined outside ``tlog.analyze.rules``) that raises
    (any exception, ``SystemExit`` too; ``KeyboardInterrupt`` still stops
    tlog) or returns anything but a list or tuple of
    :class:`~tlog.analyze.findings.Finding` is left out with one
    ``RuntimeWarning`` naming it: a plugin's bug never stops a diagnosis; so is
    a finding whose severity is not ``info``, ``warning`` or ``critical``.
    tlog's own rules raise as they are.
    """
    out: list[Finding] = []
    k = 0
    while k < len(rules):
        rule = rules[k]
        if isinstance(rule, ItemRule):
            group = [rule]
            while (k + len(group) < len(rules) and isinstance(rules[k + len(group)], ItemRule)
                   and rules[k + len(group)].over == rule.over):
                group.append(rules[k + len(group)])
            k += len(group)
            items = {id(r): _guarded(r, lambda r=r: list(r.items(ctx)), check=False)
                     for r in group}
            longest = max(len(v or []) for v in items.values())
            for i in range(longest):
                for r in group:
                    its = items[id(r)] or []
                    if i < len(its):
                        out += _guarded(r, lambda r=r, it=its[i]: r.evaluate_item(ctx, it)) or []
        else:
            k += 1
            out += _guarded(rule, lambda rule=rule: rule.evaluate(ctx)) or []
    good = []
    for f in out:
        if f.severity in ("info", "warning", "critical"):
            good.append(f)
        else:
            warnings.warn(f"tlog: finding {f.code!r} has severity {f.severity!r} (want info, "
                          f"warning or critical); left out", RuntimeWarning, stacklevel=2)
    return sort_findings(good)


def _guarded(rule: Rule, call: Any, *, check: bool = True) -> Any:
    """``call()``; for a rule from outside tlog, a failure is a warning and None.

    A failure is any exception but ``KeyboardInterrupt`` (a plugin's
    ``sys.exit()`` must not end tlog) and, with ``check``, a result that is not
    a list or tuple of :class:`Finding` (a string would be read letter by letter).
    """
    if type(rule).__module__.startswith("tlog.analyze.rules."):
        return call()                      # tlog's own rules: a bug is a bug
    try:
        result = call()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a plugin's bug must not stop the diagnosis
        warnings.warn(f"tlog: rule {rule!r} failed and was left out: "
                      f"{type(exc).__name__}: {exc} (plugin module {type(rule).__module__})",
                      RuntimeWarning, stacklevel=3)
        return None
    if check:
        bad = (f"returned {type(result).__name__}, not a list of Finding"
               if not isinstance(result, list | tuple) else
               next((f"returned a {type(f).__name__} among its findings, not a Finding"
                     for f in result if not isinstance(f, Finding)), None))
        if bad is not None:
            warnings.warn(f"tlog: rule {rule!r} {bad}; its output was left out (plugin "
                          f"module {type(rule).__module__})", RuntimeWarning, stacklevel=3)
            return None
    return result
