"""``ingest.db``: the database opened, created, refused and waited for (files made
in a temporary folder; a second process holds the lock where one is needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from tlog.ingest.db import (
    SCHEMA_VERSION,
    connect,
    default_db_path,
    memory_limit_is_shared,
    schema_version,
    sharing_database,
    stored_phase_kinds,
)
from tlog.ingest.errors import DatabaseError, DatabaseLockedError


def test_a_new_database_gets_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "t.duckdb"             # the folder is made too
    with connect(path) as con:
        assert schema_version(con) == SCHEMA_VERSION
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        assert {"runs", "iterations", "files", "rejects", "attribution_runs",
                "sys_samples", "machines"} <= tables
    with connect(path) as again:                      # opened again: nothing to do
        assert again.execute("SELECT count(*) FROM tlog_schema").fetchall() == [(1,)]
    with duckdb.connect(str(tmp_path / "bare.duckdb")) as bare:
        assert schema_version(bare) == 0


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p.mkdir(), "is a directory: give a file"),
    (lambda p: os.mkfifo(p), "is not a regular file (a FIFO, device or socket)"),
    (lambda p: p.write_text("my notes\n"), ("is not a tlog database (not a DuckDB file); it "
                                           "was left untouched")),
    (lambda p: duckdb.connect(str(p)).execute("CREATE TABLE mine (x INT)").close(),
     "is a DuckDB file but not a tlog database (it holds other tables and no tlog_schema)"),
])
def test_what_is_not_a_tlog_database_is_refused_untouched(tmp_path: Path, make, says) -> None:
    path = tmp_path / "t.duckdb"
    make(path)
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(DatabaseError) as info:
        connect(path)
    assert says in str(info.value)
    assert str(info.value).startswith((f"{path} ", f"database path {path} "))
    if before is not None:
        assert path.read_bytes() == before


def test_read_only_needs_the_file_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="no database at .*: run 'tlog ingest RUN_DIR' first"):
        connect(tmp_path / "none.duckdb", read_only=True)
    path = tmp_path / "new.duckdb"
    with connect(path) as con:
        con.execute("INSERT INTO tlog_schema (version) VALUES (?)", [SCHEMA_VERSION + 1])
    with pytest.raises(DatabaseError, match=f"has schema version {SCHEMA_VERSION + 1}, newer "
                                            f"than this tlog understands"):
        connect(path)


def test_a_writer_waits_for_nobody_and_names_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "t.duckdb"
    connect(path).close()
    holder = subprocess.Popen([sys.executable, "-c",
                               ("import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(60)"), str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(DatabaseLockedError,
                           match=rf"in use by another tlog process \(held by PID "
                                 rf"{holder.pid}\); wait for it"):
            connect(path)
        with pytest.raises(DatabaseLockedError, match=r"\(waited 0.3 s\)"):
            connect(path, read_only=True, wait_s=0.3)
        assert time.monotonic() - t0 < 10
    finally:
        holder.kill()
        holder.wait()


def test_tlog_threads_sets_duckdbs_threads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TLOG_THREADS", "3")
    with connect(tmp_path / "t.duckdb") as con:
        assert con.execute("SELECT current_setting('threads')").fetchall() == [(3,)]
    monkeypatch.setenv("TLOG_THREADS", "none")
    with pytest.raises(DatabaseError, match=r"\$TLOG_THREADS is 'none'"):
        connect(tmp_path / "t.duckdb")


def test_default_path_and_shared_memory_limit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TLOG_DB", str(tmp_path / "x.duckdb"))
    assert default_db_path() == tmp_path / "x.duckdb"
    monkeypatch.delenv("TLOG_DB")
    assert default_db_path().name == "tlog.duckdb"
    assert not memory_limit_is_shared()
    with sharing_database():
        assert memory_limit_is_shared()
    assert not memory_limit_is_shared()


def test_stored_phase_kinds_keep_only_categories() -> None:
    assert stored_phase_kinds('{"a": "sync", "b": "waiting", "c": 3}') == {"a": "sync"}
    assert stored_phase_kinds(None) == {} and stored_phase_kinds("[1]") == {}
    assert stored_phase_kinds("{bad") == {}
