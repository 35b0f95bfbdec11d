"""``analyze.rules.policies``: one frozen policy per rule family, replaced one at a
time, and a replaced limit changing what diagnose finds (a run written by hand)."""

from __future__ import annotations

import dataclasses

import pytest
from tlog.analyze import diagnose
from tlog.analyze.rules.coverage import CoveragePolicy
from tlog.analyze.rules.drift import DriftPolicy
from tlog.analyze.rules.policies import DEFAULT_POLICIES, Policies

from tests.support.runbuilder import RunBuilder, loop


def test_each_family_has_its_default_policy() -> None:
    fields = {f.name for f in dataclasses.fields(Policies)}
    assert fields == {"categories", "coverage", "drift", "host", "allocator", "machine",
                      "queues", "stragglers", "syncs", "pipeline"}
    for name in fields:
        policy = getattr(DEFAULT_POLICIES, name)
        assert policy == type(policy)()                 # the family's own defaults
        assert dataclasses.is_dataclass(policy)
    assert DEFAULT_POLICIES == Policies()


def test_one_policy_replaced_the_others_kept() -> None:
    p = Policies(drift=DriftPolicy(p=0.05))
    assert p.drift.p == 0.05 and p.drift != DEFAULT_POLICIES.drift
    assert p.coverage == DEFAULT_POLICIES.coverage
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.coverage = CoveragePolicy()


def test_a_replaced_limit_changes_the_findings(build) -> None:
    # 12 steady iterations: short of the default 20, enough for a limit of 10
    b = RunBuilder("p")
    loop(b, 12, [("forward", 0.1)])
    con = build(b)
    assert "short_run" in {f.code for f in diagnose(con, "p").findings}
    fewer = Policies(coverage=CoveragePolicy(min_steady_iters=10))
    assert "short_run" not in {f.code for f in diagnose(con, "p", policies=fewer).findings}
