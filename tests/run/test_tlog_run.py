"""``tlog run``: real jobs started through the CLI, as a user runs them.

- a 2-rank DDP job (``torchrun`` + gloo on CPU, ``tests/ddp/ddp_train.py``,
  rank 1's loader sleeping 120 ms per batch) run by ``tlog run``: the phases,
  the iterations per rank and the verdict are checked against the script's own
  bare timers (``tests/ddp/ddp_runs.Truth``), the tags and run id against
  ``tlog runs --json``, the printed verdict against ``tlog diagnose --json``;
- the job's exit code is tlog's; a job that writes nothing still gives its code;
  a command that is not there gives 127; a process the job leaves running is stopped;
- Ctrl-C reaches torchrun's ranks (each in a session of its own), their logs are
  flushed (the ingested iterations are the ones each rank counted) and no rank
  is left running; SIGTERM to tlog, or a second Ctrl-C to a job that ignores
  SIGINT, ends the job through the shim's SIGTERM flush; a ``kill -9`` of tlog
  does not leave the job running.

The plain-python jobs run ``job_script.py`` (the shim only, no torch).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import cli

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JOB = HERE / "job_script.py"
DDP = REPO / "tests" / "ddp"
sys.path.insert(0, str(DDP))

from ddp_runs import RUN_TIMEOUT_S, SLOW_RANK, Truth, torchrun_cmd


def _ddp_module(name: str):
    """A module of tests/ddp by file (``conftest`` is a name every test folder uses)."""
    import importlib.util

    key = f"ddp_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, DDP / f"{name}.py")
        sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[key])
    return sys.modules[key]

#: Seconds a plain-python job under ``tlog run`` may take, start-up and ingest included.
SHORT_TIMEOUT_S = 60
#: Batch of the DDP job: a quarter of tests/ddp's 1024, so that rank 1's 120 ms loader
#: sleep stays the larger part of a step on a loaded machine (at 1024 and a load of
#: 9-14 on 2 cores, the timers' own lockstep gain fell under the 1.3x that
#: tests/ddp asks of a straggler worth naming) and the job costs less.
DDP_BATCH = 256


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("TLOG_RUN_DIR", "TLOG_RUN_ID", "TLOG_TAGS", "TLOG_DB"):
        env.pop(var, None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _start(tmp: Path, job: list[str], *opts: str) -> subprocess.Popen:
    """``tlog run`` of ``job`` as its own process (a session of its own, so a failed
    test can kill all of it), with a database and runs directory under ``tmp``."""
    cmd = [sys.executable, "-m", "tlog", "run", "--db", str(tmp / "t.duckdb"),
           "--runs-dir", str(tmp / "runs"), *opts, "--", *job]
    return subprocess.Popen(cmd, cwd=tmp, env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(p: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"tlog run ran past {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return p.returncode, out, err


def _cli(*args: str) -> tuple[int, str]:
    return cli(args)


def _tlog(tmp: Path, *args: str) -> str:
    """Another tlog command on the same database (in this process); its output."""
    code, out = _cli(*args, "--db", str(tmp / "t.duckdb"))
    assert code == 0, out
    return out


def _rows(tmp: Path, sql: str, *params: object) -> list[tuple]:
    import duckdb

    con = duckdb.connect(str(tmp / "t.duckdb"), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, ended but not reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_progress(path: Path, completed: int, p: subprocess.Popen, timeout: float) -> None:
    """Wait until the job's progress file shows ``completed`` iterations done."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            pytest.fail(f"tlog run ended early ({p.returncode}): {p.communicate()}")
        try:
            if int(path.read_text().split()[1]) >= completed:
                return
        except (FileNotFoundError, IndexError, ValueError):
            pass
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    pytest.fail(f"{path} did not reach {completed} iterations in {timeout} s")


def _progress(path: Path) -> tuple[int, int]:
    started, completed = path.read_text().split()
    return int(started), int(completed)


# -- a real 2-rank DDP job ---------------------------------------------------------------


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """``tlog run --run-id ... --tag ... -- torchrun --nproc_per_node=2 ddp_train.py``
    (input_straggler, phases mode): exit code, stdout, stderr, tmp dir, truth."""
    if (missing := _ddp_module("conftest")._distributed_missing()) is not None:
        pytest.skip(missing)
    tmp = tmp_path_factory.mktemp("tlog-run-ddp")
    job = [*torchrun_cmd(2), str(DDP / "ddp_train.py"), "--scenario", "input_straggler",
           "--mode", "phases", "--truth-dir", str(tmp / "truth"), "--slow-rank", str(SLOW_RANK),
           "--batch", str(DDP_BATCH)]
    p = _start(tmp, job, "--run-id", "ddp-slow-loader", "--tag", "suite=tlog-run",
               "--tag", "fault=rank1-loader")
    code, out, err = _finish(p, RUN_TIMEOUT_S)
    assert code == 0, f"{out}\n{err}"
    return code, out, err, tmp, Truth.load(tmp / "truth")


def test_ddp_run_names_the_slow_loader(ddp_run) -> None:
    DDPCase = _ddp_module("conftest").DDPCase
    sc = _ddp_module("test_ddp_scenarios")
    _code, out, _err, tmp, truth = ddp_run
    d = json.loads(_tlog(tmp, "diagnose", "--run", "ddp-slow-loader", "--json"))
    case = DDPCase("input_straggler", "phases", tmp, truth, d, "", None)
    sc._assert_judged(case)
    # Truth: rank 1 waits for its data, rank 0 waits for rank 1 in the all-reduce.
    assert truth.per_step("data_s", SLOW_RANK) > 3 * truth.per_step("data_s", 0)
    assert set(sc._named(d)) == {SLOW_RANK}, d["verdict"]
    assert sc._entry(d, SLOW_RANK, "input")["phase"] == "data_wait", d["stragglers"]
    sc._assert_verdict_names_slow_rank(case)
    sc._assert_gain(case, sc._entry(d, SLOW_RANK, "input")["speedup_if_fixed"])
    # tlog run printed that verdict, as tlog diagnose prints it, and the report's path.
    assert d["verdict"] in " ".join(out.split()), out
    report = [line for line in out.splitlines() if line.startswith("Report: ")]
    assert report and Path(tmp, report[0].removeprefix("Report: ")).is_file(), out


def test_ddp_run_phases_and_iterations_per_rank(ddp_run) -> None:
    _code, _out, _err, tmp, truth = ddp_run
    phases = {r[0] for r in _rows(tmp, "SELECT DISTINCT phase FROM phase_layouts "
                                       "WHERE run_id = ?", "ddp-slow-loader")}
    assert phases == {"data_wait", "forward", "backward", "optimizer"}
    per_rank = dict(_rows(tmp, "SELECT rank, count(*) FROM iterations WHERE run_id = ? "
                               "GROUP BY rank", "ddp-slow-loader"))
    assert per_rank == {r["rank"]: r["steps"] for r in truth.ranks}
    # the run directory tlog chose: <runs-dir>/<run id>, both ranks' logs in it
    run_dir = tmp / "runs" / "ddp-slow-loader"
    assert sorted(p.name for p in run_dir.glob("rank*.jsonl")) == ["rank0.main.jsonl",
                                                                 "rank1.main.jsonl"]


def test_ddp_run_tags_and_run_id_in_runs(ddp_run) -> None:
    _code, _out, _err, tmp, _truth = ddp_run
    runs = json.loads(_tlog(tmp, "runs", "--json"))
    assert [r["run_id"] for r in runs] == ["ddp-slow-loader"]
    assert {"suite": "tlog-run", "fault": "rank1-loader"}.items() <= runs[0]["tags"].items()
    assert [r["run_id"] for r in json.loads(_tlog(tmp, "runs", "--tag", "fault=rank1-loader",
                                                  "--json"))] == ["ddp-slow-loader"]


# -- exit codes ------------------------------------------------------------------------


def test_exit_code_is_the_jobs_and_what_it_leaves_running_is_stopped(tmp_path: Path) -> None:
    orphan = tmp_path / "orphan-pid"
    p = _start(tmp_path, [sys.executable, str(JOB), "--steps", "7", "--exit-code", "3",
                          "--orphan", str(orphan)], "--run-id", "exit3")
    code, out, err = _finish(p, SHORT_TIMEOUT_S)
    assert code == 3, err
    assert _rows(tmp_path, "SELECT count(*) FROM iterations WHERE run_id = 'exit3'") == [(7,)]
    assert "Report: " in out
    # the job's sleep ran in a session of its own, as torchrun starts its ranks
    pid = int(orphan.read_text())
    assert not _alive(pid), f"the job's sleep (pid {pid}) still runs"
    assert f"pids {pid}" in err, err


def test_job_that_writes_nothing(tmp_path: Path) -> None:
    p = _start(tmp_path, [sys.executable, str(JOB), "--no-shim", "--exit-code", "4"],
               "--run-id", "silent")
    code, out, err = _finish(p, SHORT_TIMEOUT_S)
    assert code == 4, err
    said = [line for line in err.splitlines() if "wrote no timing logs" in line]
    assert len(said) == 1 and "Recorder.from_env()" in said[0], err
    assert "Report:" not in out and "Traceback" not in err
    assert not (tmp_path / "runs" / "silent").exists()   # the empty directory is not left


def test_command_not_found_is_127(tmp_path: Path) -> None:
    code, out = _cli("run", "--runs-dir", str(tmp_path), "--", "tlog-no-such-command-xyz", "-x")
    assert code == 127
    assert out == "tlog: error: tlog-no-such-command-xyz: command not found\n", out
    assert list(tmp_path.iterdir()) == []       # no run directory left behind


# -- signals -----------------------------------------------------------------------------


def test_ctrl_c_reaches_torchrun_ranks_and_logs_are_flushed(tmp_path: Path) -> None:
    """Ranks of plain python (no torch) under a real torchrun; SIGINT to tlog once."""
    job = [*torchrun_cmd(2), str(JOB), "--progress", str(tmp_path / "progress-{rank}"),
           "--report", str(tmp_path / "report-{rank}.json")]
    p = _start(tmp_path, job, "--run-id", "sigint")
    for rank in (0, 1):
        _wait_progress(tmp_path / f"progress-{rank}", 20, p, SHORT_TIMEOUT_S)
    p.send_signal(signal.SIGINT)
    code, out, err = _finish(p, SHORT_TIMEOUT_S)
    assert code != 0, err
    rows = {(r, e): n for r, e, n in _rows(
        tmp_path, "SELECT rank, extra->>'error' IS NOT NULL, count(*) FROM iterations "
                  "WHERE run_id = 'sigint' GROUP BY ALL")}
    for rank in (0, 1):
        report = json.loads((tmp_path / f"report-{rank}.json").read_text())
        assert report["ended_by"] == "KeyboardInterrupt", report   # the rank got Ctrl-C
        # every iteration the rank completed is in the database; the one Ctrl-C cut
        # short (if any) too, marked with its error
        assert rows.get((rank, False), 0) == report["completed"] >= 20, (rows, report)
        assert rows.get((rank, True), 0) == report["started"] - report["completed"], rows
        assert not _alive(report["pid"]), f"rank {rank} (pid {report['pid']}) still runs"
    assert "Report: " in out


@pytest.mark.parametrize("how", ["sigterm", "second-ctrl-c"])
def test_sigterm_ends_the_job_through_the_shims_flush(tmp_path: Path, how: str) -> None:
    """SIGTERM to tlog goes on to the job; a job that ignores Ctrl-C gets SIGTERM at
    the second. Either way the shim's SIGTERM handler writes every completed
    iteration before the job dies of the signal."""
    progress = tmp_path / "progress"
    p = _start(tmp_path, [sys.executable, str(JOB), "--ignore-sigint", "--progress",
                          str(progress)], "--run-id", "stubborn")
    _wait_progress(progress, 10, p, SHORT_TIMEOUT_S)
    if how == "second-ctrl-c":
        p.send_signal(signal.SIGINT)             # ignored by the job
        time.sleep(0.5)
        before = _progress(progress)[1]
        _wait_progress(progress, before + 5, p, SHORT_TIMEOUT_S)   # it runs on
        p.send_signal(signal.SIGINT)             # -> SIGTERM to all the job's processes
    else:
        p.send_signal(signal.SIGTERM)            # passed on as it is
    code, _out, err = _finish(p, SHORT_TIMEOUT_S)
    assert code == 128 + signal.SIGTERM, err
    _started, completed = _progress(progress)
    assert _rows(tmp_path, "SELECT count(*) FROM iterations WHERE run_id = 'stubborn'"
                 ) == [(completed,)]


def test_the_job_does_not_outlive_a_killed_tlog(tmp_path: Path) -> None:
    """kill -9 of tlog: the job's main process gets SIGTERM (PDEATHSIG), so the
    shim flushes and the job ends instead of running on unwatched."""
    progress, pid_file = tmp_path / "progress", tmp_path / "pid"
    p = _start(tmp_path, [sys.executable, str(JOB), "--progress", str(progress),
                          "--pid", str(pid_file)], "--run-id", "orphaned")
    _wait_progress(progress, 5, p, SHORT_TIMEOUT_S)
    p.kill()
    p.communicate()
    pid = int(pid_file.read_text())
    end = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pid), f"the job (pid {pid}) runs on after tlog was killed"
    log = tmp_path / "runs" / "orphaned" / "rank0.main.jsonl"
    iters = [line for line in log.read_text().splitlines() if '"type":"iter"' in line]
    assert len(iters) == _progress(progress)[1]


def _tree(tlog_pid: int) -> list:
    """The job's processes under tlog ``tlog_pid``: its descendants but the watchdog."""
    import psutil

    out = []
    for q in psutil.Process(tlog_pid).children(recursive=True):
        try:
            if not any(a.endswith("_watchdog.py") for a in q.cmdline()):
                out.append(q)
        except psutil.Error:
            pass
    return out


def test_no_process_of_the_job_outlives_a_killed_tlog(tmp_path: Path) -> None:
    """kill -9 of tlog ends the job's whole tree: the shell, its sleep in the job's
    process group, and its sleep in a session of its own (out of the group, as
    torchrun starts its ranks). Counted from /proc, by pid and start time."""
    import psutil

    job = ["bash", "-c", "setsid sleep 300 & sleep 300 & wait"]
    p = _start(tmp_path, job, "--run-id", "tree")
    end = time.monotonic() + SHORT_TIMEOUT_S
    tree: list = []
    names: list[str] = []
    # until setsid has exec'd its sleep (for a moment the process is named setsid)
    while time.monotonic() < end and names != ["bash", "sleep", "sleep"]:
        time.sleep(0.05)
        tree = _tree(p.pid)
        try:
            names = sorted(q.name() for q in tree)
        except psutil.Error:         # a process of the snapshot changed meanwhile
            names = []
    sessions = {os.getsid(q.pid) for q in tree}
    assert names == ["bash", "sleep", "sleep"], names
    assert len(sessions) == 2, sessions        # one sleep left the job's session
    time.sleep(1.5)                             # the watchdog notes the tree twice a second
    p.kill()
    p.wait()          # not communicate(): the job's processes hold tlog's stdout open
    p.stdout.close()
    p.stderr.close()

    def runs(q: psutil.Process) -> bool:
        try:
            return q.is_running() and q.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    end = time.monotonic() + 15
    while time.monotonic() < end and any(runs(q) for q in tree):
        time.sleep(0.05)
    left = [q.pid for q in tree if runs(q)]
    assert left == [], f"{len(left)} of the job's 3 processes outlived tlog: {left}"


# -- mistakes, said before the job starts ----------------------------------------------


@pytest.mark.parametrize(("args", "said"), [
    ((), "give the job to run after '--'"),
    (("--",), "give the job to run after '--'"),
    (("--tag", "lr", "--", "true"), "bad tag 'lr': write key=value"),
    (("--tag", "a=1", "--tag", "a=2", "--", "true"), "tag 'a' given twice"),
    (("--run-id", "a/b", "--", "true"), "cannot name a directory"),
    (("--run-id", "..", "--", "true"), "cannot name a directory"),
])
def test_usage_mistakes_are_one_line(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    code, out = _cli("run", "--runs-dir", str(tmp_path), *args)
    assert code == 2
    assert out.startswith("tlog: error: ") and said in out and out.count("\n") == 1, out


def test_a_run_never_mixes_with_another(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = ["sh", "-c", f"touch {marker}"]
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "rank0.main.jsonl").write_text("")
    code, out = _cli("run", "--runs-dir", str(tmp_path / "runs"), "--run-id", "taken", "--",
                     *job)
    assert code == 2 and "already holds files" in out, out
    assert not marker.exists()                       # the job never started
