"""What every finding rule is made of: :class:`RuleContext`, :class:`Rule`
(and :class:`ItemRule`), and :func:`evaluate_rules`.

A rule is one small object: a ``code`` (the finding code it reports) and
``evaluate(ctx) -> list[Finding]`` over a :class:`RuleContext`, the figures
diagnose has already computed (the attributed run, stage statistics,
bottleneck, stragglers, queues, what-if gains). Each family of rules owns its
limits as a frozen policy in its module (``DriftPolicy`` in
``analyze.rules.drift``, ...); rules read them from ``ctx.policies``
(:class:`analyze.rules.policies.Policies`, which a caller can replace:
``diagnose(con, run, policies=Policies(drift=DriftPolicy(p=0.05)))``).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import polars as pl
from tlog.analyze.findings import Finding, Severity, sort_findings
from tlog.analyze.frames import RunAnalysis
from tlog.analyze.lockstep import LockstepResult
from tlog.analyze.pipeline import EPS, HIGH_SHARE, MODERATE_SHARE, Bottleneck, StageStats
from tlog.analyze.stragglers import Straggler

if TYPE_CHECKING:
    from tlog.analyze.rules.cause import Cause
    from tlog.analyze.rules.policies import Policies


def _default_policies() -> Policies:
    from tlog.analyze.rules.policies import DEFAULT_POLICIES

    return DEFAULT_POLICIES


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
        policies: the limits rules apply, one frozen policy per family
            (:class:`analyze.rules.policies.Policies`).
        pipeline_parallel: the pipeline-parallel stages
            (:class:`analyze.pp.PPStage`: bubbles, limiting rank, balanced gain).
        min_intervals_per_worker: for a run of averaged timer logs (Megatron-LM,
            GPT-NeoX, NeMo 2, DeepSpeed's pipeline engine: each logged interval's
            figure repeated for its iterations), the fewest logged intervals
            among one worker's steady iterations: one interval is one
            observation. None when every iteration is its own.
        what_if: the what-if gains (``analyze.pipeline.what_if``: dicts with
            ``stage``, ``phase``, ``throughput_gain``), largest first.
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
    policies: Policies = field(default_factory=_default_policies)
    pipeline_parallel: Sequence[Any] = ()
    min_intervals_per_worker: int | None = None
    what_if: Sequence[dict[str, Any]] = ()

    @property
    def stage_names(self) -> list[str]:
        """The stages in pipeline order."""
        return [s.stage for s in self.stages]

    @property
    def short(self) -> bool:
        """Too few steady iterations (or logged intervals, for averaged timer
        logs) for a confident verdict (``CoveragePolicy.min_steady_iters``)."""
        want = self.policies.coverage.min_steady_iters
        return (self.steady_iterations == 0 or self.min_steady_per_worker < want
                or (self.min_intervals_per_worker is not None
                    and self.min_intervals_per_worker < want))

    @cached_property
    def cause(self) -> Cause | None:
        """What the bottleneck stage's loss is put down to, worked out once per run
        (:func:`analyze.rules.cause.bottleneck_cause`): the family whose finding
        carries the verdict's headline."""
        from tlog.analyze.rules.cause import bottleneck_cause

        return bottleneck_cause(self)

    def gain_of(self, stage: str, phase: str | None) -> float | None:
        """The what-if gain of removing ``phase`` of ``stage`` (None: no such entry)."""
        return next((w["throughput_gain"] for w in self.what_if
                     if w["stage"] == stage and w["phase"] == phase), None)


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
    """Every rule's findings in :func:`analyze.findings.finding_key` order
    (severity, then gain), stable otherwise: rules in ``rules`` order, a run
    of consecutive :class:`ItemRule` over the same items item by item.

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
