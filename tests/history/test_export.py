"""`tlog export --parquet`: hive-partitioned by run, readable by DuckDB without tlog,
whole and per-run (incremental) exports, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from tlog.ingest.db import SCHEMA_VERSION, connect
from tlog.ingest.errors import RunNotFoundError
from tlog.queries.export import EXPORT_TABLES, ExportError, export_parquet

from tests.support.cli import invoke


def _export(db: Path, out: Path, **kwargs):
    con = connect(db, read_only=True)
    try:
        return export_parquet(con, out, **kwargs)
    finally:
        con.close()


def _read(out: Path, table: str, order: str) -> list[tuple]:
    # Plain DuckDB, no tlog: the run_id column comes back from the folder names.
    with duckdb.connect() as con:
        return con.execute(f"SELECT * FROM read_parquet('{out}/{table}/*/*.parquet', "
                           f"hive_partitioning = true) ORDER BY {order}").fetchall()


def test_export_layout_and_round_trip(history_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    report = _export(history_db, out)
    # Rows per table: 4 runs; 11 + 3 + 3 + 3 iterations; phases 4+3+2 ... as in conftest.py.
    assert report.tables == {"runs": 4, "files": 0, "workers": 0, "iterations": 20,
                             "phases": 52, "queue_samples": 7, "events": 1, "rejects": 0,
                             "sys_samples": 0, "machines": 0, "iteration_categories": 20, "attribution": 20,
                             "attribution_phases": 17, "attribution_stages": 5,
                             "attribution_runs": 4}
    assert report.runs == ["r1", "r2", "r3", "r4"]
    # One file per (table, run) that has rows: runs 4, iterations 4, phases 4,
    # iteration_categories 4, queue_samples 2 (r1, r2), events 1 (r1); the stored
    # diagnosis: attribution, attribution_phases, attribution_stages, attribution_runs
    # 4 each. attribution_phases rows: one per (worker, phase) of steady iterations:
    # target-0 3 (batch_get, target_forward, hs_put), drafter-1 and drafter-2 4 each
    # (hs_get, forward, forward/mask_build, grad_allreduce), r2, r3, r4 2 each = 17;
    # attribution_stages: r1 target and drafter, r2, r3, r4 main = 5.
    assert report.files == 35
    assert sorted(p.name for p in (out / "iterations").iterdir()) == [
        "run_id=r1", "run_id=r2", "run_id=r3", "run_id=r4"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*EXPORT_TABLES, "tlog_export.json"])
    manifest = json.loads((out / "tlog_export.json").read_text())
    assert manifest["layout"] == "hive" and manifest["partition_by"] == ["run_id"]
    assert manifest["runs"] == ["r1", "r2", "r3", "r4"]
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["tables"]["events"] == [
        ["rank", "INTEGER"], ["stage", "VARCHAR"], ["worker", "VARCHAR"], ["name", "VARCHAR"],
        ["ts", "DOUBLE"], ["dur", "DOUBLE"], ["file", "VARCHAR"], ["line", "BIGINT"],
        ["extra", "JSON"], ["run_id", "VARCHAR"]]
    assert "phase_host_s" not in dict(manifest["tables"]["iterations"])

    with connect(history_db, read_only=True) as con:
        cols = "run_id, rank, stage, worker, iter, ts, dur, tokens"
        expected = con.execute(f"SELECT {cols} FROM iterations ORDER BY run_id, worker, iter").fetchall()
        phases = con.execute("SELECT * FROM phases ORDER BY run_id, worker, iter, seq").fetchall()
    got = _read(out, "iterations", "run_id, worker, iter")
    with duckdb.connect() as plain:
        names = [d[0] for d in plain.execute(
            f"SELECT * FROM read_parquet('{out}/iterations/*/*.parquet', hive_partitioning = true)"
            " LIMIT 0").description]
    idx = [names.index(c.strip()) for c in cols.split(",")]
    assert [tuple(row[i] for i in idx) for row in got] == expected
    with duckdb.connect() as plain:
        got_phases = plain.execute(
            f"SELECT run_id, rank, stage, worker, iter, seq, phase, parent, host_s, gpu_s, category"
            f" FROM read_parquet('{out}/phases/*/*.parquet', hive_partitioning = true)"
            " ORDER BY run_id, worker, iter, seq").fetchall()
    assert got_phases == phases


def test_partition_files_do_not_repeat_the_run_id(history_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    _export(history_db, out)
    with duckdb.connect() as con:
        cols = [d[0] for d in con.execute(
            f"SELECT * FROM read_parquet('{out}/runs/run_id=r1/data_0.parquet', "
            "hive_partitioning = false) LIMIT 0").description]
        tags = con.execute(f"SELECT tags FROM read_parquet('{out}/runs/*/*.parquet', "
                           "hive_partitioning = true) WHERE run_id = 'r2'").fetchall()
    assert "run_id" not in cols and "tags" in cols
    assert json.loads(tags[0][0]) == {"config": "a", "gpus": "4"}


def test_a_second_whole_export_needs_overwrite(history_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    _export(history_db, out)
    with pytest.raises(ExportError, match=r"runs already holds an export; pass --overwrite"):
        _export(history_db, out)
    report = _export(history_db, out, overwrite=True)
    assert report.tables["iterations"] == 20
    assert len(_read(out, "iterations", "run_id")) == 20


def test_per_run_export_adds_partitions_and_keeps_the_others(history_db: Path, tmp_path) -> None:
    out = tmp_path / "export"
    report = _export(history_db, out, run_ids=["r2"])
    # runs, iterations, phases, cats, queue and the four stored-diagnosis tables
    assert report.tables["iterations"] == 3 and report.files == 9
    _export(history_db, out, run_ids=["r4", "r3"])
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["run_id=r2", "run_id=r3", "run_id=r4"]
    with pytest.raises(ExportError, match=r"run_id=r2 already exists; pass --overwrite"):
        _export(history_db, out, run_ids=["r2"])
    _export(history_db, out, run_ids=["r2"], overwrite=True)
    with duckdb.connect() as con:
        names = con.execute(f"SELECT run_id, name FROM read_parquet('{out}/runs/*/*.parquet', "
                            "hive_partitioning = true) ORDER BY run_id").fetchall()
    assert names == [("r2", "fast"), ("r3", None), ("r4", None)]
    assert json.loads((out / "tlog_export.json").read_text())["runs"] == ["r2", "r3", "r4"]
    assert not list(out.glob(".tlog-export-*"))  # staging removed


def test_unknown_run_and_foreign_folders_are_refused(history_db: Path, tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError, match="no run 'r9'"):
        _export(history_db, tmp_path / "a", run_ids=["r9"])
    foreign = tmp_path / "b"
    (foreign / "runs").mkdir(parents=True)
    (foreign / "runs" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"holds files that are not a tlog export"):
        _export(history_db, foreign, overwrite=True)
    assert (foreign / "runs" / "notes.txt").read_text() == "mine"


def test_export_cli(history_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    result = invoke(["export", "--parquet", str(out), "--db", str(history_db), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tables"]["phases"] == 52
    again = invoke(["export", "--parquet", str(out), "--db", str(history_db)])
    assert again.exit_code == 1
    assert again.stderr.startswith("tlog: error: ") and "--overwrite" in again.stderr
    missing = invoke(["export", "--db", str(history_db)])
    assert missing.exit_code == 2 and "--parquet DIR" in missing.stderr
    unknown = invoke(["export", "--parquet", str(out), "--run", "r9",
                      "--db", str(history_db)])
    assert unknown.exit_code == 1 and "no run 'r9'" in unknown.stderr


def test_stored_queries_run_on_the_export_without_tlog(history_db: Path, tmp_path: Path) -> None:
    """docs/QUERIES.md: views over the Parquet files, then a stored query as-is."""
    from tlog.analyze.persist import ensure_attribution
    from tlog.queries import QUERY_DIR, read_only_connection

    out = tmp_path / "export"
    _export(history_db, out)
    sql = (QUERY_DIR / "stage_utilization.sql").read_text()
    params = {"run_id": "r1", "warmup_iters": 1}
    with read_only_connection(history_db) as con:
        ensure_attribution(con, ["r1"])   # what run_query does before it runs a query
        expected = con.execute(sql, params).fetchall()
        # iteration_positions is a view over iteration_categories and events: its
        # definition, as DuckDB keeps it, runs unchanged over the Parquet views.
        positions = con.execute("SELECT sql FROM duckdb_views() "
                                "WHERE view_name = 'iteration_positions'").fetchall()[0][0]
    with duckdb.connect() as con:
        for table in ("runs", "iterations", "phases", "events", "queue_samples",
                      "iteration_categories", "attribution"):
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet("
                        f"'{out}/{table}/*/*.parquet', hive_partitioning = true)")
        con.execute(positions)
        con.execute("PREPARE q AS " + sql.rstrip().rstrip(";"))
        got = con.execute("EXECUTE q(run_id := 'r1', warmup_iters := 1)").fetchall()
    assert got == expected and len(got) == 2
