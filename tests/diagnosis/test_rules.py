"""Findings as rules (analyze.rules): policies a caller overrides, a rule
list a caller chooses, a rule of one's own, and the report order.

The run is test_drift's uneven trend, hand-checked there: 64 iterations in
8 blocks of 8 at 100, 112, 104, 116, 108, 120, 124, 128 ms; Kendall's tau
22/28 = 0.786, exact p = 222/40320 = 0.0055, +19% from the first third to
the last.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import FrozenInstanceError, fields, replace
from typing import ClassVar

import pytest
from tlog.analyze import diagnose
from tlog.analyze.findings import Finding
from tlog.analyze.rules import (
    DEFAULT_RULES,
    CoveragePolicy,
    DriftPolicy,
    DriftRule,
    ItemRule,
    Policies,
    Rule,
    RuleContext,
    ShortRunRule,
    evaluate_rules,
)

from tests.support.runbuilder import RunBuilder, loop

TIMES = [0.100, 0.112, 0.104, 0.116, 0.108, 0.120, 0.124, 0.128]


@pytest.fixture
def run(build):
    b = RunBuilder()
    loop(b, 64, lambda i: [("forward", TIMES[i // 8])])
    return build(b)


def _codes(d) -> list[str]:
    return [f.code for f in d.findings]


def test_policies_are_frozen_and_each_limit_gives_its_source() -> None:
    policies = Policies()
    assert (policies.drift.p, policies.drift.consistent,
            policies.coverage.min_steady_iters) == (0.01, 0.80, 20)
    with pytest.raises(FrozenInstanceError):
        policies.drift.p = 0.5  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        policies.drift = DriftPolicy()  # type: ignore[misc]
    for family in fields(Policies):
        policy = type(getattr(policies, family.name))
        # each family's policy lives in its rules' module
        assert policy.__module__ == f"tlog.analyze.rules.{policy.__module__.rsplit('.', 1)[1]}"
        source = inspect.getsource(policy)
        for name in policy.__dataclass_fields__:
            # a "#:" comment block right above the field, saying where the value comes from
            at = source.index(f"    {name}: ")
            block = []
            for line in reversed(source[:at].rstrip().splitlines()):
                if not line.lstrip().startswith("#:"):
                    break
                block.append(line)
            assert block, f"{policy.__name__}.{name} has no comment"
            assert "Source" in " ".join(block), f"{policy.__name__}.{name} gives no source"


def test_drift_p_threshold_decides_the_finding(run) -> None:
    f = next(f for f in diagnose(run, "r").findings if f.code == "drift")
    assert f.evidence["p_value"] == pytest.approx(222 / 40320)       # 0.0055 < 1%
    # at 0.5%, p = 0.0055 is no trend: no drift finding
    assert "drift" not in _codes(diagnose(run, "r",
                                          policies=Policies(drift=DriftPolicy(p=0.005))))


def test_drift_consistency_threshold_decides_the_severity(run) -> None:
    d = diagnose(run, "r", policies=Policies(drift=DriftPolicy(consistent=0.75)))
    f = next(f for f in d.findings if f.code == "drift")
    # tau 0.786 >= 0.75: a consistent trend, a warning, "steadily"
    assert f.severity == "warning" and ", steadily (" in f.message


def test_min_steady_iters_reaches_short_run_and_the_confidence(run) -> None:
    d = diagnose(run, "r", policies=Policies(coverage=CoveragePolicy(min_steady_iters=1000)))
    f = next(f for f in d.findings if f.code == "short_run")
    assert f.evidence["want_per_worker"] == 1000 and f.severity == "warning"
    assert f.evidence["steady"] == d.iterations.steady <= 64
    assert d.confidence == "low"
    assert "fewer than 1000 steady iterations on some worker" in d.confidence_reasons
    assert "short_run" not in _codes(diagnose(run, "r"))


def test_rules_choose_the_findings(run) -> None:
    assert _codes(diagnose(run, "r", rules=[])) == []
    assert _codes(diagnose(run, "r", rules=[DriftRule()])) == ["drift"]
    assert "drift" not in _codes(diagnose(run, "r", rules=[r for r in DEFAULT_RULES
                                                        if r.code != "drift"]))


class SlowestBlockRule(Rule):
    """A rule of one's own: the bottleneck stage's steady iteration count."""

    code = "bottleneck_iterations"

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        st = next(s for s in ctx.stages if s.stage == ctx.bottleneck.stage)
        return [Finding(self.code, "info", f"{st.stage}: {st.iterations} steady iterations",
                        {"iterations": st.iterations, "blocks": ctx.policies.drift.blocks})]


class BrokenRule(Rule):
    code = "broken"

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        raise KeyError("no such column")


def test_a_rule_of_ones_own_and_a_broken_one(run) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = diagnose(run, "r", rules=[*DEFAULT_RULES, BrokenRule(), SlowestBlockRule()])
    mine = next(f for f in d.findings if f.code == "bottleneck_iterations")
    assert mine.evidence == {"iterations": d.iterations.steady, "blocks": 8}
    assert "drift" in _codes(d)                               # the defaults still ran
    assert any("rule BrokenRule(code='broken') failed and was left out: KeyError"
               in str(w.message) for w in caught)


class _Items(ItemRule):
    over: ClassVar[str] = "x"

    def __init__(self, code: str, severity: str = "info", over: str = "x") -> None:
        self.code, self.severity, self.over = code, severity, over  # type: ignore[misc]

    def items(self, ctx):
        return [1, 2]

    def evaluate_item(self, ctx, item):
        return [Finding(self.code, self.severity, f"{self.code}{item}")]


class _Once(Rule):
    code = "once"

    def evaluate(self, ctx):
        return [Finding("once", "info", "once")]


def test_item_rules_report_item_by_item_then_by_severity() -> None:
    a, b = _Items("a"), _Items("b")
    assert [f.message for f in evaluate_rules(None, [a, b])] == ["a1", "b1", "a2", "b2"]
    # a plain rule between them, or other items, ends the run of item rules
    assert [f.message for f in evaluate_rules(None, [a, _Once(), b])] == [
        "a1", "a2", "once", "b1", "b2"]
    assert [f.message for f in evaluate_rules(None, [a, _Items("c", over="y")])] == [
        "a1", "a2", "c1", "c2"]
    # most severe first, stable otherwise
    assert [f.message for f in evaluate_rules(None, [a, _Items("w", "warning")])] == [
        "w1", "w2", "a1", "a2"]


def test_short_run_rule_alone_on_a_context_by_hand() -> None:
    ctx = RuleContext(analysis=None, stages=[], bottleneck=None, workers=None, stragglers=[],
                      queues=[], lockstep=None, exact_sync=True, steady_iterations=30,
                      min_steady_per_worker=12)
    (f,) = ShortRunRule().evaluate(ctx)
    assert f.message == ("too short to judge with confidence: 30 steady iterations (fewest on "
                         "one worker: 12; want 20 per worker)")
    assert ShortRunRule().evaluate(replace(ctx, min_steady_per_worker=20)) == []
    # an averaged timer log: 200 steady rows, but 8 logged intervals on some worker
    few = replace(ctx, steady_iterations=200, min_steady_per_worker=100,
                  min_intervals_per_worker=8)
    (f,) = ShortRunRule().evaluate(few)
    assert f.message == ("too few logged intervals to judge with confidence: the timer log's "
                         "200 steady iterations repeat the figures of 8 logged intervals on "
                         "some worker (want 20); each interval is one observation")
    assert f.evidence["min_intervals_per_worker"] == 8
    assert ShortRunRule().evaluate(replace(few, min_intervals_per_worker=20)) == []


class _Returns(Rule):
    """A plugin rule returning whatever it is given (or raising it)."""

    code = "returns"

    def __init__(self, value) -> None:
        self.value = value

    def evaluate(self, ctx):
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


class _ItemsReturn(_Items):
    def evaluate_item(self, ctx, item):
        return "garbage" if item == 2 else super().evaluate_item(ctx, item)


@pytest.mark.parametrize(("value", "said"), [
    ("garbage", "returned str, not a list of Finding"),
    ([{"code": "x", "severity": "warning"}], "returned a dict among its findings"),
    ([Finding("ok", "info", "fine"), object()], "returned a object among its findings"),
    (None, "returned NoneType, not a list of Finding"),
    (SystemExit(3), "failed and was left out: SystemExit: 3"),
])
def test_a_plugin_rule_returning_non_findings_or_exiting_is_left_out(value, said) -> None:
    # a str was read letter by letter and crashed on .severity; a
    # SystemExit ended tlog with its code
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = evaluate_rules(None, [_Once(), _Returns(value), _Once()])
    assert [f.message for f in out] == ["once", "once"]     # the others' findings stay
    mine = [str(w.message) for w in caught]
    assert len(mine) == 1 and "rule _Returns(code='returns')" in mine[0] and said in mine[0]
    assert mine[0].endswith(f"(plugin module {__name__})")


def test_a_plugin_item_rule_with_one_bad_item_loses_that_item_only() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = evaluate_rules(None, [_ItemsReturn("a")])
    assert [f.message for f in out] == ["a1"]
    assert len(caught) == 1 and "returned str" in str(caught[0].message)


def test_keyboard_interrupt_in_a_plugin_rule_still_stops() -> None:
    with pytest.raises(KeyboardInterrupt):
        evaluate_rules(None, [_Returns(KeyboardInterrupt())])
