"""The SQL page's statement is interrupted after SQL_TIMEOUT_S (it holds the
service's write lock: ingest waits for it); the service goes on answering."""

from __future__ import annotations

import time

import pytest
from tlog.ingest.errors import QueryError

from tlog.web import service as service_mod
from tlog.web.service import Gate, Service


def test_a_long_statement_is_stopped_and_the_lock_given_back(tmp_path, monkeypatch) -> None:
    gate = Gate(tmp_path / "tlog.duckdb")
    try:
        svc = Service(gate)
        monkeypatch.setattr(service_mod, "SQL_TIMEOUT_S", 0.5)
        t0 = time.perf_counter()
        with pytest.raises(QueryError, match=r"longer than 0.5 s and was stopped"):
            # about 10**12 rows to count: hours, never finished before the fix
            svc.sql("SELECT count(*) AS n FROM range(1000000000000)")
        took = time.perf_counter() - t0
        assert 0.5 <= took < 10.0
        # the write lock is free again, and the next statement runs whole
        with gate.use(write=True, wait_s=1.0) as cur:
            assert cur.execute("SELECT 1").fetchone() == (1,)
        assert svc.sql("SELECT count(*) AS n FROM range(1000)") == [{"n": 1000}]
    finally:
        gate.close()
