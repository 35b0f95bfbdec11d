"""The findings from the machine's samples (analyze/rules/machine.py), on runs
written by hand: ``sys_samples`` rows shaped as the shim's sampler and NVML
give them, each figure checked against its value computed by hand.

The loops in test_machine_loops.py check the same findings on real runs.
"""

from __future__ import annotations

import pytest
from tlog.analyze import diagnose
from tlog.analyze.text import system_line

from tests.support.cli import invoke
from tests.support.runbuilder import RunBuilder, loop

MiB = 1 << 20
GiB = 1 << 30


def _codes(d) -> list[str]:
    return [f.code for f in d.findings]


def _of(d, code: str) -> list:
    return [f for f in d.findings if f.code == code]


def _samples(b: RunBuilder, n_iter: int, dur: float, every: int, **fields) -> None:
    """A sample every ``every`` iterations of a loop of ``dur`` s from ts 1000;
    each field a value or a function of the iteration."""
    for i in range(0, n_iter, every):
        b.sys_sample(ts=1000.0 + i * dur + dur / 2, iter=i,
                     **{k: (v(i) if callable(v) else v) for k, v in fields.items()})


# --- memory_growth ---------------------------------------------------------------

def test_rss_growing_8_mib_per_iteration_is_a_leak_with_its_rate_and_time_left(build) -> None:
    # 120 iterations of 10 ms; RSS 500 MiB + 8 MiB per iteration, sampled every 5
    # iterations with +-3 MiB of alternating noise. Rate by hand: 8 MiB/iteration.
    # The machine has 3 GiB: from the last block's median the rest lasts
    # (3072 MiB - that) / 8 MiB iterations.
    b = RunBuilder()
    loop(b, 120, [("forward", 0.010)], cpu=0.010)
    _samples(b, 120, 0.010, 5, rss_bytes=lambda i: 500 * MiB + 8 * MiB * i
             + (3 * MiB if (i // 5) % 2 else -3 * MiB), ncpu=2, running=1, load1=0.5)
    b.machine(host="box", cpu_model="X", ncpu=2, mem_total=3 * GiB)
    d = diagnose(build(b), "r")
    [f] = _of(d, "memory_growth")
    ev = f.evidence
    assert ev["memory"] == "rss"
    assert ev["rate_mib_per_iter"] == pytest.approx(8.0, rel=0.01)
    assert ev["tau"] == 1.0 and ev["p_value"] < 1e-4
    assert ev["limit_bytes"] == 3 * GiB
    assert ev["iterations_left"] == pytest.approx((3 * GiB - ev["last_bytes"]) / (8 * MiB),
                                                  rel=0.01)
    assert "RSS grows 8.00 MiB per iteration" in f.message
    assert "reaches the machine's 3.00 GiB in" in f.message
    # 3 GiB at 8 MiB/iter from ~1.4 GiB: ~200 iterations left, more than the window's
    # ~115 iterations: a warning, not yet critical.
    assert f.severity == "warning"
    assert "allocator_thrash" not in _codes(d)


def test_flat_noisy_or_levelled_memory_is_no_leak(build) -> None:
    # Flat with +-40 MiB noise; a warm-up that grows 8 MiB/iter for 25 iterations
    # then stays (a plateau); a slow rise of 32 MiB in total (below 64 MiB).
    b = RunBuilder("flat")
    loop(b, 100, [("forward", 0.010)])
    _samples(b, 100, 0.010, 5, rss_bytes=lambda i: 900 * MiB + (40 * MiB if (i * 7) % 3 else 0))
    assert _of(diagnose(build(b), "flat"), "memory_growth") == []
    b = RunBuilder("plateau")
    loop(b, 100, [("forward", 0.010)])
    _samples(b, 100, 0.010, 5, rss_bytes=lambda i: 500 * MiB + 8 * MiB * min(i, 25))
    assert _of(diagnose(build(b), "plateau"), "memory_growth") == []
    b = RunBuilder("slow")
    loop(b, 100, [("forward", 0.010)])
    _samples(b, 100, 0.010, 5, rss_bytes=lambda i: 500 * MiB + (32 * MiB * i) // 100)
    assert _of(diagnose(build(b), "slow"), "memory_growth") == []


def test_device_memory_reaching_its_limit_is_critical(build) -> None:
    # cuda_allocated grows 16 MiB/iter from 76 GiB on an 80 GiB allocator limit: about
    # 79 GiB at the end, (80 GiB - 79 GiB) / 16 MiB = ~60 iterations left, fewer than
    # the ~195 the window spans -> critical.
    b = RunBuilder()
    loop(b, 200, [("forward", 0.010)])
    _samples(b, 200, 0.010, 5, cuda_allocated=lambda i: 76 * GiB + 16 * MiB * i,
             cuda_limit=80 * GiB, gpu_mem_total=81 * GiB)
    d = diagnose(build(b), "r")
    [f] = [f for f in _of(d, "memory_growth") if f.evidence["memory"] == "device"]
    assert f.evidence["rate_mib_per_iter"] == pytest.approx(16.0)
    assert f.evidence["limit_bytes"] == 80 * GiB
    assert f.evidence["iterations_left"] < f.evidence["iterations"]
    assert f.severity == "critical"


def test_a_leak_in_the_mem_field_is_growth_not_allocator_thrash(build) -> None:
    # No sys samples: the iterations' mem figures every 10 iterations. A leak that
    # keeps a new 8 MiB tensor per step: allocated +8 MiB, one new cudaMalloc per
    # step (device_allocs +1), no retries -> memory_growth (device), no thrash.
    b = RunBuilder("leak")
    for i in range(160):
        mem = ({"allocated": GiB + 8 * MiB * i, "reserved": GiB + 8 * MiB * i + 2 * MiB,
                "alloc_retries": 0, "device_allocs": 10 + i} if i % 10 == 0 else None)
        b.iteration(iter=i, ts=1000.0 + 0.01 * i, dur=0.01, phases=[("forward", 0.01)], mem=mem)
    d = diagnose(build(b), "leak")
    assert "allocator_thrash" not in _codes(d)
    [f] = _of(d, "memory_growth")
    assert f.evidence["memory"] == "device"
    assert f.evidence["rate_mib_per_iter"] == pytest.approx(8.0)
    # Thrash: the same allocation count rising, allocated memory flat (freed and
    # allocated again) -> allocator_thrash, and no growth.
    b = RunBuilder("thrash")
    for i in range(160):
        mem = ({"allocated": GiB, "reserved": GiB + 64 * MiB, "alloc_retries": 0,
                "device_allocs": 10 + i} if i % 10 == 0 else None)
        b.iteration(iter=i, ts=1000.0 + 0.01 * i, dur=0.01, phases=[("forward", 0.01)], mem=mem)
    d = diagnose(build(b), "thrash")
    [t] = _of(d, "allocator_thrash")
    assert t.evidence["device_allocs_per_iter"] == pytest.approx(1.0)
    assert _of(d, "memory_growth") == []


# --- cpu_contention --------------------------------------------------------------

def _contended(b: RunBuilder, running: int, ncpu: int, load1: float,
               queue: float | None = None, cores: float = 3.0) -> None:
    # 60 iterations of 100 ms of forward with 30 ms of thread CPU time: off the CPU
    # 70% of the compute time, all of it compute: off share 70% of wall. ``queue``:
    # the share of wall time the thread waited runnable for a core (cpu_wait_s
    # rises by queue * 0.1 s per iteration); None: not recorded (an old log).
    # ``cores``: the process's CPU use (cpu_s rises by cores * 0.1 s per iteration).
    loop(b, 60, [("forward", 0.100)], cpu=0.030)
    waits = {} if queue is None else {"cpu_wait_s": lambda i: 5.0 + queue * 0.1 * i}
    _samples(b, 60, 0.100, 2, ncpu=ncpu, running=running, load1=load1,
             cpu_s=lambda i: cores * 0.1 * i, rss_bytes=500 * MiB, **waits)


def test_a_thread_waiting_for_a_core_is_contention_and_leads_the_verdict(build) -> None:
    # the 70% off the CPU is all run-queue wait (cpu_wait_s +70 ms per 100 ms iteration)
    b = RunBuilder()
    _contended(b, running=4, ncpu=1, load1=3.9, queue=0.7)
    d = diagnose(build(b), "r")
    f = d.findings[0]
    assert f.code == "cpu_contention" and f.severity == "critical"
    assert f.evidence["guess"] is False
    assert f.evidence["contention_share"] == pytest.approx(0.7)
    assert f.evidence["run_queue_share"] == pytest.approx(0.7)
    assert f.evidence["contention_s_per_iter"] == pytest.approx(0.070)
    assert f.evidence["off_cpu_share"] == pytest.approx(0.7)
    assert f.evidence["blocked_share"] == pytest.approx(0.0, abs=1e-9)
    assert (f.evidence["running"], f.evidence["ncpu"], f.evidence["load1"]) == (4.0, 1, 3.9)
    assert d.bottleneck.cause == "cpu_contention"
    # the verdict is the finding's headline: the stage, its rank and the measured share
    assert d.verdict == ("Bottleneck: main (rank 0) lacks CPU - its thread waited runnable "
                         "for a core 70% of its time (70 ms/iter).")
    # the words behind it are the finding's
    assert ("with 4 runnable threads of the process on 1 usable core, load 3.9; more busy "
            "threads than cores") in f.message
    # the time off the CPU is all a wait for a core: no blocking to report
    assert "blocked_in_compute" not in _codes(d)
    assert d.to_dict()["bottleneck"]["cause"] == "cpu_contention"
    assert d.system.running == 4.0 and d.system.ncpu == 1
    assert d.system.on_cpu_share == pytest.approx(0.3)
    assert d.system.run_queue_share == pytest.approx(0.7)
    assert d.system.process_cpu_cores == pytest.approx(3.0)      # 0.3 s per 0.1 s


def test_a_sleeping_thread_on_a_crowded_machine_is_blocked_not_contended(build) -> None:
    # The same thread CPU figures on the same crowded machine (4 runnable threads on 1
    # core, load 3.9), but the thread waited for a core only 5% of its time: the other
    # 65% off the CPU it was asleep (or in I/O, on a lock): blocking, not contention.
    b = RunBuilder()
    _contended(b, running=4, ncpu=1, load1=3.9, queue=0.05, cores=0.3)
    d = diagnose(build(b), "r")
    assert "cpu_contention" not in _codes(d)
    assert d.bottleneck.cause is None and "lacks CPU" not in d.verdict
    [f] = _of(d, "blocked_in_compute")
    assert f.evidence["excess_share"] == pytest.approx(0.65)
    assert f.evidence["run_queue_share"] == pytest.approx(0.05)
    assert f.severity == "warning"
    assert ("it waited for a core 5.0% of its time (the run-queue delay): the rest is "
            "blocking") in f.message
    assert "lacks a CPU" not in f.message
    assert "the process itself" not in f.message      # 0.3 of 1 core
    assert system_line(d.system).endswith(
        "the thread on the CPU 30% of its compute time, the thread waited for a core 5.0% of "
        "its time, RSS 500 MiB")


def test_a_process_filling_its_cores_blocks_its_thread_not_the_machine(build) -> None:
    # The process's own threads use 1.9 of its 2 usable cores (cpu_s +0.19 s per
    # 0.1 s iteration); the recording thread is on the CPU 30% of the time and waits
    # for a core 2% of it: the other 68% it is parked (the GIL, a lock held by its
    # own threads): blocking, and the message says the process fills its cores.
    b = RunBuilder()
    _contended(b, running=2, ncpu=2, load1=2.5, queue=0.02, cores=1.9)
    d = diagnose(build(b), "r")
    assert "cpu_contention" not in _codes(d)
    [f] = _of(d, "blocked_in_compute")
    assert f.evidence["excess_share"] == pytest.approx(0.68)
    assert f.evidence["process_cpu_cores"] == pytest.approx(1.9)
    assert ("the process itself uses 1.90 of its 2 usable cores: its own threads hold them "
            "(waits for the GIL count here)") in f.message


def test_contention_smaller_than_the_blocking_beside_it_does_not_lead(build) -> None:
    # 30% run-queue wait and 40% asleep: both said, each with its own share; the
    # blocking is the larger loss, so contention is a warning and not the verdict.
    b = RunBuilder()
    _contended(b, running=4, ncpu=1, load1=3.9, queue=0.3)
    d = diagnose(build(b), "r")
    [f] = _of(d, "cpu_contention")
    assert f.severity == "warning" and f.evidence["leads"] is False
    assert f.evidence["contention_share"] == pytest.approx(0.3)
    assert f.evidence["blocked_share"] == pytest.approx(0.4)
    assert "a further 40% off the CPU is blocking, not contention" in f.message
    [g] = _of(d, "blocked_in_compute")
    assert g.evidence["excess_share"] == pytest.approx(0.4)
    assert d.bottleneck.cause is None
    assert d.verdict.startswith("Bottleneck: main is compute-bound")


def test_without_run_queue_figures_contention_is_only_a_guess(build) -> None:
    # An old log (no cpu_wait_s): off the CPU 70% on a crowded machine may be either;
    # tlog says it guesses, as a warning, and never leads the verdict with it.
    b = RunBuilder()
    _contended(b, running=4, ncpu=1, load1=3.9)
    d = diagnose(build(b), "r")
    [f] = _of(d, "cpu_contention")
    assert f.evidence["guess"] is True and f.evidence["run_queue_share"] is None
    assert f.evidence["contention_share"] == pytest.approx(0.7)
    assert f.severity == "warning" and f.evidence["leads"] is False
    assert "may lack a CPU (tlog's guess: no run-queue figures)" in f.message
    assert d.bottleneck.cause is None and "lacks CPU" not in d.verdict
    assert d.verdict.startswith("Bottleneck: main is compute-bound")
    assert "blocked_in_compute" not in _codes(d)      # the same figure, said once
    assert d.system.run_queue_share is None


def test_a_thread_off_the_cpu_on_an_idle_machine_is_blocked_not_contended(build) -> None:
    # Same thread CPU figures, but 1 runnable thread on 2 cores, load 0.5: the
    # thread blocks (a read, a sleep) -> blocked_in_compute, no contention; with
    # no run-queue figures, and with them (1% waiting for a core).
    for queue, blocked in ((None, 0.7), (0.01, 0.69)):
        run = "old" if queue is None else "new"
        b = RunBuilder(run)
        _contended(b, running=1, ncpu=2, load1=0.5, queue=queue)
        d = diagnose(build(b), run)
        assert "cpu_contention" not in _codes(d)
        [f] = _of(d, "blocked_in_compute")
        assert f.evidence["excess_share"] == pytest.approx(blocked)
        assert d.bottleneck.cause is None
        assert d.verdict.startswith("Bottleneck: main is compute-bound")


def test_contention_smaller_than_the_stages_wait_does_not_lead(build) -> None:
    # 60 ms waiting for data (starvation) + 40 ms forward with 10 ms of CPU: off the
    # CPU 30 ms of 100 (30%), all of it waiting for a core (cpu_wait_s +30 ms per
    # iteration) -> cpu_contention (warning), but starvation (60%) is the larger
    # loss and leads.
    b = RunBuilder()
    loop(b, 60, [("data_wait", 0.060), ("forward", 0.040)], cpu=0.010)
    _samples(b, 60, 0.100, 2, ncpu=1, running=3, load1=3.0, cpu_wait_s=lambda i: 0.03 * i)
    d = diagnose(build(b), "r", )
    [f] = _of(d, "cpu_contention")
    assert f.severity == "warning" and f.evidence["leads"] is False
    assert f.evidence["contention_share"] == pytest.approx(0.3)
    assert d.bottleneck.category == "starvation" and d.bottleneck.cause is None
    assert d.verdict.startswith("Bottleneck: input")


# --- gpu_underused, gpu_throttled --------------------------------------------------

def _gpu_run(b: RunBuilder, **fields) -> None:
    # 60 iterations of 50 ms: collate 30 ms on the host only, forward 20 ms host with
    # 5 ms device; a sample every 2 iterations.
    loop(b, 60, [("collate", 0.030), ("forward", 0.020, 0.005)], cpu=0.049)
    _samples(b, 60, 0.050, 2, ncpu=8, running=1, load1=1.0, **fields)


def test_low_gpu_utilisation_with_a_busy_host_is_host_bound(build) -> None:
    # NVML utilisation 10% while the process burns 0.98 cores (cpu_s +0.049 s per
    # 50 ms iteration): gpu_underused naming collate (30 ms host, 0 device) first.
    b = RunBuilder()
    _gpu_run(b, gpu_util=10.0, cpu_s=lambda i: 0.049 * i, gpu_sm_clock_mhz=1980.0,
             gpu_sm_clock_max_mhz=1980.0, gpu_throttle=0)
    d = diagnose(build(b), "r")
    [f] = _of(d, "gpu_underused")
    assert f.evidence["gpu_util"] == 10.0
    assert f.evidence["process_cpu_cores"] == pytest.approx(0.98)
    assert [p["phase"] for p in f.evidence["phases"]] == ["collate", "forward"]
    assert f.evidence["phases"][0]["host_s_per_iter"] == pytest.approx(0.030)
    assert "the GPU is busy only 10% of the time" in f.message
    assert "collate (30 ms host, 0 µs device)" in f.message
    assert _of(d, "gpu_throttled") == []
    assert d.system.gpu_util == 10.0


def test_a_busy_gpu_or_an_idle_host_is_not_underused(build) -> None:
    b = RunBuilder("busy")
    _gpu_run(b, gpu_util=95.0, cpu_s=lambda i: 0.049 * i)
    assert _of(diagnose(build(b), "busy"), "gpu_underused") == []
    # Low utilisation, but the host idles too (0.1 core, thread on the CPU 20%):
    # neither side is busy: not host-bound.
    b = RunBuilder("idle")
    loop(b, 60, [("forward", 0.050, 0.005)], cpu=0.010)
    _samples(b, 60, 0.050, 2, gpu_util=10.0, cpu_s=lambda i: 0.005 * i)
    assert _of(diagnose(build(b), "idle"), "gpu_underused") == []


def test_a_host_thread_waiting_for_a_core_keeps_the_gpu_underused(build) -> None:
    # 60 iterations of 50 ms: collate 30 ms host-only, forward 12.5 ms (5 ms device),
    # 7.5 ms between phases (15%: the thread descheduled there). The thread is on the
    # CPU 30 ms of each 50 (60%) and waits runnable for a core 20 ms (40%, cpu_wait_s
    # +20 ms per iteration); the process uses 0.6 cores. By hand: host-only compute
    # 30/50 = 60%, thread 60%, cores 0.6, all under 90%; on the CPU + waiting for a
    # core = 100%: the host is busy, the GPU (10%) waits for it.
    b = RunBuilder()
    loop(b, 60, [("collate", 0.030), ("forward", 0.0125, 0.005)], dur=0.050, cpu=0.030)
    _samples(b, 60, 0.050, 2, ncpu=2, running=1, load1=3.5, gpu_util=10.0,
             cpu_s=lambda i: 0.030 * i, cpu_wait_s=lambda i: 0.020 * i)
    d = diagnose(build(b), "r")
    [f] = _of(d, "gpu_underused")
    assert "its thread is on the CPU 60% of the time; waits for a core 40% of it" in f.message
    # the same loop without run-queue figures (an old log): the host looks 60% busy only
    b = RunBuilder("old")
    loop(b, 60, [("collate", 0.030), ("forward", 0.0125, 0.005)], dur=0.050, cpu=0.030)
    _samples(b, 60, 0.050, 2, ncpu=2, running=1, load1=3.5, gpu_util=10.0,
             cpu_s=lambda i: 0.030 * i)
    assert _of(diagnose(build(b), "old"), "gpu_underused") == []


@pytest.mark.parametrize(("throttle", "clock", "reasons"), [
    (lambda i: 0x20 if i % 4 == 0 else 0, 1980.0, ["software thermal slowdown"]),
    (lambda i: 0x4 | 0x40, 1400.0, ["software power cap", "hardware thermal slowdown"]),
    (0, 1200.0, []),                       # no reason given, but the clock is low
])
def test_throttle_reasons_or_low_clocks_while_busy_are_throttling(build, throttle, clock,
                                                                  reasons) -> None:
    b = RunBuilder()
    _gpu_run(b, gpu_util=97.0, gpu_throttle=throttle, gpu_sm_clock_mhz=clock,
             gpu_sm_clock_max_mhz=1980.0, gpu_temp_c=84.0, gpu_power_w=690.0)
    d = diagnose(build(b), "r")
    [f] = _of(d, "gpu_throttled")
    assert f.evidence["reasons"] == reasons
    # samples at iterations 0, 2, 4, ...: a 0x20 every 4th iteration is every other sample
    want = 0.5 if callable(throttle) and clock == 1980.0 else 1.0
    assert f.evidence["throttled_share"] == pytest.approx(want)
    assert f"SM clock median {clock:.0f} of 1980 MHz, 84 °C, 690 W" in f.message


def test_idle_clocks_and_the_idle_reason_are_not_throttling(build) -> None:
    # An idle GPU (util 0) clocks down with the GpuIdle reason (0x1): not a slowdown
    # of work; a busy one at full clock with only ApplicationsClocksSetting (0x2) neither.
    b = RunBuilder()
    _gpu_run(b, gpu_util=lambda i: 0.0 if i % 4 else 97.0,
             gpu_throttle=lambda i: 0x1 if i % 4 else 0x2,
             gpu_sm_clock_mhz=lambda i: 210.0 if i % 4 else 1980.0, gpu_sm_clock_max_mhz=1980.0)
    assert _of(diagnose(build(b), "r"), "gpu_throttled") == []


def test_a_run_without_samples_has_no_system_figures(build) -> None:
    b = RunBuilder()
    loop(b, 30, [("forward", 0.010)], cpu=0.010)
    d = diagnose(build(b), "r")
    assert d.system.samples == 0 and d.system.machine is None
    assert d.system.on_cpu_share == pytest.approx(1.0)
    assert d.to_dict()["system"]["load1"] is None


def test_tlog_diagnose_prints_the_machine_and_its_load(build, tmp_path) -> None:
    # 60 iterations of 100 ms, 30 ms of them on the CPU; samples: load 3.9 on 1 core,
    # 4 runnable threads, cpu_s +0.3 s per 2 iterations (0.2 s): 1.5 cores; RSS
    # 512 MiB; a machine whose host name carries a terminal control (escaped).
    b = RunBuilder()
    loop(b, 60, [("forward", 0.100)], cpu=0.030)
    _samples(b, 60, 0.100, 2, ncpu=1, running=4, load1=3.9, cpu_s=lambda i: 0.15 * i,
             rss_bytes=512 * MiB)
    b.machine(host="box\x1b[2J", cpu_model="AMD EPYC", ncpu=2, mem_total=16 * GiB)
    build(b).close()
    result = invoke(["diagnose", "--run", "r", "--db",
                     str(tmp_path / "r.duckdb")])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("machine:"))
    assert "\x1b" not in line
    assert line.endswith("(AMD EPYC, 2 cores, 16.0 GiB); steady state: load 3.9 on 1 usable "
                         "core, 4 runnable threads, the process 1.50 cores, the thread on the "
                         "CPU 30% of its compute time, RSS 512 MiB")


def test_contention_in_an_input_bound_loop_does_not_lead(build) -> None:
    # The figures of a real loop (run a2-slowdata): 2 DataLoader workers
    # sleeping 60 ms per sample needed 960 ms per step; the loop took ~1010 ms, 420 ms
    # of it waiting for its batches (data_wait) and 590 ms of compute with 160 ms of
    # CPU, its thread waiting for a core 430 ms (43%, cpu_wait_s per iteration).
    # The waiting share (42%) makes the loop input-bound: it runs at its loader's
    # pace, a faster thread would only wait longer. Contention is said (warning),
    # the verdict names the input.
    b = RunBuilder()
    loop(b, 60, [("data_wait", 0.420), ("forward", 0.590)], cpu=0.160)
    _samples(b, 60, 1.010, 2, ncpu=2, running=1, load1=7.6,
             cpu_wait_s=lambda i: 0.430 * i)
    d = diagnose(build(b), "r")
    [f] = _of(d, "cpu_contention")
    assert f.evidence["contention_share"] == pytest.approx(0.430 / 1.010, rel=1e-3)
    assert f.evidence["contention_share"] > d.stages[0].categories.starvation
    assert f.severity == "warning" and f.evidence["leads"] is False
    assert d.bottleneck.category == "starvation" and d.bottleneck.cause is None
    assert d.verdict.startswith("Bottleneck: input - main waits for data 42% of its time "
                                "in data_wait")
    # 1 runnable thread of the process on its 2 cores: the crowd (load 7.6) is other
    # processes, and the advice says so rather than "run fewer threads"
    assert "with 1 runnable thread of the process on 2 usable cores, load 7.6" in f.message
    assert f.message.endswith("; the process's own runnable threads do not fill its cores, "
                              "other processes do (the load counts every process of the "
                              "machine, DataLoader workers included): run fewer of them, or "
                              "give the job the machine to itself")
    assert "run fewer threads" not in f.message
