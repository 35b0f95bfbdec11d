"""How long a queue sat empty, against the loop's own timers: a consumer
starved about 80% of its time by a slow producer (queue_loop.py, its own
process, two threads joined by a ``TimedQueue`` of 4 slots).

The truth is the consumer's seconds blocked in ``get`` (the queue empty) over
its wall time, by bare ``perf_counter`` reads around each call, over the
iterations tlog judged. Depth sampled right after the get/put calls read the
queue empty in far fewer samples, and ``queue_empty`` never fired.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.analyze.rules.queues import QueuePolicy

from tests.support.loops import diagnosed, ingest_all, run_loop

LOOP = Path(__file__).with_name("queue_loop.py")


def test_a_starved_queue_is_empty_by_its_time_share(tmp_path: Path) -> None:
    run, db = tmp_path / "starved", tmp_path / "t.duckdb"
    truth = run_loop(LOOP, run, "300", timeout=120)
    ingest_all(db, run)
    d = diagnosed(db, "starved")
    steady = d.analysis.steady.filter(d.analysis.steady["stage"] == "drafter")["iter"].to_list()
    empty = sum(truth[i][0] for i in steady) / sum(truth[i][1] for i in steady)
    print({"truth_empty": empty})
    assert empty > 0.3                                          # the loop's own truth
    [q] = d.queues
    print({"tlog_empty": q.empty_share, "state": q.state})
    assert q.weighted
    assert q.empty_share == pytest.approx(empty, abs=0.05)
    found = [f for f in d.findings if f.code == "queue_empty"]
    assert [f for f in d.findings if f.code == "queue_full"] == []
    limit = QueuePolicy().time_share
    if empty >= limit + 0.05:
        assert q.state == "empty"
        [f] = found
        assert f.evidence["empty_share"] == pytest.approx(empty, abs=0.05)
        assert "of the time" in f.message
    elif empty <= limit - 0.05:       # a loaded machine slowed the consumer: not starved enough
        assert q.state == "mixed" and found == []
