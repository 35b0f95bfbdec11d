"""Reports in a real browser: headless Chromium, offline, driven by Playwright
(tests/support/browser.py).

Skipped (with the reason) where Debian's ``chromium`` is not installed; CI
installs it (.ci/run), so there they run. One browser serves the module; each
page gets a fresh context.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tlog.reports import write_run_report

from tests.support.browser import Browser, find_chromium

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (apt-get install chromium, or set $TLOG_CHROMIUM)",
)

XSS = "<script>alert(1)</script>"
SLOW_LOADER = Path(__file__).resolve().parents[1] / "data" / "report_slow_loader"


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for this module's tests."""
    with Browser() as b:
        yield b


def _assert_clean(result) -> None:
    assert not result.timed_out, "the report did not finish drawing"
    assert result.console_errors == []
    assert result.requests == [], "the report tried to reach the network"
    assert result.dialogs == []
    assert result.status.get("done") is True
    assert result.status.get("errors") == []


def test_scenario_run_report_renders_offline_with_every_chart_drawn(browser, tmp_path: Path) -> None:
    """A run recorded from the reference pipeline's slow-loader scenario
    (tests/data/report_slow_loader, see expected.json there), ingested, reported,
    opened offline."""
    from tlog.analyze import diagnose
    from tlog.ingest import ingest_run
    from tlog.ingest.db import connect

    expected = json.loads((SLOW_LOADER / "expected.json").read_text(encoding="utf-8"))
    run_dir = tmp_path / "runs" / expected["run_id"]
    shutil.copytree(SLOW_LOADER, run_dir, ignore=shutil.ignore_patterns("expected.json"))
    con = connect(tmp_path / "tlog.duckdb")
    try:
        run_id = ingest_run(con, run_dir).run_id
        files = write_run_report(con, run_id, tmp_path / "out" / "index.html")
        diagnosis = diagnose(con, run_id)
    finally:
        con.close()
    assert {k: getattr(diagnosis.bottleneck, k) for k in ("stage", "category")} == expected[
        "injected_bottleneck"
    ]
    result = browser.open(files.html, timeout_s=60)
    _assert_clean(result)
    charts = result.status["charts"]
    assert sorted(charts) == sorted(expected["charts"])
    for key, chart in charts.items():
        assert chart["width"] > 100 and chart["height"] > 40, key
        assert chart["marks"] > 0, f"chart {key} drew no marks"
    assert diagnosis.verdict.startswith("Bottleneck:")
    assert diagnosis.verdict in result.text
    assert "hs_get" in result.text and "warmup" in result.text


def test_crafted_names_show_as_text_and_never_run(browser, scenario_db, tmp_path: Path) -> None:
    run_id = "<img src=x onerror=alert(2)>"
    con, _ = scenario_db(run_id, drafter_phase=XSS, tags={"branch": XSS, XSS: "x"})
    files = write_run_report(con, run_id, tmp_path / "xss.html")
    result = browser.open(
        files.html,
        timeout_s=60,
        evaluate={
            "scripts": "document.scripts.length",
            "images": "document.images.length",
            "title": "document.title",
            "svg_label": (
                "Array.from(document.querySelectorAll('svg text'))"
                f".some(t => t.textContent === {XSS!r})"
            ),
        },
    )
    _assert_clean(result)
    assert result.values["scripts"] == 3  # the writer's own: specs, bundle, embed
    assert result.values["images"] == 0
    assert result.values["title"] == f"tlog report: {run_id}"
    assert XSS in result.text  # shown in the tables, as text
    assert result.values["svg_label"] is True  # and as a chart label


def test_compare_report_renders_offline(browser, scenario_db, tmp_path: Path) -> None:
    from tlog.reports import write_compare_report

    con, _ = scenario_db("base")
    scenario_db("slow-mask", mask_build_s=0.022)
    files = write_compare_report(con, "base", "slow-mask", tmp_path / "cmp.html")
    result = browser.open(files.html, timeout_s=60)
    _assert_clean(result)
    charts = result.status["charts"]
    assert set(charts) == {"contributions", "breakdown"}
    for key, chart in charts.items():
        assert chart["marks"] > 0, f"chart {key} drew no marks"
    assert "mask_build" in result.text and "+18 ms" in result.text
