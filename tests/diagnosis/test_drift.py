"""The drift rule: a trend over the run, not a difference between its ends.

Hand-checked: the exact Mann-Kendall p-values against a brute force over
every order, a run that steps once (a neighbour's job on a shared machine)
gives no finding, an uneven trend is info, a steady one a warning
(tests/scenarios/drift).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tlog.analyze import diagnose
from tlog.analyze.statistics import kendall_trend

from tests.support.runbuilder import RunBuilder, loop


def _brute_p(x: list[float]) -> float:
    """Two-sided p of Kendall's S by enumerating every order of len(x) values."""
    n = len(x)
    s0 = sum(np.sign(x[j] - x[i]) for i in range(n) for j in range(i + 1, n))
    hits = total = 0
    for perm in itertools.permutations(range(n)):
        s = sum(1 if perm[j] > perm[i] else -1 for i in range(n) for j in range(i + 1, n))
        hits += abs(s) >= abs(s0)
        total += 1
    return hits / total


def test_kendall_trend_exact() -> None:
    # Monotone 8 blocks: S = 28, only the two monotone orders of 8! reach |S| = 28.
    assert kendall_trend(np.arange(8.0)) == (1.0, pytest.approx(2 / 40320))
    # Five equal blocks then three higher: 15 ordered pairs, the 13 tied ones count 0.
    tau, p = kendall_trend(np.array([100.0] * 5 + [136.0] * 3))
    assert tau == pytest.approx(15 / 28)
    # |S| >= 15 means |S| >= 16 (S is even for n = 8): at most 6 inversions, and the
    # Mahonian numbers of n = 8 give 1+7+27+76+174+343+602 = 1230 orders each way.
    assert p == pytest.approx(2460 / 40320)   # 0.0610: no trend at the 1% level
    x = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.6]
    tau, p = kendall_trend(np.array(x))
    assert tau == pytest.approx(7 / 21)
    assert p == pytest.approx(_brute_p(x))
    assert kendall_trend(np.array([1.0, 2.0])) == (0.0, 1.0)


def _finding(d, code):
    return next((f for f in d.findings if f.code == code), None)


def test_a_slow_stretch_at_the_end_is_not_drift(build) -> None:
    # 60 iterations of 100 ms; the last 20 take 136 ms (another job on a shared machine).
    # The old first-third vs last-third rule said "36% slower" (warning). Blocks of 7.5:
    # medians 100 x5, 136 x3 -> S = 15, p = 0.061 >= 1%: no finding.
    b = RunBuilder()
    loop(b, 60, lambda i: [("forward", 0.136 if i >= 40 else 0.100)])
    d = diagnose(build(b), "r")
    assert _finding(d, "drift") is None


def test_an_uneven_trend_is_info(build) -> None:
    # 64 iterations, 8 blocks of 8 with constant times 100, 112, 104, 116, 108, 120, 124,
    # 128 ms: 3 reversed pairs of 28 -> S = 22, tau = 0.7857 < 0.8; exact p: at most 3
    # inversions, 2 * (1 + 7 + 27 + 76) = 222 of 8! orders = 0.005506 < 1%.
    # First third (positions 0..21): 100 x8, 112 x8, 104 x6 -> median 104 ms; last third
    # (43..63): 120 x5, 124 x8, 128 x8 -> median 124 ms: +19.2%.
    times = [0.100, 0.112, 0.104, 0.116, 0.108, 0.120, 0.124, 0.128]
    b = RunBuilder()
    loop(b, 64, lambda i: [("forward", times[i // 8])])
    d = diagnose(build(b), "r")
    f = _finding(d, "drift")
    assert f is not None and f.severity == "info"
    assert f.evidence["tau"] == pytest.approx(22 / 28)
    assert f.evidence["p_value"] == pytest.approx(222 / 40320)
    assert f.evidence["change"] == pytest.approx(124 / 104 - 1)
    assert f.evidence["block_medians_s"] == pytest.approx(times)
    # forward's mean per iteration: first third 2320/22 = 105.45 ms, last 2616/21 = 124.57 ms.
    assert f.evidence["phase_change_s"] == pytest.approx(2.616 / 21 - 2.320 / 22)
    assert f.message == ("main gets 19% slower over the run, with a trend, unevenly (104 ms -> "
                         "124 ms median per iteration; Kendall's tau 0.79 over 8 blocks, "
                         "p 0.006); forward changes most (+19 ms per iteration)")
