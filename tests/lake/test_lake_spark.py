"""The lake on Spark SQL (pyspark, local[2], one JVM for the file): every stored query
gives the database's rows, and the Spark diagnosis of a 4-rank run is the local one.
Skipped without pyspark or a Java runtime (.ci/run installs Debian's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from compare import QUERY_PARAMS, same_rows
from tlog.analyze import diagnose
from tlog.ingest.db import connect
from tlog.queries import run_query
from tlog.queries.lake_sql import run_lake_query, to_spark_sql


@pytest.mark.parametrize("name", sorted(QUERY_PARAMS))
def test_stored_query_on_spark_equals_the_database(name: str, spark, lake: Path,
                                                   hosts: dict[str, Path]) -> None:
    # the first parameter set of each query (the DuckDB tests run them all)
    params = QUERY_PARAMS[name][0]
    with connect(hosts["all"], read_only=True) as con:
        want = run_query(con, name, params)
    got = run_lake_query(lake, name, params, engine="spark", spark=spark)
    assert want.height > 0
    assert same_rows(want, got) is None, (name, params, same_rows(want, got))


def test_one_sql_text_per_query_transpiled() -> None:
    """The Spark text is made from the .sql file: no hand-kept copy to drift."""
    from tlog.queries import load_query

    spark_sql = to_spark_sql(load_query("regressions_vs_best").sql)
    assert "MAX_BY(" in spark_sql and "raise_error(" in spark_sql.lower()
    assert "_run_throughput" not in spark_sql.lower() and "MATERIALIZED" not in spark_sql
    assert ":tag_key" in spark_sql and "$tag_key IS NULL" not in spark_sql


def test_a_bad_parameter_is_one_line_on_spark(spark, lake: Path) -> None:
    from tlog.ingest.errors import QueryArgumentError

    with pytest.raises(QueryArgumentError, match=r"give both \$tag_key and \$tag_value"):
        run_lake_query(lake, "runs_by_throughput", {"tag_key": "config"}, engine="spark",
                       spark=spark)


def _plain(d) -> dict:
    out = d.to_dict()
    return json.loads(json.dumps(out, default=str))


def _close(a, b, path="") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{k}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


@pytest.mark.parametrize("run_id", ["job1"])
def test_spark_diagnosis_of_a_four_rank_run_equals_the_local_one(
        run_id: str, spark, lake: Path, hosts: dict[str, Path]) -> None:
    from tlog.queries.lake_diagnose import diagnose_on_spark

    with connect(hosts["a"], read_only=True) as con:
        local = diagnose(con, run_id)
    remote = diagnose_on_spark(spark, lake, run_id)
    assert local.run_id == remote.run_id
    assert local.stages[0].workers == 4 and local.stragglers     # a run worth comparing
    assert remote.verdict == local.verdict and remote.confidence == local.confidence
    assert [(s.rank, s.kind) for s in remote.stragglers] == [(s.rank, s.kind)
                                                             for s in local.stragglers]
    _close(_plain(local), _plain(remote))
    # the groups and the walk's output went through the lake's scratch folder: gone now
    scratch = lake / "_tlog" / "scratch"
    assert not scratch.exists() or list(scratch.iterdir()) == []


def test_starting_spark_leaves_ctrl_c_to_tlog(spark) -> None:
    """SparkContext installs its own SIGINT handler; tlog keeps the one it had
    (its follow loops stop at their own waits), here pytest's default."""
    import signal

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
