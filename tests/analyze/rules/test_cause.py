"""``analyze.rules.cause.bottleneck_cause``: which family's finding carries the
verdict (pipeline parallelism, then a straggler worth it, then CPU contention,
then the category itself), on contexts written by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tlog.analyze.rules import machine
from tlog.analyze.rules.cause import Cause, bottleneck_cause
from tlog.analyze.stragglers import Straggler

SLOW = {"stage": "train", "rank": 2, "worker": "train-2", "kind": "compute",
        "phase": "backward", "slowdown": 0.4, "own_s": 0.1, "peers_s": 0.07,
        "phase_excess_s": 0.03, "peers_extra_sync_s": 0.03, "iterations": 50}


def _ctx(*, stragglers=(), pp=(), phase_gain: float | None = 0.2, stage: str = "train"):
    bn = SimpleNamespace(stage=stage, phase="allreduce", category="sync")
    return SimpleNamespace(bottleneck=bn, stragglers=list(stragglers), pipeline_parallel=pp,
                           gain_of=lambda s, p: phase_gain)


@pytest.fixture
def contended(monkeypatch: pytest.MonkeyPatch):
    """Set what ``machine.contention`` finds: whether a worker's wait for a core leads."""
    def _set(leads: bool) -> None:
        monkeypatch.setattr(machine, "contention", lambda ctx: [{"leads": leads}])
    _set(False)
    return _set


def test_no_bottleneck_no_cause() -> None:
    assert bottleneck_cause(SimpleNamespace(bottleneck=None)) is None


def test_a_pipeline_parallel_stage_first(contended) -> None:
    ctx = _ctx(pp=[SimpleNamespace(stage="train")],
               stragglers=[Straggler(**SLOW, gain_if_fixed=0.5)])
    assert bottleneck_cause(ctx) == Cause("pipeline_parallel", "train")


def test_a_straggler_worth_more_than_the_phase(contended) -> None:
    worth = Straggler(**SLOW, gain_if_fixed=0.25)     # warning, and more than the 0.2
    assert bottleneck_cause(_ctx(stragglers=[worth])) == Cause("straggler", "train", worth)
    # worth less than removing the bottleneck phase, and not critical: the category
    less = Straggler(**SLOW, gain_if_fixed=0.1)
    assert bottleneck_cause(_ctx(stragglers=[less])).kind == "category"
    # critical (1/0.75 - 1 or more): leads whatever the phase's gain
    crit = Straggler(**SLOW, gain_if_fixed=0.4)
    assert bottleneck_cause(_ctx(stragglers=[crit], phase_gain=0.9)).straggler is crit
    # a straggler of another stage, or an info one, never leads
    other = Straggler(**{**SLOW, "stage": "eval"}, gain_if_fixed=0.9)
    info = Straggler(**SLOW, gain_if_fixed=0.01)
    assert bottleneck_cause(_ctx(stragglers=[other, info])).kind == "category"


def test_cpu_contention_before_the_category(contended) -> None:
    contended(True)
    assert bottleneck_cause(_ctx()) == Cause("cpu_contention", "train")
    contended(False)
    assert bottleneck_cause(_ctx()) == Cause("category", "train")
