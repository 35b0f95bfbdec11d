"""``analyze.rules.categories``: the category findings of each stage (runs written
by hand; shares are the phases' seconds over the iteration's)."""

from __future__ import annotations

import pytest

from tests.support.runbuilder import RunBuilder, loop


def _one_stage(phases, dur: float | None = None) -> RunBuilder:
    b = RunBuilder("cat", tags={"device": "cpu"})
    loop(b, 30, phases, dur=dur)
    return b


def test_starvation_of_the_bottleneck_is_critical(findings) -> None:
    # 40 ms of 100 ms waiting for data: over HIGH_SHARE, the verdict's category
    (f,) = findings(_one_stage([("next_batch", 0.04), ("forward", 0.06)]), "starvation")
    assert f.severity == "critical"
    assert f.evidence["stage"] == "main" and f.evidence["phase"] == "next_batch"
    assert f.evidence["share"] == pytest.approx(0.4)
    assert f.evidence["phase_seconds_per_iter"] == pytest.approx(0.04)
    assert f.message == ("main waits for input 40% of its time in next_batch (40 ms per "
                         "iteration): starved by its input (data loader or other unlogged "
                         "source)")


def test_a_moderate_share_is_info_and_compute_bound_names_the_largest_phase(findings) -> None:
    b = _one_stage([("next_batch", 0.01), ("forward", 0.06), ("backward", 0.03)])
    (starved,) = findings(b, "starvation")
    assert starved.severity == "info" and starved.evidence["share"] == pytest.approx(0.1)
    (cb,) = findings(_one_stage([("next_batch", 0.01), ("forward", 0.06), ("backward", 0.03)]),
                     "compute_bound")
    assert cb.severity == "info"
    assert cb.evidence["phase"] == "forward"
    assert cb.evidence["share"] == pytest.approx(0.9)
    assert cb.evidence["phase_share"] == pytest.approx(0.6)
    assert cb.message == ("main is compute-bound (90% compute); its largest phase is forward "
                          "at 60% (60 ms per iteration)")


def test_sync_and_backpressure(findings) -> None:
    # 30% in a collective: the largest loss over HIGH_SHARE, the verdict's category
    sync = findings(_one_stage([("forward", 0.07), ("allreduce", 0.03)]), "sync_bound")
    assert [(f.severity, round(f.evidence["share"], 6)) for f in sync] == [("critical", 0.3)]
    assert sync[0].evidence["upper_bound"] is False          # a CPU run: exact
    held = findings(_one_stage([("forward", 0.09), ("queue_put", 0.01)]), "backpressure")
    assert [(f.severity, f.evidence["phase"]) for f in held] == [("info", "queue_put")]
    assert held[0].message.endswith("held by an unlogged consumer")


def test_unaccounted_from_ten_percent(findings) -> None:
    # 88 ms of phases in a 100 ms iteration: 12 ms (12%) in no phase
    (f,) = findings(_one_stage([("forward", 0.088)], dur=0.1), "unaccounted")
    assert f.severity == "warning"
    assert f.evidence["share"] == pytest.approx(0.12)
    assert f.evidence["seconds_per_iter"] == pytest.approx(0.012)
    assert f.message == ("12% of main's time (12 ms per iteration) is in no phase: timers "
                         "missing, or Python overhead between phases")
    assert findings(_one_stage([("forward", 0.092)], dur=0.1), "unaccounted") == []
