"""tlog.analyze.statistics.kendall_trend (scipy's exact Kendall test) gives the
figures of the hand-written Mann-Kendall test it replaced, which is
kept here as the reference: the exact distribution of the inversion count of
``n`` distinct values (Mahonian numbers), ties counting 0 in ``S``."""

from __future__ import annotations

import numpy as np
import pytest
from tlog.analyze.statistics import kendall_trend


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
