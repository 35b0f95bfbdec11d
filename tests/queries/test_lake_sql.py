"""``queries.lake_sql``: SQL and stored queries over a lake on DuckDB (the Spark
engine is tests/lake/test_lake_spark.py's: it needs Java)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.ingest.db import connect
from tlog.ingest.errors import RunNotFoundError, UsageError
from tlog.queries.lake import publish_runs, read_lake
from tlog.queries.lake_sql import duckdb_lake, run_lake_query, run_lake_sql
from tlog.queries.runner import WriteRefusedError

from tests.support.runbuilder import RunBuilder, loop


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    db = tmp_path / "t.duckdb"
    for run_id, dur in (("fast", 0.05), ("slow", 0.2)):
        b = RunBuilder(run_id, started=1000.0 if run_id == "fast" else 2000.0,
                       tags={"model": "m"})
        loop(b, 30, [("forward", dur)])
        b.write(db).close()
    with connect(db) as con:
        publish_runs(con, tmp_path / "lake")
    return tmp_path / "lake"


def test_the_lakes_tables_as_views(lake: Path) -> None:
    con = duckdb_lake(read_lake(lake))
    try:
        assert con.execute("SELECT run_id, count(*) FROM iterations GROUP BY 1 ORDER BY 1"
                           ).fetchall() == [("fast", 30), ("slow", 30)]
    finally:
        con.close()


def test_ad_hoc_sql_reads_only(lake: Path) -> None:
    got = run_lake_sql(lake, "SELECT run_id, avg(dur) AS d FROM iterations WHERE run_id = $r "
                             "GROUP BY 1", {"r": "slow"})
    assert got["d"].to_list() == pytest.approx([0.2])
    with pytest.raises(WriteRefusedError):
        run_lake_sql(lake, "DROP VIEW iterations")


def test_a_stored_query_on_duckdb(lake: Path) -> None:
    rows = run_lake_query(lake, "runs_by_throughput", {})
    # steady iterations per second: 1 / 0.05 and 1 / 0.2, fastest first
    assert rows["run_id"].to_list() == ["fast", "slow"]
    assert rows["iters_per_s"].to_list() == pytest.approx([20.0, 5.0])
    with pytest.raises(UsageError, match="unknown engine 'sqlite'"):
        run_lake_query(lake, "runs_by_throughput", {}, engine="sqlite")
    with pytest.raises(RunNotFoundError, match="no run 'nope' in the lake"):
        run_lake_query(lake, "rank_skew", {"run_id": "nope"})
