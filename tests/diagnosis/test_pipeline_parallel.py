"""Pipeline parallelism (docs/DIAGNOSIS.md section 6b): figures worked out by hand.

A 2-rank GPipe-like run built row by row: rank 0 computes 20 ms and waits 60 ms
on send/recv per 80 ms step, rank 1 computes 70 ms and waits 10 ms. By hand:
bubble shares 60/80 = 0.75 and 10/80 = 0.125; the limiting rank is 1; the
lockstep cycle now ``max(20, 70) + min(60, 10)`` = 80 ms, balanced
``mean(20, 70) + 10`` = 55 ms: 80/55 = 1.4545x.
"""

from __future__ import annotations

import pytest
from tlog.analyze import diagnose

from tests.support.runbuilder import RunBuilder

STEPS = 30
STEP_S = 0.080


def _pipeline(builder: RunBuilder) -> None:
    for i in range(STEPS):
        ts = 1_700_000_000.0 + i * STEP_S
        builder.iteration(iter=i, ts=ts, dur=STEP_S, rank=0, phases=[
            ("forward", 0.008), ("send_wait", 0.015), ("recv_wait", 0.045),
            ("backward", 0.011), ("optimizer_step", 0.001)],
            kinds={"send_wait": "sync", "recv_wait": "sync"})
        builder.iteration(iter=i, ts=ts, dur=STEP_S, rank=1, phases=[
            ("recv_wait", 0.010), ("forward", 0.025), ("backward", 0.044),
            ("optimizer_step", 0.001)], kinds={"recv_wait": "sync"})


def test_bubbles_limiting_rank_and_balanced_gain_by_hand(build) -> None:
    b = RunBuilder()
    _pipeline(b)
    d = diagnose(build(b), "r")
    (pp,) = d.to_dict()["pipeline_parallel"]
    ranks = {r["rank"]: r for r in pp["ranks"]}
    assert ranks[0]["bubble_share"] == pytest.approx(0.75)
    assert ranks[1]["bubble_share"] == pytest.approx(0.125)
    assert ranks[0]["own_s"] == pytest.approx(0.020)
    assert ranks[1]["own_s"] == pytest.approx(0.070)
    assert pp["limiting_rank"] == 1
    assert pp["speedup_if_balanced"] == pytest.approx(0.080 / 0.055)
    assert d.bottleneck.rank == 1
    assert d.verdict == ("Bottleneck: main is a pipeline-parallel schedule - rank 1 limits "
                         "the pipeline; with the ranks' work balanced: up to 1.45x faster. "
                         "(confidence: medium)")
    assert len(d.verdict) <= 160
    assert d.stragglers == ()
    (f,) = [f for f in d.findings if f.code == "pipeline_bubble"]
    assert f.severity == "critical"          # 1.45x >= 1/0.75
    assert "rank 0 75%, rank 1 12%" in f.message
    assert ("rank 1 limits the pipeline: its own work takes 70 ms per iteration vs 20 ms on "
            "rank 0; rank 0 waits 75% of its time on send/recv") in f.message
    assert d.findings[0] is f                 # the verdict's cause, first


def test_a_data_parallel_run_with_a_send_on_one_rank_is_not_a_pipeline(build) -> None:
    """Only a stage whose every rank waits on send/recv is a pipeline."""
    b = RunBuilder()
    for i in range(STEPS):
        ts = 1_700_000_000.0 + i * STEP_S
        for rank in (0, 1):
            phases = [("forward", 0.030), ("backward", 0.045), ("optimizer_step", 0.005)]
            if rank == 0:
                phases.append(("send_wait", 0.0001))
            b.iteration(iter=i, ts=ts, dur=STEP_S, rank=rank, phases=phases,
                        kinds={"send_wait": "sync"})
    d = diagnose(build(b), "r")
    assert d.to_dict()["pipeline_parallel"] == []
    assert d.bottleneck.rank is None
