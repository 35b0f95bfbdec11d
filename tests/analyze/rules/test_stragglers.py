"""``analyze.rules.stragglers``: the ``straggler`` finding's words."""

from __future__ import annotations

import pytest
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.rules.stragglers import in_straggler_phase

from tests.support.runbuilder import RunBuilder, loop


def test_in_straggler_phase() -> None:
    assert in_straggler_phase("backward") == ", most in backward"
    assert in_straggler_phase(UNACCOUNTED_PHASE) == (", most in time no phase covers "
                                                     "(untimed code)")
    assert in_straggler_phase(None) == ""


def test_a_compute_straggler(findings) -> None:
    # three independent ranks; rank 2 computes 60 ms where its peers take 30 ms
    b = RunBuilder("s", tags={"device": "cpu"})
    for rank in range(3):
        loop(b, 25, [("next_batch", 0.01), ("forward", 0.06 if rank == 2 else 0.03)],
             rank=rank)
    (f,) = findings(b, "straggler")
    assert (f.evidence["rank"], f.evidence["kind"], f.evidence["phase"]) == (2, "compute",
                                                                             "forward")
    assert f.evidence["slowdown"] == pytest.approx(1.0)
    # fixed, its 70 ms of own work becomes its peers' 40 ms: the three ranks' rates
    # 25 + 25 + 14.3 it/s become 75 it/s, 1.17x
    assert f.message == ("rank 2 of main computes 2.0x its peers' time (60 ms vs 30 ms per "
                         "iteration), most in forward (+30 ms); at its peers' pace the "
                         "pipeline would be 1.17x faster")
    assert f.evidence["gain_if_fixed"] == pytest.approx(75 / (50 + 1 / 0.07) - 1)
