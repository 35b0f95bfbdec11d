"""Fixtures of the lake tests: two "hosts" (two databases) publishing into one lake,
and the reference database holding every run (lake_runs.py).

The two databases are diagnosed and stored once (a writable connection, as
``tlog ingest`` leaves them); the reference is their rows copied into one file,
stored diagnosis included (its digest is per run, so it stays fresh there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.db import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lake_runs import host_a, host_b, merge


def _stored(db: Path) -> Path:
    with connect(db) as con:
        ensure_attribution(con)
    return db


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``a`` and ``b``: the two hosts' databases; ``all``: every run in one."""
    root = tmp_path_factory.mktemp("hosts")
    a = _stored(host_a(root / "a.duckdb"))
    b = _stored(host_b(root / "b.duckdb"))
    return {"a": a, "b": b, "all": merge(root / "all.duckdb", [a, b])}


@pytest.fixture(scope="session")
def lake(hosts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every run of both hosts published into one lake (a read-only lake for the tests
    that only read: copy it to change it)."""
    from tlog.queries.lake import publish_runs

    out = tmp_path_factory.mktemp("lake") / "lake"
    for host in ("a", "b"):
        with connect(hosts[host], read_only=True) as con:
            publish_runs(con, out)
    return out


@pytest.fixture(scope="session")
def spark():
    """One local Spark (2 cores, loopback only) for the whole session: the JVM starts once."""
    from tlog.queries.lake_sql import spark_missing, spark_session

    why = spark_missing()
    if why:
        pytest.skip(why)

    session = spark_session("local[2]")
    yield session
    session.stop()

