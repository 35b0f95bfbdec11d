"""``analyze.rules.machine``: ``memory_growth``, ``cpu_contention``,
``gpu_underused`` and ``gpu_throttled`` from samples written by hand."""

from __future__ import annotations

import numpy as np
import pytest
from tlog.analyze.rules.drift import DriftPolicy
from tlog.analyze.rules.machine import (
    CONTENTION_ADVICE,
    OTHERS_ADVICE,
    MachinePolicy,
    contention_advice,
    contention_words,
    memory_trend,
    shared_cores_note,
)

from tests.support.runbuilder import RunBuilder, loop

MiB, GiB = 1 << 20, 1 << 30


def test_memory_trend_of_a_leak_and_of_a_plateau() -> None:
    th, trend = MachinePolicy(), DriftPolicy()
    x = np.arange(100.0)
    # 1 MiB an iteration: 99 MiB over the readings, at least 64 MiB (memory_min_rise)
    leak = memory_trend(x, GiB + x * MiB, th, trend)
    assert leak["rate_bytes_per_iter"] == pytest.approx(MiB)
    assert leak["second_half_rate"] == pytest.approx(MiB)
    assert (leak["iterations"], leak["blocks"], leak["tau"]) == (99.0, 8, 1.0)
    # growth that stops halfway: the second half's rate (0) is under half the whole
    plateau = GiB + np.minimum(x, 50) * 4 * MiB
    assert memory_trend(x, plateau, th, trend) is None
    assert memory_trend(x, GiB + x * 1024, th, trend) is None           # 99 KiB: too small
    assert memory_trend(x[:7], GiB + x[:7] * MiB, th, trend) is None     # fewer than 8 readings
    assert memory_trend(x, GiB - x * MiB, th, trend) is None             # shrinking


def test_contention_words_and_advice() -> None:
    c = {"ncpu": 1, "running": 3.0, "load1": 2.94}
    assert contention_words(c) == "3 runnable threads of the process on 1 usable core, load 2.9"
    assert contention_words({"ncpu": 4, "running": None, "load1": None}) == "4 usable cores"
    assert contention_advice(c) == CONTENTION_ADVICE
    # 1 runnable thread of the process on 2 cores: the crowd is other processes
    assert contention_advice({"ncpu": 2, "running": 1.0}) == OTHERS_ADVICE
    assert shared_cores_note(0.23) == (
        " (rough: the ranks shared CPU cores, waiting for one up to 23% of their time: "
        "each rank's work slowed the others', which the model does not see)")


def _sampled(cpu: float, **sample) -> RunBuilder:
    """30 iterations of 100 ms (forward) whose thread was on the CPU ``cpu`` s each,
    and a sample every 0.5 s with ``sample``'s fields (callables of the sample's k)."""
    b = RunBuilder("m", tags={"device": "cpu"})
    loop(b, 30, [("forward", 0.1)], cpu=cpu)
    for k in range(7):
        b.sys_sample(ts=1000.0 + 0.5 * k,
                     **{n: (v(k) if callable(v) else v) for n, v in sample.items()})
    return b


def test_measured_contention_leads_a_compute_bound_stage(findings) -> None:
    # the thread waited runnable for a core 0.25 s per 0.5 s: 50% of its time; it was
    # on the CPU 50 ms of each 100 ms; 3 runnable threads on 1 core
    b = _sampled(0.05, ncpu=1, running=3, load1=2.9, cpu_wait_s=lambda k: 0.25 * k)
    (f,) = findings(b, "cpu_contention")
    assert f.severity == "critical" and f.evidence["leads"] is True
    assert f.evidence["run_queue_share"] == pytest.approx(0.5)
    assert f.evidence["contention_s_per_iter"] == pytest.approx(0.05)
    assert f.evidence["guess"] is False
    assert f.message.startswith("rank 0 of main lacks a CPU: its thread waited runnable for "
                                "a core 50% of its time (50 ms per iteration, the scheduler's "
                                "run-queue delay) with 3 runnable threads of the process on 1 "
                                "usable core, load 2.9")


def test_a_guess_without_run_queue_figures_says_so(findings) -> None:
    (f,) = findings(_sampled(0.05, ncpu=1, running=3, load1=2.9), "cpu_contention")
    assert f.severity == "warning" and f.evidence["guess"] is True
    assert "tlog's guess: no run-queue figures" in f.message
    # the same thread on a machine with cores to spare: no contention
    assert findings(_sampled(0.05, ncpu=8, running=1, load1=0.5), "cpu_contention") == []


def test_memory_growth_of_the_iterations_mem(findings) -> None:
    b = RunBuilder("leak", tags={"device": "cpu"})
    for i in range(100):
        b.iteration(iter=i, ts=1000.0 + 0.1 * i, dur=0.1, phases=[("forward", 0.1)],
                    mem={"allocated": GiB + i * MiB})
    (f,) = findings(b, "memory_growth")
    assert f.severity == "warning"
    assert f.evidence["rate_bytes_per_iter"] == pytest.approx(MiB)


def test_gpu_underused_while_the_host_is_busy(findings) -> None:
    # the GPU busy 20% of the time, the thread on the CPU 95 ms of each 100 ms
    b = RunBuilder("g")
    loop(b, 30, [("forward", 0.1, 0.02)], cpu=0.095)
    for k in range(7):
        b.sys_sample(ts=1000.0 + 0.5 * k, gpu_util=20.0)
    (f,) = findings(b, "gpu_underused")
    assert f.evidence["gpu_util"] == 20.0
    assert f.evidence["thread_cpu_share"] == pytest.approx(0.95)
    assert f.message.startswith("rank 0 of main: the GPU is busy only 20% of the time while "
                                "the host is busy")


def test_gpu_throttled_by_a_power_cap(findings) -> None:
    # 4 of 7 samples at work carry the power-cap reason (0x4)
    b = RunBuilder("t")
    loop(b, 30, [("forward", 0.1, 0.09)])
    for k in range(7):
        b.sys_sample(ts=1000.0 + 0.5 * k, gpu_util=90.0, gpu_throttle=0x4 if k < 4 else 0,
                     gpu_sm_clock_mhz=1400.0, gpu_sm_clock_max_mhz=1980.0)
    (f,) = findings(b, "gpu_throttled")
    assert f.evidence["reasons"] == ["software power cap"]
    # every sample is slowed: a reason, or a busy GPU's clock under 90% of its maximum
    assert f.evidence["throttled_share"] == pytest.approx(1.0)
    assert f.evidence["sm_clock_mhz"] == 1400.0
