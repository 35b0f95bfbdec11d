"""`tlog compare` knows the machine: the environments set side by side, a
slowdown where every compute phase moved with the load named as contention,
and the default baseline taken from the same kind of machine.

Runs written by hand (tests/diagnosis/runbuilder.py) into one database; the
real loops are in tests/diagnosis/test_machine_loops.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tlog.analyze.baseline import pick_baseline
from tlog.analyze.compare import compare
from tlog.ingest.db import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnosis"))
from runbuilder import RunBuilder, loop


def _run(db: Path, run_id: str, started: float, *, forward: float, backward: float,
         cpu_share: float, running: int, load1: float, ncpu: int = 1,
         machine: dict | None = None) -> None:
    b = RunBuilder(run_id)
    step = forward + backward
    loop(b, 40, [("forward", forward), ("backward", backward)], cpu=cpu_share * step)
    for i in range(0, 40, 2):
        b.sys_sample(ts=1000.0 + i * step, iter=i, ncpu=ncpu, running=running, load1=load1,
                     cpu_s=i * cpu_share * step)
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
    # 1 core, load 0.9. Loaded: both phases take twice as long (+100% each), the
    # thread on the CPU half the time, 4 runnable threads, load 3.9.
    db = tmp_path / "t.duckdb"
    _run(db, "quiet", 1.0, forward=0.040, backward=0.060, cpu_share=1.0, running=1, load1=0.9,
         machine=BOX)
    _run(db, "loaded", 2.0, forward=0.080, backward=0.120, cpu_share=0.5, running=4, load1=3.9,
         machine=BOX)
    with connect(db, read_only=True) as con:
        c = compare(con, "quiet", "loaded")
    env = c.environment
    assert env.contention is True and env.load_change == 1 and not env.machine_differs
    assert env.moved_together == pytest.approx({"forward": 1.0, "backward": 1.0})
    assert [d.field for d in env.differences] == ["running", "load1", "on_cpu_share"]
    assert c.verdict.startswith("loaded is 50% slower than quiet")
    assert ("every compute phase of main moved together (backward +100%, forward +100%) while "
            "the machine's load rose (runnable threads 1.0 -> 4.0 on 1 core; load 0.9 -> 3.9 "
            "on 1 core; the thread on the CPU 100% -> 50% of its compute time; its CPU time "
            "per iteration 100 ms -> 100 ms while its wall time went 100 ms -> 200 ms): likely "
            "contention from a busier machine, not the change under test") in c.verdict
    assert "Most of the gap" not in c.verdict
    assert c.to_dict()["environment"]["contention"] is True


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
    # time per iteration doubled with the wall time, so the load is not the cause.
    c = _pair(tmp_path / "x", {"forward": 0.040, "backward": 0.060, "cpu_share": 1.0},
              {"forward": 0.080, "backward": 0.120, "cpu_share": 1.0, "running": 4,
               "load1": 3.9})
    assert c.environment.load_change == 1 and c.environment.contention is False


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
