"""``ingest.follow``: rounds of incremental ingest of a growing run, each its own
connection; a run not there yet waited for."""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.ingest.db import connect
from tlog.ingest.errors import RunDirError
from tlog.ingest.follow import follow, ingest_round

from tests.support.runs import iter_line, write_lines


def _append(log: Path, first: int, n: int) -> None:
    with log.open("a", encoding="utf-8") as f:
        f.write("".join(iter_line(i) + "\n" for i in range(first, first + n)))


def test_each_round_loads_what_is_new(tmp_path: Path) -> None:
    run, db = tmp_path / "live", tmp_path / "t.duckdb"
    log = write_lines(run / "rank0.jsonl", [iter_line(i) for i in range(3)])
    waits: list[float] = []

    def sleep(s: float) -> None:         # the job writes between two rounds
        waits.append(s)
        _append(log, 3 * len(waits), 3)

    reports = list(follow(lambda: connect(db), run, interval_s=0.5, rounds=3, sleep=sleep))
    assert [r.records_loaded["iter"] for r in reports] == [3, 3, 3]
    assert waits == [0.5, 0.5]              # between rounds, none after the last
    with connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*), max(iter) FROM iterations").fetchall() == [(9, 8)]


def test_a_run_directory_not_there_yet_is_waited_for(tmp_path: Path) -> None:
    run, db = tmp_path / "later", tmp_path / "t.duckdb"
    told: list[str] = []
    rounds = 0

    def sleep(s: float) -> None:
        nonlocal rounds
        rounds += 1
        if rounds == 2:                     # the job starts writing
            write_lines(run / "rank0.jsonl", [iter_line(0)])

    it = follow(lambda: connect(db), run, interval_s=0.1, sleep=sleep,
                on_retry=lambda exc, s: told.append(str(exc)))
    first = next(it)
    assert first.records_loaded["iter"] == 1
    assert len(told) == 1 and "does not exist" in told[0]   # said once, not every round
    # with a number of rounds, a missing directory in the first one is an error
    with pytest.raises(RunDirError, match="does not exist"):
        list(follow(lambda: connect(db), tmp_path / "never", rounds=2, sleep=lambda s: None))


def test_ingest_round_calls_after_round_with_the_open_connection(tmp_path: Path) -> None:
    run = write_lines(tmp_path / "r" / "rank0.jsonl", [iter_line(i) for i in range(2)]).parent
    seen = []
    with connect(tmp_path / "t.duckdb") as con:
        report = ingest_round(con, run, 4, run_id="mine",
                              after_round=lambda c, rep, n: seen.append(
                                  (c.execute("SELECT count(*) FROM iterations").fetchall()[0][0],
                                   rep.run_id, n)))
    assert report.run_id == "mine" and seen == [(2, "mine", 4)]
