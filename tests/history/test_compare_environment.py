"""`tlog compare` knows the machine: the environments set side by side, a
slowdown where every compute phase moved with the load named as contention,
and the default baseline taken from the same kind of machine.

Runs written by hand (tests/support/runbuilder.py) into one database; the
real loops are in tests/diagnosis/test_machine_loops.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.analyze.baseline import pick_baseline
from tlog.analyze.compare import compare
from tlog.ingest.db import connect

from tests.support.runbuilder import RunBuilder, loop


def _run(db: Path, run_id: str, started: float, *, forward: float, backward: float,
         cpu_share: float, running: int, load1: float, ncpu: int = 1,
         machine: dict | None = None, queue: float | None = None) -> None:
    """``queue``: the share of wall time the thread waited runnable for a core
    (``cpu_wait_s`` rises by ``queue * step`` per iteration); None: not recorded."""
    b = RunBuilder(run_id)
    step = forward + backward
    loop(b, 40, [("forward", forward), ("backward", backward)], cpu=cpu_share * step)
    for i in range(0, 40, 2):
        waits = {} if queue is None else {"cpu_wait_s": 2.0 + i * queue * step}
        b.sys_sample(ts=1000.0 + i * step, iter=i, ncpu=ncpu, running=running, load1=load1,
                     cpu_s=i * cpu_share * step, **waits)
    if machine is not None:
        b.machine(**machine)
    con = b.write(db)
    con.execute("UPDATE runs SET started = ? WHERE run_id = ?", [started, run_id])
    con.close()


def _pair(tmp_path: Path, a: dict, b: dict):
    """compare("a", "b") of two runs written with :func:`_run`'s keywords (load 0.9,
    1 runnable thread unless given)."""
    tmp_path.mkdir(exist_ok=True)
    db = tmp_path / "t.duckdb"
    _run(db, "a", 1.0, **{"running": 1, "load1": 0.9, **a})
    _run(db, "b", 2.0, **{"running": 1, "load1": 0.9, **b})
    with connect(db, read_only=True) as con:
        return compare(con, "a", "b")


BOX = {"host": "box", "cpu_model": "Xeon 8480", "ncpu": 1, "gpu_name": None}


def test_every_phase_slower_with_the_load_is_named_contention(tmp_path) -> None:
    # Quiet: forward 40 + backward 60 ms on the CPU all the time, 1 runnable thread on
    # 1 core, load 0.9, no wait for a core. Loaded: both phases take twice as long
    # (+100% each), the thread on the CPU half the time and waiting runnable for a
    # core the other half (run-queue wait 0 -> 100 ms per 200 ms iteration), 4
    # runnable threads, load 3.9.
    db = tmp_path / "t.duckdb"
    _run(db, "quiet", 1.0, forward=0.040, backward=0.060, cpu_share=1.0, running=1, load1=0.9,
         machine=BOX, queue=0.0)
    _run(db, "loaded", 2.0, forward=0.080, backward=0.120, cpu_share=0.5, running=4, load1=3.9,
         machine=BOX, queue=0.5)
    with connect(db, read_only=True) as con:
        c = compare(con, "quiet", "loaded")
    env = c.environment
    assert env.contention is True and env.load_change == 1 and not env.machine_differs
    assert env.moved_together == pytest.approx({"forward": 1.0, "backward": 1.0})
    assert [d.field for d in env.differences] == ["running", "load1", "on_cpu_share",
                                                  "run_queue_share"]
    assert c.verdict.startswith("loaded is 50% slower than quiet")
    assert ("every compute phase of main moved together (backward +100%, forward +100%) while "
            "the machine's load rose (runnable threads 1.0 -> 4.0 on 1 core; load 0.9 -> 3.9 "
            "on 1 core; the thread on the CPU 100% -> 50% of its compute time; the thread "
            "waiting for a core 0% -> 50% of its time; its run-queue wait per iteration "
            "0 µs -> 100 ms while its wall time went 100 ms -> 200 ms): likely "
            "contention from a busier machine, not the change under test.") in c.verdict
    assert "Most of the gap" not in c.verdict
    assert c.to_dict()["environment"]["contention"] is True


def test_without_run_queue_figures_contention_is_a_guess(tmp_path) -> None:
    # The same two runs from logs without cpu_wait: the old evidence (CPU time per
    # iteration flat while wall time doubled, the thread off the CPU more), said
    # as a guess.
    db = tmp_path / "t.duckdb"
    _run(db, "quiet", 1.0, forward=0.040, backward=0.060, cpu_share=1.0, running=1, load1=0.9)
    _run(db, "loaded", 2.0, forward=0.080, backward=0.120, cpu_share=0.5, running=4, load1=3.9)
    with connect(db, read_only=True) as con:
        c = compare(con, "quiet", "loaded")
    assert c.environment.contention is True
    assert ("its CPU time per iteration 100 ms -> 100 ms while its wall time went 100 ms -> "
            "200 ms): likely contention from a busier machine, not the change under test "
            "(tlog's guess: no run-queue figures).") in c.verdict


def test_a_slowdown_from_sleeping_under_more_load_is_not_contention(tmp_path) -> None:
    # Both phases twice as long with the same CPU time per iteration (the thread now
    # sleeps half of it) while the machine got busier (4 runnable threads, load 3.9),
    # but its wait for a core stayed at 2% of its time: the added 100 ms per
    # iteration are a sleep, not a wait for a core -> not contention; the phases
    # that moved are named. The thread's own run-queue figures judge the load:
    # it did not rise for the thread, whatever the load average did.
    c = _pair(tmp_path, {"forward": 0.040, "backward": 0.060, "cpu_share": 1.0, "queue": 0.02},
              {"forward": 0.080, "backward": 0.120, "cpu_share": 0.5, "queue": 0.02,
               "running": 4, "load1": 3.9})
    env = c.environment
    assert env.load_change == 0 and env.contention is False
    assert "contention" not in c.verdict
    assert "Most of the gap: main backward +60 ms/iter" in c.verdict
    # the baseline from an older log (no run-queue figures): the slower run's own
    # wait, 2% of 200 ms = 4 ms per iteration, is under half the 100 ms added
    c = _pair(tmp_path / "old", {"forward": 0.040, "backward": 0.060, "cpu_share": 1.0},
              {"forward": 0.080, "backward": 0.120, "cpu_share": 0.5, "queue": 0.02,
               "running": 4, "load1": 3.9})
    assert c.environment.load_change == 1 and c.environment.contention is False


def test_one_phase_slower_on_the_same_load_is_the_code(tmp_path) -> None:
    # Only backward doubles (60 -> 120 ms), the load is the same: a phase, not the machine.
    c = _pair(tmp_path, {"forward": 0.040, "backward": 0.060, "cpu_share": 1.0},
              {"forward": 0.040, "backward": 0.120, "cpu_share": 1.0})
    assert c.environment.contention is False and c.environment.differences == []
    assert "Most of the gap: main backward +60 ms/iter" in c.verdict
    assert "load" not in c.verdict


def test_all_phases_slower_without_a_load_change_is_not_called_contention(tmp_path) -> None:
    # Both phases double with the thread on the CPU throughout (its CPU time per
    # iteration doubles too: more work) and the same load: not contention.
    c = _pair(tmp_path, {"forward": 0.040, "backward": 0.060, "cpu_share": 1.0},
              {"forward": 0.080, "backward": 0.120, "cpu_share": 1.0})
    assert c.environment.moved_together is None and c.environment.load_change == 0
    assert c.environment.contention is False
    # ... and the same runs under more load (4 runnable threads on 1 core): the CPU
    # time per iteration doubled with the wall time, so the load is not the cause;
    # the thread stayed on the CPU, so the load average alone is no busier machine.
    c = _pair(tmp_path / "x", {"forward": 0.040, "backward": 0.060, "cpu_share": 1.0},
              {"forward": 0.080, "backward": 0.120, "cpu_share": 1.0, "running": 4,
               "load1": 3.9})
    assert c.environment.load_change == 0 and c.environment.contention is False
    assert "busier machine" not in c.verdict


def test_a_different_machine_is_said(tmp_path) -> None:
    c = _pair(tmp_path, {"forward": 0.040, "backward": 0.060, "cpu_share": 1.0,
                         "machine": {"host": "n1", "cpu_model": "EPYC 7763", "ncpu": 1,
                                     "gpu_name": "A100", "driver": "550.54"}},
              {"forward": 0.040, "backward": 0.120, "cpu_share": 1.0,
               "machine": {"host": "n2", "cpu_model": "EPYC 7763", "ncpu": 1,
                           "gpu_name": "H100", "driver": "560.28"}})
    env = c.environment
    assert env.machine_differs is True
    assert [(d.field, d.baseline, d.candidate) for d in env.differences] == [
        ("machine.host", "n1", "n2"), ("machine.gpu_name", "A100", "H100"),
        ("machine.driver", "550.54", "560.28")]
    assert c.verdict.endswith("; the runs' environments differed: host n1 -> n2; GPU A100 -> "
                              "H100; driver 550.54 -> 560.28 - the change may not be the code's.")


def test_the_default_baseline_prefers_the_same_kind_of_machine(tmp_path) -> None:
    # "big" is the fastest earlier run but on another kind of machine (8 cores); "same"
    # ran on the candidate's kind: it is the baseline.
    db = tmp_path / "t.duckdb"
    big = {**BOX, "host": "big", "ncpu": 8}
    _run(db, "big", 1.0, forward=0.020, backward=0.030, cpu_share=1.0, running=1, load1=0.9,
         machine=big)
    _run(db, "same", 2.0, forward=0.040, backward=0.060, cpu_share=1.0, running=1, load1=0.9,
         machine={**BOX, "host": "other-box"})
    _run(db, "new", 3.0, forward=0.040, backward=0.060, cpu_share=1.0, running=1, load1=0.9,
         machine=BOX)
    with connect(db, read_only=True) as con:
        baseline, choice = pick_baseline(con, "new")
        assert (baseline, choice["machine"], choice["candidates"]) == ("same", "same", ["same"])
    # Without a run of its kind, the best of any kind.
    db2 = tmp_path / "t2.duckdb"
    _run(db2, "big", 1.0, forward=0.020, backward=0.030, cpu_share=1.0, running=1, load1=0.9,
         machine=big)
    _run(db2, "new", 3.0, forward=0.040, backward=0.060, cpu_share=1.0, running=1, load1=0.9,
         machine=BOX)
    with connect(db2, read_only=True) as con:
        assert pick_baseline(con, "new")[0:1] == ("big",)
        assert pick_baseline(con, "new")[1]["machine"] == "any"


def test_a_slowdown_on_a_quieter_machine_is_not_blamed_on_the_load(tmp_path) -> None:
    # a real DDP run whose rank 1 sleeps 100 ms per forward, compared with
    # its healthy baseline, ended "the thread waiting for a core 57% -> 29% ... - the
    # change may not be the code's". Here: the baseline waits for a core half its
    # time (4 runnable threads on 1 core, load 3.9); the candidate's forward takes
    # 100 ms more with the machine quiet (no wait for a core, load 0.9): a quieter
    # machine cannot have made it slower.
    c = _pair(tmp_path, {"forward": 0.040, "backward": 0.060, "cpu_share": 0.5, "running": 4,
                         "load1": 3.9, "queue": 0.5},
              {"forward": 0.140, "backward": 0.060, "cpu_share": 0.5, "queue": 0.0})
    env = c.environment
    assert env.load_change == -1 and env.contention is False
    assert "run_queue_share" in [d.field for d in env.differences]
    assert "may not be the code's" not in c.verdict
    assert ("the candidate was slower on the quieter machine: the load does not explain the "
            "change") in c.verdict
    assert "Most of the gap: main forward +100 ms/iter" in c.verdict
