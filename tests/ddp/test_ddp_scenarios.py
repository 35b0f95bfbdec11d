"""Real DDP runs (torchrun, gloo on CPU) with a known fault: tlog's verdict against the truth.

Each scenario of ``ddp_train.py`` runs twice (conftest ``ddp``): once instrumented only
with the shim's plain phases (``data_wait``, ``forward``, ``backward``, ``optimizer``),
once uninstrumented under ``torch.profiler`` and ingested as traces. The expected
verdicts come from what was injected; every figure compared comes from the bare
``perf_counter`` timers in the training script (``ddp_runs.Truth``), never from tlog.

Tolerances: shares within 10 points (issue 12's bar for unaccounted, kept for the
other shares); a gain within 25% of the truth's (issue 12). The faults are large
(80 ms of loader sleep per step, or five extra matmuls, ~3x the forward, against
steps of ~100 ms) so that a verdict on a busy shared machine is not a coin toss.
"""

from __future__ import annotations

import pytest
from ddp_runs import SCENARIOS, SLOW_RANK

MODES = ("phases", "trace")
SHARE_TOLERANCE = 0.10   # issue 12: unaccounted within 10 points of the real idle share
GAIN_TOLERANCE = 0.25    # issue 12: straggler gain within 25% of the truth
MIN_STEADY = 20          # analyze/stragglers.py STRAGGLER_MIN_ITERS: fewer and the check is skipped

# The phase each fault sits in, as each mode names it: the shim's own phase names;
# the trace converter's names for the DataLoader's __next__ and DDP's forward (docs/KINETO.md).
DATA_PHASE = {"phases": "data_wait", "trace": "data_loader_next"}
FORWARD_PHASE = {"phases": "forward", "trace": "forward"}


def _share(d: dict, category: str) -> float:
    return d["categories"][category]


def _named(d: dict) -> dict[int, dict]:
    return {s["rank"]: s for s in d["stragglers"]}


def _assert_judged(case) -> None:
    """The straggler check ran: every rank has the steady iterations it needs.

    Without this, 'no straggler named' would also pass when the check was skipped.
    """
    steady = case.diagnosis["iterations"]["steady"]
    need = MIN_STEADY * case.truth.world_size
    assert steady >= need, (f"{case.scenario}-{case.mode}: {steady} steady iterations over "
                            f"{case.truth.world_size} ranks, the straggler check needs {need}")


def _close(got: float, want: float, what: str, case) -> None:
    assert abs(got - want) <= SHARE_TOLERANCE, (
        f"{case.scenario}-{case.mode}: tlog's {what} {got:.1%} vs truth {want:.1%} "
        f"(verdict: {case.diagnosis['verdict']})")


# -- healthy ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_healthy_is_compute_bound_without_straggler(ddp, mode: str) -> None:
    case = ddp("healthy", mode)
    d = case.diagnosis
    _assert_judged(case)
    # No fault: a rank may be named only if the timers show it computing >15% more
    # than its peer (the shared machine's doing); normally none is.
    slower = case.truth.slower_ranks()
    assert set(_named(d)) <= slower, (f"healthy DDP named {sorted(_named(d))}, timers show "
                                      f"slower ranks {sorted(slower)}: {d['verdict']}")
    # Truth: the exposed all-reduce wait is the only sync; it stays under 20% here.
    assert case.truth.share("comm_wait_s") < 0.20, "the healthy run itself was sync-bound"
    assert d["bottleneck"]["category"] == "compute", d["verdict"]


# -- all ranks input-bound ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_input_bound_is_starvation(ddp, mode: str) -> None:
    case = ddp("input_bound", mode)
    d = case.diagnosis
    _assert_judged(case)
    assert case.truth.share("data_s") >= 0.25, "the injected loader sleep was not a large share"
    assert d["bottleneck"]["category"] == "starvation", d["verdict"]
    assert d["bottleneck"]["phase"] == DATA_PHASE[mode], d["verdict"]
    slower = case.truth.slower_ranks()
    assert set(_named(d)) <= slower, (f"every rank's loader is slow alike, yet named "
                                      f"{sorted(_named(d))} (timers: slower {sorted(slower)}): {d['verdict']}")


@pytest.mark.parametrize("mode", MODES)
def test_input_bound_starvation_share_matches_data_wait(ddp, mode: str) -> None:
    case = ddp("input_bound", mode)
    _close(_share(case.diagnosis, "starvation"), case.truth.share("data_s"), "starvation share", case)


# -- one slow loader ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_input_straggler_names_only_the_slow_loader(ddp, mode: str) -> None:
    case = ddp("input_straggler", mode)
    d = case.diagnosis
    _assert_judged(case)
    t = case.truth
    # Truth: rank 1 waits for data, rank 0 waits for rank 1 in the all-reduce.
    assert t.per_step("data_s", SLOW_RANK) > 3 * t.per_step("data_s", 0)
    assert t.per_step("comm_wait_s", 0) > t.per_step("comm_wait_s", SLOW_RANK) + 0.03
    named = _named(d)
    assert set(named) == {SLOW_RANK}, f"named ranks {sorted(named)}, want [{SLOW_RANK}]: {d['verdict']}"
    s = named[SLOW_RANK]
    assert s["kind"] == "input", s
    assert s["phase"] == DATA_PHASE[mode], s


@pytest.mark.parametrize("mode", MODES)
def test_input_straggler_gain_matches_lockstep_truth(ddp, mode: str) -> None:
    case = ddp("input_straggler", mode)
    named = _named(case.diagnosis)
    assert SLOW_RANK in named, case.diagnosis["verdict"]
    want = case.truth.lockstep_gain(SLOW_RANK)
    got = named[SLOW_RANK]["speedup_if_fixed"]
    assert abs(got / want - 1) <= GAIN_TOLERANCE, f"speedup_if_fixed {got:.2f}x vs truth {want:.2f}x"


# -- one rank computes more ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_compute_straggler_names_only_the_slow_rank(ddp, mode: str) -> None:
    case = ddp("compute_straggler", mode)
    d = case.diagnosis
    _assert_judged(case)
    t = case.truth
    # Truth: rank 1's forward holds the extra matmuls; rank 0 waits for it in backward.
    assert t.per_step("fault_s", SLOW_RANK) > 0.5 * t.per_step("forward_s", 0)
    assert t.per_step("comm_wait_s", 0) > t.per_step("comm_wait_s", SLOW_RANK) + 0.03
    named = _named(d)
    assert set(named) == {SLOW_RANK}, f"named ranks {sorted(named)}, want [{SLOW_RANK}]: {d['verdict']}"
    s = named[SLOW_RANK]
    assert s["kind"] == "compute", s
    assert s["phase"] == FORWARD_PHASE[mode], s


@pytest.mark.parametrize("mode", MODES)
def test_compute_straggler_gain_matches_lockstep_truth(ddp, mode: str) -> None:
    case = ddp("compute_straggler", mode)
    named = _named(case.diagnosis)
    assert SLOW_RANK in named, case.diagnosis["verdict"]
    want = case.truth.lockstep_gain(SLOW_RANK)
    got = named[SLOW_RANK]["speedup_if_fixed"]
    assert want > 1.4, f"the fault was too small to judge: truth gain {want:.2f}x"
    assert abs(got / want - 1) <= GAIN_TOLERANCE, f"speedup_if_fixed {got:.2f}x vs truth {want:.2f}x"


# -- traces: the main thread's idle time is not lost --------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_trace_unaccounted_matches_idle(ddp, scenario: str) -> None:
    """Every moment of a step is data, forward, backward (all-reduce wait included) or
    optimizer by the timers; only loop overhead is idle. The trace's unaccounted share
    stays within 10 points of that."""
    case = ddp(scenario, "trace")
    _close(_share(case.diagnosis, "unaccounted"), case.truth.idle_share(), "unaccounted share", case)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_all_reduce_wait_is_sync(ddp, scenario: str, mode: str) -> None:
    """The gradient all-reduce wait hides inside backward (phases) or in the main thread's
    idle time while gloo's threads run it (trace): tlog's sync share matches the exposed
    wait the timing comm hook measured, the waiting ranks' included."""
    case = ddp(scenario, mode)
    _close(_share(case.diagnosis, "sync"), case.truth.share("comm_wait_s"), "sync share", case)
