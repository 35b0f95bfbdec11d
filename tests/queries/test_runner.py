"""``queries.runner``: stored query files parsed and bound, queries of one's own
beside tlog's, and the read-only guard of ad-hoc SQL (a run written by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.ingest.errors import QueryArgumentError, QueryError, RunNotFoundError, UsageError
from tlog.queries.runner import (
    QUERY_DIR,
    REQUIRED,
    WriteRefusedError,
    check_read_only,
    list_queries,
    load_query,
    parse_query,
    reads_diagnosis,
    run_query,
    run_sql,
)

from tests.support.runbuilder import RunBuilder, loop

SLOWEST = """\
-- Iterations slower than a bound. Ordered by duration.
--
-- Parameters:
--   $run_id VARCHAR: the run.
--   $min_s DOUBLE = 0.0: the shortest duration kept (seconds).
--   $limit INTEGER = 3: the most rows.
--
-- Columns:
--   iter BIGINT: the iteration.
--   dur DOUBLE (s): its duration.
SELECT iter, dur FROM iterations WHERE run_id = $run_id AND dur >= $min_s
ORDER BY dur DESC, iter LIMIT $limit
"""


def test_parse_the_header_and_bind() -> None:
    q = parse_query("slowest", SLOWEST)
    assert q.summary == "Iterations slower than a bound."
    assert [(p.name, p.type, p.default) for p in q.parameters] == [
        ("run_id", "VARCHAR", REQUIRED), ("min_s", "DOUBLE", 0.0), ("limit", "INTEGER", 3)]
    assert q.parameter("run_id").required and not q.parameter("limit").required
    assert [(c.name, c.unit) for c in q.columns] == [("iter", ""), ("dur", "s")]
    assert q.used == ("run_id", "min_s", "limit")
    # values typed on the command line are parsed by the declared type
    assert q.bind({"run_id": "r", "$min_s": "0.25"}) == {"run_id": "r", "min_s": 0.25,
                                                         "limit": 3}
    with pytest.raises(QueryArgumentError, match=r"needs parameter \$run_id \(VARCHAR: the "
                                                 r"run\); give it with -p run_id=VALUE"):
        q.bind({})
    with pytest.raises(QueryArgumentError, match=r"has no parameter \$x; it takes: \$run_id, "
                                                 r"\$min_s, \$limit"):
        q.bind({"run_id": "r", "x": 1})
    with pytest.raises(QueryError, match=r"parameter \$limit"):
        q.bind({"run_id": "r", "limit": "many"})
    assert q.to_dict()["parameters"][0] == {"name": "run_id", "type": "VARCHAR",
                                            "required": True, "default": None,
                                            "description": "the run."}


@pytest.mark.parametrize(("text", "says"), [
    ("SELECT 1", "the header comment must start with the query's purpose"),
    ("-- Purpose.\nSELECT 1", "must list the output columns under 'Columns:'"),
    ("-- Purpose.\n-- Parameters:\n--   x: bad\n-- Columns:\n--   a INT: a.\nSELECT 1",
     "parameter line must read '$name TYPE [= default]: description'"),
    ("-- Purpose.\n-- Columns:\n--   a INT: a.\nSELECT $x",
     "header and body disagree: uses undeclared $x"),
    ("-- Purpose.\n-- Parameters:\n--   $y INTEGER: y.\n-- Columns:\n--   a INT: a.\nSELECT 1",
     "header and body disagree: declares unused $y"),
])
def test_bad_headers_say_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(QueryError) as info:
        parse_query("q", text)
    assert says in str(info.value)


@pytest.fixture
def con(build):
    b = RunBuilder("r")
    loop(b, 5, lambda i: [("forward", 0.1 * (i + 1))])    # 0.1 .. 0.5 s
    return build(b)


def test_run_a_query_of_ones_own(con, tmp_path: Path, monkeypatch) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "slowest.sql").write_text(SLOWEST, encoding="utf-8")
    (mine / "_private.sql").write_text(SLOWEST, encoding="utf-8")
    monkeypatch.setenv("TLOG_QUERIES", str(mine))
    assert "slowest" in list_queries() and "_private" not in list_queries()
    assert load_query("slowest").path == mine / "slowest.sql"
    rows = run_query(con, "slowest", {"run_id": "r", "min_s": "0.25"})
    assert rows["iter"].to_list() == [4, 3, 2]
    assert rows["dur"].to_list() == pytest.approx([0.5, 0.4, 0.3])
    with pytest.raises(RunNotFoundError, match="no run 'nope' in the database"):
        run_query(con, "slowest", {"run_id": "nope"})
    with pytest.raises(QueryError, match="unknown query 'nothing'"):
        load_query("nothing")


def test_tlogs_own_queries_parse() -> None:
    names = list_queries(QUERY_DIR)
    assert names and all(load_query(n, QUERY_DIR).columns for n in names)


@pytest.mark.parametrize(("sql", "error", "says"), [
    ("DROP TABLE runs", WriteRefusedError, "the statement is DROP, not a read"),
    ("SELECT 1; DELETE FROM runs", WriteRefusedError, "statement 2 of 2 is DELETE, not a read"),
    ("-- SELECT\nDROP TABLE runs", WriteRefusedError, "DROP"),
    ("WITH x AS (INSERT INTO runs (run_id) VALUES ('a') RETURNING *) SELECT * FROM x",
     WriteRefusedError, "the query runs INSERT inside a WITH clause"),
    ("  -- only a comment\n", UsageError, "no SQL statement given"),
])
def test_the_read_only_guard(sql: str, error: type, says: str) -> None:
    with pytest.raises(error, match=says):
        check_read_only(sql)


def test_reads_pass_the_guard_and_run_read_only(con, tmp_path: Path) -> None:
    for sql in ("SELECT 1", "WITH a AS (SELECT 1) SELECT * FROM a", "DESCRIBE runs",
                "EXPLAIN SELECT 1", "FROM runs"):
        assert check_read_only(sql) == sql
    db = Path(con.execute("SELECT path FROM duckdb_databases() WHERE database_name = "
                          "current_database()").fetchall()[0][0])
    con.close()
    got = run_sql("SELECT iter FROM iterations ORDER BY iter", db=db, max_rows=2)
    assert got["iter"].to_list() == [0, 1]
    with pytest.raises(WriteRefusedError):
        run_sql(f"COPY runs TO '{tmp_path / 'out.csv'}'", db=db)
    assert not (tmp_path / "out.csv").exists()


def test_reads_diagnosis_outside_comments_and_strings() -> None:
    assert reads_diagnosis("SELECT * FROM attribution_runs")
    assert reads_diagnosis("SELECT * FROM _run_throughput(3)")
    assert not reads_diagnosis("SELECT 'attribution' -- attribution\nFROM runs")
