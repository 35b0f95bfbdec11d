"""The machine fails, not tlog: disk full, file-size limit, out of memory and a
damaged database each get their own one line with what to do, never
"internal error ... a bug in tlog", and exit code 1.

The damaged database is real (bytes overwritten in a written file); a full disk
and an exhausted memory are raised where ingest writes, through the real CLI and
its one error handler (a real ENOSPC needs a full file system; the file-size
limit is real in test_cli_safety.py)."""

from __future__ import annotations

import errno

import duckdb
import pytest
import tlog.ingest.run as ingest_cmd  # the CLI calls ingest_run from there
from ingest_helpers import iter_line, write_lines
from tlog.ingest import connect, ingest_run

from tests.support.cli import assert_one_line_error, invoke


def _one_error_line(result) -> str:
    line = assert_one_line_error(result, 1)
    assert "bug in tlog" not in line
    return line


@pytest.mark.parametrize(("exc", "says"), [
    (OSError(errno.ENOSPC, "No space left on device", "/data/t.duckdb.wal"),
     "disk full (no space left on device) writing /data/t.duckdb.wal: free space"),
    (duckdb.IOException("IO Error: Could not write file: No space left on device"),
     "disk full (no space left on device)"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/data/t.duckdb"), "disk quota exceeded"),
    (MemoryError(), "out of memory: close other programs"),
    (duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block of size 256 KiB"),
     "out of memory"),
])
def test_a_failing_machine_is_its_own_one_line(tmp_path, monkeypatch, exc, says) -> None:
    run = tmp_path / "r"
    write_lines(run / "rank0.jsonl", [iter_line(i) for i in range(3)])

    def fail(*_a, **_k):
        raise exc

    monkeypatch.setattr(ingest_cmd, "ingest_run", fail)
    line = _one_error_line(invoke(["ingest", str(run),
                                   "--db", str(tmp_path / "t.duckdb")]))
    assert says in line


def test_a_damaged_database_file_says_so(tmp_path) -> None:
    db = tmp_path / "t.duckdb"
    run = tmp_path / "r"
    write_lines(run / "rank0.jsonl", [iter_line(i) for i in range(2000)])
    with connect(db) as con:
        ingest_run(con, run)
    size = db.stat().st_size
    with db.open("r+b") as f:          # overwrite the blocks after the file header
        f.seek(12288)
        f.write(b"\xa5" * (size - 12288))
    result = invoke(["runs", "--db", str(db)])
    line = _one_error_line(result)
    assert "looks damaged (Corrupt database file" in line, line
    assert "move it away and ingest the runs again into a new one" in line
