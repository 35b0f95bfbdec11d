"""``analyze.rules.base``: severities of a share, the order findings come in, and a
plugin rule's failures left out with a warning (rules defined here are plugins:
their module is not tlog's)."""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace

import pytest
from tlog.analyze.findings import Finding
from tlog.analyze.rules.base import (
    ItemRule,
    Rule,
    RuleContext,
    evaluate_rules,
    share_severity,
)
from tlog.analyze.rules.coverage import CoveragePolicy
from tlog.analyze.rules.policies import DEFAULT_POLICIES, Policies


def test_share_severity_levels() -> None:
    assert share_severity(0.01, True) == "critical"        # the bottleneck, whatever its size
    assert share_severity(0.20, False) == "warning"        # HIGH_SHARE
    assert share_severity(0.19999999999999998, False) == "warning"   # float dust of a sum
    assert share_severity(0.19, False) == "info"
    assert share_severity(0.05, False) == "info"           # MODERATE_SHARE
    assert share_severity(0.049, False) is None


def _ctx(**kw) -> RuleContext:
    fields = {"analysis": None, "stages": [SimpleNamespace(stage="a"), SimpleNamespace(stage="b")],
              "bottleneck": None, "workers": None, "stragglers": [], "queues": [],
              "lockstep": None, "exact_sync": True, "steady_iterations": 100,
              "min_steady_per_worker": 50}
    return RuleContext(**{**fields, **kw})


def test_short_by_steady_iterations_or_logged_intervals() -> None:
    assert not _ctx().short
    assert _ctx(min_steady_per_worker=19).short
    assert _ctx(steady_iterations=0).short
    assert _ctx(min_intervals_per_worker=3).short
    fewer = Policies(coverage=CoveragePolicy(min_steady_iters=3))
    assert not _ctx(policies=fewer, min_intervals_per_worker=3).short
    assert _ctx().stage_names == ["a", "b"]
    assert _ctx().policies == DEFAULT_POLICIES == Policies()
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_POLICIES.drift.p = 0.5


class Fixed(Rule):
    code = "fixed"

    def __init__(self, *found: Finding) -> None:
        self.found = list(found)

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        return self.found


class PerStage(ItemRule):
    over = "stages"

    def __init__(self, code: str, severity: str = "info") -> None:
        self.code, self.severity = code, severity

    def items(self, ctx: RuleContext) -> list:
        return ctx.stage_names

    def evaluate_item(self, ctx: RuleContext, item: str) -> list[Finding]:
        return [Finding(self.code, self.severity, f"{self.code} {item}")]


def test_item_rules_over_the_same_items_report_item_by_item() -> None:
    rules = [PerStage("x"), PerStage("y"), Fixed(Finding("z", "info", "z")), PerStage("w")]
    got = [f.message for f in evaluate_rules(_ctx(), rules)]
    assert got == ["x a", "y a", "x b", "y b", "z", "w a", "w b"]


def test_most_severe_first_stable_otherwise() -> None:
    rules = [PerStage("x"), PerStage("crit", "critical"), Fixed(Finding("w", "warning", "w"))]
    got = [f.message for f in evaluate_rules(_ctx(), rules)]
    assert got == ["crit a", "crit b", "w", "x a", "x b"]


class Broken(Rule):
    code = "broken"

    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour

    def evaluate(self, ctx: RuleContext):
        return self.behaviour()


def _fail():
    raise ZeroDivisionError("oops")


@pytest.mark.parametrize(("behaviour", "says"), [
    (_fail, "failed and was left out: ZeroDivisionError: oops"),
    (lambda: sys.exit(3), "failed and was left out: SystemExit: 3"),
    (lambda: "starvation", "returned str, not a list of Finding"),
    (lambda: [Finding("a", "info", "m"), "text"], "returned a str among its findings"),
])
def test_a_plugins_bug_is_a_warning_not_a_failed_diagnosis(behaviour, says) -> None:
    good = Fixed(Finding("ok", "info", "kept"))
    with pytest.warns(RuntimeWarning, match=says):
        got = evaluate_rules(_ctx(), [Broken(behaviour), good])
    assert [f.message for f in got] == ["kept"]


def test_a_finding_of_an_unknown_severity_is_left_out() -> None:
    with pytest.warns(RuntimeWarning, match="finding 'odd' has severity 'fatal'"):
        got = evaluate_rules(_ctx(), [Fixed(Finding("odd", "fatal", "m"),
                                            Finding("fine", "warning", "m"))])
    assert [f.code for f in got] == ["fine"]


def test_keyboard_interrupt_still_stops() -> None:
    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate_rules(_ctx(), [Broken(interrupt)])
