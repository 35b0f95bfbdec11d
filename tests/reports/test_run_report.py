"""Report pages from hand-made analysis results: text, tables, per-rank shares, paths."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from tlog.analyze import text as fmt
from tlog.reports.data import RunReportData, top_phase_pairs
from tlog.reports.run_report import (
    default_report_path,
    rank_shares,
    run_charts,
    run_page,
    stage_table,
)

XSS = "<script>alert(1)</script>"

DIAG = {
    "run_id": "r1",
    "verdict": "Bottleneck: input - drafter waits for data 42% of its time, in hs_get (51.5 "
    "ms/iter)",
    "iterations": {"total": 360, "steady": 330, "excluded": 30},
    "throughput": {"iters_per_s": 14.5, "tokens_per_s": 59392.0, "samples_per_s": None},
    "stages": [
        {
            "stage": "drafter",
            "workers": 2,
            "iterations": 230,
            "throughput": {"iters_per_s": 14.5, "tokens_per_s": None, "samples_per_s": None},
            "categories": {
                "starvation": 0.42,
                "backpressure": 0.0,
                "compute": 0.5,
                "sync": 0.08,
                "unaccounted": 0.0,
            },
            "top_phases": [
                {
                    "phase": "hs_get",
                    "category": "starvation",
                    "seconds_per_iter": 0.0515,
                    "share": 0.42,
                },
                {"phase": XSS, "category": "compute", "seconds_per_iter": 0.03, "share": 0.24},
            ],
        }
    ],
    "findings": [
        {
            "code": "starvation",
            "severity": "warning",
            "message": f"waits in {XSS}",
            "evidence": {"phase": XSS, "share": 0.42},
        }
    ],
    "stragglers": [
        {
            "stage": "drafter",
            "rank": 2,
            "kind": "compute",
            "phase": "draft_forward",
            "slowdown": 0.3,
            "own_over_peers": 1.3,
            "own_s": 0.026,
            "peers_s": 0.02,
            "speedup_if_fixed": 1.12,
        }
    ],
    "what_if": [
        {
            "stage": "drafter",
            "phase": "hs_get",
            "throughput_gain": 0.7,
            "throughput_gain_halved": 0.25,
            "speedup": 1.7,
            "speedup_halved": 1.25,
        }
    ],
    "device_times": False,
}


def _data() -> RunReportData:
    iters = pl.DataFrame(
        {
            "stage": ["drafter"] * 4,
            "rank": [1, 1, 2, 2],
            "worker": ["d1", "d1", "d2", "d2"],
            "iter": [0, 1, 0, 1],
            "ts": [0.0, 1.0, 0.0, 1.0],
            "dur": [0.1, 0.1, 0.2, 0.2],
            "steady": [False, True, True, True],
            "starvation_s": [0.05, 0.05, 0.05, 0.15],
            "backpressure_s": [0.0] * 4,
            "compute_s": [0.05, 0.05, 0.15, 0.05],
            "sync_s": [0.0] * 4,
            "unaccounted_s": [0.0] * 4,
        }
    )
    phases = pl.DataFrame(
        {
            "stage": ["drafter"] * 4,
            "rank": [1, 1, 2, 2],
            "worker": ["d1", "d1", "d2", "d2"],
            "phase": ["hs_get", XSS, "hs_get", XSS],
            "parent": [None] * 4,
            "category": ["starvation", "compute"] * 2,
            "seconds_per_iter": [0.05, 0.05, 0.1, 0.1],
        }
    )
    stats = pl.DataFrame(
        {
            "stage": ["drafter"],
            "phase": [XSS],
            "category": ["compute"],
            "mean_s": [0.05],
            "p50_s": [0.05],
            "p95_s": [0.1],
            "iterations": [3],
        }
    )
    queues = pl.DataFrame(
        schema={"name": pl.String, "ts": pl.Float64, "depth": pl.Int64, "capacity": pl.Int64}
    )
    events = pl.DataFrame(schema={"name": pl.String, "ts": pl.Float64, "dur": pl.Float64})
    return RunReportData(
        run_id=f"run {XSS}",
        run={"tags": {"branch": XSS}, "started": None},
        diagnosis=DIAG,
        iterations=iters,
        phases=phases,
        phase_stats=stats,
        queues=queues,
        events=events,
        notes=[f"note {XSS}"],
    )


def test_rank_shares_take_the_stage_from_the_diagnosis_and_ranks_from_steady_seconds() -> None:
    shares = rank_shares(_data())
    got = {
        (r["rank"], r["category"]): r["share"]
        for r in shares.iter_rows(named=True)
        if r["category"] in ("starvation", "compute")
    }
    # rank 1: only iteration 1 is steady: 0.05 starvation, 0.05 compute of 0.1
    # rank 2: 0.05 + 0.15 starvation, 0.15 + 0.05 compute of 0.4
    assert got == {
        (None, "starvation"): 0.42,
        (None, "compute"): 0.5,
        (1, "starvation"): 0.5,
        (1, "compute"): 0.5,
        (2, "starvation"): 0.5,
        (2, "compute"): 0.5,
    }


def test_stage_table_figures() -> None:
    html = stage_table(DIAG)
    for cell in (
        "<td>drafter</td>",
        '<td class="num">2</td>',
        '<td class="num">230</td>',
        '<td class="num">14.5 iterations/s</td>',
        '<td class="num">42%</td>',
        '<td class="num">8.0%</td>',
        "<td>hs_get (52 ms/iter, 42%)</td>",
    ):
        assert cell in html


def test_run_page_text_is_escaped_and_complete() -> None:
    data = _data()
    html = run_page(data, run_charts(data)).render()
    assert DIAG["verdict"] in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert XSS not in html.split('<script type="application/json"')[0]
    assert "sync shares are an upper bound" in html
    assert (
        "<td>draft_forward</td>" in html
        and "1.30x" in html             # its time over its peers', as the CLI says it
        and "26 ms" in html
        and "1.12x" in html             # throughput if fixed
        and "1.70x" in html             # what-if: multipliers, as every text shows gains
        and "1.25x" in html
        and "+70.0%" not in html
    )
    assert "330 steady" in html


def test_run_charts_leave_out_what_has_no_data() -> None:
    keys = [c.key for c in run_charts(_data())]
    assert keys == ["timeline", "shares", "rank-phase", "top-phases"]  # no queue samples


def test_top_phase_pairs_follow_the_diagnosis_then_fall_back_to_the_frame() -> None:
    data = _data()
    assert top_phase_pairs(DIAG, data.phases).rows() == [("drafter", "hs_get"), ("drafter", XSS)]
    assert top_phase_pairs({}, data.phases, fallback=1).rows() == [("drafter", XSS)]


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("run-1", "run-1"),
        ("../../etc/passwd", "_.._etc_passwd"),
        ("a b<c>", "a_b_c_"),
        ("..", "run"),
    ],
)
def test_default_path_is_one_safe_folder_under_tlog_reports(name: str, folder: str) -> None:
    path = default_report_path(name, Path("/base"))
    assert path == Path("/base/tlog-reports") / folder / "index.html"


def test_formatting() -> None:
    # One rule for the reports, the CLI and the findings (tlog.analyze.text):
    # shares in whole percent from 10%, durations in whole ms from 10 ms.
    assert (fmt.pct(0.4213), fmt.pct(None), fmt.pct(float("nan"))) == ("42%", "–", "–")
    assert (fmt.ms(0.0612), fmt.ms(0.2), fmt.ms(12.5), fmt.ms(0.0004)) == (
        "61 ms",
        "200 ms",
        "12.50 s",
        "400 µs",
    )
    assert (fmt.signed_ms(0.018), fmt.signed_ms(-0.0012)) == ("+18 ms", "-1.2 ms")
    assert (fmt.num(14512.3), fmt.num(230), fmt.num(1.234567)) == ("14,512", "230", "1.23")
    assert (fmt.signed_pct(0.12), fmt.signed_pct(-0.05)) == ("+12%", "-5.0%")
    assert fmt.when(1764403200.0) == "2025-11-29 08:00 UTC"


def test_phase_distribution_by_hand(scenario_db) -> None:
    """Drafter iterations 4..7 of ranks 1 and 2 are taken as steady: hs_get is
    6 ms (iteration 4, warm-up x3), 2, 2 and 200 ms (every fourth); mask_build
    12, 4, 4, 4 ms; on each rank."""
    from tlog.reports.data import phase_distribution

    con, run_id = scenario_db(n=8)
    iterations = pl.DataFrame(
        {
            "rank": [r for r in (1, 2) for _ in range(8)],
            "stage": ["drafter"] * 16,
            "worker": [f"drafter-{r}" for r in (1, 2) for _ in range(8)],
            "iter": list(range(8)) * 2,
            "steady": [i >= 4 for i in range(8)] * 2,
        }
    )
    wanted = pl.DataFrame(
        {"stage": ["drafter", "target", "drafter"], "phase": ["mask_build", "nope", "hs_get"]}
    )
    got = phase_distribution(con, run_id, iterations, wanted)
    assert got["phase"].to_list() == ["mask_build", "hs_get"]
    assert got["iterations"].to_list() == [8, 8]
    # linear quantiles of 8 sorted values: p50 at position 3.5, p95 at 6.65
    expected = [(0.006, 0.004, 0.012), (0.0525, 0.004, 0.2)]
    for row, (mean, p50, p95) in zip(got.iter_rows(named=True), expected, strict=True):
        assert row["mean_s"] == pytest.approx(mean)
        assert row["p50_s"] == pytest.approx(p50)
        assert row["p95_s"] == pytest.approx(p95)
