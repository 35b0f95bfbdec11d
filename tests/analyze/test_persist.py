"""``analyze.persist``: the stored diagnosis stays fresh: keyed by a digest of the
analysis code itself (a change to a rule or a policy makes every stored run
stale), computed once, again when what it reads changes, in memory on a
read-only connection, dropped with its run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tlog.analyze
from tlog.analyze import persist
from tlog.analyze.persist import (
    TABLES,
    data_keys,
    diagnosed_in_memory,
    ensure_attribution,
    main_prefix,
)
from tlog.analyze.rules.drift import DriftPolicy
from tlog.ingest.db import connect
from tlog.ingest.run import forget_run

from tests.support.runbuilder import RunBuilder, loop

ANALYZE = Path(tlog.analyze.__file__).resolve().parent


def test_the_key_is_the_digest_of_the_analysis_package() -> None:
    assert persist.analysis_key() == persist.code_digest(ANALYZE)
    assert len(persist.analysis_key()) == persist.KEY_CHARS
    assert persist.analysis_key() is persist.analysis_key()        # read once per process


def test_the_digest_changes_when_a_policy_value_changes(tmp_path: Path) -> None:
    copy = tmp_path / "analyze"
    shutil.copytree(ANALYZE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert persist.code_digest(copy) == persist.code_digest(ANALYZE)
    drift = copy / "rules" / "drift.py"
    text = drift.read_text(encoding="utf-8")
    line = f"    p: float = {DriftPolicy().p!r}\n"
    assert text.count(line) == 1                    # the default the policy documents
    drift.write_text(text.replace(line, "    p: float = 0.05\n"), encoding="utf-8")
    changed = persist.code_digest(copy)
    assert changed != persist.code_digest(ANALYZE)
    # a new rule module counts too; putting the value back gives the old key
    drift.write_text(text, encoding="utf-8")
    assert persist.code_digest(copy) == persist.code_digest(ANALYZE)
    (copy / "rules" / "mine.py").write_text("X = 1\n", encoding="utf-8")
    assert persist.code_digest(copy) not in (changed, persist.code_digest(ANALYZE))


def _two_runs(path: Path) -> Path:
    for run_id, dur in (("a", 0.1), ("b", 0.2)):
        b = RunBuilder(run_id)
        loop(b, 12, [("forward", dur)])
        b.write(path).close()
    return path


def _stored(con, table: str = "attribution_runs") -> list[str]:
    return [r[0] for r in con.execute(
        f"SELECT DISTINCT run_id FROM {table} ORDER BY run_id").fetchall()]


def test_computed_once_then_fresh(tmp_path: Path) -> None:
    with connect(_two_runs(tmp_path / "t.duckdb")) as con:
        first = ensure_attribution(con)
        assert (first.runs, first.computed, first.stored, first.removed) == (
            ["a", "b"], ["a", "b"], True, [])
        assert all(_stored(con, t) == ["a", "b"] for t in TABLES)
        # 12 iterations of 100 ms: 10 it/s, stored beside the verdict
        ips, n = con.execute("SELECT iters_per_s, iterations FROM attribution_runs "
                             "WHERE run_id = 'a'").fetchall()[0]
        assert (ips, n) == (pytest.approx(10.0), 12)
        assert ensure_attribution(con).computed == []
        assert ensure_attribution(con, ["b"]).runs == ["b"]


def test_a_change_to_what_diagnosis_reads_makes_the_run_stale(tmp_path: Path) -> None:
    with connect(_two_runs(tmp_path / "t.duckdb")) as con:
        ensure_attribution(con)
        before = data_keys(con)
        con.execute("UPDATE iterations SET dur = dur * 2 WHERE run_id = 'a'")
        after = data_keys(con)
        assert after["a"] != before["a"] and after["b"] == before["b"]
        assert ensure_attribution(con).computed == ["a"]
        # the new figure: 200 ms iterations, 5 it/s
        assert con.execute("SELECT iters_per_s FROM attribution_runs WHERE run_id = 'a'"
                           ).fetchall()[0][0] == pytest.approx(5.0)


def test_a_forgotten_run_loses_its_rows(tmp_path: Path) -> None:
    with connect(_two_runs(tmp_path / "t.duckdb")) as con:
        ensure_attribution(con)
        forget_run(con, "b")
        state = ensure_attribution(con)
        assert (state.runs, state.computed, state.removed) == (["a"], [], ["b"])
        assert _stored(con) == ["a"] and _stored(con, "attribution") == ["a"]


def test_a_read_only_connection_diagnoses_in_memory(tmp_path: Path) -> None:
    path = _two_runs(tmp_path / "t.duckdb")
    with connect(path) as con:
        ensure_attribution(con, ["a"])            # a stored, b never
    with connect(path, read_only=True) as ro:
        state = ensure_attribution(ro)
        assert (state.computed, state.stored) == (["b"], False)
        # the connection's views show both: a from the database, b from memory
        assert _stored(ro) == ["a", "b"]
        assert ro.execute(f"SELECT count(*) FROM {main_prefix(ro)}attribution_runs"
                          ).fetchall()[0][0] == 1
        assert ensure_attribution(ro).computed == []
    with connect(path, read_only=True) as again:      # nothing was written
        assert again.execute("SELECT run_id FROM attribution_runs").fetchall() == [("a",)]


def test_diagnosed_in_memory_stores_nothing_on_a_writable_connection(tmp_path: Path) -> None:
    # as tlog serve's readers do: a cursor of the writable connection, in the block
    with connect(_two_runs(tmp_path / "t.duckdb")) as con:
        reader = con.cursor()
        with diagnosed_in_memory():
            assert ensure_attribution(reader).stored is False
        assert _stored(reader) == ["a", "b"]           # its own temporary views
        assert con.execute(f"SELECT count(*) FROM {main_prefix(con)}attribution_runs"
                           ).fetchall()[0][0] == 0
        reader.close()
        assert ensure_attribution(con).stored is True


def test_main_prefix_quotes_the_database_name(tmp_path: Path) -> None:
    with connect(tmp_path / 'we"ird.duckdb') as con:
        assert main_prefix(con) == '"we""ird".main.'
