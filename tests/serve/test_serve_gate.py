"""The pieces under ``tlog serve`` in one process: the announcement file and its
lock (tlog/web/endpoint.py), and the gate: readers on a snapshot beside one
writer (tlog/web/service.py Gate)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from tlog.ingest.errors import DatabaseError

from tlog.web.endpoint import Announcement, ServiceInfo, live_service, service_file
from tlog.web.service import Gate, GateBusyError


def _info(db: Path) -> ServiceInfo:
    return ServiceInfo(url="http://127.0.0.1:9", pid=os.getpid(), db=str(db),
                       watch=["/runs"], token=None)


def test_a_file_nobody_holds_is_stale_and_a_held_one_is_live(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    service_file(db).write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": 1,
                                            "db": str(db)}))
    assert live_service(db) is None           # left by a service that died: not trusted
    a = Announcement(_info(db))
    try:
        assert live_service(db) == _info(db)
        assert (service_file(db).stat().st_mode & 0o777) == 0o600
        with pytest.raises(DatabaseError, match="already served"):
            Announcement(_info(db))
    finally:
        a.close()
    assert not service_file(db).exists() and live_service(db) is None


def test_a_reader_sees_one_snapshot_and_never_waits_for_the_writer(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    gate = Gate(db)
    try:
        with gate.use(write=True) as w:
            w.execute("CREATE TABLE t AS SELECT 1 AS x")
        in_write, release = threading.Event(), threading.Event()

        def write() -> None:                     # an ingest round: holds the lock 1.5 s
            with gate.use(write=True) as cur:
                cur.execute("BEGIN TRANSACTION")
                cur.execute("INSERT INTO t VALUES (2)")
                in_write.set()
                release.wait(10)
                cur.execute("COMMIT")

        t = threading.Thread(target=write)
        t.start()
        assert in_write.wait(10)
        start = time.perf_counter()
        with gate.reader() as cur:               # does not wait for the round
            assert cur.execute("SELECT sum(x) FROM t").fetchall() == [(1,)]
            took = time.perf_counter() - start
            release.set()
            t.join(10)
            # the snapshot holds while the writer commits
            assert cur.execute("SELECT sum(x) FROM t").fetchall() == [(1,)]
        assert took < 0.5
        with gate.reader() as cur:               # the next reader sees the commit
            assert cur.execute("SELECT sum(x) FROM t").fetchall() == [(3,)]
        with pytest.raises(GateBusyError), gate.use(write=True, wait_s=0.2), \
                gate.use(write=True, wait_s=0.2):
            pass
    finally:
        gate.close()
    with pytest.raises(GateBusyError, match="stopping"), gate.use(wait_s=1):
        pass


def test_all_high_water_marks_at_once_equal_each_one_alone(tmp_path: Path) -> None:
    """:func:`high_water_marks` (the runs list) is :func:`high_water_mark` (tlog
    watch, compare's default baseline) for every run. Runs by hand: a, b, c of
    one configuration (gpus=1) an hour apart, c slower than a; d of another
    (gpus=2); e untagged, so matched by its phase names (the same program).
    All but c run at 2,500 tokens/s, and of equals the earliest is the mark:
    b's, c's and e's mark is a; a has no earlier run, d none of its tags."""
    from tlog.analyze.baseline import high_water_mark, high_water_marks
    from tlog.ingest import ingest_run
    from tlog.ingest.db import connect

    from tests.serve.runs import T0, write_small_run

    runs = tmp_path / "runs"
    write_small_run(runs, "a")
    write_small_run(runs, "b", started=T0 + 3600)
    write_small_run(runs, "c", started=T0 + 7200, forward_s=0.050)
    write_small_run(runs, "d", started=T0 + 9000, tags={"gpus": "2"})
    write_small_run(runs, "e", started=T0 + 9600, tags={})
    con = connect(tmp_path / "t.duckdb")
    try:
        for r in "abcde":
            ingest_run(con, runs / r)
        every = high_water_marks(con)
        assert every == {r: high_water_mark(con, r) for r in "abcde"}
        assert {r: m.run_id for r, m in every.items()} == {
            "a": None, "b": "a", "c": "a", "d": None, "e": "a"}
        assert every["c"].versus("c", {"tokens_per_s": 100 / 0.060})["ratio"] == \
            pytest.approx(0.040 / 0.060)
    finally:
        con.close()


def test_files_state_changes_exactly_when_a_file_grows_or_appears(tmp_path: Path) -> None:
    from tlog.web.service import files_state

    run = tmp_path / "r"
    (run / "traces").mkdir(parents=True)
    (run / "rank0.main.jsonl").write_text('{"a": 1}\n')
    (run / "traces" / "t.json").write_text("{}")
    first = files_state(run)
    assert [(Path(p).name, size) for p, size, _ in first] == [("rank0.main.jsonl", 9),
                                                              ("t.json", 2)]
    assert files_state(run) == first                   # nothing changed: the round is skipped
    with (run / "rank0.main.jsonl").open("a") as fh:
        fh.write('{"a": 2}\n')
    grown = files_state(run)
    assert grown != first and grown[0][1] == 18
    (run / "run.json").write_text("{}")
    assert len(files_state(run)) == 3
    (run / "link.jsonl").symlink_to(run / "run.json")  # links are not followed
    assert len(files_state(run)) == 3
