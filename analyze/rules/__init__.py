"""Findings as rules: one small object per finding over a typed context.

- :class:`Rule` (``code``, ``evaluate(ctx) -> list[Finding]``) and
  :class:`ItemRule` (judged stage by stage or queue by queue), in
  ``analyze.rules.base``;
- :class:`RuleContext`: what rules read (the attributed run, stage
  statistics, bottleneck, stragglers, queues, what-if gains, policies);
- one module per family (``categories``, ``stragglers``, ``drift``,
  ``allocator``, ``machine``, ``host``, ``queues``, ``coverage``, ``syncs``,
  ``pp``), each owning its limits as a frozen policy (``DriftPolicy``, ...,
  every field with its source); :class:`Policies` holds one of each, and a
  caller overrides any: ``diagnose(con, run, policies=Policies(drift=DriftPolicy(p=0.05)))``;
- ``analyze.rules.cause``: which family's finding the verdict leads with;
- :data:`DEFAULT_RULES`: tlog's own rules, in report order;
- :func:`plugin_rules`: rules other distributions declare under the
  ``tlog.rules`` entry-point group; ``diagnose`` runs them after the
  defaults unless given ``rules=[...]``.

A new finding: a :class:`Rule` subclass in the module of its family (its
limits as fields of the family's policy), added to :data:`DEFAULT_RULES`, its
code in ``analyze.findings.Code``, its row in docs/DIAGNOSIS.md section 7
(docs/DESIGN.md "Where a change goes"). A finding that should lead the verdict
carries a ``Headline`` and a gain: the verdict is the first finding with a
headline in ``analyze.findings.finding_key`` order.
"""

from __future__ import annotations

import warnings
from functools import cache, partial
from importlib.metadata import entry_points
from typing import Any

from tlog.analyze.plugins import RULES_GROUP
from tlog.analyze.rules.allocator import AllocatorPolicy, AllocatorThrashRule
from tlog.analyze.rules.base import (
    ItemRule,
    Rule,
    RuleContext,
    evaluate_rules,
    share_severity,
)
from tlog.analyze.rules.categories import (
    BackpressureRule,
    CategoryPolicy,
    ComputeBoundRule,
    StarvationRule,
    SyncBoundRule,
    UnaccountedRule,
)
from tlog.analyze.rules.cause import Cause, bottleneck_cause
from tlog.analyze.rules.coverage import CoveragePolicy, NoDeviceTimesRule, ShortRunRule
from tlog.analyze.rules.drift import DriftPolicy, DriftRule
from tlog.analyze.rules.host import BlockedInComputeRule, HostBoundRule, HostPolicy
from tlog.analyze.rules.machine import (
    CpuContentionRule,
    GpuThrottledRule,
    GpuUnderusedRule,
    MachinePolicy,
    MemoryGrowthRule,
)
from tlog.analyze.rules.policies import DEFAULT_POLICIES, Policies
from tlog.analyze.rules.pp import PipelineBubbleRule, PipelinePolicy
from tlog.analyze.rules.queues import (
    QueueEmptyRule,
    QueueFullRule,
    QueuePolicy,
    queue_states,
    queue_waits,
)
from tlog.analyze.rules.stragglers import StragglerPolicy, StragglerRule, in_straggler_phase
from tlog.analyze.rules.syncs import ImplicitSyncRule, SyncPolicy
from tlog.ingest.plugins import load_plugin

#: tlog's own rules, in report order (a tuple: extend it in a new list,
#: ``[*DEFAULT_RULES, MyRule()]``, and pass that as ``rules=``).
DEFAULT_RULES: tuple[Rule, ...] = (
    StarvationRule(), BackpressureRule(), SyncBoundRule(), ImplicitSyncRule(),
    UnaccountedRule(), ComputeBoundRule(), PipelineBubbleRule(), StragglerRule(), DriftRule(), AllocatorThrashRule(),
    MemoryGrowthRule(), CpuContentionRule(),
    HostBoundRule(), BlockedInComputeRule(), GpuUnderusedRule(), GpuThrottledRule(), QueueEmptyRule(), QueueFullRule(),
    NoDeviceTimesRule(), ShortRunRule(),
)


def _load_rule(ep: Any) -> Any:
    """The object entry point ``ep`` names: a :class:`Rule` subclass is made with no arguments."""
    obj = ep.load()
    return obj() if isinstance(obj, type) and issubclass(obj, Rule) else obj


@cache
def plugin_rules() -> tuple[Rule, ...]:
    """The rules installed distributions declare under :data:`RULES_GROUP`,
    by entry-point name. An entry point may name a :class:`Rule` subclass
    (made with no arguments) or instance. One that fails to load (an
    exception, or an import that does not return within
    :func:`tlog.ingest.plugins.plugin_timeout_s`), or is not a rule, is left
    out with a ``RuntimeWarning`` naming it and why; it never stops nor hangs a
    diagnosis. Read once per process."""
    out: list[Rule] = []
    for ep in sorted(entry_points(group=RULES_GROUP), key=lambda e: e.name):
        try:
            rule = load_plugin(partial(_load_rule, ep))
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop tlog
            warnings.warn(f"tlog: rule plugin {ep.name!r} ({ep.value}) failed to load and is "
                          f"left out: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        if not isinstance(rule, Rule):
            warnings.warn(f"tlog: rule plugin {ep.name!r} ({ep.value}) is not a "
                          f"tlog.analyze.rules.Rule and is left out", RuntimeWarning, stacklevel=2)
            continue
        out.append(rule)
    return tuple(out)


__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_RULES",
    "RULES_GROUP",
    "AllocatorPolicy",
    "AllocatorThrashRule",
    "BackpressureRule",
    "BlockedInComputeRule",
    "CategoryPolicy",
    "Cause",
    "ComputeBoundRule",
    "CoveragePolicy",
    "CpuContentionRule",
    "DriftPolicy",
    "DriftRule",
    "GpuThrottledRule",
    "GpuUnderusedRule",
    "HostBoundRule",
    "HostPolicy",
    "ImplicitSyncRule",
    "ItemRule",
    "MachinePolicy",
    "MemoryGrowthRule",
    "NoDeviceTimesRule",
    "PipelinePolicy",
    "Policies",
    "QueueEmptyRule",
    "QueueFullRule",
    "QueuePolicy",
    "Rule",
    "RuleContext",
    "ShortRunRule",
    "StarvationRule",
    "StragglerPolicy",
    "StragglerRule",
    "SyncBoundRule",
    "SyncPolicy",
    "UnaccountedRule",
    "bottleneck_cause",
    "evaluate_rules",
    "in_straggler_phase",
    "plugin_rules",
    "queue_states",
    "queue_waits",
    "share_severity",
]
