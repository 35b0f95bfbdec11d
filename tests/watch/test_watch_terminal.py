"""``tlog watch`` in a pseudo-terminal (pexpect), watching a run that a shim
process writes meanwhile (tests/watch/shim_writer.py: 30 ms of sleep in
``load_batch`` then 10 ms of spinning in ``forward`` per iteration).

Checked against the writer, not against tlog: the iteration count on screen
grows between refreshes; the bottleneck shown is the injected starvation in
``load_batch``; the it/s shown is within 20% of the writer's own timer; ``q``
and Ctrl-C end it with exit code 0; afterwards the database opens, holds a
whole prefix of each worker's iterations (no half-written round), and after a
final ingest exactly the iterations the writer wrote.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tlog

pexpect = pytest.importorskip("pexpect")

WRITER = Path(__file__).with_name("shim_writer.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\r")
HEADER = re.compile(r"run watched · ([\d,]+) iterations · refreshed")
NOW = re.compile(r"now: ([\d.,]+) it/s over")
BOTTLENECK = re.compile(r"bottleneck: stage (\S+) is (\w+)-bound \(\S+ of its time\), "
                        r"most in phase (\S+)")


class Screen:
    """Everything a pexpect child printed so far, escapes stripped."""

    def __init__(self, child) -> None:
        self.child = child
        self.text = ""

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.text += ANSI.sub("", self.child.read_nonblocking(65536, timeout=0.2))
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                return

    def wait_for(self, predicate, timeout: float):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = predicate(self.text)
            if found:
                return found
            self.pump(0.3)
        raise AssertionError(f"not on screen within {timeout} s; screen ends with:\n"
                             f"{self.text[-2000:]}")

    def counts(self) -> list[int]:
        return [int(m.replace(",", "")) for m in HEADER.findall(self.text)]


def _start_writer(run_dir: Path, work: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WRITER), str(run_dir), str(work)])


def _stop_writer(writer: subprocess.Popen, work: Path) -> int:
    (work / "stop").touch()
    assert writer.wait(timeout=20) == 0
    status = json.loads((work / "status.json").read_text())
    assert status.get("done")
    return status["n"]


def _watch(run_dir: Path, db: Path):
    return pexpect.spawn(sys.executable, ["-m", "tlog", "watch", str(run_dir), "--db", str(db),
                                          "--interval", "1"],
                         dimensions=(60, 200), encoding="utf-8", codec_errors="replace",
                         env={"TERM": "xterm-256color", "PATH": "/usr/bin:/bin",
                              "HOME": str(db.parent)})


def _iters(db: Path) -> list[int]:
    frame = tlog.open(db).sql("SELECT iter FROM iterations WHERE run_id = 'watched' "
                              "ORDER BY iter")
    return frame["iter"].to_list()


def _check_growing_view(screen: Screen, work: Path) -> None:
    """Two refreshes with a growing count; the injected bottleneck; it/s near the writer's."""
    screen.wait_for(lambda t: len(set(HEADER.findall(t))) >= 2 and screen.counts()[-1] > 0,
                    timeout=25)
    counts = screen.counts()
    assert counts[-1] > counts[0], counts
    # the latest view: its rate against the writer's own timer read now
    screen.wait_for(lambda t: NOW.search(t, t.rfind("iterations · refreshed"))
                    and BOTTLENECK.search(t, t.rfind("iterations · refreshed")), timeout=10)
    status = json.loads((work / "status.json").read_text())
    writer_rate = status["n"] / status["elapsed"]
    shown_rate = float(NOW.findall(screen.text)[-1].replace(",", ""))
    assert shown_rate == pytest.approx(writer_rate, rel=0.20), (shown_rate, writer_rate)
    stage, category, phase = BOTTLENECK.findall(screen.text)[-1]
    assert (stage, category, phase) == ("main", "starvation", "load_batch")


def _check_database(db: Path, run_dir: Path, writer: subprocess.Popen, work: Path,
                    seen: int) -> None:
    """The database opens and holds a whole prefix of the iterations; after the
    writer stops and a final ingest, exactly the writer's count."""
    got = _iters(db)
    assert got == list(range(len(got))) and len(got) >= seen
    n = _stop_writer(writer, work)
    tlog.open(db).ingest(run_dir)
    assert _iters(db) == list(range(n))


def test_watch_shows_the_growing_run_and_quits_on_q(tmp_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "db.duckdb"
    child = _watch(run_dir, db)               # before the run exists: waited for, told once
    screen = Screen(child)
    writer = None
    try:
        screen.wait_for(lambda t: "waiting" in t and str(run_dir) in t, timeout=20)
        writer = _start_writer(run_dir, tmp_path)
        _check_growing_view(screen, tmp_path)
        child.send("q")
        child.expect(pexpect.EOF, timeout=20)
        child.close()
        assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
        # told once (per distinct problem: no directory yet, then no log in it yet)
        told = re.findall(r"waiting: (.*?); looking again", screen.text + child.before)
        assert told and len(told) == len(set(told)), told
        _check_database(db, run_dir, writer, tmp_path, screen.counts()[-1])
    finally:
        child.close(force=True)
        if writer is not None and writer.poll() is None:
            writer.kill()


def test_ctrl_c_exits_zero_with_the_database_consistent(tmp_path: Path) -> None:
    """Ctrl-C: exit 0. Then a second view of the same run, ended by SIGTERM:
    the same clean end (terminal mode restored, diagnosis stored), exit 143."""
    run_dir, db = tmp_path / "run", tmp_path / "db.duckdb"
    writer = _start_writer(run_dir, tmp_path)
    child = _watch(run_dir, db)
    screen = Screen(child)
    try:
        screen.wait_for(lambda t: len(screen.counts()) >= 2 and screen.counts()[-1] > 0,
                        timeout=25)
        child.sendintr()
        child.expect(pexpect.EOF, timeout=20)
        child.close()
        assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
        assert "stopped watching run watched" in screen.text + child.before
        got = _iters(db)
        assert got == list(range(len(got))) and len(got) >= screen.counts()[-1]

        child = _watch(run_dir, db)
        screen = Screen(child)
        screen.wait_for(lambda t: screen.counts() and screen.counts()[-1] > len(got),
                        timeout=25)
        child.kill(signal.SIGTERM)
        child.expect(pexpect.EOF, timeout=20)
        child.close()
        assert child.exitstatus == 128 + signal.SIGTERM, (child.exitstatus,
                                                          child.signalstatus)
        assert "stopped watching run watched" in screen.text + child.before
        _check_database(db, run_dir, writer, tmp_path, screen.counts()[-1])
    finally:
        child.close(force=True)
        if writer.poll() is None:
            writer.kill()


def test_until_ends_the_view_after_a_last_round(tmp_path: Path, capsys) -> None:
    """``watch(until=...)`` (what ``tlog run --live`` calls, until = the job
    ended): the view ends on its own after one more round, which loads every
    record the writer flushed at its exit. stdout is not a terminal here
    (captured): one summary line per refresh, no escape sequences."""
    from tlog.commands.watch import watch

    run_dir, db = tmp_path / "run", tmp_path / "db.duckdb"
    writer = subprocess.Popen([sys.executable, str(WRITER), str(run_dir), str(tmp_path), "2"])
    try:
        shown = watch(run_dir, db=db, interval=0.5, until=lambda: writer.poll() is not None)
    finally:
        if writer.poll() is None:
            writer.kill()
    status = json.loads((tmp_path / "status.json").read_text())
    assert writer.returncode == 0 and status["done"]
    assert _iters(db) == list(range(status["n"]))       # no final ingest needed
    lines = capsys.readouterr().out.splitlines()
    assert shown == len(lines) >= 1
    assert f"run watched: {status['n']:,} iterations" in lines[-1]
    for line in lines:
        assert "\x1b" not in line
        assert re.search(r"run watched: [\d,]+ iterations; now ", line), line
    assert re.search(r"run watched: [\d,]+ iterations; now [\d.,]+ it/s \(last \d+ s\); "
                     r"bottleneck: stage main is starvation-bound", lines[-1]), lines[-1]


def test_tlog_run_live_shows_the_view_while_the_job_runs(tmp_path: Path) -> None:
    """``tlog run --live``: the live view while the job writes its run, the
    job's output in RUN_DIR/job.log (not on the screen), the view ends when
    the job does, then the run is judged; tlog exits with the job's code."""
    run_dir, db = tmp_path / "watched", tmp_path / "db.duckdb"
    child = pexpect.spawn(sys.executable, [
        "-m", "tlog", "run", "--live", "--runs-dir", str(tmp_path), "--run-id", "watched",
        "--db", str(db), "--", sys.executable, str(WRITER), str(run_dir), str(tmp_path), "4"],
        dimensions=(60, 200), encoding="utf-8", codec_errors="replace",
        env={"TERM": "xterm-256color", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        cwd=str(tmp_path))
    screen = Screen(child)
    try:
        screen.wait_for(lambda t: HEADER.search(t), timeout=30)
        assert "Ctrl-C stops the job" in screen.text
        child.expect(pexpect.EOF, timeout=60)
        screen.text += ANSI.sub("", child.before)
        child.close()
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, screen.text[-2000:])
    # the view was drawn while the job ran: before tlog said it ended
    assert HEADER.search(screen.text).start() < screen.text.index("the job exited with code 0")
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["done"] and _iters(db) == list(range(status["n"]))
    assert (run_dir / "job.log").read_text() == "shim writer started\n"
    assert "shim writer started" not in screen.text
    verdict = screen.text[screen.text.index("Bottleneck: "):].splitlines()[0]  # then the verdict
    assert "main waits for data" in verdict and "in load_batch" in verdict


def test_tlog_run_live_ends_when_a_job_that_wrote_no_logs_ends(tmp_path: Path) -> None:
    """``tlog run --live`` of a job that exits without writing timing logs (a
    typo in the script, no Recorder) ends with the job: before, the follow
    loop retried 'no logs' forever, spinning a core (the waiter returned at
    once once the job had ended) and ignoring SIGTERM."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tlog", "run", "--live", "--runs-dir", str(tmp_path),
         "--run-id", "nologs", "--db", str(tmp_path / "db.duckdb"), "--", sys.executable,
         "-c", "raise SystemExit(3)"],
        check=False, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 3, proc.stderr
    assert "the job exited with code 3" in proc.stderr
    assert "wrote no timing logs" in proc.stderr
    assert took < 30, took
