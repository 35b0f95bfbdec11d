"""``analyze.rules.queues``: how long each queue sat empty or full, its state and
the ``queue_empty`` / ``queue_full`` findings."""

from __future__ import annotations

import polars as pl
import pytest
from tlog.analyze.frames import attribute
from tlog.analyze.rules.queues import queue_states, queue_waits

from tests.support.runbuilder import RunBuilder, loop


def _samples(rows: list[tuple[str, float, int, int | None]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"name": pl.String, "ts": pl.Float64, "depth": pl.Int64,
                                      "capacity": pl.Int64}, orient="row")


def test_states_from_depth_samples() -> None:
    q = _samples([("hs", t, d, 4) for t, d in enumerate([0] * 9 + [1])]
                 + [("out", t, 4, 4) for t in range(10)]
                 + [("mix", t, d, None) for t, d in enumerate([0, 1] * 5)])
    states = {s["name"]: s for s in queue_states(q, [])}
    # 9 of 10 samples at depth 0: empty (queue_state_share 90%)
    assert (states["hs"]["empty_share"], states["hs"]["state"]) == (0.9, "empty")
    assert states["hs"]["mean_depth"] == pytest.approx(0.1) and states["hs"]["capacity"] == 4
    assert (states["out"]["full_share"], states["out"]["state"]) == (1.0, "full")
    assert (states["mix"]["full_share"], states["mix"]["state"]) == (0.0, "mixed")
    assert not states["hs"]["weighted"]
    # only the samples inside the steady window count (when some are)
    assert queue_states(q.filter(pl.col("name") == "out"), [(0.0, 3.0)])[0]["samples"] == 4
    assert queue_states(q.head(0), []) == []


def test_time_weighted_states_from_the_get_waits(build) -> None:
    # the consumer waits 60 ms of each 100 ms in hs_get: empty 60% of the time (>= 50%),
    # though its depth samples (taken after each put, at depth 1) never read 0
    b = RunBuilder("q")
    loop(b, 30, [("hs_get", 0.06), ("forward", 0.04)])
    for k in range(30):
        b.queue(name="hs", ts=1000.0 + 0.1 * k, depth=1, capacity=4, rank=0, stage="main")
    analysis = attribute(build(b), "q")
    waits = queue_waits(analysis, ["hs"])
    assert waits == {"hs": {"empty_share": pytest.approx(0.6), "full_share": 0.0}}
    (state,) = queue_states(analysis.data.queues, [(1000.0, 1003.0)], waits=waits)
    assert (state["state"], state["weighted"]) == ("empty", True)
    assert queue_waits(analysis, []) == {}


def test_findings(findings) -> None:
    b = RunBuilder("q")
    loop(b, 30, [("hs_get", 0.06), ("forward", 0.04)])
    for k in range(30):
        b.queue(name="hs", ts=1000.0 + 0.1 * k, depth=1, capacity=4, rank=0, stage="main")
    (f,) = findings(b, "queue_empty")
    assert f.severity == "info"
    assert f.message == ("queue hs is empty 60% of the time (its consumer waited in get that "
                         "share of its steady time): its consumer is starved by its producer")
