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
