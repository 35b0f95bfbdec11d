"""Symbolic links and permissions in a run directory.

- A symbolic link out of the run directory is never followed: nothing of what
  it points to reaches ``rejects``, the screen, or a Parquet export; each such
  link is named once per ingest in a warning.
- A link to a file inside the run directory is fine: each file is read once
  (under its own name when both are found).
- A file or directory that cannot be read is named in a warning (printed by
  ``tlog ingest``, in the report's ``warnings``), never skipped silently, and
  is loaded in full by the ingest after its permissions are fixed.

Counts are by construction: ``GOOD`` is one meta line and three iterations.
``chmod 000`` does not deny reads to root (CAP_DAC_OVERRIDE): as root the
permission cases run ``tlog ingest`` in a child process without the
DAC-override capabilities (``setpriv``), and are skipped, saying why, where
that is not possible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from ingest_helpers import ROOT
from tlog.ingest import connect, ingest_run
from tlog.ingest.sources import JSONL, LogFile, pieces

from tests.support.cli import invoke

MARKER = "SECRET-MARKER-7f3a"
GOOD = [
    {"type": "meta", "rank": 0, "stage": "s", "worker": "w0"},
    {"iter": 0, "ts": 1000.0, "dur": 1.0, "phases": {"fwd": 0.5, "get": 0.25}},
    {"iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {"fwd": 0.5, "get": 0.25}},
    {"iter": 2, "ts": 1002.0, "dur": 1.0, "phases": {"fwd": 0.5, "get": 0.25}},
]


def _log(path: Path, rank: int, iters: int = 3) -> Path:
    """A log of one meta line and ``iters`` iterations of worker ``w{rank}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"type": "meta", "rank": rank, "stage": "s", "worker": f"w{rank}"}]
    lines += [{"iter": i, "ts": 1000.0 + i, "dur": 1.0, "phases": {"fwd": 0.5, "get": 0.25}}
              for i in range(iters)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _secret(path: Path) -> Path:
    """A /etc/passwd-like file (not JSON: every line would be a reject)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"user{i}:x:{i}:{i}:{MARKER}:/home/u{i}:/bin/sh\n"
                            for i in range(5)))
    return path


def _tlog(*args: object):
    return invoke([str(a) for a in args])


def _count(con, sql: str) -> int:
    return con.execute(sql).fetchall()[0][0]


# -- links out of the run directory ---------------------------------------------------------------

def test_link_out_of_the_run_is_not_followed(tmp_path: Path) -> None:
    """rank1.jsonl -> a passwd-like file outside, traces -> a directory outside
    holding a real log, run.json -> a file outside: none is read; each named
    once per ingest; the run's own 4 lines load; nothing of the outside in
    rejects, on screen or in the Parquet export."""
    run = tmp_path / "run"
    _log(run / "rank0.jsonl", 0)
    secret = _secret(tmp_path / "outside" / "passwd.jsonl")
    _log(tmp_path / "outside" / "more" / "rank7.jsonl", 7)
    (tmp_path / "outside" / "run.json").write_text(json.dumps({"name": MARKER}))
    (run / "rank1.jsonl").symlink_to(secret)
    (run / "traces").symlink_to(tmp_path / "outside" / "more")
    (run / "run.json").symlink_to(tmp_path / "outside" / "run.json")
    db = tmp_path / "t.duckdb"

    shown = _tlog("ingest", "--db", db, run)
    assert shown.exit_code == 0, shown.output
    assert MARKER not in shown.output and "user0" not in shown.output
    warnings = [ln.strip() for ln in shown.stdout.splitlines() if "warning:" in ln]
    hint = "(copy what it points to into the run directory to load it)"
    assert warnings == [
        f"warning: {name} is a symbolic link out of the run directory: not followed, not "
        f"read {hint}" for name in ("rank1.jsonl", "run.json", "traces")], warnings

    again = _tlog("ingest", "--json", "--db", db, run)       # named again, once, next time
    rep = json.loads(again.stdout)
    assert MARKER not in again.output
    assert rep["files"] == 1 and rep["files_unchanged"] == 1
    assert sum("symbolic link out of the run directory" in w for w in rep["warnings"]) == 3

    con = connect(db)
    try:
        assert _count(con, "SELECT count(*) FROM rejects") == 0
        assert _count(con, "SELECT count(*) FROM iterations") == 3
        assert con.execute("SELECT path FROM files").fetchall() == [("rank0.jsonl",)]
        assert con.execute("SELECT name FROM runs").fetchall() == [(None,)]
        assert _count(con, "SELECT count(*) FROM workers WHERE rank = 7") == 0
    finally:
        con.close()

    out = tmp_path / "export"
    exported = _tlog("export", "--parquet", out, "--db", db)
    assert exported.exit_code == 0, exported.output
    parquet = sorted(out.rglob("*.parquet"))
    assert parquet
    for path in parquet:
        rows = duckdb.sql(f"SELECT * FROM read_parquet('{path}')").fetchall()
        assert MARKER not in repr(rows) and "user0" not in repr(rows), path


def test_only_links_out_is_an_error_that_names_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.jsonl").symlink_to(_secret(tmp_path / "outside" / "passwd.jsonl"))
    result = _tlog("ingest", "--db", tmp_path / "t.duckdb", run)
    assert result.exit_code == 1
    assert MARKER not in result.output
    assert result.stderr.startswith("tlog: error: no logs under ")
    assert "rank0.jsonl is a symbolic link out of the run directory" in result.stderr


# -- links inside the run directory -----------------------------------------------------------

def test_links_inside_the_run_read_each_file_once(tmp_path: Path) -> None:
    """latest.jsonl -> logs/rank0.jsonl and alias.jsonl -> the same: read once,
    as logs/rank0.jsonl; rank5.jsonl -> .staging/rank5.jsonl (a hidden folder,
    not walked): read once, under the link's name; a link to a folder inside
    (current -> logs) is not walked: its files are found by their own path."""
    run = tmp_path / "run"
    _log(run / "logs" / "rank0.jsonl", 0)
    _log(run / ".staging" / "rank5.jsonl", 5, iters=2)
    (run / "latest.jsonl").symlink_to("logs/rank0.jsonl")
    (run / "alias.jsonl").symlink_to(run / "logs" / "rank0.jsonl")
    (run / "rank5.jsonl").symlink_to(".staging/rank5.jsonl")
    (run / "current").symlink_to("logs")
    con = connect(tmp_path / "t.duckdb")
    try:
        rep = ingest_run(con, run, run_id="r")
        assert rep.files == rep.files_read == 2
        assert rep.records_loaded == {"iter": 5, "queue": 0, "event": 0, "meta": 2}
        assert rep.duplicates == 0 and rep.records_rejected == 0
        assert not [w for w in rep.warnings if "symbolic" in w]
        assert sorted(con.execute("SELECT path, lines FROM files").fetchall()) == [
            ("logs/rank0.jsonl", 4), ("rank5.jsonl", 3)]
        # the link's target grows: read once more, through the link
        with open(run / ".staging" / "rank5.jsonl", "a") as fh:
            fh.write(json.dumps({"iter": 2, "ts": 1002.0, "dur": 1.0, "phases": {"fwd": 0.5}})
                     + "\n")
        grown = ingest_run(con, run, run_id="r")
        assert grown.records_loaded["iter"] == 1 and grown.files_unchanged == 1
    finally:
        con.close()


# -- unreadable files and directories ---------------------------------------------------------

def _denying_prefix(tmp_path: Path) -> list[str]:
    """The command prefix under which ``chmod 000`` denies reads ([] when not
    root; as root, ``setpriv`` without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH),
    checked on a probe file; skips the test, saying why, when there is none."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root (chmod 000 does not deny root) and no setpriv to "
                        "drop CAP_DAC_OVERRIDE")
        drop = "-dac_override,-dac_read_search"
        prefix = [setpriv, f"--inh-caps={drop}", f"--bounding-set={drop}"]
    check = subprocess.run([*prefix, sys.executable, "-c",
                            "import sys; open(sys.argv[1]).read()", str(probe)],
                           capture_output=True, text=True, check=False)
    probe.chmod(0o600)
    if check.returncode == 0 or "PermissionError" not in check.stderr:
        pytest.skip("chmod 000 does not deny reads here (root whose capabilities cannot be "
                    f"dropped: {check.stderr.strip()[-200:] or 'read succeeded'})")
    return prefix


def _ingest_cli(prefix: list[str], db: Path, run: Path, *extra: str):
    return subprocess.run([*prefix, sys.executable, "-m", "tlog", "ingest", "--db", str(db),
                           *extra, str(run)], capture_output=True, text=True, cwd=ROOT,
                          check=False, timeout=120)


def test_unreadable_file_and_directory_are_reported_then_loaded(tmp_path: Path) -> None:
    """rank1.jsonl (mode 000) and host2/ (mode 000, holding rank2.jsonl): each
    named once by ``tlog ingest``; the readable log's 4 lines load. With the
    permissions fixed, the next ingest loads the 3 + 3 lines of the two."""
    prefix = _denying_prefix(tmp_path)
    run = tmp_path / "run"
    _log(run / "rank0.jsonl", 0)
    _log(run / "rank1.jsonl", 1, iters=2).chmod(0)
    _log(run / "host2" / "rank2.jsonl", 2, iters=2)
    (run / "host2").chmod(0)
    db = tmp_path / "t.duckdb"
    try:
        shown = _ingest_cli(prefix, db, run)
        assert shown.returncode == 0, shown.stderr
        warnings = [ln.strip() for ln in shown.stdout.splitlines() if "warning:" in ln]
        assert warnings == [
            ("warning: cannot read rank1.jsonl (permission denied): not loaded; fix its "
            "permissions and ingest again"),
            ("warning: cannot read directory host2/ (permission denied): nothing in it is "
            "loaded; fix its permissions and ingest again")], shown.stdout
        assert "loaded 3 iter, 0 queue, 0 event, 1 meta from 1 of 1 files" in shown.stdout
        rep = json.loads(_ingest_cli(prefix, db, run, "--json").stdout)
        assert len(rep["warnings"]) == 2 and rep["files_unchanged"] == 1
    finally:
        (run / "host2").chmod(0o755)
        (run / "rank1.jsonl").chmod(0o644)
    con = connect(db)
    try:
        rep = ingest_run(con, run)
        assert rep.warnings == []
        assert rep.files == 3 and rep.files_read == 2 and rep.files_unchanged == 1
        assert rep.records_loaded == {"iter": 4, "queue": 0, "event": 0, "meta": 2}
        assert _count(con, "SELECT count(*) FROM iterations") == 7
    finally:
        con.close()


def test_a_loaded_file_made_unreadable_keeps_its_rows(tmp_path: Path) -> None:
    """Loaded, then chmod 000 and grown: the next ingest names it and keeps
    its 3 rows; readable again, the 2 new lines load (no duplicate)."""
    prefix = _denying_prefix(tmp_path)
    run = tmp_path / "run"
    log = _log(run / "rank0.jsonl", 0)
    _log(run / "rank1.jsonl", 1)
    db = tmp_path / "t.duckdb"
    con = connect(db)
    ingest_run(con, run)
    con.close()
    with open(log, "a") as fh:
        fh.writelines(json.dumps({"iter": i, "ts": 1000.0 + i, "dur": 1.0,
                                 "phases": {"fwd": 0.5}}) + "\n" for i in (3, 4))
    log.chmod(0)
    try:
        rep = json.loads(_ingest_cli(prefix, db, run, "--json").stdout)
        assert rep["warnings"] == [("cannot read rank0.jsonl (permission denied): not loaded; "
                                   "fix its permissions and ingest again")]
        assert rep["records_loaded"]["iter"] == 0 and rep["files_unchanged"] == 1
    finally:
        log.chmod(0o644)
    con = connect(db)
    try:
        assert _count(con, "SELECT count(*) FROM iterations") == 6
        rep2 = ingest_run(con, run)
        assert rep2.records_loaded["iter"] == 2 and rep2.duplicates == 0
        assert _count(con, "SELECT count(*) FROM iterations WHERE rank = 0") == 5
    finally:
        con.close()


def test_a_file_gone_between_plan_and_read_is_named_not_fatal(tmp_path: Path) -> None:
    """A file that cannot be opened when its turn comes (removed, or made
    unreadable, after the plan): nothing read, a reason kept for the warning."""
    path = _log(tmp_path / "rank0.jsonl", 0)
    log = LogFile(path=path, rel="rank0.jsonl", source=JSONL, size=path.stat().st_size,
                  mtime=0.0)
    path.unlink()
    got = list(pieces(log, 0, 1))
    assert [(p.n_lines, p.last) for p in got] == [(0, True)]
    assert log.unreadable == "no such file or directory"
