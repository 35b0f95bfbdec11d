"""``$TLOG_THREADS`` bounds the threads of tlog's queries (ingest/threads.py):
DuckDB's ``threads`` setting on every connection, polars' pool through
``POLARS_MAX_THREADS``; a value that is not a thread count is one line, exit 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tlog.ingest.db import DatabaseError, connect

CHECK = """
import tlog
from tlog.ingest.db import connect
con = connect(sys.argv[1])
import polars as pl
print(con.execute("SELECT current_setting('threads')").fetchone()[0], pl.thread_pool_size())
"""


def _in_process(env: dict, db) -> list[int]:
    done = subprocess.run([sys.executable, "-c", "import sys\n" + CHECK, str(db)],
                          env=env, capture_output=True, text=True, timeout=60, check=True)
    return [int(x) for x in done.stdout.split()]


def test_tlog_threads_sets_duckdb_and_polars(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TLOG_THREADS", "POLARS_MAX_THREADS")}
    cores = len(os.sched_getaffinity(0))
    assert _in_process(dict(env, TLOG_THREADS="1"), tmp_path / "a.duckdb") == [1, 1]
    assert _in_process(dict(env, TLOG_THREADS="3"), tmp_path / "b.duckdb") == [3, 3]
    # unset: the libraries' own default, one per core
    assert _in_process(env, tmp_path / "c.duckdb") == [cores, cores]


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_tlog_threads_is_one_line(tmp_path, monkeypatch, value) -> None:
    monkeypatch.setenv("TLOG_THREADS", value)
    with pytest.raises(DatabaseError, match=r"TLOG_THREADS is .*whole number of threads >= 1"):
        connect(tmp_path / "t.duckdb")
    done = subprocess.run([sys.executable, "-m", "tlog", "runs", "--db", str(tmp_path / "t.duckdb")],
                          env=dict(os.environ, TLOG_THREADS=value), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"tlog: error: $TLOG_THREADS is '{value}': give a whole number of threads >= 1, or unset it"]
    assert not (tmp_path / "t.duckdb").exists()  # nothing made
