"""``analyze.live``: the live view of a growing run over its latest window (a run
written by hand: 100 iterations of 125 ms from t = 1000 s)."""

from __future__ import annotations

import pytest
from tlog.analyze.baseline import HighWaterMark
from tlog.analyze.live import WHOLE_RUN_CODES, live_view, run_extent, stored_trends
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.errors import RunNotFoundError

from tests.support.runbuilder import RunBuilder

MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture
def con(build):
    b = RunBuilder("live")
    for i in range(100):
        # device memory grows 1 MiB an iteration from 1 GiB: 99 MiB over the run, a leak
        # by memory_growth's rule (a steady rise of at least 64 MiB)
        b.iteration(iter=i, ts=1000.0 + 0.125 * i, dur=0.125, phases=[("forward", 0.125)],
                    mem={"allocated": GiB + i * MiB})
    for ts, depth in ((1001.0, 1), (1011.0, 3), (1012.0, 2)):
        b.queue(name="hs", ts=ts, depth=depth, capacity=4, rank=0, stage="main")
    return build(b)


def test_run_extent(con) -> None:
    assert run_extent(con, "live") == (100, 1000.0 + 0.125 * 99, 1012.5)
    assert run_extent(con, "nope") is None


def test_the_view_covers_the_latest_seconds(con) -> None:
    best = HighWaterMark("best", {"iters_per_s": 10.0, "tokens_per_s": None})
    v = live_view(con, "live", window_s=2.0, high_water=best)
    # the window starts 2 s before the last end (1012.5 s): iterations 84..99
    assert (v.window.since, v.window.first, v.window.until) == (1010.5, 1010.5, 1012.5)
    assert (v.window.iterations, v.window.whole_run, v.window.seconds) == (16, False, 2.0)
    assert v.iterations == 100 and v.last_end == 1012.5
    assert (v.unit, v.now) == ("it/s", pytest.approx(8.0))
    assert v.high_water_value == 10.0 and v.vs_high_water == pytest.approx(0.8)
    assert v.idle_s == pytest.approx(v.as_of - 1012.5)
    (q,) = v.queues
    assert (q.name, q.depth, q.capacity, q.ts) == ("hs", 2, 4, 1012.0)
    (mem,) = v.memory
    assert (mem.kind, mem.source, mem.samples) == ("device memory", "iterations' mem", 16)
    assert (mem.first_bytes, mem.latest_bytes, mem.peak_bytes) == (GiB, GiB + 99 * MiB,
                                                                   GiB + 99 * MiB)
    assert mem.rate_bytes_per_iter == pytest.approx(MiB)


def test_a_window_longer_than_the_run_holds_all_of_it(con) -> None:
    v = live_view(con, "live", window_s=3600.0)
    assert v.window.whole_run and v.window.iterations == 100
    assert v.high_water is None and v.vs_high_water is None


def test_bad_calls(con) -> None:
    with pytest.raises(ValueError, match="window_s must be a positive number"):
        live_view(con, "live", window_s=0)
    with pytest.raises(RunNotFoundError, match="run 'nope' holds no iterations yet"):
        live_view(con, "nope")


def test_stored_trends_read_the_whole_runs_diagnosis(con) -> None:
    assert stored_trends(con, "live") is None          # nothing stored yet
    ensure_attribution(con, ["live"])
    whole = stored_trends(con, "live")
    assert whole.iterations == 100
    # the leak over the whole run; the window's diagnosis could not see it
    assert [f.code for f in whole.findings] == ["memory_growth"]
    assert "memory_growth" in WHOLE_RUN_CODES
