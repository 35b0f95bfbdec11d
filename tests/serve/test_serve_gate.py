"""The pieces under ``tlog serve`` in one process: the announcement file and its
lock (tlog/web/endpoint.py), and the gate that lends the database out
(tlog/web/service.py Gate)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import duckdb
import pytest
from tlog.ingest.errors import DatabaseError

from tlog.web.endpoint import (
    Announcement,
    ServedDatabaseError,
    ServiceInfo,
    live_service,
    reading,
    refuse_writes,
    service_file,
)
from tlog.web.service import Gate, GateBusyError


def _info(db: Path) -> ServiceInfo:
    return ServiceInfo(url="http://127.0.0.1:9", pid=os.getpid(), db=str(db),
                       watch=["/runs"], token=None)


def test_a_file_nobody_holds_is_stale_and_a_held_one_is_live(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    service_file(db).write_text(json.dumps({"url": "http://127.0.0.1:9", "pid": 1,
                                            "db": str(db)}))
    assert live_service(db) is None           # left by a service that died
    with reading(db) as info:                 # so readers go their own way
        assert info is None
    refuse_writes(db, "ingest")               # and writers too
    a = Announcement(_info(db))
    try:
        assert live_service(db) == _info(db)
        assert (service_file(db).stat().st_mode & 0o777) == 0o600
        with pytest.raises(DatabaseError, match="already served"):
            Announcement(_info(db))
        with pytest.raises(ServedDatabaseError, match=r"under its --watch directories \(/runs\)"):
            refuse_writes(db, "ingest")
        with pytest.raises(ServedDatabaseError, match="run 'tlog forget' again"):
            refuse_writes(db, "forget")
    finally:
        a.close()
    assert not service_file(db).exists() and live_service(db) is None


def test_a_lease_waits_for_users_closes_the_file_and_reopens_it(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    gate = Gate(db)
    try:
        leased: list[str] = []
        with gate.use() as cur:
            t = threading.Thread(target=lambda: leased.append(gate.lease(os.getpid())))
            t.start()
            time.sleep(0.3)
            assert leased == []                       # waits for the cursor in use
            assert cur.execute("SELECT 1").fetchall() == [(1,)]
        t.join(timeout=10)
        (lease,) = leased
        other = duckdb.connect(str(db), read_only=True)   # as another process would
        other.close()
        with pytest.raises(GateBusyError), gate.use(wait_s=0.3):
            pass
        assert gate.release(lease) and not gate.release(lease)
        with gate.use(wait_s=5) as cur:
            assert cur.execute("SELECT count(*) FROM runs").fetchall() == [(0,)]
        # a lease whose process has ended is taken back by the next user
        gone = subprocess.Popen(["true"])
        gone.wait()
        gate.lease(gone.pid)
        with gate.use(wait_s=5) as cur:
            assert cur.execute("SELECT 1").fetchall() == [(1,)]
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
