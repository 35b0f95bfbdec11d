"""``analyze.findings``: the finding record, its JSON form and the severity order."""

from __future__ import annotations

import pytest
from tlog.analyze.findings import Code, Finding, Severity, sort_findings


def test_codes_and_severities_are_the_stable_strings_scripts_match() -> None:
    assert Code.STARVATION == "starvation" and Code.PIPELINE_BUBBLE == "pipeline_bubble"
    assert len(set(Code)) == len(Code) == 20
    assert [str(s) for s in Severity] == ["info", "warning", "critical"]


def test_to_dict_is_the_json_item() -> None:
    f = Finding(Code.DRIFT, Severity.WARNING, "iteration time grew 12%", {"stage": "main"})
    assert f.to_dict() == {"code": "drift", "severity": "warning",
                           "message": "iteration time grew 12%", "evidence": {"stage": "main"}}
    assert Finding("x", "info", "m").evidence == {}


def test_sort_puts_the_most_severe_first_and_keeps_the_rest_in_order() -> None:
    a = Finding("a", "info", "1")
    b = Finding("b", "critical", "2")
    c = Finding("c", "warning", "3")
    d = Finding("d", "critical", "4")
    e = Finding("e", "info", "5")
    assert [f.code for f in sort_findings([a, b, c, d, e])] == ["b", "d", "c", "a", "e"]
    assert sort_findings([]) == []


def test_an_unknown_severity_is_refused() -> None:
    with pytest.raises(ValueError, match="'fatal' is not a valid Severity"):
        sort_findings([Finding("a", "fatal", "m")])
