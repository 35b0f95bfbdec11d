"""``analyze.gaps``: the wall time before each iteration is counted in it,
pauses and gaps an event covers are not; the words for that time."""

from __future__ import annotations

import polars as pl
import pytest
from tlog.analyze.gaps import (
    BETWEEN_COLUMN,
    BETWEEN_WORDS,
    PAUSE_FACTOR,
    Pauses,
    absorb_gaps,
    between_words,
    pauses_note,
)


def _iters(rows: list[tuple[int, int, float, float]]) -> pl.DataFrame:
    """``(wid, iter, ts, dur)`` rows, grouped by worker as analyze.load orders them."""
    return pl.DataFrame(rows, schema={"wid": pl.Int32, "iter": pl.Int64, "ts": pl.Float64,
                                      "dur": pl.Float64}, orient="row")


def _events(rows: list[tuple[float, float]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"ts": pl.Float64, "dur": pl.Float64}, orient="row")


def test_each_gap_moves_the_start_back_and_grows_the_iteration() -> None:
    # 1 s iterations that start every 1.5 s: 0.5 s before each one after the first
    it = _iters([(0, 0, 0.0, 1.0), (0, 1, 1.5, 1.0), (0, 2, 3.0, 1.0), (0, 3, 4.5, 1.0)])
    out, pauses = absorb_gaps(it)
    assert out["ts"].to_list() == [0.0, 1.0, 2.5, 4.0]
    assert out["dur"].to_list() == [1.0, 1.5, 1.5, 1.5]
    assert out[BETWEEN_COLUMN].to_list() == [0.0, 0.5, 0.5, 0.5]
    assert out[BETWEEN_COLUMN].dtype == pl.Float32
    assert pauses == Pauses(0, 0.0)


def test_a_gap_over_ten_median_cycles_is_a_pause_left_out() -> None:
    # cycles (gap + dur): 1.0, 1.5, 1.5, 1.5 and then 21 s; median 1.5 s, so the limit
    # is PAUSE_FACTOR * 1.5 = 15 s and the 20 s gap is a pause, not absorbed
    assert PAUSE_FACTOR == 10.0
    it = _iters([(0, 0, 0.0, 1.0), (0, 1, 1.5, 1.0), (0, 2, 3.0, 1.0), (0, 3, 4.5, 1.0),
                 (0, 4, 25.5, 1.0)])
    out, pauses = absorb_gaps(it)
    assert out[BETWEEN_COLUMN].to_list() == [0.0, 0.5, 0.5, 0.5, 0.0]
    assert out["ts"][4] == 25.5 and out["dur"][4] == 1.0
    assert pauses == Pauses(1, 20.0)


def test_only_consecutive_iterations_of_one_worker_are_joined() -> None:
    it = _iters([(0, 0, 0.0, 1.0), (0, 1, 1.5, 1.0),      # joined: 0.5 s
                 (0, 7, 3.0, 1.0),                        # renumbered (a restart): afresh
                 (1, 0, 3.25, 1.0), (1, 1, 4.5, 1.0)])    # worker 1: its own 0.25 s
    out, _ = absorb_gaps(it)
    assert out[BETWEEN_COLUMN].to_list() == [0.0, 0.5, 0.0, 0.0, 0.25]


def test_a_gap_an_event_overlaps_belongs_to_the_event() -> None:
    it = _iters([(0, 0, 0.0, 1.0), (0, 1, 1.5, 1.0), (0, 2, 3.0, 1.0)])
    # a 0.1 s checkpoint at 1.2 s lies in the gap before iteration 1 (1.0 .. 1.5 s)
    out, _ = absorb_gaps(it, _events([(1.2, 0.1)]))
    assert out[BETWEEN_COLUMN].to_list() == [0.0, 0.0, 0.5]
    # an event longer than half the run is a span marker: it takes no gap
    out, _ = absorb_gaps(it, _events([(0.0, 4.0)]))
    assert out[BETWEEN_COLUMN].to_list() == [0.0, 0.5, 0.5]


def test_noise_and_overlaps_count_as_no_gap() -> None:
    # 5 us (under MIN_GAP_S, clock noise) and -0.1 s (overlapping iterations)
    it = _iters([(0, 0, 0.0, 1.0), (0, 1, 1.000005, 1.0), (0, 2, 1.9, 1.0)])
    out, pauses = absorb_gaps(it)
    assert out.equals(it) and BETWEEN_COLUMN not in out.columns
    assert pauses == Pauses(0, 0.0)
    empty = it.head(0)
    assert absorb_gaps(empty) == (empty, Pauses(0, 0.0))


def test_between_words_name_the_core_wait_only_when_it_can_hold_the_time() -> None:
    assert between_words(None, 0.2) == BETWEEN_WORDS
    assert between_words(0.0, 0.2) == BETWEEN_WORDS
    assert between_words(0.1, 0.2) == BETWEEN_WORDS         # waits for a core hold half of it
    words = between_words(0.3, 0.2)
    assert words.startswith("its thread waited runnable for a core 30% of its time")
    assert between_words(0.2, 0.2) == between_words(0.2, 0.2) != BETWEEN_WORDS


@pytest.mark.parametrize(("pauses", "note"), [
    (Pauses(0, 0.0), None),
    (Pauses(2, 31.04), ("2 pause(s) between iterations (31.0 s in all, each longer than 10x "
                        "its worker's median iteration) are not counted in any iteration: an "
                        "evaluation or checkpoint not logged as an event?")),
])
def test_pauses_note(pauses: Pauses, note: str | None) -> None:
    assert pauses_note(pauses) == note
