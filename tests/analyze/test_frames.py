"""``analyze.frames``: the attributed iteration and phase frames of a run (a run
written by hand: its categories and steady state known from its figures)."""

from __future__ import annotations

import pytest
from tlog.analyze.frames import PARTS, attribute
from tlog.ingest.errors import RunNotFoundError

from tests.support.runbuilder import RunBuilder, loop

#: 12 iterations of 100 ms: 25 ms waiting for data, 30 + 45 ms of compute;
#: the first one takes 500 ms (warm-up: the rest settle at 100 ms).
PHASES = [("next_batch", 0.025), ("forward", 0.030), ("backward", 0.045)]


@pytest.fixture
def analysis(build):
    b = RunBuilder("hand")
    b.iteration(iter=0, ts=999.5, dur=0.5, phases=[("next_batch", 0.425), ("forward", 0.030),
                                                    ("backward", 0.045)], tokens=64)
    loop(b, 11, PHASES, t0=1000.0, tokens=64)
    # renumber the loop's iterations 1..11 after the warm-up iteration
    b.iterations = [b.iterations[0]] + [(*r[:4], r[4] + 1, *r[5:]) for r in b.iterations[1:]]
    b.phases = b.phases[:3] + [(*p[:4], p[4] + 1, *p[5:]) for p in b.phases[3:]]
    return attribute(build(b), "hand")


def test_iteration_frame_splits_each_iteration_into_its_categories(analysis) -> None:
    it = analysis.iteration_frame()
    assert it.columns == ["run_id", "rank", "stage", "worker", "iter", "ts", "dur", "cpu",
                          "tokens", "samples", "steady", "excluded", "starvation_s",
                          "backpressure_s", "compute_s", "sync_s", "unaccounted_s", "gpu_s"]
    assert it["iter"].to_list() == list(range(12))
    assert it["steady"].to_list() == [False] + [True] * 11
    assert it["excluded"].to_list() == ["warmup"] + [None] * 11
    steady = it.filter("steady")
    assert steady["starvation_s"].to_list() == pytest.approx([0.025] * 11)
    assert steady["compute_s"].to_list() == pytest.approx([0.075] * 11)
    assert steady["sync_s"].sum() == steady["backpressure_s"].sum() == 0.0
    assert steady["unaccounted_s"].to_list() == pytest.approx([0.0] * 11, abs=1e-12)
    assert it["starvation_s"][0] == pytest.approx(0.425)   # warm-up still attributed
    assert it["gpu_s"].null_count() == 12                 # no device times recorded


def test_phase_frame_totals_the_steady_iterations(analysis) -> None:
    ph = analysis.phase_frame().sort("phase")
    assert ph["phase"].to_list() == ["backward", "forward", "next_batch"]
    assert ph["category"].to_list() == ["compute", "compute", "starvation"]
    assert ph["iterations"].to_list() == [11, 11, 11]
    assert ph["host_s"].to_list() == pytest.approx([11 * 0.045, 11 * 0.030, 11 * 0.025])
    assert ph["seconds_per_iter"].to_list() == pytest.approx([0.045, 0.030, 0.025])
    everything = analysis.phase_frame(steady_only=False).sort("phase")
    assert everything["host_s"].to_list() == pytest.approx(
        [12 * 0.045, 12 * 0.030, 11 * 0.025 + 0.425])


def test_steady_rows_are_split_into_parts_for_trends(analysis) -> None:
    # 11 steady iterations in PARTS (3) parts: (cumulative count - 1) * 3 // 11
    assert PARTS == 3
    parts = analysis.iterations.sort("iter")["part"].to_list()
    assert parts == [None, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert analysis.steady.height == 11
    assert analysis.attempts == [] and analysis.pp_stages == frozenset()


def test_an_unknown_run_is_refused(build) -> None:
    con = build(RunBuilder("other"))
    with pytest.raises(RunNotFoundError, match="nope"):
        attribute(con, "nope")
