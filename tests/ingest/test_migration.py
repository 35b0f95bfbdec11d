"""Schema version and the v1 -> v2 -> ... -> v8 migrations (``ingest.db.MIGRATIONS``)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from ingest_helpers import DATA, rows
from tlog.ingest import connect, ingest_run
from tlog.ingest.db import SCHEMA_VERSION, schema_version
from tlog.ingest.errors import DatabaseError

from tests.support.phase_rows import insert_phase_rows

V1 = DATA / "ingest_schema_v1" / "schema.sql"
# (run, rank, stage, worker, iter, seq, phase, parent, host_s, gpu_s, category)
PHASES = [
    ("r", 0, "drafter", "d0", 0, 0, "hs_get", None, 0.25, None, "starvation"),
    ("r", 0, "drafter", "d0", 0, 1, "forward", None, 0.5, 0.75, "compute"),
    ("r", 0, "drafter", "d0", 0, 2, "forward/mask", "forward", 0.125, None, "compute"),
    ("r", 0, "drafter", "d0", 1, 0, "hs_get", None, 0.5, None, "starvation"),
    ("r", 0, "drafter", "d0", 1, 1, "forward", None, 0.25, None, "compute"),
    ("r", 0, "drafter", "d0", 1, 2, "forward/mask", "forward", 0.125, None, "compute"),
    ("r", 1, "target", "t1", 0, 0, "target_forward", None, 0.5, None, "compute"),
    ("r", 1, "target", "t1", 0, 1, "hs_put", None, 0.25, None, "backpressure"),
]
ITERS = [("r", 0, "drafter", "d0", 0, 100.0, 1.0), ("r", 0, "drafter", "d0", 1, 101.0, 1.0),
         ("r", 1, "target", "t1", 0, 100.0, 1.0), ("r", 1, "target", "t1", 1, 101.0, 2.0)]
VIEW = ("SELECT rank, stage, worker, iter, seq, phase, parent, host_s, gpu_s, category "
        "FROM phases ORDER BY rank, stage, worker, iter, seq")
CATS = ("SELECT rank, iter, starvation_s, backpressure_s, compute_s, sync_s, unaccounted_s "
        "FROM iteration_categories ORDER BY rank, iter")
EXPECTED_CATS = [  # by hand: top-level host times by category, unaccounted = dur - their sum
    {"rank": 0, "iter": 0, "starvation_s": 0.25, "backpressure_s": 0.0, "compute_s": 0.5,
     "sync_s": 0.0, "unaccounted_s": 0.25},
    {"rank": 0, "iter": 1, "starvation_s": 0.5, "backpressure_s": 0.0, "compute_s": 0.25,
     "sync_s": 0.0, "unaccounted_s": 0.25},
    {"rank": 1, "iter": 0, "starvation_s": 0.0, "backpressure_s": 0.25, "compute_s": 0.5,
     "sync_s": 0.0, "unaccounted_s": 0.25},
    {"rank": 1, "iter": 1, "starvation_s": 0.0, "backpressure_s": 0.0, "compute_s": 0.0,
     "sync_s": 0.0, "unaccounted_s": 2.0},
]


def _v1(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute(V1.read_text())
    con.executemany("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", ITERS)
    con.executemany("INSERT INTO phases VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", PHASES)
    con.execute("INSERT INTO queue_samples VALUES ('r', 0, 'drafter', 'd0', 'q', 100.5, 3, 8)")
    con.execute("INSERT INTO events VALUES ('r', 0, 'drafter', 'd0', 'ckpt', 102.0, 4.0)")
    con.execute("INSERT INTO rejects VALUES ('r', 'a.jsonl', 3, 'not JSON', 'x')")
    con.close()


def _expected_view() -> list[dict]:
    names = ("rank", "stage", "worker", "iter", "seq", "phase", "parent", "host_s", "gpu_s",
             "category")
    return [dict(zip(names, p[1:], strict=True)) for p in PHASES]


def test_v1_database_is_migrated(tmp_path: Path):
    path = tmp_path / "old.duckdb"
    _v1(path)
    con = connect(path)
    try:
        assert SCHEMA_VERSION == 8
        assert schema_version(con) == 8
        assert rows(con, "SELECT version FROM tlog_schema ORDER BY version") == [
            {"version": 1}, {"version": 8}]
        assert rows(con, "SELECT (SELECT count(*) FROM sys_samples) AS s, "
                         "(SELECT count(*) FROM machines) AS m") == [{"s": 0, "m": 0}]
        assert rows(con, VIEW) == _expected_view()
        assert rows(con, CATS) == EXPECTED_CATS
        assert rows(con, "SELECT name, depth, file, line, extra FROM queue_samples") == [
            {"name": "q", "depth": 3, "file": None, "line": None, "extra": None}]
        assert rows(con, "SELECT code FROM rejects") == [{"code": None}]
        # two layouts for three phase lists: d0's two iterations share one
        assert rows(con, "SELECT count(DISTINCT layout) AS n FROM phase_layouts") == [{"n": 2}]
        # and the migrated database takes new runs
        assert ingest_run(con, DATA / "ingest_duplicates").records_loaded["iter"] == 5
    finally:
        con.close()
    con = connect(path, read_only=True)     # reopening does not migrate again
    assert schema_version(con) == 8
    con.close()


POSITIONS = ("SELECT rank, iter, pos, in_event FROM iteration_positions ORDER BY rank, iter")
# by hand: position within the worker by iter; the event [102, 106] overlaps only
# t1 iter 1 [101, 103); d0 iter 1 [101, 102) ends when the event starts.
EXPECTED_POSITIONS = [
    {"rank": 0, "iter": 0, "pos": 1, "in_event": False},
    {"rank": 0, "iter": 1, "pos": 2, "in_event": False},
    {"rank": 1, "iter": 0, "pos": 1, "in_event": False},
    {"rank": 1, "iter": 1, "pos": 2, "in_event": True},
]


def test_v2_database_gains_iteration_positions(tmp_path: Path):
    path = tmp_path / "v2.duckdb"
    _v1(path)
    connect(path).close()
    # Bring it back to v2 as v2 code left it: no iteration_positions, no _run_throughput,
    # no phase_layouts.given.
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW iteration_positions; DROP MACRO TABLE _run_throughput; "
                "ALTER TABLE phase_layouts DROP COLUMN given; "
                "DROP TABLE sys_samples; DROP TABLE machines; "
                "DELETE FROM tlog_schema WHERE version = 8; "
                "INSERT INTO tlog_schema (version) VALUES (2)")
    con.close()
    con = connect(path, read_only=True)
    with pytest.raises(duckdb.CatalogException):
        con.execute(POSITIONS)
    con.close()
    con = connect(path)
    try:
        assert rows(con, "SELECT version FROM tlog_schema ORDER BY version") == [
            {"version": 1}, {"version": 2}, {"version": 8}]
        assert rows(con, POSITIONS) == EXPECTED_POSITIONS
        assert rows(con, CATS) == EXPECTED_CATS
        # d0: warm-up 1 leaves iter 1 (1 s, no tokens); t1 has nothing steady left.
        # (_run_throughput reads the stored diagnosis, schema v5: store it first;
        # diagnose needs the runs row a v1 scaffold never wrote. Its 4 s ckpt event
        # spans the whole 3 s run: a span marker, which leaves nothing out.)
        from tlog.analyze.persist import ensure_attribution
        con.execute("INSERT INTO runs (run_id) VALUES ('r')")
        ensure_attribution(con)
        assert rows(con, "SELECT run_id, stage, iterations, iters_per_s, tokens_per_s "
                         "FROM _run_throughput(1)") == [
            {"run_id": "r", "stage": "drafter", "iterations": 1, "iters_per_s": 1.0,
             "tokens_per_s": None}]
    finally:
        con.close()


def test_v3_database_marks_the_categories_records_gave(tmp_path: Path):
    """v3 -> v4: a category that the run's phase_kinds and the name rules do not
    give must have come from a record's kinds: it is marked ``given`` (and kept
    by later ingests); the others are not (and follow a later phase_kinds)."""
    path = tmp_path / "v3.duckdb"
    con = connect(path)
    con.executemany("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", ITERS[:1])
    # rules: decode, step, backward -> compute. run.json says decode is
    # starvation, and said nothing when iter 0 was loaded (a stale layout);
    # a record said step is sync.
    insert_phase_rows(con, [
        ("r", 0, "drafter", "d0", 0, 0, "decode", None, 0.25, None, "compute"),
        ("r", 0, "drafter", "d0", 0, 1, "step", None, 0.25, None, "sync"),
        ("r", 0, "drafter", "d0", 0, 2, "backward", None, 0.25, None, "compute"),
        ("r", 0, "drafter", "d0", 1, 0, "decode", None, 0.25, None, "starvation"),
        ("r", 0, "drafter", "d0", 1, 1, "step", None, 0.25, None, "sync"),
        ("r", 0, "drafter", "d0", 1, 2, "backward", None, 0.25, None, "compute")])
    con.execute("""INSERT INTO runs (run_id, phase_kinds) VALUES ('r', '{"decode": "starvation"}')""")
    con.execute("ALTER TABLE phase_layouts DROP COLUMN given; "
                "DELETE FROM tlog_schema; INSERT INTO tlog_schema (version) VALUES (3)")
    con.close()
    con = connect(path)
    try:
        assert schema_version(con) == 8
        assert rows(con, "SELECT layout, phase, category, given FROM phase_layouts "
                         "ORDER BY layout, seq") == [
            {"layout": 0, "phase": "decode", "category": "compute", "given": None},
            {"layout": 0, "phase": "step", "category": "sync", "given": "sync"},
            {"layout": 0, "phase": "backward", "category": "compute", "given": None},
            {"layout": 1, "phase": "decode", "category": "starvation", "given": None},
            {"layout": 1, "phase": "step", "category": "sync", "given": "sync"},
            {"layout": 1, "phase": "backward", "category": "compute", "given": None}]
        # the next ingest of the run brings the stale layout in line with run.json
        from tlog.ingest.recategorize import recategorize
        assert recategorize(con, "r", {"decode": "starvation"}) == [
            {"phase": "decode", "from": "compute", "to": "starvation"}]
        assert rows(con, "SELECT DISTINCT category FROM phase_layouts "
                         "WHERE phase = 'decode'") == [{"category": "starvation"}]
    finally:
        con.close()


@pytest.mark.parametrize("stored", ["null", "[1]", '"x"', '{"decode": 5}',
                                    '{"decode": "bogus"}'])
def test_v3_migration_survives_a_hand_edited_phase_kinds(stored: str, tmp_path: Path):
    """runs.phase_kinds edited by hand into something that is not {phase:
    category}: the migration reads it as no kinds instead of failing."""
    path = tmp_path / "v3.duckdb"
    con = connect(path)
    con.executemany("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", ITERS[:1])
    insert_phase_rows(con, [("r", 0, "drafter", "d0", 0, 0, "decode", None, 0.25, None,
                             "starvation")])
    con.execute("INSERT INTO runs (run_id, phase_kinds) VALUES ('r', ?)", [stored])
    con.execute("ALTER TABLE phase_layouts DROP COLUMN given; "
                "DELETE FROM tlog_schema; INSERT INTO tlog_schema (version) VALUES (3)")
    con.close()
    con = connect(path)
    try:
        assert rows(con, "SELECT phase, category, given FROM phase_layouts") == [
            {"phase": "decode", "category": "starvation", "given": "starvation"}]
    finally:
        con.close()


def test_insert_phase_rows_builds_the_same_view(db):
    db.executemany("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)", ITERS)
    assert insert_phase_rows(db, PHASES) == 3
    assert rows(db, VIEW) == _expected_view()
    # stored as given, so that an ingest of the run keeps them
    assert rows(db, "SELECT count(*) AS n, count(*) FILTER (WHERE given = category) AS g "
                    "FROM phase_layouts") == [{"n": 5, "g": 5}]   # d0's 3 phases, t1's 2
    assert rows(db, CATS) == EXPECTED_CATS


def test_newer_database_is_refused(tmp_path: Path):
    path = tmp_path / "new.duckdb"
    connect(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO tlog_schema (version) VALUES (99)")
    con.close()
    with pytest.raises(DatabaseError, match="schema version 99, newer than this tlog "
                                            r"understands \(8\); upgrade tlog"):
        connect(path)


def _older(path: Path, case: str, undo: str, version: int):
    """A database holding run ``case``, taken back to schema ``version`` by the
    SQL ``undo``, then opened again (migrated): its connection."""
    con = connect(path)
    ingest_run(con, DATA / case)
    con.execute(f"{undo}; DELETE FROM tlog_schema; "
                f"INSERT INTO tlog_schema (version) VALUES ({version})")
    con.close()
    con = connect(path)
    assert schema_version(con) == 8
    return con


def test_v5_database_gains_the_sys_tables(tmp_path: Path):
    """v5 -> v6 -> v7: ``sys_samples`` and ``machines`` are created (empty), the runs
    already there keep their rows, and a run with ``sys`` records loads into them."""
    con = _older(tmp_path / "v5.duckdb", "ingest_duplicates",
                 "DROP TABLE sys_samples; DROP TABLE machines", 5)
    try:
        assert rows(con, "SELECT count(*) AS n FROM iterations") == [{"n": 5}]
        assert rows(con, "SELECT count(*) AS n FROM sys_samples") == [{"n": 0}]
        report = ingest_run(con, DATA / "ingest_sys")
        assert report.records_loaded["sys"] == 5
        assert rows(con, "SELECT count(*) AS n FROM sys_samples") == [{"n": 5}]
        assert rows(con, "SELECT worker FROM machines ORDER BY worker") == [
            {"worker": "main-0"}, {"worker": "main-1"}]
    finally:
        con.close()


def test_v6_database_gains_cpu_wait(tmp_path: Path):
    """v6 -> v7: ``sys_samples.cpu_wait_s`` is added, NULL in the rows already
    there; a later ingest fills it."""
    con = _older(tmp_path / "v6.duckdb", "ingest_sys",
                 "ALTER TABLE sys_samples DROP COLUMN cpu_wait_s", 6)
    try:
        assert rows(con, "SELECT count(*) AS n, count(cpu_wait_s) AS w FROM sys_samples") == [
            {"n": 5, "w": 0}]
        con.execute("DELETE FROM sys_samples; DELETE FROM files")
        ingest_run(con, DATA / "ingest_sys")
        assert rows(con, "SELECT line, cpu_wait_s FROM sys_samples WHERE cpu_wait_s IS NOT NULL"
                    ) == [{"line": 3, "cpu_wait_s": 0.75}]
    finally:
        con.close()


def test_v7_database_keys_its_stored_diagnosis_by_a_digest(tmp_path: Path):
    """v7 -> v8: ``attribution_runs.analysis_version`` becomes text. A v7 database
    opened read-only (not migrated) still reads, its stored rows stale; opened
    writable it is migrated, the run diagnosed again and stored under the
    digest of the analysis code (``tlog.analyze.persist.analysis_key``)."""
    from tlog.analyze.persist import analysis_key, ensure_attribution

    path = tmp_path / "v7.duckdb"
    con = connect(path)
    ingest_run(con, DATA / "ingest_duplicates")
    run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    ensure_attribution(con)
    # as v7 left it: the analysis version a number (the run's data unchanged since)
    con.execute("ALTER TABLE attribution_runs ALTER analysis_version TYPE INTEGER USING 8; "
                "DELETE FROM tlog_schema; INSERT INTO tlog_schema (version) VALUES (7)")
    con.close()
    with connect(path, read_only=True) as old:
        assert schema_version(old) == 7
        assert ensure_attribution(old).computed == [run_id]
        assert rows(old, "SELECT analysis_version FROM attribution_runs") == [
            {"analysis_version": analysis_key()}]
    con = connect(path)
    try:
        assert schema_version(con) == 8
        assert rows(con, "SELECT data_type FROM information_schema.columns WHERE "
                         "table_name = 'attribution_runs' AND column_name = 'analysis_version'"
                    ) == [{"data_type": "VARCHAR"}]
        assert rows(con, "SELECT analysis_version FROM attribution_runs") == [
            {"analysis_version": "8"}]
        assert ensure_attribution(con).computed == [run_id]
        assert rows(con, "SELECT analysis_version FROM attribution_runs") == [
            {"analysis_version": analysis_key()}]
        assert ensure_attribution(con).computed == []
    finally:
        con.close()
