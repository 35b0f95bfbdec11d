"""``analyze.rules.host``: ``host_bound`` and ``blocked_in_compute`` from the
iterations' ``cpu`` and device times (runs written by hand)."""

from __future__ import annotations

import pytest

from tests.support.runbuilder import RunBuilder, loop


def test_host_bound_thread_on_the_cpu_while_the_device_idles(findings) -> None:
    # the thread on the CPU 95 ms of each 100 ms, the device busy 20 ms of them
    b = RunBuilder("h")
    loop(b, 30, [("forward", 0.1, 0.02)], cpu=0.095)
    (f,) = findings(b, "host_bound")
    assert f.severity == "warning"
    assert f.evidence["cpu_share"] == pytest.approx(0.95)
    assert f.evidence["device_share"] == pytest.approx(0.2)
    assert f.message.startswith("rank 0 of main is host-bound: its thread is on the CPU 95% "
                                "of the time while the device is busy only 20%")
    # the device busy 90 ms: not host-bound
    busy = RunBuilder("h")
    loop(busy, 30, [("forward", 0.1, 0.09)], cpu=0.095)
    assert findings(busy, "host_bound") == []


def test_blocked_in_compute_against_the_busiest_peer(findings) -> None:
    # two CPU ranks: rank 0 on the CPU all of its 100 ms forward, rank 1 only 30 ms:
    # blocked (1 - 0.3 / 1.0) * 100% of its time = 70%, over blocked_warn (40%)
    b = RunBuilder("blk", tags={"device": "cpu"})
    loop(b, 30, [("forward", 0.1)], cpu=0.1, rank=0)
    loop(b, 30, [("forward", 0.1)], cpu=0.03, rank=1)
    (f,) = findings(b, "blocked_in_compute")
    assert f.evidence["rank"] == 1
    assert f.severity == "warning"
    assert f.evidence["excess_share"] == pytest.approx(0.7)
    assert f.evidence["blocked_s_per_iter"] == pytest.approx(0.07)
    assert (f.evidence["on_cpu_share"], f.evidence["reference_on_cpu_share"]) == (
        pytest.approx(0.3), pytest.approx(1.0))
    assert f.evidence["reference_worker"] == "main-0"
    assert [p["phase"] for p in f.evidence["phases"]] == ["forward"]
