"""``analyze.rules.syncs``: ``implicit_sync``, one finding per call site that blocks
the host on the device (phase names as the shim writes them)."""

from __future__ import annotations

import pytest

from tests.support.runbuilder import RunBuilder, loop

ITEM = "optimizer_step/sync.item@train.py:212"
CPU = "forward/sync.cpu@model.py:40"


def test_each_call_site_by_its_share(findings) -> None:
    # 100 ms iterations: optimizer_step 20 ms of which .item() blocks 8 ms (8%: warning);
    # forward 80 ms of which .cpu() blocks 2 ms (2%: info); 0.5 ms is under 1%
    b = RunBuilder("syn", tags={"device": "cpu"})
    loop(b, 30, [("forward", 0.08), (CPU, 0.002), ("optimizer_step", 0.02), (ITEM, 0.008),
                 ("optimizer_step/sync.item@train.py:300", 0.0005)])
    got = findings(b, "implicit_sync")
    assert [(f.evidence["phase"], f.severity) for f in got] == [(ITEM, "warning"),
                                                                (CPU, "info")]
    item = got[0]
    assert (item.evidence["op"], item.evidence["file"], item.evidence["line"]) == (
        "item", "train.py", 212)
    assert item.evidence["share"] == pytest.approx(0.08)
    assert item.evidence["seconds_per_iter"] == pytest.approx(0.008)
    assert item.message == ("`.item()` at train.py:212 in optimizer_step blocks main on the "
                            "device 8.0 ms per iteration (8.0% of its time): read the value "
                            "less often, later, or without blocking (non_blocking copy + "
                            "event)")


def test_no_sites_no_finding(findings) -> None:
    b = RunBuilder("syn")
    loop(b, 30, [("forward", 0.1)])
    assert findings(b, "implicit_sync") == []
