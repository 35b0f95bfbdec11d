"""``analyze.stragglers``: ranks that do their own work more slowly than their
peers (runs written by hand, the slow rank known)."""

from __future__ import annotations

import numpy as np
import pytest
from tlog.analyze.frames import attribute
from tlog.analyze.pipeline import worker_table
from tlog.analyze.stragglers import (
    STRAGGLER_CRITICAL,
    STRAGGLER_MIN_ITERS,
    Straggler,
    find_stragglers,
    noise_shifts,
)

from tests.support.runbuilder import RunBuilder, loop


def _ranks(build, n: int, phases_of: dict[int, list]):
    b = RunBuilder("dp")
    for rank, phases in phases_of.items():
        loop(b, n, phases, rank=rank)
    return attribute(build(b), "dp")


def test_a_slow_rank_and_a_starved_rank_are_named(build) -> None:
    # rank 2 computes 60 ms where its peers take 30 ms: slowdown 60 / 30 - 1 = 1.0;
    # rank 1 waits 50 ms for data where its peers wait 10 ms: 40 ms extra over the
    # peers' median iteration (rank 0: 40 ms, rank 2: 70 ms -> 55 ms), 0.727
    analysis = _ranks(build, 25, {0: [("next_batch", 0.01), ("forward", 0.03)],
                                  1: [("next_batch", 0.05), ("forward", 0.03)],
                                  2: [("next_batch", 0.01), ("forward", 0.06)]})
    notes: list[str] = []
    found = find_stragglers(analysis, worker_table(analysis), notes=notes)
    assert [(s.rank, s.kind, s.phase) for s in found] == [(2, "compute", "forward"),
                                                          (1, "input", "next_batch")]
    slow, starved = found
    assert slow.slowdown == pytest.approx(1.0)
    assert (slow.own_s, slow.peers_s) == (pytest.approx(0.06), pytest.approx(0.03))
    assert slow.phase_excess_s == pytest.approx(0.03)
    assert slow.own_over_peers == pytest.approx(2.0)
    assert slow.iterations == 25 and slow.worker == "main-2"
    assert starved.slowdown == pytest.approx(0.04 / 0.055)
    assert starved.phase_excess_s == pytest.approx(0.04)
    assert notes == []


def test_too_few_steady_iterations_is_a_note_not_a_verdict(build) -> None:
    assert STRAGGLER_MIN_ITERS == 20
    analysis = _ranks(build, 12, {0: [("forward", 0.03)], 1: [("forward", 0.09)]})
    notes: list[str] = []
    assert find_stragglers(analysis, worker_table(analysis), notes=notes) == []
    assert notes == [("stragglers of main not judged: a worker has fewer than 20 steady "
                      "iterations (rank 0: 12, rank 1: 12)")]


def test_equal_ranks_have_no_straggler(build) -> None:
    analysis = _ranks(build, 25, {r: [("next_batch", 0.01), ("forward", 0.03)]
                                  for r in range(3)})
    assert find_stragglers(analysis, worker_table(analysis)) == []


def test_noise_shifts_by_hand() -> None:
    # 3 ranks, 4 steps; rank 2 is 10 ms slower on every step, ranks 0 and 1 jitter
    own = np.array([[1.00, 1.02, 1.00, 1.02],
                    [1.02, 1.00, 1.02, 1.00],
                    [1.10, 1.11, 1.10, 1.11]])
    z, shift, noise = noise_shifts(own)
    # rank 0's excess over the median of the others on each step: the median of two
    # values is their mean: 1.00 - 1.06, 1.02 - 1.055, ... -> median -0.0475
    assert shift[0] == pytest.approx(np.median([1.00 - 1.06, 1.02 - 1.055, 1.00 - 1.06,
                                                1.02 - 1.055]))
    assert shift[2] == pytest.approx(np.median([1.10 - 1.01, 1.11 - 1.01] * 2))
    spreads = [1.4826 * np.median(np.abs(e - np.median(e))) for e in
               (own[0] - (own[1] + own[2]) / 2, own[1] - (own[0] + own[2]) / 2,
                own[2] - (own[0] + own[1]) / 2)]
    assert noise == pytest.approx(np.median(spreads))
    assert z[2] == pytest.approx(shift[2] / noise)
    # no noise at all: a positive shift is infinitely far, the others 0
    z, shift, noise = noise_shifts(np.array([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]]))
    assert noise == 0.0 and z.tolist() == [0.0, 0.0, np.inf]


#: A compute straggler 20% slower than its peers in ``fwd``.
SLOW = {"stage": "s", "rank": 1, "worker": "w1", "kind": "compute", "phase": "fwd",
        "slowdown": 0.2, "own_s": 0.06, "peers_s": 0.05, "phase_excess_s": 0.01,
        "peers_extra_sync_s": 0.01, "iterations": 30}


def _straggler(**kw) -> Straggler:
    return Straggler(**{**SLOW, **kw})


def test_severity_by_the_gain_of_the_fix_else_by_the_slowdown() -> None:
    assert _straggler(gain_if_fixed=None, slowdown=0.2).severity == "warning"
    assert _straggler(gain_if_fixed=None, slowdown=STRAGGLER_CRITICAL).severity == "critical"
    assert _straggler(gain_if_fixed=0.01).severity == "info"
    assert _straggler(gain_if_fixed=0.05).severity == "warning"
    assert _straggler(gain_if_fixed=1 / 0.75 - 1).severity == "critical"
    s = _straggler(gain_if_fixed=0.25, peers_s=0.0)
    assert s.speedup_if_fixed == 1.25 and s.own_over_peers is None
    d = _straggler(gain_if_fixed=0.25).to_dict()
    assert (d["severity"], d["speedup_if_fixed"], d["own_over_peers"]) == (
        "warning", 1.25, pytest.approx(1.2))
