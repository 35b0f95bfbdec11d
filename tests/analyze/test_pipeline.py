"""``analyze.pipeline``: stage shares, pipeline order, the bottleneck rule, the
pipeline model and its what-ifs (a two-stage run written by hand)."""

from __future__ import annotations

import numpy as np
import pytest
from tlog.analyze.frames import attribute
from tlog.analyze.pipeline import (
    HIGH_SHARE,
    StageStats,
    find_bottleneck,
    lockstep_cycle,
    order_stages,
    part_medians,
    pipeline_model,
    stage_phase_seconds,
    stage_stats,
    what_if,
    worker_table,
)

from tests.support.runbuilder import RunBuilder, loop

N = 30


@pytest.fixture
def analysis(build):
    """A drafter (30 ms drafting, 10 ms blocked handing on: ``hs_put``) feeding a
    target (5 ms waiting for it: ``hs_get``, 30 ms forward, 5 ms of loss: both
    compute), 40 ms iterations each,
    both from t = 1000 s (a later start of one stage would make the other's first
    iterations start-up: ``analyze.steady.shared_warmup_end``)."""
    b = RunBuilder("pipe")
    loop(b, N, [("draft", 0.030), ("hs_put", 0.010)], stage="drafter", t0=1000.0)
    loop(b, N, [("hs_get", 0.005), ("target_forward", 0.030), ("loss", 0.005)],
         stage="target", t0=1000.0)
    return attribute(build(b), "pipe")


def _stages(analysis) -> list[StageStats]:
    workers = worker_table(analysis)
    return order_stages(stage_stats(analysis, workers, stage_phase_seconds(analysis)))


def test_stage_shares_and_order(analysis) -> None:
    drafter, target = _stages(analysis)      # the stage that hands output on comes first
    assert (drafter.stage, target.stage) == ("drafter", "target")
    assert drafter.seconds == pytest.approx(N * 0.040)
    assert drafter.shares["compute"] == pytest.approx(0.75)
    assert drafter.shares["backpressure"] == pytest.approx(0.25)
    assert target.shares["starvation"] == pytest.approx(0.125)
    assert target.wait_share == pytest.approx(0.125)
    assert drafter.iters_per_s == pytest.approx(25.0)
    assert target.top_phase("compute") == ("target_forward", pytest.approx(N * 0.030))
    assert target.top_phase("sync") == (None, 0.0)
    assert target.top_phases[0] == {"phase": "target_forward", "category": "compute",
                                    "seconds_per_iter": pytest.approx(0.030),
                                    "share": pytest.approx(0.75), "waiting_s_per_iter": 0.0}


def test_the_stage_that_waits_least_is_the_bottleneck(analysis) -> None:
    # target waits 12.5% of its time, the drafter 25%: the target limits; its
    # starvation (12.5%) is under HIGH_SHARE (20%), so the category is compute
    b = find_bottleneck(_stages(analysis))
    assert (b.stage, b.category, b.phase) == ("target", "compute", "target_forward")
    assert b.share == pytest.approx(0.875) and b.phase_share == pytest.approx(0.75)
    assert b.margin == pytest.approx(0.125) and b.runner_up == "drafter"
    assert HIGH_SHARE == 0.20
    assert find_bottleneck([]) is None


def test_pipeline_model_and_what_if(analysis) -> None:
    stages = _stages(analysis)
    model = pipeline_model(stages, worker_table(analysis), analysis)
    # busy time: the drafter's 30 ms (its hs_put waits on a logged stage), the
    # target's 35 ms (its hs_get too): 33.3 and 28.6 iterations per second
    assert model.unit == "iterations" and model.lockstep == set()
    assert model.rates == pytest.approx({"drafter": 1 / 0.030, "target": 1 / 0.035})
    assert (model.limiting_stage, model.throughput) == ("target", pytest.approx(1 / 0.035))
    ifs = what_if(analysis, stages, model)
    # removing target_forward (the target's busy time 35 -> 5 ms) or halving it
    # (-> 20 ms): the drafter then limits at 1/0.030, a gain of 35/30 - 1; removing
    # loss (-> 30 ms) ties the drafter: the same gain, and the larger phase first;
    # halving loss (-> 32.5 ms) gains 35/32.5 - 1 with the target still limiting.
    # Removing draft gains nothing (the target still limits): left out.
    assert [(w["stage"], w["phase"]) for w in ifs] == [("target", "target_forward"),
                                                       ("target", "loss")]
    forward, loss = ifs
    assert forward["throughput_gain"] == pytest.approx(0.035 / 0.030 - 1)
    assert forward["throughput_gain_halved"] == pytest.approx(0.035 / 0.030 - 1)
    assert forward["speedup"] == pytest.approx(0.035 / 0.030)
    assert (forward["limited_by"], forward["limited_by_halved"]) == ("drafter", "drafter")
    assert forward["seconds_per_iter"] == pytest.approx(0.030)
    assert loss["throughput_gain"] == pytest.approx(0.035 / 0.030 - 1)
    assert loss["throughput_gain_halved"] == pytest.approx(0.035 / 0.0325 - 1)
    assert (loss["limited_by"], loss["limited_by_halved"]) == ("drafter", "target")


def test_what_if_removing_a_stages_only_busy_phase_hands_the_limit_on(build) -> None:
    """The target's whole busy time is its forward (40 ms; hs_get is waiting): without
    it the target limits nothing and the drafter's 30 ms do, 40/30 - 1 more
    throughput (whichever side of 0 the float residue of 40 - 40 ms falls: below
    :func:`test_free_rates_of_a_worker_left_with_no_busy_time`)."""
    b = RunBuilder("pipe1")
    loop(b, N, [("draft", 0.030), ("hs_put", 0.010)], stage="drafter", t0=1000.0)
    loop(b, N, [("hs_get", 0.005), ("target_forward", 0.040)], stage="target", t0=1000.0)
    analysis = attribute(build(b), "pipe1")
    stages = _stages(analysis)
    model = pipeline_model(stages, worker_table(analysis), analysis)
    assert model.rates == pytest.approx({"drafter": 1 / 0.030, "target": 1 / 0.040})
    ifs = what_if(analysis, stages, model)
    assert [(w["stage"], w["phase"]) for w in ifs] == [("target", "target_forward")]
    (forward,) = ifs
    assert forward["throughput_gain"] == pytest.approx(0.040 / 0.030 - 1)
    assert forward["throughput_gain_halved"] == pytest.approx(0.040 / 0.030 - 1)
    assert (forward["limited_by"], forward["limited_by_halved"]) == ("drafter", "drafter")
    assert forward["seconds_per_iter"] == pytest.approx(0.040)


def test_free_rates_of_a_worker_left_with_no_busy_time() -> None:
    """Independent workers' rates summed (items / busy seconds); a worker with items
    and no busy time left (0, or a rounding residue below it) does not limit: inf."""
    from tlog.analyze.pipeline import _free_rates

    items = np.array([30.0, 30.0])
    own = np.array([[0.030, 0.060], [0.0, 0.060], [-1e-18, 0.060]])
    sync = np.zeros((3, 2))
    rates = _free_rates(own, sync, items)
    assert rates[0] == pytest.approx(30 / 0.030 + 30 / 0.060)
    assert rates[1] == np.inf and rates[2] == np.inf
    # a worker with no items and no time adds nothing
    assert _free_rates(np.array([[0.0, 0.060]]), np.zeros((1, 2)),
                       np.array([0.0, 30.0]))[0] == pytest.approx(30 / 0.060)


def test_lockstep_cycle_is_the_slowest_rank_plus_the_shortest_wait() -> None:
    own = np.array([[0.10, 0.12], [0.08, 0.10]])
    sync = np.array([[0.01, 0.00], [0.03, 0.02]])
    # step 0: 0.10 + 0.01; step 1: 0.12 + 0.00; mean 0.115
    assert lockstep_cycle(own, sync) == pytest.approx(0.115)
    assert lockstep_cycle(np.zeros((2, 0)), np.zeros((2, 0))) == 0.0


def test_part_medians_of_the_first_and_last_thirds(analysis) -> None:
    pm = part_medians(analysis)
    assert pm["part"].to_list() == [0, 2, 0, 2]
    assert pm["median_dur"].to_list() == pytest.approx([0.04] * 4)
    assert pm["n"].to_list() == [10, 10, 10, 10]
