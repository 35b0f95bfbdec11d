"""``analyze.rules.coverage``: ``no_device_times`` and ``short_run``."""

from __future__ import annotations

import pytest

from tests.support.runbuilder import RunBuilder, loop


def _run(n: int, tags: dict | None = None, gpu: float | None = None) -> RunBuilder:
    b = RunBuilder("c", tags=tags)
    phases = [("forward", 0.06), ("allreduce", 0.04)] if gpu is None else \
        [("forward", 0.06, gpu), ("allreduce", 0.04)]
    loop(b, n, phases)
    return b


def test_no_device_times_says_sync_is_an_upper_bound(findings) -> None:
    # allreduce (a collective) is 40 ms of each 100 ms iteration
    (f,) = findings(_run(30), "no_device_times")
    assert f.severity == "info"
    assert f.evidence == {"max_sync_share": pytest.approx(0.4)}
    assert "record phases with a stream" in f.message


@pytest.mark.parametrize(("tags", "gpu"), [({"device": "cpu"}, None),
                                           ({"torch": "2.13.0+cpu"}, None),
                                           (None, 0.05)])
def test_exact_sync_has_no_such_finding(findings, tags, gpu) -> None:
    # a CPU-only run (by its tags) or one with device times: sync shares are exact
    assert findings(_run(30, tags, gpu), "no_device_times") == []


def test_short_run(findings) -> None:
    (f,) = findings(_run(12), "short_run")
    assert f.severity == "warning"
    assert f.evidence == {"steady": 12, "min_per_worker": 12, "want_per_worker": 20}
    assert f.message == ("too short to judge with confidence: 12 steady iterations (fewest "
                         "on one worker: 12; want 20 per worker)")
    assert findings(_run(20), "short_run") == []
