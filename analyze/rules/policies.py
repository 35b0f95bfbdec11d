"""Every family's policy in one frozen object: what ``diagnose`` hands its rules.

Each family of finding rules owns its limits as a frozen dataclass in its own
module, every field with its source; :class:`Policies` holds one of each, and
a caller replaces any of them::

    from tlog.analyze.rules import DriftPolicy, Policies
    diagnose(con, run, policies=Policies(drift=DriftPolicy(p=0.05)))

The stored diagnosis is always computed with :data:`DEFAULT_POLICIES`; their
values are part of the analysis code whose digest keys it
(``tlog.analyze.persist.analysis_key``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tlog.analyze.rules.allocator import AllocatorPolicy
from tlog.analyze.rules.categories import CategoryPolicy
from tlog.analyze.rules.coverage import CoveragePolicy
from tlog.analyze.rules.drift import DriftPolicy
from tlog.analyze.rules.host import HostPolicy
from tlog.analyze.rules.machine import MachinePolicy
from tlog.analyze.rules.pp import PipelinePolicy
from tlog.analyze.rules.queues import QueuePolicy
from tlog.analyze.rules.stragglers import StragglerPolicy
from tlog.analyze.rules.syncs import SyncPolicy


@dataclass(frozen=True)
class Policies:
    """One policy per family of rules (each documents its fields and sources).

    Attributes:
        categories: ``starvation``, ``backpressure``, ``sync_bound``,
            ``unaccounted``, ``compute_bound``.
        coverage: ``short_run`` and the verdict's confidence.
        drift: ``drift`` (and the trend test of ``memory_growth`` and
            ``allocator_thrash``).
        host: ``host_bound``, ``blocked_in_compute``.
        allocator: ``allocator_thrash``.
        machine: ``memory_growth``, ``cpu_contention``, ``gpu_underused``,
            ``gpu_throttled``.
        queues: the queues' states, ``queue_empty``, ``queue_full``.
        stragglers: ``straggler`` and when a straggler leads the verdict.
        syncs: ``implicit_sync``.
        pipeline: ``pipeline_bubble``.
    """

    categories: CategoryPolicy = field(default_factory=CategoryPolicy)
    coverage: CoveragePolicy = field(default_factory=CoveragePolicy)
    drift: DriftPolicy = field(default_factory=DriftPolicy)
    host: HostPolicy = field(default_factory=HostPolicy)
    allocator: AllocatorPolicy = field(default_factory=AllocatorPolicy)
    machine: MachinePolicy = field(default_factory=MachinePolicy)
    queues: QueuePolicy = field(default_factory=QueuePolicy)
    stragglers: StragglerPolicy = field(default_factory=StragglerPolicy)
    syncs: SyncPolicy = field(default_factory=SyncPolicy)
    pipeline: PipelinePolicy = field(default_factory=PipelinePolicy)


#: The policies diagnose uses unless told otherwise.
DEFAULT_POLICIES = Policies()
