"""Crash safety (kill -9 mid-ingest) and concurrent ingests on one database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from ingest_helpers import iter_line, write_lines
from tlog.ingest import connect, ingest_run
from tlog.ingest.errors import DatabaseLockedError

ROOT = Path(__file__).resolve().parents[2]
FILES, PER_FILE = 6, 400


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "big"
    for f in range(FILES):
        write_lines(run / f"rank{f}.jsonl",
                    [f'{{"type":"meta","rank":{f},"stage":"drafter"}}']
                    + [iter_line(i) for i in range(PER_FILE)] + ["not json"])
    return run


def _child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"child ended early: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("child did not get going")
        time.sleep(0.01)


def test_kill_9_mid_ingest_then_ingest_again(tmp_path: Path):
    run, db = _run(tmp_path), tmp_path / "crash.duckdb"
    marker = tmp_path / "one-batch-done"
    # Small batches (about one file each), a marker after the first commit,
    # then the child keeps going until it is killed.
    child = _child("""
        import sys, pathlib
        from tlog.ingest import connect, ingest_run
        con = connect(sys.argv[2])
        def progress(p):
            pathlib.Path(sys.argv[3]).touch()
        ingest_run(con, sys.argv[1], chunk_bytes=4096, progress=progress)
        """, str(run), str(db), str(marker))
    _wait_for(marker, child)
    time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    con = connect(db)
    try:
        # whatever committed is whole: each file's offset matches its records exactly
        state = con.execute('SELECT path, lines FROM files').fetchall()
        for path, lines in state:
            n_iter = con.execute("SELECT count(*), coalesce(max(line), 0) FROM iterations "
                                 "WHERE file = ?", [path]).fetchall()[0]
            n_rej = con.execute("SELECT count(*) FROM rejects WHERE file = ?",
                                [path]).fetchall()[0][0]
            # lines 2..PER_FILE+1 are iter records, line PER_FILE+2 is the reject
            assert n_iter[0] == min(max(lines - 1, 0), PER_FILE)
            assert n_rej == (1 if lines == PER_FILE + 2 else 0)
        loaded_before = con.execute("SELECT count(*) FROM iterations").fetchall()[0][0]
        assert loaded_before < FILES * PER_FILE, "the child finished before it was killed"
        report = ingest_run(con, run)
        assert report.duplicates == 0
        assert report.records_loaded["iter"] == FILES * PER_FILE - loaded_before
        assert con.execute("SELECT count(*) FROM iterations").fetchall()[0][0] == FILES * PER_FILE
        assert con.execute("SELECT count(*) FROM rejects").fetchall()[0][0] == FILES
        assert con.execute("SELECT count(DISTINCT (rank, iter)) FROM iterations"
                           ).fetchall()[0][0] == FILES * PER_FILE
    finally:
        con.close()


HOLD = """
    import sys, time, pathlib
    from tlog.ingest import connect
    con = connect(sys.argv[1])
    pathlib.Path(sys.argv[2]).touch()
    deadline = time.monotonic() + 60
    while not pathlib.Path(sys.argv[3]).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    con.close()
    """


def test_second_ingest_waits_for_the_lock_or_fails_clearly(tmp_path: Path):
    run, db = _run(tmp_path), tmp_path / "shared.duckdb"
    held, release = tmp_path / "held", tmp_path / "release"
    holder = _child(HOLD, str(db), str(held), str(release))
    _wait_for(held, holder)
    t = time.monotonic()
    with pytest.raises(DatabaseLockedError, match="in use by another tlog process"):
        connect(db, wait_s=0.2)
    assert time.monotonic() - t < 5
    threading.Timer(1.0, release.touch).start()
    con = connect(db, wait_s=30)        # waits until the holder lets go
    try:
        assert holder.wait(timeout=30) == 0
        report = ingest_run(con, run)
        assert report.records_loaded["iter"] == FILES * PER_FILE
    finally:
        con.close()


def test_cli_ingest_while_locked(tmp_path: Path):
    run, db = _run(tmp_path), tmp_path / "shared.duckdb"
    held, release = tmp_path / "held", tmp_path / "release"
    tlog = [sys.executable, "-m", "tlog", "ingest", str(run), "--db", str(db)]
    holder = _child(HOLD, str(db), str(held), str(release))
    _wait_for(held, holder)
    fast = subprocess.run(tlog + ["--wait", "0"], check=False, cwd=ROOT, capture_output=True, text=True)
    assert fast.returncode == 1
    assert fast.stderr.strip().count("\n") == 0
    assert fast.stderr.startswith("tlog: error: database ") and "in use" in fast.stderr
    proc = subprocess.Popen(tlog + ["--wait", "60"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(5)                       # it starts, finds the lock, says it waits ...
    release.touch()                                                  # ... then gets in
    out, rest = proc.communicate(timeout=60)
    assert holder.wait(timeout=30) == 0
    waited = subprocess.CompletedProcess(proc.args, proc.returncode, out, rest)
    assert waited.returncode == 0, waited.stderr
    assert "in use by another tlog process; waiting up to 60 s" in waited.stderr
    assert "loaded 2,400 iter, 0 queue, 0 event, 6 meta" in waited.stdout
