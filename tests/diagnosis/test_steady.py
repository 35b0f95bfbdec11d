"""Steady state: warm-up detection, event exclusion, periodic stalls kept."""

from __future__ import annotations

import numpy as np
import polars as pl
from tlog.analyze import attribute
from tlog.analyze.steady import WARMUP_MAX_SHARE, overlaps_events, warmup_length

from tests.support.runbuilder import RunBuilder, loop


def test_leading_slow_iterations_are_warmup() -> None:
    # Reference: median of the second half = 1.0. Iterations 0 (5.0) and 1 (2.0) are above
    # 1.2; from iteration 2 on the value and its forward window median are 1.0.
    dur = np.array([5.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert warmup_length(dur) == 2


def test_periodic_stalls_are_not_warmup() -> None:
    # A 3 s stall every fourth iteration: the forward median of five ignores it.
    dur = np.array([0.1 if i % 4 != 3 else 3.1 for i in range(40)])
    assert warmup_length(dur) == 0
    # Even when the very first iteration is not a stall but the fourth is.
    assert warmup_length(np.concatenate([[0.5, 0.4], dur])) == 2


def test_a_slightly_slower_first_iteration_is_not_warmup() -> None:
    dur = np.array([0.115] + [0.100] * 19)  # 15% above: within the 20% tolerance
    assert warmup_length(dur) == 0


def test_warmup_is_capped() -> None:
    dur = np.linspace(10.0, 1.0, 40)  # never settles within 20% of the second half's median
    assert warmup_length(dur) == int(40 * WARMUP_MAX_SHARE)


def test_short_workers_get_no_warmup() -> None:
    assert warmup_length(np.array([9.0, 1.0, 1.0, 1.0, 1.0])) == 0


def test_event_overlap() -> None:
    ts = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    dur = np.ones(5)
    events = pl.DataFrame({"ts": [1.5, 3.0, 10.0], "dur": [0.2, 0.0, 1.0]})
    # [1.5, 1.7] hits iteration 1; the marker at 3.0 hits iteration 3 (not 2, which ends there).
    assert overlaps_events(ts, dur, events).tolist() == [False, True, False, True, False]


def test_touching_interval_then_a_later_one() -> None:
    # The first merged interval ends exactly at the iteration's start; the second overlaps it.
    ts, dur = np.array([5.0]), np.array([3.0])
    events = pl.DataFrame({"ts": [0.0, 6.0], "dur": [5.0, 0.5]})
    assert overlaps_events(ts, dur, events).tolist() == [True]


def test_overlapping_events_merge() -> None:
    ts = np.arange(10.0)
    dur = np.full(10, 0.5)
    events = pl.DataFrame({"ts": [2.2, 2.4, 6.9], "dur": [3.0, 0.1, 0.0]})
    # [2.2, 5.2] covers iterations 3, 4, 5 and the tail of 2 ([2, 2.5)); 6.9 is between
    # iteration 6 ([6, 6.5)) and 7: no hit.
    assert np.flatnonzero(overlaps_events(ts, dur, events)).tolist() == [2, 3, 4, 5]


def test_an_event_on_one_rank_excludes_every_worker(build) -> None:
    b = RunBuilder()
    for rank in (0, 1):
        loop(b, 30, [("forward", 0.050), ("backward", 0.050)], rank=rank, stage="train")
    b.event(name="checkpoint", ts=1000.0 + 1.05, dur=0.3, rank=0)  # iterations 10..13
    con = build(b)
    it = attribute(con, "r").iteration_frame()
    for rank in (0, 1):
        mine = it.filter(rank=rank)
        assert mine.filter(excluded="event")["iter"].to_list() == [10, 11, 12, 13]
        assert mine["steady"].sum() == 26


def test_warmup_and_events_are_counted_apart(build) -> None:
    b = RunBuilder()
    loop(b, 40, lambda i: [("forward", 0.5 if i < 3 else 0.05), ("backward", 0.05)])
    b.event(name="eval", ts=1000.0 + 3 * 0.55 + 20 * 0.1 + 0.01, dur=0.0)  # inside iteration 23
    con = build(b)
    it = attribute(con, "r").iteration_frame()
    assert it.filter(excluded="warmup")["iter"].to_list() == [0, 1, 2]
    assert it.filter(excluded="event")["iter"].to_list() == [23]


def test_an_event_spanning_the_run_is_a_marker(build) -> None:
    b = RunBuilder()
    loop(b, 30, [("forward", 0.050), ("backward", 0.050)])
    b.event(name="epoch 1", ts=1000.0, dur=3.0)  # the whole run
    b.event(name="checkpoint", ts=1001.01, dur=0.05)  # iteration 10 only
    con = build(b)
    from tlog.analyze import diagnose

    d = diagnose(con, "r")
    assert d.iterations.event == 1
    assert any("'epoch 1'" in n and "span marker" in n for n in d.notes)


def test_a_pipeline_starts_up_together_across_stages() -> None:
    """A drafter slow for its first 10 iterations (warm-up by its own times) and a
    target whose times look settled from the start: the target's iterations that
    start before the drafter's first steady one are start-up too. Figures by hand:
    both workers run 40 iterations of 0.1 s from t=0, the drafter's first ten take
    0.5 s, so its first steady iteration starts at 10 * 0.5 = 5.0 s and the target's
    iterations 0..49 would start before it; capped at a quarter of its 40: 10."""
    import numpy as np
    import polars as pl
    from tlog.analyze.steady import steady_flags

    d_dur = np.r_[np.full(10, 0.5), np.full(30, 0.1)]
    t_dur = np.full(40, 0.1)
    rows = pl.DataFrame({
        "wid": [0] * 40 + [1] * 40,
        "ts": np.r_[np.cumsum(np.r_[0.0, d_dur[:-1]]), np.cumsum(np.r_[0.0, t_dur[:-1]])],
        "dur": np.r_[d_dur, t_dur]})
    events = pl.DataFrame({"ts": [], "dur": []}, schema={"ts": pl.Float64, "dur": pl.Float64})
    workers = pl.DataFrame({"wid": [0, 1], "stage": ["drafter", "target"]})
    alone = steady_flags(rows, events)["steady"].to_numpy()
    assert (~alone[:40]).sum() == 10 and (~alone[40:]).sum() == 0     # per worker only
    flags = steady_flags(rows, events, workers)["steady"].to_numpy()
    assert (~flags[:40]).sum() == 10
    assert (~flags[40:]).sum() == 10 and not flags[40:50].any()
    # one stage: the same two workers keep their own warm-up
    one = workers.with_columns(stage=pl.lit("main"))
    assert (steady_flags(rows, events, one)["steady"].to_numpy() == alone).all()
