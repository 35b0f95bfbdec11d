"""``ingest.batch``: what the load stage makes of the parsed lines: each file's
``meta`` defaults (also changed mid-file), phase layouts shared by the iterations
that have the same phases, the machine and the files' state."""

from __future__ import annotations

import json
from pathlib import Path

from tlog.ingest import connect, ingest_run
from tlog.ingest.batch import ensure_macros

from tests.support.runs import iter_line, write_lines


def _meta(**kw) -> str:
    return json.dumps({"type": "meta", **kw})


def test_meta_defaults_apply_to_the_lines_after_them(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_lines(run / "a.jsonl", [_meta(rank=1, stage="target", worker="t1", host="h1"),
                                  iter_line(0), iter_line(1),
                                  _meta(stage="drafter"),         # from here on
                                  iter_line(2),
                                  iter_line(3, worker="w9")])     # a record's own field wins
    with connect(tmp_path / "t.duckdb") as con:
        ingest_run(con, run)
        rows = con.execute("SELECT iter, rank, stage, worker FROM iterations ORDER BY iter"
                           ).fetchall()
        assert rows == [(0, 1, "target", "t1"), (1, 1, "target", "t1"),
                        (2, 1, "drafter", "t1"), (3, 1, "drafter", "w9")]


def test_a_record_with_its_own_rank_or_stage_is_its_own_worker(tmp_path: Path) -> None:
    """docs/FORMAT.md: the meta's worker is the default of records that keep the
    meta's rank and stage; one naming another rank or stage is ``<stage>-<rank>``."""
    run = tmp_path / "r"
    write_lines(run / "a.jsonl", [_meta(rank=3, stage="target", worker="tw"),
                                  iter_line(0), iter_line(1, rank=5),
                                  iter_line(2, stage="drafter")])
    with connect(tmp_path / "t.duckdb") as con:
        ingest_run(con, run)
        rows = con.execute("SELECT iter, rank, stage, worker FROM iterations ORDER BY iter"
                           ).fetchall()
        assert rows == [(0, 3, "target", "tw"), (1, 5, "target", "target-5"),
                        (2, 3, "drafter", "drafter-3")]


def test_iterations_with_the_same_phases_share_a_layout(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_lines(run / "a.jsonl", [
        iter_line(0), iter_line(1),                            # hs_get, forward
        json.dumps({"iter": 2, "ts": 1002.0, "dur": 1.0, "phases": {"forward": 0.5}}),
        json.dumps({"iter": 3, "ts": 1003.0, "dur": 1.0, "phases": {"hs_get": 0.1},
                    "kinds": {"hs_get": "sync"}})])            # same name, given kind
    with connect(tmp_path / "t.duckdb") as con:
        ingest_run(con, run)
        layouts = con.execute("SELECT layout, list(phase ORDER BY seq), "
                              "list(category ORDER BY seq) FROM phase_layouts "
                              "GROUP BY layout ORDER BY layout").fetchall()
        assert [(names, cats) for _, names, cats in layouts] == [
            (["hs_get", "forward"], ["starvation", "compute"]), (["forward"], ["compute"]),
            (["hs_get"], ["sync"])]
        per_iter = con.execute("SELECT iter, phase_host_s FROM iterations ORDER BY iter"
                               ).fetchall()
        assert per_iter == [(0, [0.25, 0.5]), (1, [0.25, 0.5]), (2, [0.5]), (3, [0.1])]


def test_the_machine_and_the_files_state(tmp_path: Path) -> None:
    run = tmp_path / "r"
    log = write_lines(run / "a.jsonl", [
        _meta(rank=0, machine={"host": "box", "cpu_model": "EPYC", "ncpu": 8}), iter_line(0)])
    with connect(tmp_path / "t.duckdb") as con:
        ingest_run(con, run)
        assert con.execute("SELECT host, cpu_model, ncpu FROM machines").fetchall() == [
            ("box", "EPYC", 8)]
        assert con.execute('SELECT path, "offset", lines FROM files').fetchall() == [
            ("a.jsonl", log.stat().st_size, 2)]


def test_macros_are_made_once(tmp_path: Path) -> None:
    with connect(tmp_path / "t.duckdb") as con:
        ensure_macros(con)
        ensure_macros(con)          # nothing to do the second time
        names = {r[0] for r in con.execute("SELECT function_name FROM duckdb_functions() "
                                           "WHERE function_type = 'macro'").fetchall()}
        assert names
