"""Statistics tlog's verdicts rest on (no tlog types: arrays and frames in, figures out).

- :func:`welch_interval`: Welch's t interval for a difference of means
  (``tlog compare``'s significance, ``analyze.compare``), over
- :func:`batch_means`: the method of non-overlapping batch means (Law &
  Kelton, *Simulation Modeling and Analysis*, ch. 9): iteration times are
  autocorrelated (drift, periodic stalls), so each run's steady iterations
  are cut into :data:`MAX_BATCHES` contiguous batches per worker and the
  batch means, not single iterations, are the samples.
- :func:`kendall_trend`: the exact Mann-Kendall trend test (the ``drift``
  and ``memory_growth`` findings, ``analyze.rules``), on
  :func:`block_medians`;
- :func:`theil_sen`: the Theil-Sen slope (the ``memory_growth`` rate).

The distributions are scipy's (``scipy.stats``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

#: Confidence level of the interval on the change in iteration time.
CONFIDENCE = 0.95
#: Batches per run for the batch-means interval (Law & Kelton recommend 10 to
#: 30 batches; 10 keeps each batch long enough to average out periodic stalls).
MAX_BATCHES = 10
#: Fewest iterations per batch; with fewer batches than MIN_BATCHES a run is
#: too short to judge (significant is then False, with the reason).
MIN_BATCH_ITERS = 3
MIN_BATCHES = 4


@dataclass
class WelchInterval:
    """Welch's t interval for ``mean(b) - mean(a)``."""

    mean_a: float
    mean_b: float
    delta: float
    low: float
    high: float
    df: float
    n_a: int
    n_b: int


def welch_interval(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE) -> WelchInterval:
    """Welch's (unequal variances) t interval for ``mean(b) - mean(a)``.

    Degrees of freedom by Welch-Satterthwaite; the quantile of Student's t is
    scipy's (``scipy.stats.t.ppf``). Needs at least 2 values per sample. When
    both samples have no spread the interval is the point ``delta``.

    Raises:
        ValueError: a sample has fewer than 2 values.
    """
    n_a, n_b = len(a), len(b)
    if n_a < 2 or n_b < 2:
        msg = "each sample needs at least 2 values"
        raise ValueError(msg)
    ma, mb = float(np.mean(a)), float(np.mean(b))
    va, vb = float(np.var(a, ddof=1)) / n_a, float(np.var(b, ddof=1)) / n_b
    delta = mb - ma
    se2 = va + vb
    if se2 <= 0.0:
        return WelchInterval(ma, mb, delta, delta, delta, math.inf, n_a, n_b)
    df = se2 * se2 / ((va * va) / (n_a - 1) + (vb * vb) / (n_b - 1))
    # imported when a test runs: scipy.stats is most of the analysis' import time,
    # and most diagnoses run none
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2.0, df)) * math.sqrt(se2)
    return WelchInterval(ma, mb, delta, delta - half, delta + half, df, n_a, n_b)


def batch_means(frame: pl.DataFrame) -> np.ndarray:
    """Batch means of a stage's steady iteration times (module docstring).

    Args:
        frame: steady iterations of one stage: ``worker``, ``rank``, ``iter``,
            ``base_s`` (seconds per iteration).

    Returns:
        One mean per batch (seconds); empty when a worker has fewer than
        ``MIN_BATCHES * MIN_BATCH_ITERS`` steady iterations.
    """
    if frame.height == 0:
        return np.array([])
    groups = [g.sort("iter")["base_s"].to_numpy()
              for _, g in frame.group_by("rank", "worker", maintain_order=True)]
    shortest = min(len(g) for g in groups)
    k = min(MAX_BATCHES, shortest // MIN_BATCH_ITERS)
    if k < MIN_BATCHES:
        return np.array([])
    sums = np.zeros(k)
    counts = np.zeros(k)
    for g in groups:
        for j, part in enumerate(np.array_split(g, k)):
            sums[j] += part.sum()
            counts[j] += len(part)
    return sums / counts


def kendall_trend(values: np.ndarray) -> tuple[float, float]:
    """Mann-Kendall trend test of ``values`` against their order.

    Returns:
        ``(tau, p)``: Kendall's tau ``S / (n (n - 1) / 2)`` with ``S`` the
        ordered minus the reversed pairs (ties count 0), and the exact
        two-sided p-value ``P(|S'| >= |S|)`` over the ``n!`` equally likely
        orders of ``n`` distinct values (with ties it is slightly
        conservative). ``(0.0, 1.0)`` for fewer than 3 values.

    The p-value is scipy's exact Kendall test (``scipy.stats.kendalltau``,
    ``method="exact"``), which depends only on ``n`` and ``S``: without ties
    it runs on ``values`` themselves; scipy refuses ties for the exact test,
    so with ties it runs on an order of ``n`` distinct values with the first
    ``|S|`` at or above this one that ``n`` values can reach (the parity of
    ``n (n - 1) / 2``), the same tail as before the ties.
    """
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 3:
        return 0.0, 1.0
    i, j = np.triu_indices(n, 1)
    s = int(np.sign(x[j] - x[i]).sum())
    pairs = n * (n - 1) // 2
    order = np.arange(n)
    from scipy import stats  # imported when used (see the first one)

    if len(np.unique(x)) == n:
        p = float(stats.kendalltau(order, x, method="exact").pvalue)
    else:
        reach = abs(s) + (pairs - abs(s)) % 2     # S of n distinct values has pairs' parity
        p = float(stats.kendalltau(order, _with_inversions(n, (pairs - reach) // 2),
                                   method="exact").pvalue)
    return s / pairs, min(p, 1.0)


def _with_inversions(n: int, k: int) -> np.ndarray:
    """An order of ``0..n-1`` with exactly ``k`` inversions (``0 <= k <= n (n - 1) / 2``):
    taking the ``c``-th smallest remaining value makes ``c`` inversions."""
    rest = list(range(n))
    out = []
    for _ in range(n):
        c = min(k, len(rest) - 1)
        out.append(rest.pop(c))
        k -= c
    return np.array(out, dtype=np.float64)


def theil_sen(x: np.ndarray, y: np.ndarray, confidence: float = CONFIDENCE
              ) -> tuple[float, float, float]:
    """The Theil-Sen slope of ``y`` against ``x``: the median of the slopes
    between every pair of points, robust to a minority of outliers (a
    garbage collection, a cache flush). scipy's ``scipy.stats.theilslopes``.

    Returns:
        ``(slope, low, high)``: the slope (units of ``y`` per unit of ``x``) and
        its ``confidence`` interval (Sen 1968). ``(0.0, 0.0, 0.0)`` for fewer
        than 2 points or no spread in ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return 0.0, 0.0, 0.0
    from scipy import stats  # imported when used (see the first one)

    res = stats.theilslopes(y, x, alpha=confidence)
    return float(res.slope), float(res.low_slope), float(res.high_slope)


def block_medians(values: np.ndarray, blocks: int) -> np.ndarray:
    """Medians of ``blocks`` consecutive blocks of ``values`` (block ``b`` holds
    positions ``p`` with ``p * blocks // n == b``; fewer blocks when there are
    fewer values): the samples of :func:`kendall_trend` when neighbouring
    values share noise (the batch-means idea of :func:`batch_means`)."""
    v = np.asarray(values, dtype=np.float64)
    k = min(blocks, len(v))
    if k == 0:
        return np.zeros(0)
    block = np.arange(len(v)) * k // len(v)
    return np.array([float(np.median(v[block == b])) for b in range(k)])
