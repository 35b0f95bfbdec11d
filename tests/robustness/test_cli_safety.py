"""Nothing from a log acts, every command survives one bad run, honest errors
, through the real CLI.

Before: ESC/OSC in phase, stage and file names reached the terminal, a newline
in a name forged a ``Bottleneck:`` line; ``tlog runs`` failed for the whole
database over one run's ``started``; there was no way to remove a run; a full
file-size limit read "internal error ... a bug in tlog"; ``--db`` on a FIFO
hung; a reader failed at once while an ingest held the database.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ingest_helpers import ROOT, iter_line, write_lines
from tlog.ingest import connect

from tests.support.cli import invoke
from tlog.app import shown


def _tlog(*args: str | Path):
    return invoke([str(a) for a in args])


def _run(tmp_path: Path, name: str = "r", lines: list[str] | None = None) -> Path:
    run = tmp_path / name
    write_lines(run / "rank0.jsonl", lines or [iter_line(i) for i in range(30)])
    return run


def test_shown_escapes_every_control_character_visibly() -> None:
    assert shown("a\x1b]52;c;aGk=\x07b") == "a\\x1b]52;c;aGk=\\x07b"
    assert shown("x\nBottleneck: y\r\t") == "x\\nBottleneck: y\\r\\t"
    assert shown("p\u2028q\u202er\x9b") == "p\\u2028q\\u202er\\x9b"
    assert shown("[red]x[/] [link=file:///etc]y") == "[red]x[/] [link=file:///etc]y"


def test_hostile_names_are_inert_in_diagnose_and_ingest(tmp_path: Path) -> None:
    """Stage, worker and phase names with ESC, OSC 52, BEL and a forged line;
    a run id with rich markup: printed escaped and as written, never acting."""
    forged = "s\nBottleneck: forged"
    lines = [json.dumps({"type": "meta", "stage": forged, "worker": "w\x1b]52;c;aGk=\x07"})]
    lines += [json.dumps({"iter": i, "ts": 1000.0 + i, "dur": 1.0,
                          "phases": {"\x1b[2Jload": 0.6, "[red]fwd[/]": 0.3}})
              for i in range(30)]
    run = _run(tmp_path, "d\x1b[31m", lines)
    db = tmp_path / "t.duckdb"
    rid = "nightly[/][link=https://x]"
    ingested = _tlog("ingest", "--db", db, "--run-id", rid, run)
    assert ingested.exit_code == 0, ingested.output
    for cmd in (["diagnose", "--run", rid], ["runs"], ["ingest", "--run-id", rid, run]):
        result = _tlog(*cmd[:1], "--db", db, *cmd[1:])
        assert result.exit_code == 0, (cmd, result.output)
        out = result.output
        assert "\x1b" not in out and "\x07" not in out, (cmd, out)
        assert not any(line.startswith("Bottleneck: forged") for line in out.splitlines())
    diag = _tlog("diagnose", "--db", db, "--run", rid).output
    assert "s\\nBottleneck: forged" in diag
    assert "\\x1b[2Jload" in diag


def test_forget_removes_one_run_and_needs_yes(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    for name in ("a", "b"):
        assert _tlog("ingest", "--db", db, _run(tmp_path, name)).exit_code == 0
    dry = _tlog("forget", "--db", db, "a")
    assert dry.exit_code == 2 and "would remove run a (30 iterations, 0 rejects)" in dry.stderr
    done = _tlog("forget", "--db", db, "--yes", "a")
    assert done.exit_code == 0, done.output
    assert "Removed run a: 30 iterations" in done.stdout
    con = connect(db, read_only=True)
    try:
        assert con.execute("SELECT run_id, count(*) FROM iterations GROUP BY run_id"
                           ).fetchall() == [("b", 30)]
        for table in ("runs", "files", "workers", "phase_layouts"):
            assert con.execute(f"SELECT count(*) FROM {table} WHERE run_id = 'a'"
                               ).fetchall()[0][0] == 0
    finally:
        con.close()
    missing = _tlog("forget", "--db", db, "--yes", "a")
    assert missing.exit_code == 1 and "no run 'a'" in missing.stderr
    again = _tlog("ingest", "--db", db, tmp_path / "a")       # loads again from its logs
    assert again.exit_code == 0 and "loaded 30 iter" in again.stdout


def test_runs_survives_one_run_with_an_impossible_start(tmp_path: Path) -> None:
    """A run stored before ingest checked ``started`` (or edited by SQL)."""
    db = tmp_path / "t.duckdb"
    for name in ("a", "b"):
        assert _tlog("ingest", "--db", db, _run(tmp_path, name)).exit_code == 0
    con = connect(db)
    con.execute("UPDATE runs SET started = -1e18 WHERE run_id = 'a'")
    con.close()
    result = _tlog("runs", "--db", db)
    assert result.exit_code == 0, result.output
    assert "-1e+18 (not a date)" in result.stdout and "1970-01-01" in result.stdout


def test_run_json_started_out_of_range_is_a_warning(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "run.json").write_text('{"started": -1e18}')
    db = tmp_path / "t.duckdb"
    result = _tlog("ingest", "--db", db, run)
    assert result.exit_code == 0, result.output
    assert "field 'started' (-1e+18) negative for epoch seconds" in result.stdout
    con = connect(db, read_only=True)
    assert con.execute("SELECT started FROM runs").fetchall() == [(1000.0,)]  # first ts
    con.close()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_db_on_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "db.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    for cmd in (["runs"], ["ingest", _run(tmp_path)]):
        result = _tlog(cmd[0], "--db", fifo, *cmd[1:])
        assert result.exit_code == 1
        assert "not a regular file" in result.stderr and "Traceback" not in result.output
    assert time.monotonic() - started < 10


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # write() fails with EFBIG instead


def test_file_size_limit_is_its_own_error(tmp_path: Path) -> None:
    run = _run(tmp_path, lines=[iter_line(i) for i in range(3000)])
    proc = subprocess.run([sys.executable, "-m", "tlog", "ingest", "--db",
                           str(tmp_path / "t.duckdb"), str(run)], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_file_size)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tlog: error: "), proc.stderr
    assert "file too large" in lines[0] and "a bug in tlog" not in lines[0]


def test_a_reader_waits_for_a_writer_then_names_it(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tlog.ingest import db as dbmod

    # the default (15 s) outlasts a stored diagnosis of a 1M-iteration run; 5 s here
    # keeps the test short
    monkeypatch.setattr(dbmod, "READ_WAIT_S", 5.0)
    db = tmp_path / "t.duckdb"
    assert _tlog("ingest", "--db", db, _run(tmp_path)).exit_code == 0
    hold = ("import sys, time, duckdb; c = duckdb.connect(sys.argv[1]); print('held', "
            "flush=True); time.sleep(float(sys.argv[2]))")
    # held for 1.5 s: the reader waits and succeeds
    holder = subprocess.Popen([sys.executable, "-c", hold, str(db), "1.5"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    waited = _tlog("runs", "--db", db)
    assert waited.exit_code == 0, waited.output
    assert time.monotonic() - started >= 0.5
    holder.wait(timeout=30)
    # held past the wait: one line naming the holder's PID
    holder = subprocess.Popen([sys.executable, "-c", hold, str(db), "20"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        failed = _tlog("runs", "--db", db)
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert failed.exit_code == 1
    assert f"held by PID {holder.pid}" in failed.stderr and "waited 5 s" in failed.stderr
    assert 4.5 <= took < 15
