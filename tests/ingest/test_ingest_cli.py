"""``tlog ingest``: output, --json, --follow, and one-line errors for bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from ingest_helpers import DATA, following, iter_line, write_lines

from tests.support.cli import invoke

ROOT = Path(__file__).resolve().parents[2]


def tlog(*args: str):
    return invoke(list(args))


def test_json_output(tmp_path: Path):
    res = tlog("ingest", str(DATA / "ingest_bad_lines"), "--db", str(tmp_path / "t.duckdb"),
               "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["run_id"] == "ingest_bad_lines"
    assert out["records_loaded"] == {"iter": 5, "queue": 0, "event": 0, "meta": 1}
    assert out["records_rejected"] == 48
    assert out["duplicates"] == 0
    assert out["errors"][0] == {"file": "bad.jsonl", "line": 3, "reason": "not JSON"}
    assert len(out["errors"]) == 48
    assert out["rejected_by_reason"]["wrong_type"] == 11


def test_human_output(tmp_path: Path):
    res = tlog("ingest", str(DATA / "ingest_duplicates"), "--db", str(tmp_path / "t.duckdb"))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Run ingest_duplicates: loaded 5 iter, 0 queue, 0 event, 2 meta "
                               "from 2 of 2 files")
    assert lines[1] == "  2 duplicate iterations (same run, rank, stage, worker, iter) kept once"
    again = tlog("ingest", str(DATA / "ingest_duplicates"), "--db", str(tmp_path / "t.duckdb"))
    assert "loaded 0 iter, 0 queue, 0 event, 0 meta from 0 of 2 files" in again.stdout
    assert "2 files unchanged since the last ingest" in again.stdout


def test_run_id_option(tmp_path: Path):
    res = tlog("ingest", str(DATA / "ingest_truncated_tail"), "--db", str(tmp_path / "t.duckdb"),
               "--run-id", "mine", "--json")
    assert json.loads(res.stdout)["run_id"] == "mine"
    assert json.loads(res.stdout)["partial_lines"] == ["rank1.jsonl"]


@pytest.mark.parametrize(("make", "message", "code"), [
    (lambda p: p / "missing", "run directory {p}/missing does not exist", 1),
    (lambda p: (p / "empty").mkdir() or p / "empty",
     "no logs under {p}/empty ({kinds}) and no run.json: is this a run directory?", 1),
    (lambda p: write_lines(p / "one.jsonl", [iter_line(0)]),
     ("{p}/one.jsonl is a file, not a run directory: pass the directory that holds the "
     "rank*.jsonl logs ({p})"), 1),
    (lambda p: (p / "bad").mkdir() or (p / "bad" / "run.json").write_text('{"v": 1,') and p / "bad",
     ("{p}/bad/run.json:1: not valid JSON (Expecting property name enclosed in double quotes); "
     "fix or remove the manifest"), 1),
    (lambda p: (p / "v9").mkdir() or (p / "v9" / "run.json").write_text('{"v": 9}') and p / "v9",
     "{p}/v9/run.json: unknown manifest version 9 (this tlog reads version 1); upgrade tlog", 1),
    (lambda p: (p / "pk").mkdir() or (p / "pk" / "run.json").write_text(
        '{"phase_kinds": {"x": "waiting"}}') and p / "pk",
     ("{p}/pk/run.json: phase_kinds['x'] = \"waiting\" is not a category; use one of "
     "backpressure, compute, starvation, sync"), 1),
])
def test_bad_input_is_one_line(tmp_path: Path, make, message: str, code: int):
    path = make(tmp_path)
    res = tlog("ingest", str(path), "--db", str(tmp_path / "t.duckdb"))
    assert res.exit_code == code
    assert res.stdout == ""
    from tlog.ingest.sources import active_sources

    kinds = ", ".join(s.describe() for s in active_sources())
    assert kinds.startswith("*.jsonl, *.jsonl.gz")
    assert res.stderr == "tlog: error: " + message.format(p=tmp_path, kinds=kinds) + "\n"


def test_bad_option_values(tmp_path: Path):
    res = tlog("ingest", str(DATA / "ingest_duplicates"), "--interval", "0")
    assert (res.exit_code, res.stderr) == (2, "tlog: error: --interval must be a positive number of seconds, got 0\n")


def _wait_line(lines: list[str], text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline, f"no {text!r} in {lines}"
        time.sleep(0.05)


def test_follow_until_interrupted(tmp_path: Path):
    run = tmp_path / "live"
    log = write_lines(run / "rank0.jsonl", [iter_line(0)])
    db = tmp_path / "t.duckdb"
    with following(run, db) as (out, ended):
        _wait_line(out, "loaded 1 iter")
        with open(log, "a") as fh:
            fh.write(iter_line(1) + "\n" + iter_line(2) + "\n")
        _wait_line(out, "loaded 2 iter")
    code, err = ended
    assert code == 0, err
    assert "stopped following after" in err
    from tlog.ingest import connect
    con = connect(db)
    assert con.execute("SELECT count(*) FROM iterations").fetchall()[0][0] == 3
    # the 2 lines of round 2 came within FOLLOW_STORE_INTERVAL_S of the first
    # store: Ctrl-C stored them
    assert con.execute("SELECT iterations FROM attribution_runs").fetchall() == [(3,)]
    con.close()


def test_follow_rides_out_a_bad_run_json_and_says_when_categories_move(tmp_path: Path):
    """While following, a run.json caught mid-save (not JSON yet) is a warning
    and the next round tries again; a round that only moves categories (a
    phase_kinds edit, no new records) still says so."""
    run = tmp_path / "live"
    write_lines(run / "rank0.jsonl", [iter_line(0)])
    with following(run, tmp_path / "t.duckdb") as (out, ended):
        _wait_line(out, "loaded 1 iter")
        (run / "run.json").write_text('{"phase_kinds": {"forward": "sy')
        time.sleep(1.0)
        (run / "run.json").write_text('{"phase_kinds": {"forward": "sync"}}')
        _wait_line(out, "forward compute -> sync")
    code, err = ended
    assert code == 0, err
    assert "tlog: warning: " in err and "run.json" in err and "trying again in 0.2 s" in err


# --- several run directories --------------------------------------------------------------

def test_several_run_directories_in_one_command(tmp_path: Path):
    """Each directory loads as its own run (its summary line as from one ``tlog
    ingest``), and ``tlog runs`` lists them with their stored verdicts."""
    from tests.support.cli import assert_one_line_error

    db = str(tmp_path / "t.duckdb")
    res = tlog("ingest", str(DATA / "ingest_duplicates"), str(DATA / "ingest_sys"), "--db", db)
    assert res.exit_code == 0, res.output
    runs = [line.split(":")[0] for line in res.stdout.splitlines() if line.startswith("Run ")]
    assert runs == ["Run ingest_duplicates", "Run ingest_sys"]
    assert "  2 duplicate iterations (same run, rank, stage, worker, iter) kept once" \
        in res.stdout.splitlines()
    assert res.stderr == "tlog: 2 runs ingested\n"
    listed = json.loads(tlog("runs", "--db", db, "--json").stdout)
    assert sorted(r["run_id"] for r in listed) == ["ingest_duplicates", "ingest_sys"]
    assert all(r["verdict"] for r in listed)
    # --json: one list of the reports; nothing new the second time
    again = tlog("ingest", str(DATA / "ingest_duplicates"), str(DATA / "ingest_sys"),
                 "--db", db, "--json")
    assert [(r["run_id"], r["files_unchanged"], sum(r["records_loaded"].values()))
            for r in json.loads(again.stdout)] == [("ingest_duplicates", 2, 0), ("ingest_sys", 2, 0)]
    # options of one run with several
    bad = tlog("ingest", str(DATA / "ingest_duplicates"), str(DATA / "ingest_sys"),
               "--follow", "--db", db)
    assert_one_line_error(bad, 2, "--follow takes one run directory")


def test_each_loads_the_run_directories_of_a_folder(tmp_path: Path):
    from tests.support.cli import assert_one_line_error

    sweep = tmp_path / "sweep"
    for k in range(3):
        write_lines(sweep / f"lr{k}" / "rank0.jsonl", [iter_line(i) for i in range(5)])
    (sweep / "notes").mkdir()
    db = str(tmp_path / "t.duckdb")
    res = tlog("ingest", "--each", str(sweep), "--db", db, "--json")
    assert res.exit_code == 0, res.output
    assert [(r["run_id"], r["records_loaded"]["iter"]) for r in json.loads(res.stdout)] == [
        ("lr0", 5), ("lr1", 5), ("lr2", 5)]
    # without --each the folder is one run whose logs are in subdirectories
    one = tlog("ingest", str(sweep), "--db", str(tmp_path / "one.duckdb"), "--json")
    assert json.loads(one.stdout)["run_id"] == "sweep"
    assert json.loads(one.stdout)["files"] == 3
    none = tlog("ingest", "--each", str(sweep / "notes"), "--db", db)
    assert_one_line_error(none, 1, "notes holds no run directory", "nothing was loaded")



def test_empty_text_for_a_directory_is_refused(tmp_path: Path, monkeypatch):
    """``tlog ingest --each "$SWEEP"`` with $SWEEP unset: one line, nothing
    loaded (``Path("")`` is the current directory, whose folders are runs here)."""
    from tests.support.cli import assert_one_line_error

    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "lr0" / "rank0.jsonl", [iter_line(i) for i in range(5)])
    db = tmp_path / "t.duckdb"
    for args in (["--each", ""], ["", "lr0"], [""]):
        assert_one_line_error(tlog("ingest", *args, "--db", str(db)), 2,
                              "a run directory given is empty text")
    assert not db.exists()



def test_a_symlink_loop_among_several_is_one_line(tmp_path: Path):
    from tests.support.cli import assert_one_line_error

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    res = tlog("ingest", str(tmp_path / "loop"), str(DATA / "ingest_sys"),
               "--db", str(tmp_path / "t.duckdb"))
    assert_one_line_error(res, 1, f"run directory {tmp_path}/loop does not exist",
                          "nothing was loaded")

def test_a_run_id_held_for_another_directory_says_what_fixes_it(tmp_path: Path):
    """The advice holds with several directories (where --run-id is refused),
    and says the same command loads the rest only once the cause is gone."""
    db = str(tmp_path / "t.duckdb")
    write_lines(tmp_path / "old" / "exp" / "rank0.jsonl", [iter_line(i) for i in range(5)])
    assert tlog("ingest", str(tmp_path / "old" / "exp"), "--db", db).exit_code == 0
    write_lines(tmp_path / "new" / "a" / "rank0.jsonl", [iter_line(i) for i in range(3)])
    write_lines(tmp_path / "new" / "exp" / "rank0.jsonl", [iter_line(i) for i in range(3)])
    res = tlog("ingest", str(tmp_path / "new" / "a"), str(tmp_path / "new" / "exp"), "--db", db)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.stdout.startswith("Run a: loaded 3 iter")     # the run before it, kept
    [line] = res.stderr.splitlines()
    assert line.startswith("tlog: error: ") and "1 of 2 runs were loaded before it" in line
    assert "a run_id in its run.json, or --run-id when it is ingested alone" in line
    assert line.endswith("fix it (or leave it out) and the same command again loads what "
                         "is missing")

def test_a_bad_directory_among_several_loads_nothing(tmp_path: Path):
    from tests.support.cli import assert_one_line_error

    db = tmp_path / "t.duckdb"
    res = tlog("ingest", str(DATA / "ingest_duplicates"), str(tmp_path / "missing"),
               "--db", str(db))
    line = assert_one_line_error(res, 1, f"run directory {tmp_path}/missing does not exist",
                                 "nothing was loaded")
    assert line.endswith("does not exist; nothing was loaded")
    assert not db.exists()


def test_ctrl_c_among_many_runs_stops_between_two_runs_with_diagnoses_stored(tmp_path: Path):
    """SIGINT while ``tlog ingest --each`` loads 120 runs, just after the first
    group of 64 went to be stored (on the background thread where there are two
    cores): the run in progress finishes, every run loaded is whole (its 20
    iterations once) with its diagnosis stored (a group store is never cut
    short), exit 130 and one line saying so."""
    import os
    import signal
    import subprocess
    import sys

    from ingest_helpers import ROOT
    from tlog.ingest import connect

    sweep = tmp_path / "sweep"
    for k in range(120):
        write_lines(sweep / f"r{k:03d}" / "rank0.jsonl", [iter_line(i) for i in range(20)])
    db = tmp_path / "t.duckdb"
    # as a user runs it: without make test's $TLOG_THREADS, the second thread stores
    env = {k: v for k, v in os.environ.items() if k != "TLOG_THREADS"}
    proc = subprocess.Popen([sys.executable, "-m", "tlog", "ingest", "--each", str(sweep),
                             "--db", str(db)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    printed = 0
    assert proc.stdout is not None
    for line in proc.stdout:               # a few runs loaded: Ctrl-C
        printed += line.startswith("Run ")
        if printed == 66:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=120)
    printed += sum(line.startswith("Run ") for line in out.splitlines())
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"tlog: stopped by Ctrl-C after {printed} runs" in err, err
    assert 66 <= printed < 120
    with connect(db, read_only=True) as con:
        per_run = con.execute("SELECT run_id, count(*), count(DISTINCT iter) FROM iterations "
                              "GROUP BY run_id ORDER BY run_id").fetchall()
        stored = con.execute("SELECT run_id FROM attribution_runs ORDER BY run_id").fetchall()
    assert per_run == [(f"r{k:03d}", 20, 20) for k in range(printed)]
    assert stored == [(f"r{k:03d}",) for k in range(printed)]
