"""File identity like a log shipper's: rotated, truncated and
replaced logs keep every row exactly once.

Before: ``rank0.jsonl`` renamed to ``rank0.1.jsonl`` and a fresh
``rank0.jsonl`` started left only the fresh file's rows (the renamed copy's
records were "duplicates", then the "rewritten" ``rank0.jsonl``'s rows were
deleted); copytruncate deleted the rows already loaded; a file replaced during
an ingest stored the new file's fingerprint with the old file's offset.

Counts are the test's own: each file holds iterations numbered by the test.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ingest_helpers import iter_line, write_lines
from tlog.ingest import connect, ingest_run

#: Lines of ~100 bytes: 200 of them are well past the 4 KiB fingerprint.
N = 200


def _lines(lo: int, hi: int) -> list[str]:
    return [iter_line(i) for i in range(lo, hi)]


def _iters(con) -> list[int]:
    return [r[0] for r in con.execute("SELECT iter FROM iterations ORDER BY iter").fetchall()]


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def test_rename_rotation_keeps_every_row(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = write_lines(run / "rank0.jsonl", _lines(0, N))
    con = connect(tmp_path / "t.duckdb")
    try:
        assert ingest_run(con, run).records_loaded["iter"] == N
        _append(log, _lines(N, N + 10))           # written after the ingest, before rotation
        log.rename(run / "rank0.1.jsonl")
        write_lines(run / "rank0.jsonl", _lines(N + 10, N + 60))
        second = ingest_run(con, run)
        assert second.files_moved == [{"from": "rank0.jsonl", "to": "rank0.1.jsonl"}]
        assert second.records_loaded["iter"] == 60 and second.duplicates == 0
        assert _iters(con) == list(range(N + 60))
        by_file = dict(con.execute("SELECT file, count(*) FROM iterations GROUP BY file"
                                   ).fetchall())
        assert by_file == {"rank0.1.jsonl": N + 10, "rank0.jsonl": 50}
        # a second rotation: rank0.1 -> rank0.2, rank0 -> rank0.1, a fresh rank0
        (run / "rank0.1.jsonl").rename(run / "rank0.2.jsonl")
        (run / "rank0.jsonl").rename(run / "rank0.1.jsonl")
        write_lines(run / "rank0.jsonl", _lines(N + 60, N + 70))
        third = ingest_run(con, run)
        assert sorted(m["to"] for m in third.files_moved) == ["rank0.1.jsonl", "rank0.2.jsonl"]
        assert third.records_loaded["iter"] == 10 and third.duplicates == 0
        assert _iters(con) == list(range(N + 70))
        # the oldest rotated away (deleted): its rows stay
        (run / "rank0.2.jsonl").unlink()
        assert ingest_run(con, run).records_total == 0
        assert len(_iters(con)) == N + 70
    finally:
        con.close()


def test_copytruncate_keeps_every_row(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = write_lines(run / "rank0.jsonl", _lines(0, N))
    con = connect(tmp_path / "t.duckdb")
    try:
        ingest_run(con, run)
        _append(log, _lines(N, N + 5))
        shutil.copyfile(log, run / "rank0.1.jsonl")    # logrotate copytruncate
        with open(log, "r+b") as fh:
            fh.truncate(0)
        _append(log, _lines(N + 5, N + 25))
        second = ingest_run(con, run)
        assert second.files_moved == [{"from": "rank0.jsonl", "to": "rank0.1.jsonl"}]
        assert second.records_loaded["iter"] == 25 and second.duplicates == 0
        assert _iters(con) == list(range(N + 25))
        assert ingest_run(con, run).records_total == 0
    finally:
        con.close()


def test_a_file_replaced_mid_read_keeps_its_rows_and_the_new_file_loads(tmp_path: Path) -> None:
    """The path is replaced (another file renamed over it) after the first
    batch: the ingest finishes the file it opened and stores that file's
    fingerprint; the next ingest reads the new file from its start."""
    run = tmp_path / "run"
    log = write_lines(run / "rank0.jsonl", _lines(0, N))
    other = write_lines(tmp_path / "other.jsonl", ['{"type":"meta","rank":1}'] + _lines(0, 30))
    swapped = []

    def swap(_progress) -> None:
        if not swapped:
            os.replace(other, log)
            swapped.append(True)

    con = connect(tmp_path / "t.duckdb")
    try:
        first = ingest_run(con, run, chunk_bytes=4096, progress=swap)
        assert swapped and first.records_loaded["iter"] == N
        second = ingest_run(con, run)
        assert second.files_replaced == [{"path": "rank0.jsonl", "old_rows_as": "rank0.jsonl#1"}]
        assert second.records_loaded["iter"] == 30 and second.duplicates == 0
        got = con.execute("SELECT rank, count(*), min(iter), max(iter) FROM iterations "
                          "GROUP BY rank ORDER BY rank").fetchall()
        assert got == [(0, N, 0, N - 1), (1, 30, 0, 29)]
        assert ingest_run(con, run).records_total == 0
    finally:
        con.close()
