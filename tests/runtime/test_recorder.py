"""What the Recorder writes: the meta line and exact iter/queue/event records (fake clock)."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from runtime_helpers import WALL0, read_lines, records

from dflash_runtime import NULL_ITERATION, Recorder


def test_meta_line_first_with_identity_and_clock_pair(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, stage="drafter", rank=3, world_size=8, install_handlers=False)
    rec.close()
    lines = read_lines(tmp_path / "rank3.drafter.jsonl")
    assert lines[0] == {
        "type": "meta", "v": 1, "rank": 3, "stage": "drafter", "worker": "drafter-3",
        "host": socket.gethostname(), "pid": os.getpid(), "world_size": 8,
        "clock": {"wall": WALL0 + 100.0, "mono": 100.0},
    }
    assert len(lines) == 1


def test_iteration_record_exact(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, stage="drafter", rank=0, install_handlers=False, mem_every=0)
    clock.t = 100.0
    with rec.iteration(tokens=4096) as it:          # t0 = 100.0, cpu 10.0
        clock.t = 100.25
        it.lap("load")                              # load 0.25
        clock.t = 100.5
        with it.phase("forward"):                   # forward 100.5 .. 101.5
            clock.t = 101.0
            it.lap("mask_build")                    # forward/mask_build 0.5
            clock.t = 101.5
        clock.t = 102.0
        it.lap("load")                              # load again: 0.25 + 0.5
        with it.phase("grad_norm_item", kind="sync"):
            clock.t = 102.25
        it.samples = 8
        clock.t = 102.5
        clock.cpu.t = 11.5                          # cpu 1.5
    rec.close()
    (r,) = records(tmp_path / "rank0.drafter.jsonl")
    assert r == {
        "type": "iter", "v": 1, "iter": 0, "ts": WALL0 + 100.0, "dur": 2.5,
        "phases": {"load": 0.75, "forward": 1.0, "forward/mask_build": 0.5,
                   "grad_norm_item": 0.25},
        "cpu": 1.5, "tokens": 4096, "samples": 8, "kinds": {"grad_norm_item": "sync"},
    }


def test_iterations_number_from_zero_and_set_kind_covers_laps(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    for i in range(3):
        clock.t = 10.0 * i
        with rec.iteration() as it:
            clock.t += 1.0
            it.lap("optimizer_step")
            it.set_kind("optimizer_step", "compute")
            clock.t += 1.0
    rec.close()
    got = records(tmp_path / "rank0.main.jsonl")
    assert [r["iter"] for r in got] == [0, 1, 2]
    assert [r["ts"] for r in got] == [WALL0, WALL0 + 10.0, WALL0 + 20.0]
    assert all(r["dur"] == 2.0 and r["phases"] == {"optimizer_step": 1.0} for r in got)
    assert all(r["kinds"] == {"optimizer_step": "compute"} for r in got)
    assert all("cpu" not in r for r in got)


def test_an_exception_is_recorded_and_propagates(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False)
    with pytest.raises(KeyError), rec.iteration() as it:
        clock.t = 101.0
        with it.phase("forward"):
            clock.t = 102.0
            raise KeyError("boom")
    rec.close()
    (r,) = records(tmp_path / "rank0.main.jsonl")
    assert r["phases"] == {"forward": 1.0}
    assert r["dur"] == 2.0
    assert r["error"] == "KeyError"


def test_queue_samples_events_and_marks(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False)
    clock.t = 200.0
    rec.queue_sample("hs_queue", 3, 8)
    with rec.event("checkpoint", step=100):
        clock.t = 204.5
    rec.mark("warmup_done")
    rec.close()
    lines = read_lines(tmp_path / "rank0.main.jsonl")[1:]
    assert lines == [
        {"type": "queue", "v": 1, "name": "hs_queue", "ts": WALL0 + 200.0, "depth": 3,
         "capacity": 8},
        {"type": "event", "v": 1, "name": "checkpoint", "ts": WALL0 + 200.0, "dur": 4.5,
         "step": 100},
        {"type": "event", "v": 1, "name": "warmup_done", "ts": WALL0 + 204.5, "dur": 0.0},
    ]


def test_bad_arguments_raise_value_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="stage"):
        Recorder(tmp_path, stage="")
    with pytest.raises(ValueError, match="rank"):
        Recorder(tmp_path, rank=-1)
    with pytest.raises(ValueError, match="world_size"):
        Recorder(tmp_path, rank=4, world_size=4)
    with pytest.raises(ValueError, match="flush_interval"):
        Recorder(tmp_path, flush_interval=2.0)
    rec = Recorder(tmp_path, install_handlers=False)
    with rec.iteration() as it, pytest.raises(ValueError, match="unknown phase kind 'io'"):
        it.phase("x", kind="io")
    rec.close()


def test_disabled_recorder_writes_nothing_and_costs_nothing(tmp_path) -> None:
    run = tmp_path / "never"
    rec = Recorder(run, enabled=False)
    with rec.iteration(tokens=5) as it:
        assert it is NULL_ITERATION
        it.lap("a")
        with it.phase("b", kind="sync"):
            pass
        it.set_kind("a", "compute")
    rec.queue_sample("q", 1, 2)
    with rec.event("e"):
        pass
    with pytest.raises(RuntimeError), rec.iteration():
        raise RuntimeError("propagates")
    rec.close()
    assert not run.exists()
    assert rec.path is None
    assert rec.stats()["records_written"] == 0


def test_closed_recorder_records_nothing_more(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False)
    with rec.iteration():
        pass
    rec.close()
    with rec.iteration() as it:
        it.lap("late")
    rec.close()  # idempotent
    assert len(records(tmp_path / "rank0.main.jsonl")) == 1


def test_nested_iterations_of_one_recorder_are_separate_records(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False)
    clock.t = 0.0
    with rec.iteration() as outer:
        clock.t = 1.0
        with rec.iteration() as inner:
            clock.t = 3.0
            inner.lap("eval_step")
        clock.t = 4.0
        outer.lap("train_step")
    rec.close()
    got = {r["iter"]: r for r in records(tmp_path / "rank0.main.jsonl")}
    assert got[0]["phases"] == {"train_step": 4.0} and got[0]["dur"] == 4.0
    assert got[1]["phases"] == {"eval_step": 2.0} and got[1]["dur"] == 2.0


def test_same_rank_and_stage_twice_gets_a_second_file(tmp_path) -> None:
    a = Recorder(tmp_path, install_handlers=False)
    b = Recorder(tmp_path, install_handlers=False)
    assert a.path.name == "rank0.main.jsonl"
    assert b.path.name == "rank0.main.1.jsonl"
    assert (a.worker, b.worker) == ("main-0", "main-0.1")
    a.close()
    b.close()
    named = Recorder(tmp_path, worker="mine", install_handlers=False)   # a name is kept
    assert named.path.name == "rank0.main.2.jsonl" and named.worker == "mine"
    named.close()


def test_a_restarted_process_keeps_its_iterations_apart(tmp_path) -> None:
    """A second process in the same run directory counts iter from 0 again: as
    worker main-0.1 its 3 iterations load beside the first's 3 (they used to be
    taken for duplicates, and one process's iterations were dropped)."""
    from tlog.ingest import connect, ingest_run

    for _ in range(2):
        rec = Recorder(tmp_path / "run", install_handlers=False)
        for _ in range(3):
            with rec.iteration() as it:
                it.lap("step")
        rec.close()
    con = connect(tmp_path / "t.duckdb")
    try:
        report = ingest_run(con, tmp_path / "run")
        assert report.records_loaded["iter"] == 6 and report.duplicates == 0
        assert con.execute("SELECT worker, count(*), min(iter), max(iter) FROM iterations "
                           "GROUP BY worker ORDER BY worker").fetchall() == [
            ("main-0", 3, 0, 2), ("main-0.1", 3, 0, 2)]
    finally:
        con.close()


def test_threads_each_get_their_own_iteration(tmp_path) -> None:
    rec = Recorder(tmp_path, install_handlers=False)
    seen = []

    def work() -> None:
        with rec.iteration() as it:
            seen.append(it)
            barrier.wait()

    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.close()
    assert seen[0] is not seen[1]
    assert sorted(r["iter"] for r in records(rec.path)) == [0, 1]


def _iterate(rec, clock, start: float, length: float, cpu_used: float) -> None:
    clock.t = start
    with rec.iteration():
        clock.t = start + length
        clock.cpu.t += cpu_used


def test_cpu_of_back_to_back_long_iterations_chains_one_clock_read_each(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, mem_every=0)
    clock.cpu.t = 10.0
    for i in range(3):  # 2 ms iterations, back to back, using 1.5 ms, 1.0 ms, 0.5 ms CPU
        _iterate(rec, clock, 0.002 * i, 0.002, 0.0015 - 0.0005 * i)
    rec.close()
    got = [r["cpu"] for r in records(rec.path)]
    assert got == pytest.approx([0.0015, 0.001, 0.0005], abs=1e-12)
    assert clock.cpu.calls == 4  # one start reading, then one reading per iteration


def test_cpu_of_long_iterations_with_gaps_is_on_every_iteration(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, mem_every=0)
    for i in range(3):  # 5 ms iterations 0.2 ms apart (work outside the iteration)
        _iterate(rec, clock, 0.0052 * i, 0.005, 0.004)
        clock.cpu.t += 0.0002  # CPU spent between iterations is not charged
    rec.close()
    assert [r["cpu"] for r in records(rec.path)] == pytest.approx([0.004] * 3, abs=1e-12)
    assert clock.cpu.calls == 6


def test_cpu_of_short_iterations_is_sampled_about_once_per_millisecond(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, mem_every=0)
    for i in range(25):  # 10 us iterations every 100 us: 2.5 ms in all
        _iterate(rec, clock, 1e-4 * i, 1e-5, 1e-5)
    rec.close()
    got = records(rec.path)
    sampled = [r["iter"] for r in got if "cpu" in r]
    # read at 0; the next read is allowed from 1.01 ms (iteration 11 starts at 1.1 ms),
    # then from 2.11 ms (iteration 22 at 2.2 ms)
    assert sampled == [0, 11, 22]
    assert all(r["cpu"] == pytest.approx(1e-5) for r in got if "cpu" in r)
    assert clock.cpu.calls == 6


def test_context_managers_work_under_exit_stack(tmp_path, clock) -> None:
    """ExitStack calls ``type(cm).__enter__(cm)``: the hot-path managers accept that too."""
    import contextlib

    rec = Recorder(tmp_path, stage="drafter", rank=0, install_handlers=False, cpu=False,
                   mem_every=0)
    clock.t = 100.0
    with contextlib.ExitStack() as stack:
        it = stack.enter_context(rec.iteration())
        clock.t = 100.5
        with contextlib.ExitStack() as inner:
            assert inner.enter_context(it.phase("forward")) is None
            clock.t = 101.25
        stack.enter_context(rec.event("eval"))
        clock.t = 102.0
    rec.close()
    (r,) = records(tmp_path / "rank0.drafter.jsonl")
    assert r["dur"] == 2.0 and r["phases"] == {"forward": 0.75}
    (e,) = records(tmp_path / "rank0.drafter.jsonl", "event")
    assert e["name"] == "eval" and e["dur"] == 0.75

    off = Recorder(tmp_path / "off", enabled=False)
    with contextlib.ExitStack() as stack:
        assert stack.enter_context(off.iteration()) is NULL_ITERATION
        stack.enter_context(NULL_ITERATION.phase("forward"))
        stack.enter_context(off.event("eval"))
