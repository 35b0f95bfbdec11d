"""``analyze.pp``: the ranks of a pipeline-parallel stage, their bubbles, the
limiting rank and the gain of balancing them (a two-rank run written by hand)."""

from __future__ import annotations

import numpy as np
import pytest
from tlog.analyze.frames import attribute
from tlog.analyze.pipeline import (
    order_stages,
    pipeline_model,
    stage_phase_seconds,
    stage_stats,
    worker_table,
)
from tlog.analyze.pp import PPRank, PPStage, balanced_speedup, pipeline_parallel

from tests.support.runbuilder import RunBuilder, loop


def test_balanced_speedup_by_hand() -> None:
    # one step: now max(1, 3) + min(2, 0) = 3; each rank doing the mean 2: 2 + 0 = 2
    assert balanced_speedup(np.array([[1.0], [3.0]]), np.array([[2.0], [0.0]])) == 1.5
    # two steps: now (3 + 0 + 4 + 1) / 2 = 4; balanced (2 + 0 + 3 + 1) / 2 = 3
    own = np.array([[1.0, 2.0], [3.0, 4.0]])
    sync = np.array([[2.0, 2.0], [0.0, 1.0]])
    assert balanced_speedup(own, sync) == pytest.approx(4 / 3)
    assert balanced_speedup(np.zeros((2, 0)), np.zeros((2, 0))) is None


def test_two_ranks_of_a_pipeline(build) -> None:
    # rank 0 forwards 10 ms and waits 30 ms on rank 1's recv; rank 1 waits 5 ms and
    # forwards 35 ms: 40 ms iterations on both
    b = RunBuilder("pp")
    loop(b, 30, [("forward", 0.010), ("recv_wait", 0.030)], rank=0, stage="pp")
    loop(b, 30, [("recv_wait", 0.005), ("forward", 0.035)], rank=1, stage="pp")
    analysis = attribute(build(b), "pp")
    assert analysis.pp_stages == frozenset({"pp"})
    workers = worker_table(analysis)
    stages = order_stages(stage_stats(analysis, workers, stage_phase_seconds(analysis)))
    model = pipeline_model(stages, workers, analysis)
    (stage,) = pipeline_parallel(analysis, workers, model)
    r0, r1 = stage.ranks
    assert (r0.rank, r0.own_s, r0.wait_s, r0.bubble_share) == (
        0, pytest.approx(0.010), pytest.approx(0.030), pytest.approx(0.75))
    assert (r1.rank, r1.own_s, r1.wait_s, r1.bubble_share) == (
        1, pytest.approx(0.035), pytest.approx(0.005), pytest.approx(0.125))
    assert stage.limiting_rank == 1 and stage.limiting is r1 and stage.most_idle is r0
    # the cycle 35 + 5 = 40 ms; each rank doing the mean 22.5 ms: 27.5 ms
    assert stage.speedup_if_balanced == pytest.approx(0.040 / 0.0275)


def test_json_forms() -> None:
    r = PPRank(rank=0, worker="pp-0", own_s=0.01, wait_s=0.03, bubble_share=0.75)
    s = PPStage(stage="pp", ranks=(r,), limiting_rank=0, speedup_if_balanced=None)
    assert s.to_dict() == {"stage": "pp", "ranks": [{"rank": 0, "worker": "pp-0",
                                                     "own_s": 0.01, "wait_s": 0.03,
                                                     "bubble_share": 0.75}],
                           "limiting_rank": 0, "speedup_if_balanced": None}
