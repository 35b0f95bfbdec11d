"""TimedQueue / timed(): waits become phases of the current iteration, plus depth samples."""

from __future__ import annotations

import queue
import threading
import time

from runtime_helpers import WALL0, records

from dflash_runtime import Recorder, TimedQueue, current_iteration, timed


def test_get_and_put_waits_are_phases_with_kinds(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False)
    q = TimedQueue(4, name="hs_queue", get_phase="hs_get", sample_interval=0.0)
    q.put("batch")  # outside any iteration: not timed, no recorder to sample into
    clock.step = 1.0  # every clock read advances one second
    clock.t = 0.0
    with rec.iteration() as it:        # t0 = 0
        q.get()                        # wait 1 .. 2, depth sample reads 3
        it.lap("mask_build")           # 2 .. 4
        q.put("hidden", phase="hs_put")  # wait 5 .. 6, depth sample reads 7
    rec.close()                        # iteration ends at 8
    (r,) = records(rec.path)
    assert r["phases"] == {"hs_get": 1.0, "mask_build": 2.0, "hs_put": 1.0}
    assert r["kinds"] == {"hs_get": "starvation", "hs_put": "backpressure"}
    assert r["dur"] == 8.0
    samples = records(rec.path, "queue")
    assert samples == [
        {"type": "queue", "v": 1, "name": "hs_queue", "ts": WALL0 + 3.0, "depth": 0,
         "capacity": 4},
        {"type": "queue", "v": 1, "name": "hs_queue", "ts": WALL0 + 7.0, "depth": 1,
         "capacity": 4},
    ]


def test_default_phase_names_and_a_wait_inside_a_block_is_its_child(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False)
    q = TimedQueue(name="batches")
    q.put(1)
    clock.t = 0.0
    with rec.iteration() as it:
        with it.phase("input"):
            clock.t = 1.0
            q.get()
            clock.t = 3.0
        q.put(2)
    rec.close()
    (r,) = records(rec.path)
    assert r["phases"] == {"input": 3.0, "input/batches_get": 0.0, "batches_put": 0.0}
    assert r["kinds"] == {"input/batches_get": "starvation", "batches_put": "backpressure"}


def test_a_real_wait_for_a_slow_producer_is_charged_to_the_consumer(tmp_path) -> None:
    rec = Recorder(tmp_path, install_handlers=False)
    q = TimedQueue(2, name="hs_queue", get_phase="hs_get", recorder=rec)

    def producer() -> None:
        time.sleep(0.2)
        q.put("hidden states")

    t = threading.Thread(target=producer)
    with rec.iteration():
        t.start()
        assert q.get(timeout=5) == "hidden states"
    t.join()
    rec.close()
    (r,) = records(rec.path)
    assert 0.15 <= r["phases"]["hs_get"] <= r["dur"]


def test_a_timed_out_get_still_records_the_wait(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False)
    q = TimedQueue(1, name="q")
    clock.step = 0.5
    clock.t = 0.0
    with rec.iteration():
        try:
            q.get(block=False)
        except queue.Empty:
            pass
    rec.close()
    (r,) = records(rec.path)
    assert r["phases"] == {"q_get": 0.5}


def test_outside_an_iteration_only_depth_is_sampled(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False)
    q = TimedQueue(3, name="q", recorder=rec)
    assert current_iteration() is None
    q.put(1)
    q.put(2)  # within sample_interval of the first sample (frozen clock): not sampled
    rec.close()
    assert [s["depth"] for s in records(rec.path, "queue")] == [1]
    assert records(rec.path) == []


def test_timed_wraps_any_queue_like_object(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False)
    inner = queue.SimpleQueue()
    q = timed(inner, name="mpq", recorder=rec, capacity=16, get_phase="recv_hidden")
    clock.t = 0.0
    q.put("x")  # sampled at 0.0, next sample from 0.1
    clock.step = 1.0
    with rec.iteration():
        assert q.get() == "x"
        assert q.empty()  # passed through to the wrapped queue
    rec.close()
    (r,) = records(rec.path)
    assert r["phases"] == {"recv_hidden": 1.0}
    assert r["kinds"] == {"recv_hidden": "starvation"}
    assert [s["capacity"] for s in records(rec.path, "queue")] == [16, 16]


def test_timed_queue_is_a_queue(tmp_path) -> None:
    q = TimedQueue(2, name="q")
    assert isinstance(q, queue.Queue)
    q.put_nowait(1)
    assert q.get_nowait() == 1
