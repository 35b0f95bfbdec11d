"""``analyze.rules.pp``: the ``pipeline_bubble`` finding and the words it shares
with the verdict."""

from __future__ import annotations

import pytest
from tlog.analyze.pp import PPRank, PPStage
from tlog.analyze.rules.pp import pp_clause

from tests.support.runbuilder import RunBuilder, loop


def test_pp_clause() -> None:
    r0 = PPRank(0, "pp-0", own_s=0.010, wait_s=0.030, bubble_share=0.75)
    r1 = PPRank(1, "pp-1", own_s=0.035, wait_s=0.005, bubble_share=0.125)
    st = PPStage("pp", (r0, r1), limiting_rank=1, speedup_if_balanced=0.040 / 0.0275)
    assert pp_clause(st) == (
        "rank 1 limits the pipeline: its own work takes 35 ms per iteration vs 10 ms on rank "
        "0; rank 0 waits 75% of its time on send/recv (the pipeline bubble, 30 ms/iter); "
        "balancing the ranks' work (moving layers to the lighter ranks) would make it up to "
        "1.45x faster")
    balanced = PPStage("pp", (r0, r1), limiting_rank=1, speedup_if_balanced=1.001)
    assert "balancing" not in pp_clause(balanced)


def test_pipeline_bubble_finding(findings) -> None:
    # rank 0 forwards 10 ms and waits 30 ms, rank 1 waits 5 ms and forwards 35 ms:
    # balanced (22.5 ms each) the 40 ms cycle is 27.5 ms, a gain of 45%: critical (33%)
    b = RunBuilder("pp")
    loop(b, 30, [("forward", 0.010), ("recv_wait", 0.030)], rank=0, stage="pp")
    loop(b, 30, [("recv_wait", 0.005), ("forward", 0.035)], rank=1, stage="pp")
    (f,) = findings(b, "pipeline_bubble")
    assert f.severity == "critical"
    assert f.evidence["limiting_rank"] == 1
    assert f.evidence["speedup_if_balanced"] == pytest.approx(0.040 / 0.0275)
    assert f.message.startswith("pp runs as a 2-rank pipeline (send/recv between ranks); time "
                                "waiting on send/recv: rank 0 75%, rank 1 12%; rank 1 limits")
