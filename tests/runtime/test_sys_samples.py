"""``sys`` samples of the shim (dflash_runtime/sysinfo.py): taken on the writer
thread, what they measure against what the test did, NVML through a fake
``pynvml`` module, the ``machine`` of the meta line, and the ingest of both."""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
import types

import pytest
from runtime_helpers import read_lines, records
from tlog.ingest import ingest_run
from tlog.ingest.db import connect

from dflash_runtime import Recorder, sysinfo
from dflash_runtime.sysinfo import Sampler, last_iteration

MiB = 1 << 20


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y on x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


@pytest.fixture
def fresh_sampler(monkeypatch: pytest.MonkeyPatch):
    """A new process-wide sampler (it caches NVML and the machine once per process)."""
    monkeypatch.setattr(sysinfo, "_sampler", None)


def test_rss_rises_by_what_the_loop_retains(tmp_path, fresh_sampler) -> None:
    """A real loop that keeps 8 MiB per step: the sys records' rss rises 8 MiB per
    iteration (least squares over every sample, within 10% of the bytes kept),
    and every sys record of the file loads into sys_samples."""
    keep: list[bytes] = []
    step = 8 * MiB
    rec = Recorder(tmp_path, sys_interval=0.02, install_handlers=False)
    for _ in range(12):
        with rec.iteration() as it:
            keep.append(b"\x01" * step)         # written, so resident: 8 MiB a step
            it.lap("retain")
            time.sleep(0.06)
    rec.close()
    samples = records(rec.path, "sys")
    points = [(s["iter"], s["rss"]) for s in samples if s["iter"] is not None]
    assert len({x for x, _ in points}) >= 8, points        # most iterations sampled
    assert _slope(points) == pytest.approx(step, rel=0.10)
    assert all(s["ncpu"] == len(os.sched_getaffinity(0)) for s in samples)
    cpu = [s["cpu"] for s in samples]
    assert cpu == sorted(cpu) and cpu[-1] <= time.process_time()
    con = connect(tmp_path / "t.duckdb")
    try:
        report = ingest_run(con, tmp_path)
        assert report.records_loaded["sys"] == len(samples) and report.records_rejected == 0
        got = con.execute("SELECT worker, iter, rss_bytes, cpu_s FROM sys_samples "
                          "ORDER BY line").fetchall()
        assert got == [("main-0", s["iter"], s["rss"], pytest.approx(s["cpu"])) for s in samples]
    finally:
        con.close()


def test_samples_are_taken_on_the_writer_thread(tmp_path, monkeypatch, fresh_sampler) -> None:
    """Every sample while recording is taken by the writer thread; the training
    thread takes only the last one, at close."""
    threads: list[str] = []
    real = Sampler.sample

    def spy(self, rec):
        threads.append(threading.current_thread().name)
        return real(self, rec)

    monkeypatch.setattr(Sampler, "sample", spy)
    rec = Recorder(tmp_path, sys_interval=0.02, install_handlers=False)
    for _ in range(10):
        with rec.iteration():
            time.sleep(0.02)
    rec.close()
    assert len(threads) >= 4
    assert set(threads[:-1]) == {"tlog-writer"} and threads[-1] == "MainThread"
    assert len(records(rec.path, "sys")) == len(threads)


def test_interval_zero_writes_no_sys_record_and_no_machine(tmp_path) -> None:
    rec = Recorder(tmp_path, sys_interval=0, install_handlers=False)
    with rec.iteration():
        pass
    rec.close()
    lines = read_lines(rec.path)
    assert [r["type"] for r in lines] == ["meta", "iter"]
    assert "machine" not in lines[0]


def test_interval_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("TLOG_SYS_INTERVAL")
    assert sysinfo.sys_interval(None) == 2.0
    monkeypatch.setenv("TLOG_SYS_INTERVAL", "0.5")
    assert sysinfo.sys_interval(None) == 0.5
    assert sysinfo.sys_interval(3) == 3.0                     # an argument wins
    monkeypatch.setenv("TLOG_SYS_INTERVAL", "often")
    with pytest.raises(ValueError, match="TLOG_SYS_INTERVAL='often'"):
        Recorder("unused", install_handlers=False)
    for bad in (-1, 0.001, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="sys_interval"):
            sysinfo.sys_interval(bad)


def test_last_iteration_costs_the_training_thread_nothing() -> None:
    class Rec:
        _counter = itertools.count()

    assert last_iteration(Rec) is None
    next(Rec._counter)
    next(Rec._counter)
    assert last_iteration(Rec) == 1


def test_running_counts_threads_on_or_waiting_for_a_cpu() -> None:
    """Threads hashing large buffers (hashlib releases the GIL) are runnable
    (state R); the sampling thread itself is not counted; idle ones are not."""
    s = Sampler()
    idle = [s.sample(object())["running"] for _ in range(3)]
    stop = threading.Event()
    data = b"x" * (8 * MiB)

    def burn() -> None:
        while not stop.is_set():
            hashlib.sha256(data).digest()

    busy = [threading.Thread(target=burn, daemon=True) for _ in range(3)]
    for t in busy:
        t.start()
    try:
        time.sleep(0.05)
        loaded = [s.sample(object()) for _ in range(5)]
    finally:
        stop.set()
        for t in busy:
            t.join()
    assert min(idle) == 0
    assert max(x["running"] for x in loaded) >= 2
    assert all(x["threads"] >= 4 for x in loaded)   # this one and the three


class _NotSupported(Exception):
    pass


def _fake_nvml(calls: list[str]) -> types.ModuleType:
    """A ``pynvml`` stand-in: device 2 of 4 reports fixed figures; power is not
    supported (raises, as NVML does on some boards)."""
    nv = types.ModuleType("pynvml")
    nv.NVML_TEMPERATURE_GPU = 0
    nv.NVML_CLOCK_SM = 1

    def rec(name, value):
        def f(*args):
            calls.append(name)
            if isinstance(value, Exception):
                raise value
            return value(*args) if callable(value) else value
        return f

    nv.nvmlInit = rec("init", None)
    nv.nvmlDeviceGetCount = rec("count", 4)
    nv.nvmlDeviceGetHandleByIndex = rec("by_index", lambda i: f"handle-{i}")
    nv.nvmlDeviceGetHandleByUUID = rec("by_uuid", _NotSupported("no uuid"))
    nv.nvmlDeviceGetUtilizationRates = rec(
        "util", types.SimpleNamespace(gpu=37, memory=12))
    nv.nvmlDeviceGetMemoryInfo = rec(
        "mem", types.SimpleNamespace(used=3 * 1024**3, total=80 * 1024**3, free=77 * 1024**3))
    nv.nvmlDeviceGetTemperature = rec("temp", lambda h, sensor: 71 if sensor == 0 else -1)
    nv.nvmlDeviceGetClockInfo = rec("clock", lambda h, kind: 1410 if kind == 1 else -1)
    nv.nvmlDeviceGetMaxClockInfo = rec("max_clock", lambda h, kind: 1980 if kind == 1 else -1)
    nv.nvmlDeviceGetPowerUsage = rec("power", _NotSupported("power"))
    nv.nvmlDeviceGetCurrentClocksEventReasons = rec("reasons", 0x20 | 0x4)
    nv.nvmlDeviceGetName = rec("name", lambda h: b"NVIDIA H200" if h == "handle-2" else b"?")
    nv.nvmlSystemGetDriverVersion = rec("driver", "550.54.15")
    nv.nvmlSystemGetCudaDriverVersion = rec("cuda", 12040)
    return nv


GPU = {"util": 37.0, "mem_used": 3 * 1024**3, "mem_total": 80 * 1024**3, "temp": 71.0,
       "sm_clock": 1410.0, "sm_clock_max": 1980.0, "throttle": 0x24}


def test_fake_nvml_gives_exact_gpu_fields(monkeypatch) -> None:
    """The device CUDA_VISIBLE_DEVICES names (2) is asked; an unsupported query
    (power) is left out and not asked again."""
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(calls))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if "torch" in sys.modules:   # a CPU torch never has CUDA initialised
        assert not sys.modules["torch"].cuda.is_initialized()
    s = Sampler()
    first, second = s.sample(object()), s.sample(object())
    assert first["gpu"] == GPU and second["gpu"] == GPU
    assert "cuda" not in first
    assert calls.count("init") == 1 and calls.count("by_index") == 1
    assert calls.count("power") == 1 and calls.count("util") == 2


def test_machine_row_from_the_meta_line(tmp_path, monkeypatch, fresh_sampler) -> None:
    """A recorder writes the machine into its meta line and gpu fields into its
    sys records; ingest gives the machines row and the sys_samples gpu columns."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    rec = Recorder(tmp_path, stage="drafter", rank=1, sys_interval=0.05, install_handlers=False)
    for _ in range(3):
        with rec.iteration():
            time.sleep(0.03)
    rec.close()
    meta = read_lines(rec.path)[0]
    with open("/proc/meminfo") as f:   # independent of sysconf: MemTotal kB
        kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    cpu_model = None
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    assert meta["machine"] == {"host": socket.gethostname(), "cpu_model": cpu_model,
                               "ncpu": os.cpu_count(), "mem_total": kb * 1024,
                               "gpu_name": "NVIDIA H200", "gpu_count": 4,
                               "driver": "550.54.15", "cuda": "12.4"}
    samples = records(rec.path, "sys")
    assert samples and all(s["gpu"] == GPU for s in samples)
    con = connect(tmp_path / "t.duckdb")
    try:
        ingest_run(con, tmp_path)
        assert con.execute("SELECT worker, host, cpu_model, ncpu, mem_total, gpu_name, "
                           "gpu_count, driver, cuda FROM machines").fetchall() == [
            ("drafter-1", socket.gethostname(), cpu_model, os.cpu_count(), kb * 1024,
             "NVIDIA H200", 4, "550.54.15", "12.4")]
        got = con.execute("SELECT DISTINCT gpu_util, gpu_mem_used, gpu_mem_total, gpu_temp_c, "
                          "gpu_sm_clock_mhz, gpu_sm_clock_max_mhz, gpu_power_w, gpu_throttle, "
                          "count(*) OVER () FROM sys_samples").fetchall()
        assert got == [(37.0, 3 * 1024**3, 80 * 1024**3, 71.0, 1410.0, 1980.0, None, 0x24,
                        len(samples))]
    finally:
        con.close()


def _fake_torch(calls: list) -> types.ModuleType:
    """A ``torch`` stand-in with CUDA initialised on two devices: the allocator's
    host-side counters per device, a memory fraction of one half."""
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(cuda="12.8")
    stats = {0: {"allocated_bytes.all.current": 1, "reserved_bytes.all.current": 2,
                 "num_alloc_retries": 0},
             1: {"allocated_bytes.all.current": 3 * MiB, "reserved_bytes.all.current": 8 * MiB,
                 "num_alloc_retries": 5}}

    def memory_stats(dev):
        calls.append(("memory_stats", dev))
        return stats[dev]

    def synchronize(*args):   # the sampler must never call it
        calls.append(("synchronize",))

    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: 2, memory_stats=memory_stats,
        get_device_properties=lambda dev: types.SimpleNamespace(
            total_memory=80 * 1024**3, uuid=f"uuid-{dev}"),
        get_per_process_memory_fraction=lambda dev: 0.5, synchronize=synchronize,
        get_device_name=lambda dev: f"Fake GPU {dev}")
    return torch


def test_cuda_allocator_figures_of_the_process_device(monkeypatch) -> None:
    """With CUDA initialised, ``cuda`` holds the allocator's counters of the device
    torchrun gives the process (LOCAL_RANK 1 of 2 devices) and the limit its memory
    fraction allows; nothing synchronises. Without NVML, the machine's GPU comes
    from torch."""
    calls: list = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(calls))
    monkeypatch.setitem(sys.modules, "pynvml", None)    # import pynvml -> ImportError
    monkeypatch.setenv("LOCAL_RANK", "1")
    s = Sampler()
    sample = s.sample(object())
    assert sample["cuda"] == {"allocated": 3 * MiB, "reserved": 8 * MiB, "retries": 5,
                              "limit": 40 * 1024**3}
    assert "gpu" not in sample
    assert calls == [("memory_stats", 1)]
    machine = s.machine(object())
    assert (machine["cuda"], machine["gpu_name"], machine["gpu_count"]) == ("12.8", "Fake GPU 1", 2)


def test_cpu_wait_is_the_recording_threads_run_queue_wait() -> None:
    """Pinned to one core with two busy processes, the recording thread (which
    only hashes: it never blocks) is off the CPU only while it waits for the
    core: ``cpu_wait`` rises by its wall time minus its CPU time
    (``time.thread_time``). Measured here it is equal to 0.1 ms in most windows;
    a window where the thread also waited off the run queue (the GIL, while a
    thread left by an earlier test ran) rises by less. So: in each of three
    windows no more than the off-CPU time (+2% of the wall time) and at least a
    third of the wall time (three tasks share one core), and in the best one
    within 2% of the wall time. The rivals are processes: rival threads would
    make this one wait for the GIL too, off the CPU but not runnable."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    data = b"x" * (4 * MiB)
    os.sched_setaffinity(0, {core})      # this thread only
    rivals = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for p in rivals:
            os.sched_setaffinity(p.pid, {core})
        time.sleep(0.05)
        rec = Recorder("unused", enabled=False)
        rec._threads.append(threading.get_native_id())   # what iteration() does per thread
        s = Sampler()
        assert s.sample(rec)["cpu_wait"] >= 0
        windows = []
        for _ in range(3):
            # the clocks bracket the two readings, so a wait for the core between a
            # reading and a clock falls inside both measures
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            first = s._cpu_wait(rec)                    # the sample's own reading, alone
            for _ in range(12):
                hashlib.sha256(data).digest()
            waited = s._cpu_wait(rec) - first
            windows.append((waited, time.perf_counter() - wall0, time.thread_time() - cpu0))
    finally:
        for p in rivals:
            p.kill()
            p.wait()
        os.sched_setaffinity(0, before)
    for waited, wall, cpu in windows:
        assert wall / 3 <= waited <= wall - cpu + 0.02 * wall
    assert min(abs(waited - (wall - cpu)) / wall for waited, wall, cpu in windows) <= 0.02


def test_iteration_threads_are_noted_once(tmp_path) -> None:
    rec = Recorder(tmp_path, sys_interval=0, install_handlers=False)
    for _ in range(3):
        with rec.iteration():
            pass
    t = threading.Thread(target=lambda: rec.iteration().__exit__(None, None, None))
    t.start()
    t.join()
    rec.close()
    assert rec._threads == [threading.get_native_id(), t.native_id]
