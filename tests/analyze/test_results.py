"""``analyze.results``: the typed parts of a diagnosis and their JSON forms (the
keys and order of ``tlog diagnose --json``)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from tlog.analyze.results import (
    BottleneckResult,
    CategoryShares,
    IterationCounts,
    LeadingStraggler,
    MachineInfo,
    PipelineSummary,
    QueueState,
    StageResult,
    SystemSummary,
    Throughput,
    TopPhase,
    WhatIf,
)

SHARES = CategoryShares(starvation=0.25, backpressure=0.0, compute=0.7, sync=0.05,
                        unaccounted=0.0)


def test_category_shares_in_the_json_order_and_by_name() -> None:
    assert list(SHARES.to_dict()) == ["starvation", "backpressure", "compute", "sync",
                                      "unaccounted"]
    assert SHARES["compute"] == 0.7
    with pytest.raises(KeyError):
        SHARES["waiting"]
    assert CategoryShares.from_mapping({**SHARES.to_dict(), "other": 1.0}) == SHARES
    with pytest.raises(KeyError):
        CategoryShares.from_mapping({"starvation": 1.0})


def test_throughput_round_trips_and_missing_units_are_none() -> None:
    t = Throughput.from_mapping({"iters_per_s": 10.0, "tokens_per_s": 5120.0})
    assert t == Throughput(10.0, 5120.0, None)
    assert t.to_dict() == {"iters_per_s": 10.0, "tokens_per_s": 5120.0, "samples_per_s": None}


def test_results_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SHARES.compute = 0.1


def test_stage_and_bottleneck_json_nest_their_parts() -> None:
    top = TopPhase("forward", "compute", 0.03, 0.3, 0.0)
    stage = StageResult(stage="main", workers=2, ranks=(0, 1), iterations=20, seconds=2.0,
                        throughput=Throughput(10.0, None, None), categories=SHARES,
                        wait_share=0.25, top_phases=(top,), lockstep=None)
    d = stage.to_dict()
    assert d["ranks"] == [0, 1] and d["lockstep"] is None
    assert d["top_phases"] == [{"phase": "forward", "category": "compute",
                                "seconds_per_iter": 0.03, "share": 0.3,
                                "waiting_s_per_iter": 0.0}]
    assert d["categories"]["starvation"] == 0.25
    lead = LeadingStraggler(2, "main-2", "compute", "backward", 1.38)
    b = BottleneckResult("main", "sync", "allreduce", 0.4, 0.35, None, None, None, "high",
                         lead)
    assert b.to_dict() == {"stage": "main", "category": "sync", "phase": "allreduce",
                           "share": 0.4, "phase_share": 0.35, "margin": None,
                           "runner_up": None, "seen_from": None, "confidence": "high",
                           "straggler": {"rank": 2, "worker": "main-2", "kind": "compute",
                                         "phase": "backward", "speedup_if_fixed": 1.38},
                           "cause": None, "rank": None}
    json.dumps([d, b.to_dict()])      # plain JSON


def test_the_smaller_records() -> None:
    assert IterationCounts(40, 36, 4, 3, 1, 0).to_dict() == {
        "total": 40, "steady": 36, "excluded": 4, "warmup": 3, "event": 1, "attempt": 0}
    w = WhatIf("main", "load", 0.025, 0.333, 0.143, 1.333, 1.143, "main", None)
    assert w.to_dict()["limited_by_halved"] is None and w.to_dict()["speedup"] == 1.333
    q = QueueState("hs", 100, 0.4, 4, 0.6, 0.0, "empty")
    assert q.to_dict() == {"name": "hs", "samples": 100, "mean_depth": 0.4, "capacity": 4,
                           "empty_share": 0.6, "full_share": 0.0, "state": "empty",
                           "weighted": False}
    p = PipelineSummary(("drafter", "target"), "tokens", 5000.0, "target",
                        {"drafter": 8000.0, "target": 5000.0}, ())
    assert p.to_dict()["order"] == ["drafter", "target"] and p.to_dict()["lockstep"] == []


def test_machine_kind_and_system_json() -> None:
    m = MachineInfo("node-a", "EPYC", 64, 2**40, "A100", 8, "535", "12.1")
    assert m.kind() == ("EPYC", 64, "A100")
    s = SystemSummary(m, 12, 64, 3.9, 4.0, 1.5, 0.8, 512.0, None, None, None, None, 0.2)
    d = s.to_dict()
    assert d["machine"]["gpu_name"] == "A100" and d["run_queue_share"] == 0.2
    assert list(d) == ["machine", "samples", "ncpu", "load1", "running", "process_cpu_cores",
                       "on_cpu_share", "run_queue_share", "rss_bytes", "gpu_util",
                       "gpu_sm_clock_mhz", "gpu_sm_clock_max_mhz", "throttled_share"]
    assert dataclasses.replace(s, machine=None).to_dict()["machine"] is None
