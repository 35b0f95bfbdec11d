"""``analyze.steady``: which iterations the verdict is computed from, the pieces
one by one on hand-made arrays and frames (the whole rule on built runs is in
tests/diagnosis/test_steady.py and test_attempts.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from tlog.analyze.steady import (
    EXCLUDED_ATTEMPT,
    StageAttempts,
    disruptive_events,
    exclude_attempts,
    find_attempts,
    shared_warmup_end,
    steady_flags,
    warmup_length,
    worker_slices,
)


def _its(rows: list[tuple[int, float, float]]) -> pl.DataFrame:
    """``(wid, ts, dur)`` rows, grouped by worker."""
    return pl.DataFrame(rows, schema={"wid": pl.Int64, "ts": pl.Float64, "dur": pl.Float64},
                        orient="row")


def _events(rows: list[tuple[float, float]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"ts": pl.Float64, "dur": pl.Float64}, orient="row")


def test_worker_slices() -> None:
    assert worker_slices(np.array([3, 3, 1, 1, 1, 2])) == [(3, 0, 2), (1, 2, 5), (2, 5, 6)]
    assert worker_slices(np.array([], dtype=np.int64)) == []


def test_warmup_of_a_worker() -> None:
    # reference: the median of the second half (1.0); 5.0 and 2.0 are above 1.2
    assert warmup_length(np.array([5.0, 2.0] + [1.0] * 8)) == 2
    assert warmup_length(np.array([5.0] * 7)) == 0             # under 8 iterations
    # never settles: capped at a quarter of 12 iterations
    assert warmup_length(np.array([9.0, 8.0, 7.0, 6.0, 5.0, 4.0] + [1.0] * 6)) == 3


def test_disruptive_events_leave_out_span_markers() -> None:
    ts, dur = np.array([0.0, 10.0]), np.array([10.0, 10.0])      # the run spans 20 s
    ev = _events([(5.0, 1.0), (0.0, 15.0), (12.0, None)])
    keep, markers = disruptive_events(ev, ts, dur)
    # a 15 s event is over half the 20 s run: a marker ("training", "epoch 1")
    assert keep["ts"].to_list() == [5.0, 12.0]
    assert markers["dur"].to_list() == [15.0]


def test_shared_warmup_end_is_the_latest_stage_median() -> None:
    # stage a's two workers settle at ts 3 and 5 (median 4), stage b's one at ts 7
    ts = np.array([0.0, 1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 0.0, 7.0, 8.0])
    lengths = {0: (0, 4, 3), 1: (4, 7, 1), 2: (7, 10, 1)}
    assert shared_warmup_end(np.zeros(10), ts, lengths, {0: "a", 1: "a", 2: "b"}) == 7.0
    assert shared_warmup_end(np.zeros(10), ts, lengths, {0: "a", 1: "a", 2: "a"}) is None


def test_steady_flags_mark_warmup_and_event_iterations() -> None:
    # worker 0: 10 iterations of 1 s, the first 5 s (warm-up); worker 1: 10 of 1 s;
    # a checkpoint at 1004.5 s overlaps each worker's iteration running then
    w0 = [(0, 1000.0, 5.0)] + [(0, 1005.0 + k, 1.0) for k in range(9)]
    w1 = [(1, 1000.0 + k, 1.0) for k in range(10)]
    flags = steady_flags(_its(w0 + w1), _events([(1004.5, 0.2)]))
    assert flags["excluded"].to_list() == (
        ["warmup"] + [None] * 9 + [None] * 4 + ["event"] + [None] * 5)
    assert flags["steady"].to_list() == [not x for x in
                                         [True] + [False] * 9 + [False] * 4 + [True] + [False] * 5]


def test_a_restart_is_two_attempts_judged_on_the_one_with_more_steady_iterations() -> None:
    # rank 0 of stage s ran 3 iterations, then (a restart) 6 more; rank 1 likewise
    rows = ([(0, 100.0 + k, 1.0) for k in range(3)] + [(1, 200.0 + k, 1.0) for k in range(6)]
            + [(2, 100.0 + k, 1.0) for k in range(3)] + [(3, 200.0 + k, 1.0) for k in range(6)])
    it = _its(rows)
    workers = pl.DataFrame({"wid": [0, 1, 2, 3], "stage": ["s"] * 4, "rank": [0, 0, 1, 1],
                            "worker": ["s-0", "s-0.1", "s-1", "s-1.1"]})
    steady = np.ones(it.height, dtype=bool)
    (att,) = find_attempts(it, workers, steady)
    assert att == StageAttempts(stage="s", wids=((0, 2), (1, 3)), starts=(100.0, 200.0),
                                iterations=(6, 12), steady=(6, 12), kept=1)
    assert att.left_out == (0, 2) and att.left_out_iterations == 6
    assert att.note() == (
        "run holds 2 attempts of stage s (a restart at 1970-01-01 00:03:20 UTC; workers that "
        "share a rank and ran one after the other): judged on the last (the most steady "
        "iterations), 12 steady iterations; 6 iterations of the earlier attempt left out "
        "(its ranks never ran with the judged ones)")
    flags = steady_flags(it, _events([]))
    out = exclude_attempts(flags, it, [att])
    assert out["excluded"].to_list() == [EXCLUDED_ATTEMPT] * 3 + [None] * 6 + \
        [EXCLUDED_ATTEMPT] * 3 + [None] * 6
    assert out["steady"].sum() == 12
    assert exclude_attempts(flags, it, []) is flags


def test_workers_that_overlap_in_time_are_not_attempts() -> None:
    it = _its([(0, 100.0 + k, 1.0) for k in range(5)] + [(1, 102.0 + k, 1.0) for k in range(5)])
    workers = pl.DataFrame({"wid": [0, 1], "stage": ["s", "s"], "rank": [0, 0],
                            "worker": ["s-0", "s-0.1"]})
    assert find_attempts(it, workers, np.ones(10, dtype=bool)) == []


@pytest.mark.parametrize("n", [1, 0])
def test_few_workers_have_no_attempts(n: int) -> None:
    it = _its([(0, 100.0, 1.0)] * n)
    workers = pl.DataFrame({"wid": [0], "stage": ["s"], "rank": [0], "worker": ["s-0"]})
    assert find_attempts(it, workers, np.ones(n, dtype=bool)) == []
