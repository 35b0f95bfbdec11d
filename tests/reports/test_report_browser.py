"""Reports in a real browser: headless Chromium, offline, DevTools protocol.

Skipped (with the reason) where Debian's ``chromium`` is not installed; CI
installs it (.ci/run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reports import write_run_report
from reports.headless import find_chromium, open_page

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="chromium is not installed (apt-get install chromium)"
)

XSS = "<script>alert(1)</script>"
RUN_CHARTS = {"timeline", "shares", "rank-phase", "queues", "top-phases"}


def _assert_clean(result) -> None:
    assert not result.timed_out, "the report did not finish drawing"
    assert result.console_errors == []
    assert result.requests == [], "the report tried to reach the network"
    assert result.dialogs == []
    assert result.status.get("done") is True
    assert result.status.get("errors") == []


def test_run_report_renders_offline_with_every_chart_drawn(scenario_db, tmp_path: Path) -> None:
    from analyze import diagnose

    con, run_id = scenario_db()
    files = write_run_report(con, run_id, tmp_path / "out" / "index.html")
    result = open_page(files.html, timeout_s=60)
    _assert_clean(result)
    charts = result.status["charts"]
    assert set(charts) == RUN_CHARTS
    for key, chart in charts.items():
        assert chart["width"] > 100 and chart["height"] > 40, key
        assert chart["marks"] > 0, f"chart {key} drew no marks"
    verdict = diagnose(con, run_id).verdict
    assert verdict.startswith("Bottleneck:")
    assert verdict in result.text
    assert "hs_get" in result.text and "checkpoint" in result.text


def test_crafted_names_show_as_text_and_never_run(scenario_db, tmp_path: Path) -> None:
    run_id = "<img src=x onerror=alert(2)>"
    con, _ = scenario_db(run_id, drafter_phase=XSS, tags={"branch": XSS, XSS: "x"})
    files = write_run_report(con, run_id, tmp_path / "xss.html")
    result = open_page(
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


def test_compare_report_renders_offline(scenario_db, tmp_path: Path) -> None:
    from reports import write_compare_report

    con, _ = scenario_db("base")
    scenario_db("slow-mask", mask_build_s=0.022)
    files = write_compare_report(con, "base", "slow-mask", tmp_path / "cmp.html")
    result = open_page(files.html, timeout_s=60)
    _assert_clean(result)
    charts = result.status["charts"]
    assert set(charts) == {"contributions", "breakdown"}
    for key, chart in charts.items():
        assert chart["marks"] > 0, f"chart {key} drew no marks"
    assert "mask_build" in result.text and "+18.0 ms" in result.text
