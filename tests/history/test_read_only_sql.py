"""Ad-hoc SQL is read-only: writing statements are refused with a clear message,
by the statement check and, independently, by the locked-down connection, and the
database file is byte-for-byte unchanged afterwards."""

from __future__ import annotations

import hashlib
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from tlog.ingest.errors import QueryError, UsageError
from tlog.queries import WriteRefusedError, check_read_only, read_only_connection, run_sql
from tlog.queries.runner import _execute_read
from tlog.queries.sqltext import blank_comments_and_strings, find_parameters


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _counts(db: Path) -> dict[str, int]:
    tables = ["runs", "iterations", "phases", "events", "queue_samples"]
    with read_only_connection(db) as con:
        return {t: con.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in tables}


WRITES = [
    ("INSERT INTO runs (run_id) VALUES ('x')", "INSERT"),
    ("DROP TABLE runs", "DROP"),
    ("ATTACH 'other.duckdb' AS other", "ATTACH"),
    ("COPY runs TO '{out}/runs.csv'", "COPY"),
    ("COPY (SELECT * FROM runs) TO '{out}/runs.parquet' (FORMAT parquet)", "COPY"),
    ("EXPORT DATABASE '{out}/dump'", "EXPORT"),
    ("-- just a look at the runs\nDELETE FROM runs", "DELETE"),
    ("/* SELECT * FROM runs */ UPDATE runs SET name = 'x'", "UPDATE"),
    ("SELECT 1; -- and then\nDROP TABLE iterations", "DROP"),
    ("CREATE TEMP TABLE t AS SELECT 1", "CREATE"),
    ("SET enable_external_access = true", "SET"),
    ("PRAGMA enable_profiling", "PRAGMA"),
    ("LOAD parquet", "LOAD"),
    ("INSTALL httpfs", "LOAD"),
    ("CALL checkpoint()", "CALL"),
    ("CHECKPOINT", "CALL"),
    ("EXPLAIN ANALYZE COPY runs TO '{out}/x.csv'", "COPY"),
]


@pytest.mark.parametrize(("sql", "kind"), WRITES)
def test_writing_statements_are_refused_and_nothing_changes(sql, kind, history_db, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    before, counts = _digest(history_db), _counts(history_db)
    with pytest.raises(WriteRefusedError, match=rf"^refused: .*\b{kind}\b.*tlog sql only reads"):
        run_sql(sql.format(out=out), db=history_db)
    assert _digest(history_db) == before
    assert _counts(history_db) == counts
    assert list(out.iterdir()) == []


def test_the_refusal_names_the_hidden_statement() -> None:
    with pytest.raises(WriteRefusedError,
                       match=r"^refused: statement 2 of 2 is DROP, not a read"):
        check_read_only("SELECT 1; -- nothing to see\nDROP TABLE runs")


def test_a_data_modifying_cte_is_refused(history_db) -> None:
    # DuckDB parses this as a SELECT and would run the INSERT on a writable database.
    sql = "WITH x AS (INSERT INTO runs (run_id) VALUES ('x') RETURNING *) SELECT * FROM x"
    before = _digest(history_db)
    with pytest.raises(WriteRefusedError, match=r"runs INSERT inside a WITH clause"):
        run_sql(sql, db=history_db)
    assert _digest(history_db) == before


@pytest.mark.parametrize("sql", [
    "COPY runs TO '{out}/runs.csv'",
    "EXPORT DATABASE '{out}/dump'",
    "ATTACH '{out}/other.duckdb' AS o",
    "SELECT * FROM read_csv('{csv}')",
    "SET enable_external_access = true",
    "INSERT INTO runs (run_id) VALUES ('x')",
    "WITH x AS (INSERT INTO runs (run_id) VALUES ('x') RETURNING *) SELECT * FROM x",
])
def test_the_connection_refuses_writes_even_past_the_statement_check(sql, history_db, tmp_path):
    """Second guard: read-only + no external access + locked configuration."""
    out = tmp_path / "out"
    out.mkdir()
    csv = tmp_path / "outside.csv"
    csv.write_text("a\n1\n")
    before = _digest(history_db)
    with read_only_connection(history_db) as con, pytest.raises(WriteRefusedError, match="^refused: "):
        _execute_read(con, sql.format(out=out, csv=csv))
    assert _digest(history_db) == before
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("sql", [
    "SELECT run_id FROM runs ORDER BY run_id",
    "-- the runs\nSELECT run_id FROM runs ORDER BY run_id;",
    "WITH r AS (SELECT run_id FROM runs) SELECT * FROM r ORDER BY run_id",
    "FROM runs SELECT run_id ORDER BY run_id",
])
def test_reads_return_a_polars_frame(sql, history_db) -> None:
    frame = run_sql(sql, db=history_db)
    assert_frame_equal(frame, pl.DataFrame({"run_id": ["r1", "r2", "r3", "r4"]}))


def test_other_reads_pass(history_db) -> None:
    assert run_sql("DESCRIBE runs", db=history_db)["column_name"][0] == "run_id"
    assert run_sql("SUMMARIZE runs", db=history_db).height == 12
    assert run_sql("EXPLAIN SELECT 1", db=history_db).height == 1
    tables = run_sql("SHOW TABLES", db=history_db)["name"].to_list()
    assert "iterations" in tables and "iteration_categories" in tables


def test_sql_errors_are_one_line(history_db) -> None:
    with pytest.raises(QueryError, match=r"^SQL failed: Catalog Error: Table with name nope"):
        run_sql("SELECT * FROM nope", db=history_db)
    with pytest.raises(QueryError, match=r"^cannot parse the SQL: Parser Error"):
        run_sql("SELEC 1", db=history_db)
    with pytest.raises(UsageError, match="no SQL statement given"):
        run_sql("  -- only a comment\n", db=history_db)


def test_a_missing_database_is_a_clear_error(tmp_path) -> None:
    from tlog.ingest.errors import DatabaseError

    with pytest.raises(DatabaseError, match="no database at"):
        run_sql("SELECT 1", db=tmp_path / "none.duckdb")


# --- the lexer behind parameter finding ---------------------------------------

def test_blanking_keeps_offsets_and_lines() -> None:
    sql = "SELECT 'a$x' AS \"$c\", $p -- $q\n/* $r /* nested $s */ $t */ $u"
    blank = blank_comments_and_strings(sql)
    assert len(blank) == len(sql)
    assert blank.count("\n") == sql.count("\n")
    assert find_parameters(sql) == ["p", "u"]


@pytest.mark.parametrize(("sql", "found"), [
    ("SELECT E'it\\'s $no' AS a, $yes", ["yes"]),
    ("SELECT 'it''s $no', $yes", ["yes"]),
    ("SELECT $$ $no $$, $tag$ $no $tag$, $yes", ["yes"]),
    ("SELECT tags ->> '$.gpus' FROM runs WHERE run_id = $run_id AND x = $run_id", ["run_id"]),
    ("SELECT type'x', $a", ["a"]),
])
def test_parameters_inside_strings_and_comments_do_not_count(sql, found) -> None:
    assert find_parameters(sql) == found


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT 'open", r"string literal opened at line 1 is never closed"),
    ("SELECT 1 /* open /* nested */", r"block comment opened at line 1 is never closed"),
    ('SELECT "open', r"quoted identifier opened at line 1 is never closed"),
    ("SELECT\n$$ open", r"dollar-quoted string \$\$...\$\$ opened at line 2"),
    ("SELECT * FROM runs WHERE run_id = ?", r"positional parameter '\?' at line 1"),
    ("SELECT $1", r"positional parameter '\$1'"),
])
def test_malformed_sql_text_is_reported(sql, message) -> None:
    with pytest.raises(QueryError, match=message):
        find_parameters(sql)
