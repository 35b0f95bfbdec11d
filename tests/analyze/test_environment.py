"""``analyze.environment``: two runs' machines and load compared, and whether a
change is contention (figures and sentences worked out by hand)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tlog.analyze.environment import (
    GUESS_WORDS,
    compare_environments,
    moved_together,
    split_change,
)
from tlog.analyze.results import MachineInfo, SystemSummary

#: A quiet machine's figures: 2 cores, load 1, one runnable thread, on the CPU 95%.
QUIET = {"machine": None, "samples": 10, "ncpu": 2, "load1": 1.0, "running": 1.0,
         "process_cpu_cores": None, "on_cpu_share": 0.95, "rss_bytes": None, "gpu_util": None,
         "gpu_sm_clock_mhz": None, "gpu_sm_clock_max_mhz": None, "throttled_share": None,
         "run_queue_share": None}
NODE = {"host": "node-a", "cpu_model": "EPYC", "ncpu": 64, "mem_total": 2**40,
        "gpu_name": "A100", "gpu_count": 8, "driver": "535", "cuda": "12.1"}


def _system(**kw) -> SystemSummary:
    return SystemSummary(**{**QUIET, **kw})


def _machine(**kw) -> MachineInfo:
    return MachineInfo(**{**NODE, **kw})


def _c(phase: str, base: float, cand: float, category: str = "compute",
       stage: str = "main") -> SimpleNamespace:
    return SimpleNamespace(stage=stage, phase=phase, category=category,
                           baseline_s_per_iter=base, candidate_s_per_iter=cand,
                           delta_s_per_iter=cand - base)


def test_split_change_into_work_and_a_busier_core() -> None:
    # the same 20 ms of work, from no wait to 20 ms waiting for a core: all machine
    assert split_change(0.02, 0.0, 0.02, 0.02) == pytest.approx((0.0, 0.02))
    # twice the work at the same load (no wait): all work
    assert split_change(0.02, 0.0, 0.04, 0.0) == pytest.approx((0.02, 0.0))
    # stretch 1.5 -> 2.0 with work 20 -> 30 ms: work 10 ms * 1.5, machine 0.5 * 30 ms;
    # together the whole change, (30 + 30) - (20 + 10) = 30 ms
    assert split_change(0.02, 0.01, 0.03, 0.03) == pytest.approx((0.015, 0.015))
    assert split_change(0.0, 0.01, 0.03, 0.03) == (0.0, 0.0)


def test_moved_together() -> None:
    both = [_c("forward", 0.04, 0.06), _c("backward", 0.04, 0.07),
            _c("load", 0.02, 0.02, "starvation"), _c("forward", 0.1, 0.1, stage="other")]
    assert moved_together(both, "main", 0.05, alike=True) == pytest.approx(
        {"forward": 0.5, "backward": 0.75})
    # +50% and +200%: more than TOGETHER_FACTOR (2x) apart, alike or not
    apart = [_c("forward", 0.04, 0.06), _c("backward", 0.04, 0.12)]
    assert moved_together(apart, "main", 0.05, alike=True) is None
    assert moved_together(apart, "main", 0.05, alike=False) == pytest.approx(
        {"forward": 0.5, "backward": 2.0})
    # opposite ways, or under the smallest change that counts
    assert moved_together([_c("forward", 0.04, 0.06), _c("backward", 0.04, 0.03)], "main",
                          0.05, alike=False) is None
    assert moved_together([_c("forward", 0.04, 0.041)], "main", 0.05, alike=False) is None
    # one phase is enough unless alike asks for two; a phase under 5% of the stage is noise
    one = [_c("forward", 0.04, 0.06), _c("tiny", 0.001, 0.004), _c("io", 0.1, 0.1, "sync")]
    assert moved_together(one, "main", 0.05, alike=False) == pytest.approx({"forward": 0.5})
    assert moved_together(one, "main", 0.05, alike=True) is None


def test_measured_contention() -> None:
    base = _system(load1=1.0, running=1.0, run_queue_share=0.05)
    cand = _system(load1=3.9, running=4.0, run_queue_share=0.5)
    # per iteration: CPU 20 ms both, wall 40 -> 80 ms, run-queue wait 2 -> 40 ms:
    # the wait grew 38 ms, over half the 40 ms change; no more work
    env = compare_environments(base, cand, [_c("forward", 0.02, 0.04),
                                            _c("backward", 0.02, 0.04)],
                               "main", 0.04, 0.05,
                               cpu_wall=((0.02, 0.04, 0.002), (0.02, 0.08, 0.04)))
    assert env.contention and env.recorded and not env.machine_differs
    assert env.load_change == 1
    assert env.work_s == pytest.approx(0.0)
    assert env.machine_s == pytest.approx(0.038)      # (3.0 - 1.1) * 20 ms
    assert [d.field for d in env.differences] == ["running", "load1", "run_queue_share"]
    assert env.sentence == (
        "every compute phase of main moved together (forward +100%, backward +100%) while "
        "the machine's load rose (runnable threads 1.0 -> 4.0 on 2 cores; load 1.0 -> 3.9 on "
        "2 cores; the thread waiting for a core 5.0% -> 50% of its time; its run-queue wait "
        "per iteration 2.0 ms -> 40 ms while its wall time went 40 ms -> 80 ms): likely "
        "contention from a busier machine, not the change under test")
    assert GUESS_WORDS not in env.sentence


def test_guessed_contention_says_it_is_a_guess() -> None:
    # no run-queue figures: the thread's on-CPU share fell 95% -> 40%, its CPU time per
    # iteration stayed 20 ms while the wall time doubled
    env = compare_environments(_system(on_cpu_share=0.95), _system(on_cpu_share=0.4),
                               [_c("forward", 0.02, 0.04)], "main", 0.02, 0.05,
                               cpu_wall=((0.02, 0.04), (0.02, 0.06)))
    assert env.contention and env.load_change == 1
    assert env.sentence.endswith(f"not the change under test ({GUESS_WORDS})")
    assert "the thread on the CPU 95% -> 40% of its compute time" in env.sentence


def test_machine_differences_and_a_slower_run_on_a_quieter_machine() -> None:
    env = compare_environments(_system(machine=_machine()),
                               _system(machine=_machine(gpu_name="H100", driver="550")),
                               [], "main", 0.01, 0.05)
    assert env.machine_differs
    assert [(d.field, d.words) for d in env.differences] == [
        ("machine.gpu_name", "GPU A100 -> H100"), ("machine.driver", "driver 535 -> 550")]
    assert env.sentence == ("the runs' environments differed: GPU A100 -> H100; driver 535 "
                            "-> 550 - the change may not be the code's")
    # the candidate is slower but its thread was on the CPU more: not the load
    quiet = compare_environments(_system(on_cpu_share=0.5), _system(on_cpu_share=0.9),
                                 [_c("forward", 0.02, 0.03)], "main", 0.01, 0.05)
    assert quiet.load_change == -1 and not quiet.contention
    assert quiet.sentence == (
        "the runs' environments differed: the thread on the CPU 50% -> 90% of its compute "
        "time - the candidate was slower on the quieter machine: the load does not explain "
        "the change")


def test_nothing_recorded() -> None:
    env = compare_environments(None, _system(), [], "main", 0.01, 0.05)
    assert (env.recorded, env.machine_differs, env.differences, env.sentence) == (
        False, False, [], "")
    same = compare_environments(_system(), _system(), [], "main", 0.01, 0.05)
    assert same.recorded and same.differences == [] and same.sentence == ""
    assert same.to_dict()["contention"] is False
