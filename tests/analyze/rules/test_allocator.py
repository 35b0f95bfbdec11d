"""``analyze.rules.allocator``: ``allocator_thrash`` from the iterations' ``mem``
figures (retries, device allocations)."""

from __future__ import annotations

import pytest

from tests.support.runbuilder import RunBuilder

MiB = 1 << 20


def _run(retries, allocs, dur=lambda i: 0.1, allocated=lambda i: 100 * MiB) -> RunBuilder:
    b = RunBuilder("alloc", tags={"device": "cpu"})
    t = 1000.0
    for i in range(40):
        d = dur(i)
        b.iteration(iter=i, ts=t, dur=d, phases=[("forward", d)],
                    mem={"allocated": allocated(i), "reserved": 200 * MiB,
                         "alloc_retries": retries(i), "device_allocs": allocs(i)})
        t += d
    return b


def test_retries_during_the_steady_state(findings) -> None:
    # a retry at iterations 20 and 30 (cumulative count), each such iteration 200 ms
    retried = {20, 30}
    b = _run(lambda i: sum(1 for k in retried if k <= i), lambda i: 10,
             dur=lambda i: 0.2 if i in retried else 0.1)
    (f,) = findings(b, "allocator_thrash")
    assert f.severity == "warning"
    assert f.evidence["alloc_retries"] == 2
    assert f.evidence["dur_with_retry_s"] == pytest.approx(0.2)
    assert f.evidence["dur_without_retry_s"] == pytest.approx(0.1)
    assert f.message == ("rank 0 of main: 2 allocator retries (cache flushes) during steady "
                         "state; iterations with a retry take 200 ms vs 100 ms")


def test_device_allocations_that_are_freed_again(findings) -> None:
    # one new device allocation an iteration, allocated memory flat: thrash
    (f,) = findings(_run(lambda i: 0, lambda i: i), "allocator_thrash")
    assert f.evidence["device_allocs"] == 39
    assert f.evidence["device_allocs_per_iter"] == pytest.approx(1.0)
    # the same allocations kept (allocated memory rising with them): a leak's growth
    kept = _run(lambda i: 0, lambda i: i, allocated=lambda i: 100 * MiB + i * MiB)
    assert findings(kept, "allocator_thrash") == []


def test_a_calm_allocator(findings) -> None:
    assert findings(_run(lambda i: 0, lambda i: 10), "allocator_thrash") == []
