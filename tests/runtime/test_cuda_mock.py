"""Device times without synchronisation, against a fake ``torch`` (docs: "Device time").

The fake CUDA API raises on every call that would block the host on the device
(``torch.cuda.synchronize``, ``Event.synchronize``/``wait``, ``Stream.synchronize``,
``.item()``, ``.cpu()``) and on ``elapsed_time`` before the end event completed, as real
CUDA does (cudaErrorNotReady). The test controls when the fake device finishes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import types

import pytest
from runtime_helpers import records

from dflash_runtime import Recorder


class SyncCalled(AssertionError):
    """A code path blocked the host on the device."""


def _forbidden(what: str):
    def call(*args, **kwargs):
        raise SyncCalled(f"{what} called: the shim must never synchronise")

    return call


class FakeDevice:
    """Completion state of recorded events; ``finish()`` retires all queued work."""

    def __init__(self) -> None:
        self.clock_ms = 0.0
        self.done_upto = 0  # events with seq < done_upto are complete
        self.seq = 0
        self.queries = 0
        self.query_threads: set[str] = set()
        self.set_device_calls: list[tuple[str, int]] = []
        self.device_ctx_calls: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def finish(self) -> None:
        with self.lock:
            self.done_upto = self.seq


class FakeEvent:
    synchronize = _forbidden("Event.synchronize")
    wait = _forbidden("Event.wait")
    item = _forbidden("Event.item")
    cpu = _forbidden("Event.cpu")

    def __init__(self, device: FakeDevice, enable_timing: bool = False) -> None:
        assert enable_timing
        self.device = device
        self.seq = None
        self.at_ms = None

    def record(self, stream) -> None:
        with self.device.lock:
            self.seq = self.device.seq
            self.device.seq += 1
            self.at_ms = stream.device_ms  # device time when the work before it ends
            stream.pending.append(self)

    def query(self) -> bool:
        d = self.device
        d.queries += 1
        d.query_threads.add(threading.current_thread().name)
        return self.seq is not None and self.seq < d.done_upto

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")  # what torch raises
        return end.at_ms - self.at_ms


class FakeStream:
    synchronize = _forbidden("Stream.synchronize")
    wait_stream = _forbidden("Stream.wait_stream")
    item = _forbidden("Stream.item")
    cpu = _forbidden("Stream.cpu")

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index
        self.device_ms = 0.0
        self.pending: list = []

    def run(self, ms: float) -> None:
        """Enqueue ``ms`` of device work on this stream (the host does not wait)."""
        self.device_ms += ms


@pytest.fixture
def fake_torch(monkeypatch):
    device = FakeDevice()
    cuda = types.ModuleType("torch.cuda")
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: True
    cuda.synchronize = _forbidden("torch.cuda.synchronize")
    cuda.current_stream = _forbidden("torch.cuda.current_stream")  # not needed: stream given
    cuda.Event = lambda enable_timing=False: FakeEvent(device, enable_timing)
    cuda.set_device = lambda i: device.set_device_calls.append(
        (threading.current_thread().name, i))

    @contextlib.contextmanager
    def device_ctx(i):
        device.device_ctx_calls.append((threading.current_thread().name, i))
        yield

    cuda.device = device_ctx
    cuda.memory_stats = lambda device=None: {
        "allocated_bytes.all.current": 2048, "reserved_bytes.all.current": 4096,
        "num_alloc_retries": 1, "num_device_alloc": 7, "active.all.current": 3,
    }
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"
    torch.cuda = cuda
    torch.device_state = device
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.cuda", cuda)
    return torch


def test_gpu_field_appears_only_when_events_complete_and_nothing_syncs(tmp_path, fake_torch):
    dev = fake_torch.device_state
    s = FakeStream(device_index=0)
    rec = Recorder(tmp_path, install_handlers=False, mem_every=0)
    for _ in range(3):
        with rec.iteration() as it:
            with it.phase("draft_forward", stream=s):
                s.run(12.5)
            with it.phase("backward", stream=s):
                s.run(20.0)
                with it.phase("allreduce", stream=s):
                    s.run(5.0)
            with it.phase("backward", stream=s):  # a repeated name sums
                s.run(2.5)
    rec.flush()
    assert records(rec.path) == []  # the device has not finished: records wait
    assert rec.stats()["gpu_pending"] == 3
    dev.finish()
    rec.close()
    got = records(rec.path)
    assert [r["gpu"] for r in got] == [
        {"draft_forward": 0.0125, "backward": 0.0275, "backward/allreduce": 0.005}] * 3
    assert dev.queries > 0
    # flush()/close() ran here, on the training thread: its current device is only
    # switched inside torch.cuda.device(...) (restored after), never set for good
    assert all(name != "MainThread" for name, _ in dev.set_device_calls)
    assert ("MainThread", 0) in dev.device_ctx_calls


def test_events_are_polled_by_the_writer_thread(tmp_path, fake_torch):
    dev = fake_torch.device_state
    s = FakeStream()
    rec = Recorder(tmp_path, install_handlers=False, flush_interval=0.05)
    with rec.iteration() as it, it.phase("forward", stream=s):
        s.run(1.0)
    dev.finish()
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not records(rec.path):
        time.sleep(0.02)
    assert records(rec.path)[0]["gpu"] == {"forward": 0.001}
    assert "tlog-writer" in dev.query_threads
    assert ("tlog-writer", 0) in dev.set_device_calls  # queried with the device current
    rec.close()


def test_event_pool_is_bounded_and_drops_are_counted(tmp_path, fake_torch):
    dev = fake_torch.device_state
    s = FakeStream()
    rec = Recorder(tmp_path, install_handlers=False, max_gpu_events=4)
    for _ in range(10):  # a loop that never synchronises
        with rec.iteration() as it, it.phase("forward", stream=s):
            s.run(1.0)
    assert rec.stats()["gpu_dropped"] == 6
    dev.finish()
    rec.flush()
    # the pool is refilled once the writer has seen the events complete
    with rec.iteration() as it, it.phase("forward", stream=s):
        s.run(3.0)
    dev.finish()
    rec.close()
    got = sorted(records(rec.path), key=lambda r: r["iter"])
    assert [("gpu" in r) for r in got] == [True] * 4 + [False] * 6 + [True]
    assert got[-1]["gpu"] == {"forward": 0.003}
    assert rec.stats()["gpu_dropped"] == 6


def test_close_gives_up_on_unfinished_events_without_syncing(tmp_path, fake_torch):
    s = FakeStream()
    rec = Recorder(tmp_path, install_handlers=False)
    with rec.iteration() as it, it.phase("forward", stream=s):
        s.run(1.0)
    rec.close(timeout=0.2)  # the fake device never finishes
    (r,) = records(rec.path)
    assert "gpu" not in r and r["phases"].keys() == {"forward"}
    assert rec.stats()["gpu_dropped"] == 1


def test_memory_figures_every_n_iterations(tmp_path, fake_torch):
    rec = Recorder(tmp_path, install_handlers=False, mem_every=2)
    for _ in range(5):
        with rec.iteration():
            pass
    rec.close()
    mem = {r["iter"]: r.get("mem") for r in records(rec.path)}
    figures = {"allocated": 2048, "reserved": 4096, "alloc_retries": 1, "device_allocs": 7}
    assert mem == {0: figures, 1: None, 2: figures, 3: None, 4: figures}


def test_without_torch_a_stream_argument_only_times_the_host(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    rec = Recorder(tmp_path, install_handlers=False)
    with rec.iteration() as it, it.phase("forward", stream=object()):
        pass
    rec.close()
    (r,) = records(rec.path)
    assert "gpu" not in r and list(r["phases"]) == ["forward"]
    assert "torch" not in sys.modules


def test_the_shim_source_has_no_blocking_device_call():
    """Belt and braces for the mocked test: no call site exists at all (pipeline excluded)."""
    import re
    from pathlib import Path

    import dflash_runtime

    pkg = Path(dflash_runtime.__file__).parent
    pattern = re.compile(r"\.(synchronize|item|cpu|tolist|numpy)\(|cuda\.synchronize")
    offenders = [f"{p.name}:{i}" for p in sorted(pkg.glob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if pattern.search(line.split("#")[0])]
    assert offenders == []


def test_ddp_wait_event_pair_lands_in_gpu_without_sync(tmp_path, fake_torch):
    """watch_ddp on CUDA: the last bucket's pair (start at readiness, end in the completion
    callback) is resolved by polling into ``gpu['backward/ddp_allreduce_wait']``."""
    from dflash_runtime.collectives import CollectiveSlot

    dev = fake_torch.device_state
    s = FakeStream(device_index=0)
    rec = Recorder(tmp_path, install_handlers=False, mem_every=0)
    rec._coll = slot = CollectiveSlot()
    with rec.iteration() as it, it.phase("backward"):
        s.run(4.0)                          # backward kernels
        pair = rec._acquire_events(s)       # what the hook does at the last bucket
        pair[0].record(s)
        slot.ready(time.perf_counter(), True, pair)
        s.run(7.5)                          # the all-reduce the streams wait for
        pair[1].record(s)                   # recorded in the completion callback
        slot.done(time.perf_counter())      # host: NCCL returned at once
    rec.flush()
    assert records(rec.path) == []          # waits for the device, never syncs
    dev.finish()
    rec.close()
    (r,) = records(rec.path)
    assert r["gpu"] == {"backward/ddp_allreduce_wait": 0.0075}
    assert r["kinds"] == {"backward/ddp_allreduce_wait": "sync"}
    assert rec._pools[0]._free                # the pair went back to the pool


def test_begin_end_with_a_stream_records_the_device_time_like_the_with_form(tmp_path, fake_torch):
    s = FakeStream(device_index=0)
    rec = Recorder(tmp_path, install_handlers=False, mem_every=0)
    it = rec.begin_iteration()
    it.begin("forward", stream=s)
    s.run(12.5)
    it.begin("attn", stream=s)
    s.run(2.5)
    it.end("attn")
    it.end("forward")
    it.begin("backward", stream=s)
    s.run(20.0)
    rec.end_iteration()   # backward still open: it and its end event end here
    fake_torch.device_state.finish()
    rec.close()
    (r,) = records(rec.path)
    assert set(r["phases"]) == {"forward", "forward/attn", "backward"}
    assert r["gpu"] == {"forward": 0.015, "forward/attn": 0.0025, "backward": 0.02}
