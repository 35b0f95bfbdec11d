"""`tlog query` and `tlog sql` on the tiny database: output formats, one-line errors."""

from __future__ import annotations

import json

import pytest
from tlog.queries import list_queries

from tests.support.cli import assert_one_line_error, invoke


def _run(*args: str, stdin: str | None = None):
    return invoke(list(args), input=stdin)


def test_query_list_names_every_query_with_its_purpose() -> None:
    result = _run("query", "--list", "--format", "json")
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [q["name"] for q in listed] == list_queries()
    phase = next(q for q in listed if q["name"] == "phase_breakdown")
    assert [(p["name"], p["required"], p["default"]) for p in phase["parameters"]] == [
        ("run_id", True, None), ("warmup_iters", False, None)]
    table = _run("query", "--list")
    assert "runs_by_throughput" in table.stdout and "fastest first" in table.stdout


def test_query_csv_rows(history_db) -> None:
    result = _run("query", "queue_occupancy", "-p", "run_id=r1", "--format", "csv",
                  "--db", str(history_db))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "name,samples,capacity,mean_depth,max_depth,empty_share,full_share",
        "batch_queue,2,,2.0,3,0.0,",
        "hs_queue,4,4,1.5,4,0.5,0.25",
    ]


def test_query_json_rows(history_db) -> None:
    result = _run("query", "runs_by_throughput", "-p", "warmup_iters=1", "-p", "limit=1",
                  "-f", "json", "--db", str(history_db))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{
        "run_id": "r2", "name": "fast", "started_utc": "1970-01-01T00:33:20",
        "tags": '{"config": "a", "gpus": "4"}', "stage": "main", "iterations": 2,
        "iters_per_s": 4.0, "tokens_per_s": 4000.0}]


def test_query_table(history_db) -> None:
    result = _run("query", "stage_utilization", "-p", "run_id=r1", "-p", "warmup_iters=1",
                  "--db", str(history_db))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.split("│")[1:4] == [" drafter ", "       2 ", "          4 "] for line in lines)


@pytest.mark.parametrize(("args", "code", "message"), [
    (["query", "nope"], 1, "tlog: error: unknown query 'nope'; known queries: "),
    (["query", "phase_breakdown", "-p", "run_id"], 2, ("tlog: error: bad parameter 'run_id': "
                                                      "write -p key=value")),
    (["query", "phase_breakdown", "-p", "=r1"], 2, "tlog: error: bad parameter '=r1'"),
    # a missing or unknown parameter is a bad argument: exit 2 like the others
    (["query", "phase_breakdown"], 2, ("tlog: error: query 'phase_breakdown' needs parameter "
                                       "$run_id (VARCHAR: the run); give it with -p run_id=VALUE")),
    (["query", "phase_breakdown", "-p", "run_id=r1", "-p", "x=1"], 2,
     "tlog: error: query 'phase_breakdown' has no parameter $x"),
    (["query", "phase_breakdown", "-p", "run_id=r1", "-p", "warmup_iters=many"], 2,
     "tlog: error: "),
    # values a stored query cannot take: exit 2, its own words, no DuckDB internals
    (["query", "runs_by_throughput", "-p", "limit=-1"], 2,
     "tlog: error: parameter $limit must be a count from 0 to 2,147,483,647, got '-1'"),
    (["query", "runs_by_throughput", "-p", "tag_key=gpus"], 2,
     "tlog: error: query 'runs_by_throughput': give both $tag_key and $tag_value, or neither"),
    (["query", "throughput_over_time", "-p", "run_id=r1", "-p", "bucket_s=1e-300"], 2,
     "tlog: error: query 'throughput_over_time': parameter $bucket_s must be at least 0.001"),
    (["query", "phase_breakdown", "-p", "run_id=r9"], 1, "tlog: error: no run 'r9' in the database"),
    (["query"], 2, "tlog: error: name a stored query"),
    (["query", "--list", "phase_breakdown"], 2, "tlog: error: --list takes no query name"),
    (["sql", "DROP TABLE runs"], 2, "tlog: error: refused: the statement is DROP, not a read"),
    (["sql", "SELECT * FROM nope"], 1, "tlog: error: SQL failed: Catalog Error"),
])
def test_bad_input_is_one_line_and_an_exit_code(args, code, message, history_db) -> None:
    result = _run(*args, "--db", str(history_db))
    assert assert_one_line_error(result, code).startswith(message), result.stderr


def test_sql_from_stdin_as_csv(history_db) -> None:
    result = _run("sql", "--db", str(history_db), "-f", "csv",
                  stdin="-- how many iterations per run\n"
                        "SELECT run_id, count(*) AS n FROM iterations GROUP BY run_id ORDER BY run_id")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["run_id,n", "r1,11", "r2,3", "r3,3", "r4,3"]


def test_sql_json_turns_non_finite_numbers_into_null(history_db) -> None:
    result = _run("sql", "SELECT 'nan'::DOUBLE AS x, 1.5 AS y, NULL AS z", "-f", "json",
                  "--db", str(history_db))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"x": None, "y": 1.5, "z": None}]
