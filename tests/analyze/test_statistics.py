"""tlog.analyze.statistics.kendall_trend (scipy's exact Kendall test) gives the
figures of the hand-written Mann-Kendall test it replaced, which is
kept here as the reference: the exact distribution of the inversion count of
``n`` distinct values (Mahonian numbers), ties counting 0 in ``S``."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from tlog.analyze.statistics import (
    batch_means,
    block_medians,
    kendall_trend,
    theil_sen,
    welch_interval,
)


def _mahonian_trend(values: np.ndarray) -> tuple[float, float]:
    """The implementation tlog had before scipy (analyze/findings.py)."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 3:
        return 0.0, 1.0
    i, j = np.triu_indices(n, 1)
    s = int(np.sign(x[j] - x[i]).sum())
    pairs = n * (n - 1) // 2
    counts = np.ones(1, dtype=np.float64)
    for m in range(2, n + 1):
        counts = np.convolve(counts, np.ones(m))
    s_all = pairs - 2 * np.arange(pairs + 1)
    p = float(counts[np.abs(s_all) >= abs(s)].sum() / counts.sum())
    return s / pairs, min(p, 1.0)


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(14)
    out = [np.arange(8.0), np.arange(8.0)[::-1], np.array([100.0] * 5 + [136.0] * 3),
           np.array([3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.6]), np.array([1.0, 1.0, 1.0]),
           np.array([2.0, 1.0, 3.0]), np.array([5.0, 5.0, 4.0, 6.0, 6.0, 7.0, 7.0, 8.0])]
    for n in (3, 4, 5, 8, 9, 12):
        out.append(rng.normal(size=n))                       # no ties
        out.append(rng.normal(size=n) + 0.3 * np.arange(n))  # a trend
        out.append(np.round(rng.normal(size=n) * 2))         # ties
    return out


@pytest.mark.parametrize("values", _arrays(), ids=lambda v: f"n{len(v)}")
def test_scipy_kendall_equals_the_hand_written_test(values: np.ndarray) -> None:
    tau, p = kendall_trend(values)
    ref_tau, ref_p = _mahonian_trend(values)
    assert tau == ref_tau
    assert p == pytest.approx(ref_p, rel=1e-9, abs=1e-15)


def test_kendall_of_three_values_by_hand() -> None:
    # n = 3: of the 6 orders, S = +3 and S = -3 once each, so P(|S| >= 3) = 2/6
    assert kendall_trend(np.array([1.0, 2.0, 3.0])) == (1.0, pytest.approx(1 / 3))
    assert kendall_trend(np.array([3.0, 2.0, 1.0])) == (-1.0, pytest.approx(1 / 3))
    # a tie counts 0: S = 0 + 1 + 1 = 2 of 3 pairs; S of 3 distinct values is odd,
    # so the tail starts at the next reachable S, 3: p = 1/3 again
    tau, p = kendall_trend(np.array([1.0, 1.0, 2.0]))
    assert (tau, p) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert kendall_trend(np.array([1.0, 2.0])) == (0.0, 1.0)


# --- Welch's interval, batch means, Theil-Sen, block medians ----------------------------

def test_welch_interval_of_equal_spreads_has_integer_degrees_of_freedom() -> None:
    # a = 1, 2, 3 and b = 3, 4, 5: variances 1 (ddof 1), so each mean's is 1/3,
    # se^2 = 2/3, df = (2/3)^2 / (2 * (1/3)^2 / 2) = 4; Student's t(0.975, 4) = 2.776445 (tables)
    w = welch_interval(np.array([1.0, 2.0, 3.0]), np.array([3.0, 4.0, 5.0]))
    assert (w.mean_a, w.mean_b, w.delta, w.n_a, w.n_b) == (2.0, 4.0, 2.0, 3, 3)
    assert w.df == pytest.approx(4.0)
    half = 2.776445 * math.sqrt(2 / 3)
    assert w.low == pytest.approx(2.0 - half, abs=1e-6)
    assert w.high == pytest.approx(2.0 + half, abs=1e-6)


def test_welch_interval_unequal_sizes_and_spreads() -> None:
    # a = 1, 2, 3 (var 1, n 3) and b = 2, 4, 6, 8 (var 20/3, n 4): per-mean variances
    # 1/3 and 5/3, se^2 = 2, df = 4 / ((1/9) / 2 + (25/9) / 3) = 4 / (1/18 + 50/54) = 4.0755
    w = welch_interval(np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0, 8.0]))
    assert w.delta == pytest.approx(3.0)
    assert w.df == pytest.approx(4 / (1 / 18 + 50 / 54))
    assert w.high - w.delta == pytest.approx(w.delta - w.low)   # symmetric about delta


def test_welch_interval_without_spread_is_the_point_and_needs_two_values() -> None:
    w = welch_interval(np.array([1.0, 1.0]), np.array([2.5, 2.5]))
    assert (w.low, w.delta, w.high, w.df) == (1.5, 1.5, 1.5, math.inf)
    with pytest.raises(ValueError, match="at least 2 values"):
        welch_interval(np.array([1.0]), np.array([1.0, 2.0]))


def _steady(values: dict[tuple[int, str], list[float]]) -> pl.DataFrame:
    rows = [(rank, worker, i, v) for (rank, worker), vs in values.items()
            for i, v in enumerate(vs)]
    rows.reverse()                          # batch_means orders by iter itself
    return pl.DataFrame(rows, schema=["rank", "worker", "iter", "base_s"], orient="row")


def test_batch_means_cuts_each_worker_into_the_same_batches() -> None:
    # 12 iterations: min(10 batches, 12 // 3) = 4 batches of 3 iterations
    one = {(0, "w0"): [1.0] * 3 + [2.0] * 3 + [3.0] * 3 + [4.0] * 3}
    assert batch_means(_steady(one)).tolist() == [1.0, 2.0, 3.0, 4.0]
    # a second worker at 2.0 throughout: each batch averages its 6 iterations
    two = {**one, (1, "w1"): [2.0] * 12}
    assert batch_means(_steady(two)).tolist() == [1.5, 2.0, 2.5, 3.0]


def test_batch_means_of_a_short_run_is_empty() -> None:
    # 11 iterations give 3 batches, fewer than MIN_BATCHES (4): too short to judge
    assert batch_means(_steady({(0, "w"): [1.0] * 11})).size == 0
    empty = pl.DataFrame(schema={"rank": pl.Int64, "worker": pl.String, "iter": pl.Int64,
                                 "base_s": pl.Float64})
    assert batch_means(empty).size == 0


def test_theil_sen_ignores_a_minority_of_outliers() -> None:
    # y = 2x + 1 with the last point at 100: of the 10 pairwise slopes six are 2 and
    # four are large (24.75, 32.3, 47.5, 93), so the median slope is 2
    x = np.arange(5.0)
    y = np.array([1.0, 3.0, 5.0, 7.0, 100.0])
    slope, low, high = theil_sen(x, y)
    assert slope == 2.0
    assert low <= 2.0 <= high
    assert theil_sen(np.array([1.0]), np.array([1.0])) == (0.0, 0.0, 0.0)
    assert theil_sen(np.array([3.0, 3.0]), np.array([1.0, 2.0])) == (0.0, 0.0, 0.0)


def test_block_medians() -> None:
    # 7 values in 3 blocks: position p goes to p * 3 // 7 = 0,0,0,1,1,2,2
    assert block_medians(np.arange(1.0, 8.0), 3).tolist() == [2.0, 4.5, 6.5]
    assert block_medians(np.array([5.0, 1.0]), 4).tolist() == [5.0, 1.0]   # fewer values
    assert block_medians(np.array([]), 3).size == 0
