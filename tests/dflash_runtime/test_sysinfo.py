"""``dflash_runtime.sysinfo``: the sampling pace and one ``sys`` sample of this
process, each figure checked against what the test reads itself."""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from dflash_runtime.sysinfo import (
    ADAPTIVE_MIN_S,
    ADAPTIVE_SAMPLES,
    DEFAULT_SYS_INTERVAL_S,
    Sampler,
    adaptive,
    last_iteration,
    next_gap,
    sys_interval,
)

linux = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")


def test_sys_interval_from_the_argument_then_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("TLOG_SYS_INTERVAL", raising=False)
    assert sys_interval(None) == DEFAULT_SYS_INTERVAL_S == 2.0
    assert sys_interval(0) == 0.0 and sys_interval(0.5) == 0.5
    monkeypatch.setenv("TLOG_SYS_INTERVAL", " 0.25 ")
    assert sys_interval(None) == 0.25
    assert sys_interval(1.0) == 1.0                      # an argument wins
    monkeypatch.setenv("TLOG_SYS_INTERVAL", "fast")
    with pytest.raises(ValueError, match="TLOG_SYS_INTERVAL='fast' is not a number"):
        sys_interval(None)
    for bad in (-1.0, 0.001, float("inf")):
        with pytest.raises(ValueError, match="must be 0 .off. or at least 0.01 seconds"):
            sys_interval(bad)


def test_the_adaptive_pace(monkeypatch) -> None:
    monkeypatch.delenv("TLOG_SYS_INTERVAL", raising=False)
    assert adaptive(None) and not adaptive(2.0)
    monkeypatch.setenv("TLOG_SYS_INTERVAL", "2")
    assert not adaptive(None)
    # age / 32 between 0.05 s and the interval
    assert next_gap(2.0, 0.0, adapt=True) == ADAPTIVE_MIN_S == 0.05
    assert next_gap(2.0, 16.0, adapt=True) == 16.0 / ADAPTIVE_SAMPLES == 0.5
    assert next_gap(2.0, 640.0, adapt=True) == 2.0
    assert next_gap(2.0, 16.0, adapt=False) == 2.0
    assert next_gap(0.0, 16.0, adapt=True) == 0.0


def test_last_iteration_reads_the_recorders_counter() -> None:
    counter = itertools.count()
    rec = SimpleNamespace(_counter=counter)
    assert last_iteration(rec) is None
    next(counter), next(counter), next(counter)
    assert last_iteration(rec) == 2
    assert last_iteration(SimpleNamespace()) is None


@linux
def test_a_sample_of_this_process() -> None:
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait)
    extra.start()
    try:
        before = time.process_time()
        s = Sampler().sample(SimpleNamespace(_counter=itertools.count(8)))
        after = time.process_time()
        threads_now = len(os.listdir("/proc/self/task"))
    finally:
        stop.set()
        extra.join()
    assert s["type"] == "sys" and s["v"] == 1 and s["iter"] == 7
    assert before - 1e-6 <= s["cpu"] <= after + 1e-6
    assert s["ncpu"] == len(os.sched_getaffinity(0))
    assert s["threads"] == threads_now
    assert 0 <= s["running"] < s["threads"]
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert abs(s["rss"] - rss) <= 0.1 * rss
    assert s["load1"] == pytest.approx(os.getloadavg()[0], abs=1.0)
    assert abs(s["ts"] - time.time()) < 5.0


@linux
def test_the_machine_is_described_once() -> None:
    sampler = Sampler()
    m = sampler.machine(SimpleNamespace())
    assert m["host"] == socket.gethostname() and m["ncpu"] == os.cpu_count()
    with open("/proc/meminfo") as f:
        kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert m["mem_total"] == kib * 1024
    assert set(m) == {"host", "cpu_model", "ncpu", "mem_total", "gpu_name", "gpu_count",
                      "driver", "cuda"}
    m["host"] = "changed"
    assert sampler.machine(SimpleNamespace())["host"] == socket.gethostname()   # a copy
