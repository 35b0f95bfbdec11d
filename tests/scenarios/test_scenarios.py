"""The diagnosis scenario suite (docs: "Done when").

Each ``tests/scenarios/<name>/run/`` is a hand-made run folder (written by
``make_scenarios.py`` with round numbers) and ``expected.json`` beside it
holds the figures worked out by hand (its ``why`` gives the arithmetic). The
run is ingested with ``ingest.ingest_run`` into a fresh database and
``analyze.diagnose`` must give the expected bottleneck stage, category and
phase, shares, stragglers, what-if gains and exactly the expected findings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tlog.analyze import diagnose
from tlog.ingest import connect, ingest_run

ROOT = Path(__file__).resolve().parent
CASES = sorted(p.name for p in ROOT.iterdir() if (p / "expected.json").is_file())
TOL = 1e-3


def _close(actual: Any, expected: Any, where: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not an object"
        for key, value in expected.items():
            assert key in actual, f"{where}: no {key!r} in {sorted(actual)}"
            _close(actual[key], value, f"{where}.{key}")
    elif isinstance(expected, float) and not isinstance(expected, bool):
        assert actual == pytest.approx(expected, abs=TOL, rel=TOL), f"{where}: {actual} != {expected}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


@pytest.fixture(scope="module")
def diagnoses(tmp_path_factory) -> dict[str, dict]:
    out = {}
    tmp = tmp_path_factory.mktemp("scenarios")
    for name in CASES:
        con = connect(tmp / f"{name}.duckdb")
        try:
            report = ingest_run(con, ROOT / name / "run")
            assert report.to_dict()["records_rejected"] == 0
            out[name] = diagnose(con, report.run_id).to_dict()
        finally:
            con.close()
    return out


def test_the_suite_covers_issue_5() -> None:
    wanted = {"starvation_next_batch", "starvation_get_train_batch", "starvation_batch_generator",
              "starvation_data_loading", "periodic_stalls", "sync_host_only",
              "sync_with_device_times", "pipeline_target_bound", "pipeline_drafter_bound",
              "straggler_compute", "straggler_input", "drift", "mostly_unaccounted",
              "allocator_thrash", "short_run"}
    assert wanted <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_scenario(name: str, diagnoses: dict[str, dict]) -> None:
    expected = json.loads((ROOT / name / "expected.json").read_text(encoding="utf-8"))
    d = diagnoses[name]
    for key in ("iterations", "categories", "bottleneck", "throughput", "pipeline"):
        if key in expected:
            _close(d[key], expected[key], key)
    assert sum(d["categories"].values()) == pytest.approx(1.0)
    for stage, shares in expected.get("stages", {}).items():
        got = next(s for s in d["stages"] if s["stage"] == stage)
        _close(got["categories"], shares, f"stages.{stage}")
    got_findings = sorted([f["code"], f["severity"]] for f in d["findings"])
    assert got_findings == sorted(expected["findings"]), d["findings"]
    for code, evidence in expected.get("finding_evidence", {}).items():
        finding = next(f for f in d["findings"] if f["code"] == code)
        _close(finding["evidence"], evidence, f"findings.{code}")
    assert len(d["stragglers"]) == len(expected["stragglers"]), d["stragglers"]
    for got, want in zip(d["stragglers"], expected["stragglers"], strict=True):
        _close(got, want, "stragglers")
    for i, want in enumerate(expected.get("what_if", [])):
        _close(d["what_if"][i], want, f"what_if[{i}]")
    if "device_times" in expected:
        assert d["device_times"] is expected["device_times"]
    assert d["confidence"] == expected["confidence"], d["confidence_reasons"]
    assert d["verdict"].startswith("Bottleneck: ")
    assert d["verdict"].startswith(expected.get("verdict_starts", "Bottleneck: "))
    assert expected.get("verdict_contains", "") in d["verdict"]
    # one sentence of at most 160 characters that names the bottleneck stage, or the
    # straggler rank that leads it (docs/DIAGNOSIS.md section 8)
    assert len(d["verdict"]) <= 160, d["verdict"]
    lead = d["bottleneck"]["straggler"]
    assert (f"rank {lead['rank']} of {d['bottleneck']['stage']}" if lead
            else d["bottleneck"]["stage"]) in d["verdict"]
