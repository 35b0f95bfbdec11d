"""``analyze.findings``: the findings' sort key, the verdict's headline and one
finding for several ranks of a stage, on findings built by hand."""

from __future__ import annotations

import pytest
from tlog.analyze.findings import (
    HEADLINE_MAX,
    Code,
    Finding,
    Headline,
    Severity,
    finding_key,
    lead_finding,
    merge_ranks,
    sort_findings,
)


def _f(name: str, severity: str, gain: float | None = None, *, headline: str | None = None,
       **evidence) -> Finding:
    return Finding(name, severity, name, evidence, gain=gain,
                   headline=Headline.of(headline) if headline else None)


def test_severity_first_then_gain_then_the_report_order() -> None:
    found = [_f("info_big_gain", "info", 5.0), _f("warn_none", "warning"),
             _f("crit_small", "critical", 0.10), _f("warn_gain", "warning", 0.02),
             _f("crit_none_a", "critical"), _f("crit_big", "critical", 0.38),
             _f("crit_none_b", "critical"), _f("warn_zero", "warning", 0.0)]
    assert [f.code for f in sort_findings(found)] == [
        "crit_big", "crit_small",             # critical, largest gain first
        "crit_none_a", "crit_none_b",         # then those without a gain, as reported
        "warn_gain", "warn_zero", "warn_none",  # a gain of 0 is still a gain
        "info_big_gain"]                      # no gain lifts an info above a warning
    assert finding_key(found[2]) == (0, -0.10)
    with pytest.raises(ValueError):
        finding_key(_f("x", "fatal"))


def test_the_verdict_leads_with_the_first_finding_that_has_a_headline() -> None:
    context = _f("short_run", "warning")                   # context: never leads
    cause = _f("compute_bound", "info", 1.8, headline="Bottleneck: main is compute-bound")
    assert lead_finding([cause, context]) is cause
    # a rule of one's own leads with no edit to the verdict: critical, with a headline
    own = _f("mine", "critical", 0.5, headline="Bottleneck: main waits on my thing")
    assert lead_finding([cause, context, own]) is own
    # between two that could lead, the larger gain
    bigger = _f("bigger", "critical", 0.9, headline="Bottleneck: bigger")
    assert lead_finding([own, bigger]) is bigger
    assert lead_finding([context]) is None


def test_a_headline_leaves_out_its_parts_in_their_order_to_fit() -> None:
    h = Headline.of("A" * 10, ("b" * 10, 2), None, ("c" * 10, 1), ("d" * 10, 3))
    assert h.text() == "A" * 10 + "b" * 10 + "c" * 10 + "d" * 10
    assert h.text(39) == "A" * 10 + "b" * 10 + "c" * 10           # d first (3)
    assert h.text(29) == "A" * 10 + "c" * 10                      # then b (2)
    assert h.text(10) == "A" * 10                                 # then c; A never
    assert h.text(5) == "AAAA…"                                   # cut as a last resort
    same = Headline.of("x", ("1", 1), ("2", 1))
    assert same.text(2) == "x1"                                   # the later one first
    assert HEADLINE_MAX == 160


def test_several_ranks_of_a_stage_are_one_finding_listing_them() -> None:
    found = [_f("cpu_contention", "warning", stage="main", rank=0, share=0.3),
             _f("drift", "info", stage="main"),
             _f("cpu_contention", "critical", 0.7, headline="Bottleneck: main lacks CPU",
                stage="main", rank=1, share=0.41),
             _f("cpu_contention", "warning", stage="other", rank=2, share=0.25),
             _f("cpu_contention", "warning", stage="main", rank=3, share=0.22)]
    merged = merge_ranks(found, figure=lambda ev: f"{ev['share']:.0%}")
    assert [(f.code, f.evidence["stage"]) for f in merged] == [
        ("cpu_contention", "main"), ("drift", "main"), ("cpu_contention", "other")]
    one = merged[0]
    # its lead is the most severe (then largest gain): rank 1, whose figures it keeps
    assert (one.severity, one.gain, one.evidence["rank"]) == ("critical", 0.7, 1)
    assert one.headline is not None and one.headline.text() == "Bottleneck: main lacks CPU"
    assert one.evidence["ranks"] == [1, 0, 3]
    assert [e["share"] for e in one.evidence["per_rank"]] == [0.41, 0.3, 0.22]
    assert one.message == "cpu_contention; also ranks 0 (30%) and 3 (22%)"
    # a lone rank and a finding without ranks pass unchanged
    assert merged[1] is found[1] and merged[2] is found[3]
    # other keys keep findings apart (a straggler's kind, a memory kind)
    kinds = [_f("straggler", "warning", stage="s", rank=0, kind="compute"),
             _f("straggler", "warning", stage="s", rank=1, kind="input")]
    assert len(merge_ranks(kinds, by=("stage", "kind"))) == 2
    assert len(merge_ranks(kinds)) == 1


def test_codes_and_severities_are_the_stable_strings_scripts_match() -> None:
    assert Code.STARVATION == "starvation" and Code.PIPELINE_BUBBLE == "pipeline_bubble"
    assert len(set(Code)) == len(Code) == 20
    assert [str(s) for s in Severity] == ["info", "warning", "critical"]


def test_to_dict_is_the_json_item_without_gain_or_headline() -> None:
    f = Finding(Code.DRIFT, Severity.WARNING, "iteration time grew 12%", {"stage": "main"},
                gain=0.12, headline=Headline.of("Bottleneck: drift"))
    assert f.to_dict() == {"code": "drift", "severity": "warning",
                           "message": "iteration time grew 12%", "evidence": {"stage": "main"}}
    assert Finding("x", "info", "m").evidence == {}
