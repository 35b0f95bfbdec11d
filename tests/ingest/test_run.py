"""``ingest.run``: a run directory loaded, again incrementally, reloaded,
forgotten; the shim's drop counts and the rejected lines summed up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tlog.ingest import connect, ingest_run
from tlog.ingest.errors import RunDirError, RunNotFoundError
from tlog.ingest.run import (
    forget_run,
    ingest_lines,
    shim_drops,
    stored_shim_drops,
    summarize_reasons,
)

from tests.support.runs import iter_line, write_lines


def _count(con, table: str = "iterations") -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]


def test_load_then_only_what_is_new(tmp_path: Path) -> None:
    run = tmp_path / "nightly"
    log = write_lines(run / "rank0.jsonl", [iter_line(i) for i in range(5)])
    with connect(tmp_path / "t.duckdb") as con:
        first = ingest_run(con, run)
        assert (first.run_id, first.root) == ("nightly", str(run.resolve()))
        assert first.records_loaded["iter"] == 5 and first.files_read == 1
        assert first.bytes_read == log.stat().st_size
        again = ingest_run(con, run)                      # nothing new
        assert again.records_loaded["iter"] == 0 and again.files_unchanged == 1
        with log.open("a") as f:
            f.write(iter_line(5) + "\n" + iter_line(6))     # the last line not finished
        grown = ingest_run(con, run)
        assert grown.records_loaded["iter"] == 1 and grown.partial_lines == ["rank0.jsonl"]
        assert _count(con) == 6
        # reload: forgotten and loaded again from the logs
        assert ingest_run(con, run, reload=True).records_loaded["iter"] == 6
        assert _count(con) == 6


def test_the_run_id_from_run_json_or_the_argument(tmp_path: Path) -> None:
    run = write_lines(tmp_path / "dir" / "rank0.jsonl", [iter_line(0)]).parent
    (run / "run.json").write_text(json.dumps({"v": 1, "run_id": "from-json"}))
    with connect(tmp_path / "t.duckdb") as con:
        assert ingest_run(con, run).run_id == "from-json"
        assert ingest_run(con, run, run_id="given").run_id == "given"


def test_a_run_id_of_another_directory_is_refused(tmp_path: Path) -> None:
    a = write_lines(tmp_path / "a" / "rank0.jsonl", [iter_line(0)]).parent
    # another run's log (a copy of a's would be the same run, moved)
    b = write_lines(tmp_path / "b" / "rank0.jsonl", [iter_line(7)]).parent
    with connect(tmp_path / "t.duckdb") as con:
        ingest_run(con, a, run_id="same")
        with pytest.raises(RunDirError, match=f"run id 'same' is already in the database for "
                                              f"{a.resolve()}; give this run another id"):
            ingest_run(con, b, run_id="same")


def test_ingest_lines_is_a_virtual_file(tmp_path: Path) -> None:
    with connect(tmp_path / "t.duckdb") as con:
        lines = [json.dumps({"type": "meta", "rank": 3, "stage": "s"}), iter_line(0),
                 iter_line(1)]
        r = ingest_lines(con, "mem", "virtual.jsonl", lines)
        assert r.records_loaded["iter"] == 2
        assert ingest_lines(con, "mem", "virtual.jsonl", lines).records_loaded["iter"] == 0
        assert con.execute("SELECT DISTINCT rank, stage FROM iterations").fetchall() == [(3, "s")]


def test_forget_run(tmp_path: Path) -> None:
    run = write_lines(tmp_path / "r" / "rank0.jsonl", [iter_line(i) for i in range(4)]).parent
    with connect(tmp_path / "t.duckdb") as con:
        ingest_run(con, run)
        counts = forget_run(con, "r")
        assert counts["iterations"] == 4 and counts["runs"] == 1 and counts["files"] == 1
        assert _count(con) == 0 and _count(con, "runs") == 0
        with pytest.raises(RunNotFoundError, match="no run 'r' in the database .it is empty."):
            forget_run(con, "r")


def test_shim_drops_in_words(tmp_path: Path) -> None:
    assert shim_drops({"extra": {"records_dropped": 1200, "iters_dropped": 30}}) == (
        "the shim dropped 1,200 records (30 iterations) of this log (its queue was full or "
        "its file could not be written): figures rest on the records it kept")
    assert shim_drops({"extra": {"records_dropped": 0}}) is None
    assert shim_drops({"extra": {"records_dropped": True}}) is None
    assert shim_drops(None) is None
    run = write_lines(tmp_path / "r" / "rank0.jsonl", [
        iter_line(0), json.dumps({"type": "meta", "records_dropped": 5, "iters_dropped": 2})
    ]).parent
    with connect(tmp_path / "t.duckdb") as con:
        ingest_run(con, run)
        assert stored_shim_drops(con, "r") == [
            ("rank0.jsonl: the shim dropped 5 records (2 iterations) of this log (its queue was "
            "full or its file could not be written): figures rest on the records it kept")]


def test_summarize_reasons_most_frequent_first(tmp_path: Path) -> None:
    run = write_lines(tmp_path / "r" / "rank0.jsonl",
                      [iter_line(0), "nope", "[1]", "also nope", iter_line(1)]).parent
    with connect(tmp_path / "t.duckdb") as con:
        report = ingest_run(con, run)
    assert [(code, n) for code, n, _ in summarize_reasons(report)] == [("not_json", 2),
                                                                       ("not_object", 1)]
    assert summarize_reasons(report)[0][2].startswith("the line is not JSON")


def test_check_run_dir_and_run_dirs_under(tmp_path: Path) -> None:
    """The run id a directory would load under (its name, or run.json's), the
    checks before loading, and a folder's subdirectories by name (hidden ones
    and files left out)."""
    from tlog.ingest.errors import RunDirError
    from tlog.ingest.run import check_run_dir, run_dirs_under

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rank0.jsonl").write_text('{"iter": 0, "ts": 1.0, "dur": 1.0}\n')
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run.json").write_text('{"v": 1, "run_id": "named"}')
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "file.txt").write_text("x")
    assert run_dirs_under(tmp_path) == [tmp_path / "a", tmp_path / "b"]
    assert [check_run_dir(d) for d in run_dirs_under(tmp_path)] == ["named", "b"]
    with pytest.raises(RunDirError, match="no logs under"):
        check_run_dir(tmp_path / ".hidden")
    with pytest.raises(RunDirError, match="does not exist: give the folder"):
        run_dirs_under(tmp_path / "nope")
    # a folder with a run's own files is one run (logs in per-node folders): not split
    (tmp_path / "rank1.jsonl").write_text('{"iter": 0, "ts": 1.0, "dur": 1.0}\n')
    with pytest.raises(RunDirError, match=r"holds a run's own files \(rank1.jsonl\): it is "
                                          r"one run.*without --each"):
        run_dirs_under(tmp_path)
    (tmp_path / "rank1.jsonl").unlink()
    (tmp_path / "run.json").write_text('{"v": 1, "run_id": "multi-node"}')
    with pytest.raises(RunDirError, match=r"\(run.json\)"):
        run_dirs_under(tmp_path)
