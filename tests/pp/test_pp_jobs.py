"""Pipeline-parallel jobs on gloo (tests/pp/README.md) against their own bare timers.

Every figure of truth comes from ``time.perf_counter()`` readings in pp_train.py
(the step, each p2p wait); tlog's output only says which steps it judged steady,
and the truth is summed over those same steps.
"""

from __future__ import annotations

import numpy as np
import pytest

INSTRUMENTED = ("gpipe:instrument", "1f1b:instrument", "interleaved:instrument",
                "handwritten:instrument")
TRACED = ("gpipe:trace", "1f1b:trace", "interleaved:trace", "handwritten:trace")
#: Stage 0's wait share, tlog against the timers: within 5 points (the issue's bar).
SHARE_POINTS = 0.05


def _truth_share(case, rank: int) -> tuple[float, list[int]]:
    """The timers' wait share of ``rank`` over the steps tlog judged steady there."""
    steps = case.truth[rank]["steps"]
    iters = [i for i in case.steady_iters(rank) if i < len(steps)]
    wait = sum(steps[i]["wait_s"] for i in iters)
    cycle = sum(steps[i]["cycle_s"] for i in iters)
    return wait / cycle, iters


def _pp(case) -> dict:
    (pp,) = case.diagnosis["pipeline_parallel"]
    return pp


@pytest.mark.parametrize("job", INSTRUMENTED + TRACED)
def test_stage0_wait_matches_the_timers(pp, job: str) -> None:
    case = pp(job)
    share, iters = _truth_share(case, 0)
    assert len(iters) >= 15, f"{job}: tlog judged only {len(iters)} steps steady on rank 0"
    ranks = {r["rank"]: r for r in _pp(case)["ranks"]}
    got = ranks[0]["bubble_share"]
    assert abs(got - share) <= SHARE_POINTS, (
        f"{job}: rank 0 waits {got:.3f} of its time by tlog, {share:.3f} by the timers "
        f"over the same {len(iters)} steps")
    # the waits are sync, not time in no phase (instrumented) or compute (traced)
    sync0 = case.diagnosis["categories"]["sync"]
    assert sync0 > 0.2


@pytest.mark.parametrize("job", INSTRUMENTED + TRACED)
def test_heavy_stage_named_and_no_wrong_verdict(pp, job: str) -> None:
    case = pp(job)
    d = case.diagnosis
    assert case.truth[1]["own_s_per_step"] > 1.5 * case.truth[0]["own_s_per_step"], (
        "the timers do not show stage 1 heavier: the job did not run as designed")
    assert _pp(case)["limiting_rank"] == 1
    assert d["bottleneck"]["rank"] == 1
    assert "rank 1 limits the pipeline" in d["verdict"]
    # not read as data parallelism: no straggler, no inferred alignment
    assert d["stragglers"] == []
    assert "inferred from rank alignment" not in d["verdict"]
    assert "compute-bound" not in d["verdict"]
    assert not [f for f in d["findings"] if f["code"] == "straggler"]
    codes = [f["code"] for f in d["findings"]]
    assert "pipeline_bubble" in codes


@pytest.mark.parametrize("job", INSTRUMENTED + TRACED)
def test_balanced_gain_matches_the_timers_lockstep_model(pp, job: str) -> None:
    """The timers' own work per rank and step (cycle less p2p waits), balanced over
    the ranks, by the lockstep model: within 15% of tlog's figure."""
    case = pp(job)
    iters = sorted(set(case.steady_iters(0)) & set(case.steady_iters(1)))
    own = np.array([[case.truth[r]["steps"][i]["cycle_s"] - case.truth[r]["steps"][i]["wait_s"]
                     for i in iters] for r in (0, 1)])
    wait = np.array([[case.truth[r]["steps"][i]["wait_s"] for i in iters] for r in (0, 1)])
    now = (own.max(axis=0) + wait.min(axis=0)).mean()
    even = (own.mean(axis=0) + wait.min(axis=0)).mean()
    truth = now / even
    got = _pp(case)["speedup_if_balanced"]
    assert truth > 1.1, f"{job}: the timers show no imbalance to balance ({truth:.2f}x)"
    assert got == pytest.approx(truth, rel=0.15), f"{job}: tlog {got:.2f}x, timers {truth:.2f}x"


@pytest.mark.parametrize("job", INSTRUMENTED)
def test_instrumented_leaves_little_unaccounted_on_the_light_stage(pp, job: str) -> None:
    """Before the p2p waits were timed, rank 0's wait was time in no phase."""
    case = pp(job)
    ranks = {r["rank"]: r for r in _pp(case)["ranks"]}
    assert ranks[0]["wait_s"] > 0
    # rank 0's own work (everything but its waits) is what the timers say it is
    steps = case.truth[0]["steps"]
    iters = [i for i in case.steady_iters(0) if i < len(steps)]
    own = np.mean([steps[i]["cycle_s"] - steps[i]["wait_s"] for i in iters])
    assert ranks[0]["own_s"] == pytest.approx(own, rel=0.25)
