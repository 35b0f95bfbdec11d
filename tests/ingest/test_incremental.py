"""Incremental ingest: growing files, partial lines, rewritten files, gzip,
duplicates across ingests, meta carried between ingests, run ids."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest
from ingest_helpers import iter_line, rows, write_lines
from tlog.ingest import ingest_lines, ingest_run
from tlog.ingest.errors import RunDirError

META = '{"type":"meta","rank":2,"stage":"drafter","worker":"d2"}'


def counts(con, run_id: str) -> dict[str, int]:
    return {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchall()[0][0]
            for t in ("iterations", "queue_samples", "events", "rejects")}


def test_growing_file_with_partial_lines(db, tmp_path: Path):
    run = tmp_path / "live"
    log = run / "rank2.jsonl"
    write_lines(log, [META, iter_line(0), iter_line(1)])
    with open(log, "a") as fh:
        fh.write(iter_line(2)[:20])            # half a line, still being written
    r1 = ingest_run(db, run)
    assert r1.records_loaded == {"iter": 2, "queue": 0, "event": 0, "meta": 1}
    assert r1.partial_lines == ["rank2.jsonl"]
    with open(log, "a") as fh:                 # the rest of line 4, two more, half of a 7th
        fh.write(iter_line(2)[20:] + "\n" + iter_line(3) + "\n" + iter_line(4) + "\n" + "{")
    r2 = ingest_run(db, run)
    assert r2.records_loaded == {"iter": 3, "queue": 0, "event": 0, "meta": 0}
    assert r2.records_rejected == 0 and r2.duplicates == 0
    assert r2.partial_lines == ["rank2.jsonl"]
    got = rows(db, "SELECT worker, iter, line FROM iterations ORDER BY line")
    assert got == [{"worker": "d2", "iter": i, "line": i + 2} for i in range(5)]
    with open(log, "a") as fh:                 # the 7th line completes, badly
        fh.write('"iter": 5}\n')
    r3 = ingest_run(db, run)
    assert r3.records_loaded["iter"] == 0
    assert r3.records_rejected == 1
    assert r3.errors == [{"file": "rank2.jsonl", "line": 7,
                          "reason": "missing required field 'ts'"}]
    assert r3.partial_lines == []
    state = rows(db, 'SELECT "offset", lines, size FROM files')
    assert state == [{"offset": log.stat().st_size, "lines": 7, "size": log.stat().st_size}]
    assert counts(db, "live") == {"iterations": 5, "queue_samples": 0, "events": 0, "rejects": 1}


def test_unchanged_and_touched_files_add_nothing(db, tmp_path: Path):
    run = tmp_path / "r"
    log = write_lines(run / "a.jsonl", [iter_line(i) for i in range(3)])
    assert ingest_run(db, run).records_loaded["iter"] == 3
    again = ingest_run(db, run)
    assert (again.files_unchanged, again.files_read, again.bytes_read) == (1, 0, 0)
    os.utime(log, (1, 1))                      # a new mtime, same bytes
    touched = ingest_run(db, run)
    assert touched.records_loaded["iter"] == 0 and touched.files_read == 1
    assert touched.bytes_read == 0 and touched.files_rewritten == []
    assert counts(db, "r")["iterations"] == 3


def test_a_file_replaced_at_its_path_is_a_new_file(db, tmp_path: Path):
    """A plain log is known by its fingerprint, not its name: another file
    written at the path is read from its start and the old one's rows stay,
    relabelled ``a.jsonl#1`` (a log shipper never deletes what it shipped)."""
    run = tmp_path / "r"
    log = write_lines(run / "a.jsonl", [META] + [iter_line(i) for i in range(4)] + ["oops"])
    first = ingest_run(db, run)
    assert (first.records_loaded["iter"], first.records_rejected) == (4, 1)
    # another file written over the same file name: other head, other records
    write_lines(log, ['{"type":"meta","rank":7,"stage":"target"}',
                      iter_line(0, dur=2.0), iter_line(1, dur=2.0)])
    second = ingest_run(db, run)
    assert second.files_rewritten == []
    assert second.files_replaced == [{"path": "a.jsonl", "old_rows_as": "a.jsonl#1"}]
    assert second.records_loaded == {"iter": 2, "queue": 0, "event": 0, "meta": 1}
    assert second.duplicates == 0
    got = rows(db, "SELECT worker, iter, dur, file FROM iterations ORDER BY file, iter")
    assert got == ([{"worker": "target-7", "iter": i, "dur": 2.0, "file": "a.jsonl"}
                    for i in range(2)]
                   + [{"worker": "d2", "iter": i, "dur": 1.0, "file": "a.jsonl#1"}
                      for i in range(4)])
    assert counts(db, "r") == {"iterations": 6, "queue_samples": 0, "events": 0, "rejects": 1}
    assert rows(db, "SELECT path, lines FROM files ORDER BY path") == [
        {"path": "a.jsonl", "lines": 3}, {"path": "a.jsonl#1", "lines": 6}]
    third = ingest_run(db, run)
    assert third.files_unchanged == 1 and third.files_replaced == []


def test_a_file_truncated_in_place_keeps_its_rows(db, tmp_path: Path):
    """Truncated and written again (copytruncate without the copy): the rows
    read before stay; the new content is a new file (its iteration 0 is a
    duplicate, kept once)."""
    run = tmp_path / "r"
    log = write_lines(run / "a.jsonl", [iter_line(i) for i in range(4)])
    ingest_run(db, run)
    write_lines(log, [iter_line(0), iter_line(4)])   # same head, shorter than the offset
    second = ingest_run(db, run)
    assert second.files_replaced == [{"path": "a.jsonl", "old_rows_as": "a.jsonl#1"}]
    assert (second.records_loaded["iter"], second.duplicates) == (1, 1)
    assert counts(db, "r")["iterations"] == 5


def test_duplicates_across_two_ingests(db, tmp_path: Path):
    run = tmp_path / "r"
    write_lines(run / "a.jsonl", [META] + [iter_line(i) for i in range(3)])
    assert ingest_run(db, run).records_loaded["iter"] == 3
    # a restarted process logs iterations 2 and 3 again in a new file
    write_lines(run / "b.jsonl", [META, iter_line(2, dur=5.0), iter_line(3)])
    second = ingest_run(db, run)
    assert second.records_loaded["iter"] == 1
    assert second.duplicates == 1
    got = rows(db, "SELECT iter, dur, file FROM iterations ORDER BY iter")
    assert got == [{"iter": 0, "dur": 1.0, "file": "a.jsonl"}, {"iter": 1, "dur": 1.0, "file": "a.jsonl"},
                   {"iter": 2, "dur": 1.0, "file": "a.jsonl"}, {"iter": 3, "dur": 1.0, "file": "b.jsonl"}]


def test_meta_defaults_carry_over_to_the_next_ingest(db, tmp_path: Path):
    run = tmp_path / "r"
    log = write_lines(run / "x.jsonl", [META, iter_line(0)])
    ingest_run(db, run)
    with open(log, "a") as fh:
        fh.write(iter_line(1) + "\n" + '{"type":"queue","name":"q","ts":1.0,"depth":2}\n')
    ingest_run(db, run)
    assert rows(db, "SELECT rank, stage, worker, iter FROM iterations ORDER BY iter") == [
        {"rank": 2, "stage": "drafter", "worker": "d2", "iter": 0},
        {"rank": 2, "stage": "drafter", "worker": "d2", "iter": 1}]
    assert rows(db, "SELECT rank, worker, depth FROM queue_samples") == [
        {"rank": 2, "worker": "d2", "depth": 2}]


def _gz(path: Path, lines: list[str], mode: str = "wb") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, mode) as fh:
        fh.write(("\n".join(lines) + "\n").encode())


def test_gzip_files_load_and_grow(db, tmp_path: Path):
    run = tmp_path / "gz"
    log = run / "rank0.jsonl.gz"
    _gz(log, [META] + [iter_line(i) for i in range(3)])
    first = ingest_run(db, run)
    assert first.records_loaded == {"iter": 3, "queue": 0, "event": 0, "meta": 1}
    assert ingest_run(db, run).files_unchanged == 1
    _gz(log, [iter_line(3), iter_line(4)], mode="ab")   # a second gzip member
    grown = ingest_run(db, run)
    assert grown.records_loaded["iter"] == 2 and grown.duplicates == 0
    assert rows(db, "SELECT worker, iter, line FROM iterations ORDER BY iter") == [
        {"worker": "d2", "iter": i, "line": i + 2} for i in range(5)]
    assert rows(db, "SELECT source FROM files") == [{"source": "jsonl.gz"}]
    _gz(log, ['{"type":"meta","rank":1}', iter_line(9)])  # rewritten
    again = ingest_run(db, run)
    assert again.files_rewritten == ["rank0.jsonl.gz"]
    assert rows(db, "SELECT worker, iter FROM iterations") == [{"worker": "main-1", "iter": 9}]


def test_truncated_gzip_loads_what_is_complete(db, tmp_path: Path):
    run = tmp_path / "gz"
    full = tmp_path / "full.gz"
    _gz(full, [iter_line(i) for i in range(200)])
    data = full.read_bytes()
    (run).mkdir()
    (run / "a.jsonl.gz").write_bytes(data[: len(data) - 10])  # the writer was killed
    report = ingest_run(db, run)
    assert 0 < report.records_loaded["iter"] <= 200
    assert report.records_rejected == 0


def test_ingest_lines_seam(db):
    lines = [META, iter_line(0), iter_line(1)]
    first = ingest_lines(db, "conv", "trace0.pt.trace.json", lines, source="kineto")
    assert first.records_loaded == {"iter": 2, "queue": 0, "event": 0, "meta": 1}
    assert ingest_lines(db, "conv", "trace0.pt.trace.json", lines,
                        source="kineto").records_total == 0
    more = ingest_lines(db, "conv", "trace0.pt.trace.json", lines + [iter_line(2)],
                        source="kineto")
    assert more.records_loaded["iter"] == 1
    assert rows(db, "SELECT run_id, source, root FROM runs") == [
        {"run_id": "conv", "source": "kineto", "root": "trace0.pt.trace.json"}]
    assert rows(db, "SELECT worker, iter, file FROM iterations ORDER BY iter") == [
        {"worker": "d2", "iter": i, "file": "trace0.pt.trace.json"} for i in range(3)]


def test_registered_source_decodes_other_files(db, tmp_path: Path):
    from tlog.ingest.sources import Source, register_source, unregister_source

    def find(root: Path) -> list[Path]:
        return sorted(root.rglob("*.csvlog"))

    def decode(path: Path):
        for row in path.read_text().splitlines():       # "iter,dur" rows -> v1 lines
            i, dur = row.split(",")
            yield iter_line(int(i), dur=float(dur)) + "\n"

    register_source(Source(kind="csvlog", find=find, decode=decode, run_source="kineto"))
    try:
        run = tmp_path / "csv"
        run.mkdir()
        (run / "w.csvlog").write_text("0,1.5\n1,2.5\n")
        report = ingest_run(db, run)
        assert report.source == "kineto" and report.records_loaded["iter"] == 2
        assert rows(db, "SELECT iter, dur FROM iterations ORDER BY iter") == [
            {"iter": 0, "dur": 1.5}, {"iter": 1, "dur": 2.5}]
        (run / "w.csvlog").write_text("0,1.5\n1,2.5\n2,0.5\n")   # grew
        assert ingest_run(db, run).records_loaded["iter"] == 1
    finally:
        unregister_source("csvlog")


def test_same_run_id_from_another_directory(db, tmp_path: Path):
    a = tmp_path / "a" / "out"
    b = tmp_path / "b" / "out"
    write_lines(a / "rank0.jsonl", [iter_line(0)])
    write_lines(b / "rank0.jsonl", [iter_line(5, dur=3.0)])
    ingest_run(db, a)
    with pytest.raises(RunDirError, match="already in the database for .*--run-id"):
        ingest_run(db, b)
    assert ingest_run(db, b, run_id="out-b").records_loaded["iter"] == 1
    moved = tmp_path / "moved" / "out"              # the same run, moved: allowed
    shutil.copytree(a, moved)
    assert ingest_run(db, moved).records_loaded["iter"] == 0
    assert rows(db, "SELECT root FROM runs WHERE run_id = 'out'") == [{"root": str(moved)}]


def test_a_new_run_reusing_an_id_before_it_logs_cannot_take_the_old_one_over(
        db, tmp_path: Path):
    """A new run directory whose run.json reuses an existing run id, ingested
    before it has logs (the shim writes run.json first), used to take the run
    over (root, name, kinds), and its first log then 'rewrote' the old run's
    file of the same name: the old iterations were deleted."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_lines(a / "rank0.jsonl", [iter_line(i) for i in range(5)])
    (a / "run.json").write_text('{"run_id": "exp"}')
    b.mkdir()
    (b / "run.json").write_text('{"run_id": "exp", "name": "other"}')
    ingest_run(db, a)
    with pytest.raises(RunDirError, match="'exp' is already in the database for .*--run-id"):
        ingest_run(db, b)
    write_lines(b / "rank0.jsonl", [iter_line(i, dur=3.0) for i in range(3)])
    with pytest.raises(RunDirError, match="already in the database"):
        ingest_run(db, b)
    assert rows(db, "SELECT root, name FROM runs") == [{"root": str(a), "name": None}]
    assert rows(db, "SELECT count(*) AS n, max(dur) AS d FROM iterations") == [
        {"n": 5, "d": 1.0}]


def test_manifest_run_id_and_empty_run(db, tmp_path: Path):
    run = tmp_path / "dir-name"
    run.mkdir()
    (run / "run.json").write_text('{"run_id": "from-manifest", "world_size": 4}')
    report = ingest_run(db, run)                    # a run that has not logged yet
    assert report.run_id == "from-manifest" and report.records_total == 0
    assert rows(db, "SELECT run_id, world_size FROM runs") == [
        {"run_id": "from-manifest", "world_size": 4}]


def test_the_same_files_through_another_root_are_not_renamed(db, tmp_path: Path):
    """Ingesting runs/a once and runs/a/tlog (where the logs are) later, or the
    other way round, reaches the same files: their paths are re-based, nothing is
    reported renamed, nothing is read twice (a new user saw 'found renamed
    (rotated)' flip on every call)."""
    outer = tmp_path / "a"
    log = write_lines(outer / "tlog" / "rank0.jsonl", [iter_line(i) for i in range(5)])
    first = ingest_run(db, outer, run_id="a")
    assert first.records_loaded["iter"] == 5
    inner = ingest_run(db, outer / "tlog", run_id="a")
    assert inner.files_moved == [] and inner.records_loaded["iter"] == 0
    assert any("the same files, now read from" in w for w in inner.warnings)
    assert rows(db, "SELECT path FROM files") == [{"path": "rank0.jsonl"}]
    with log.open("a") as f:                       # the log grows: read from its offset
        f.write(iter_line(5) + "\n")
    back = ingest_run(db, outer, run_id="a")
    assert back.files_moved == [] and back.records_loaded["iter"] == 1
    assert rows(db, "SELECT path FROM files") == [{"path": "tlog/rank0.jsonl"}]
    assert counts(db, "a")["iterations"] == 6
    assert rows(db, "SELECT DISTINCT file FROM iterations") == [{"file": "tlog/rank0.jsonl"}]
