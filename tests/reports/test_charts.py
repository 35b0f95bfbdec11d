"""Chart builders: display aggregation checked by hand, and what the specs carry."""

from __future__ import annotations

import json

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from tlog.reports import charts
from tlog.reports.charts import (
    bin_iterations,
    bin_queue,
    breakdown_comparison_chart,
    category_share_chart,
    contribution_chart,
    queue_chart,
    rank_phase_heatmap,
    timeline_chart,
    top_phases_chart,
)


def _iters() -> pl.DataFrame:
    """drafter: ranks 0 and 1, iterations 0..3 (iteration 0 is warm-up);
    target: rank 2, iterations 5..7. compute is 0.1 s, the rest of dur is starvation."""
    drafter_dur = [0.1, 0.1, 0.4, 0.1, 0.1, 0.2, 0.1, 0.1]
    rows = pl.DataFrame(
        {
            "stage": ["drafter"] * 8 + ["target"] * 3,
            "rank": [0] * 4 + [1] * 4 + [2] * 3,
            "worker": ["d0"] * 4 + ["d1"] * 4 + ["t2"] * 3,
            "iter": [0, 1, 2, 3] * 2 + [5, 6, 7],
            "dur": drafter_dur + [0.3, 0.3, 0.6],
            "steady": [False, True, True, True] * 2 + [True] * 3,
        }
    )
    return rows.with_columns(
        compute_s=pl.lit(0.1),
        starvation_s=pl.col("dur") - 0.1,
        backpressure_s=pl.lit(0.0),
        sync_s=pl.lit(0.0),
        unaccounted_s=pl.lit(0.0),
    )


def _axis_order(spec: dict, encoding: dict, field: str) -> list[str]:
    """The order a nominal axis draws ``field`` in: sorted by the rows' position
    column (never by a list of names, which Vega compiles into an expression)."""
    assert encoding["sort"] == {"field": charts.POSITION, "op": "min", "order": "ascending"}
    rows = [r for values in spec["datasets"].values() for r in values if field in r]
    first: dict[str, int] = {}
    for r in rows:
        first[r[field]] = min(first.get(r[field], r[charts.POSITION]), r[charts.POSITION])
    return sorted(first, key=first.__getitem__)


def test_bin_iterations_by_hand() -> None:
    got = bin_iterations(_iters(), bins=2)
    expected = pl.DataFrame(
        {
            "stage": ["drafter", "drafter", "target", "target"],
            "bin": [0, 1, 0, 1],
            "iter_start": [0, 2, 5, 7],
            "iter_end": [1, 3, 6, 7],
            "iterations": [4, 4, 2, 1],
            "dur_mean_s": [0.125, 0.175, 0.3, 0.6],
            # linear p95 of 4 values: sorted[2] + 0.85 * (sorted[3] - sorted[2])
            "dur_p95_s": [0.185, 0.355, 0.3, 0.6],
            "dur_max_s": [0.2, 0.4, 0.3, 0.6],
            "starvation_s": [0.025, 0.075, 0.2, 0.5],
            "backpressure_s": [0.0] * 4,
            "compute_s": [0.1] * 4,
            "sync_s": [0.0] * 4,
            "unaccounted_s": [0.0] * 4,
            "left_out": [0.5, 0.0, 0.0, 0.0],
        }
    )
    assert_frame_equal(got.select(expected.columns), expected, check_dtypes=False, abs_tol=1e-12)


def test_bin_iterations_keeps_one_bin_per_iteration_when_few() -> None:
    got = bin_iterations(_iters(), bins=300)
    assert got.filter(pl.col("stage") == "drafter")["iter_start"].to_list() == [0, 1, 2, 3]
    assert got.filter(pl.col("stage") == "drafter")["dur_max_s"].to_list() == [0.1, 0.2, 0.4, 0.1]


def test_bin_iterations_errors() -> None:
    with pytest.raises(ValueError, match="lacks the column"):
        bin_iterations(_iters().drop("sync_s"))
    with pytest.raises(ValueError, match="empty"):
        bin_iterations(_iters().clear())
    with pytest.raises(ValueError, match="at least 1"):
        bin_iterations(_iters(), bins=0)


def test_many_iterations_become_few_bins_and_a_stall_survives() -> None:
    n = 200_000
    it = (
        pl.DataFrame({"iter": pl.int_range(n, eager=True)})
        .with_columns(
            stage=pl.lit("drafter"),
            rank=pl.lit(0),
            steady=pl.lit(True),
            # a 3 s loader stall every fourth iteration on top of 0.1 s of compute
            starvation_s=pl.when(pl.col("iter") % 4 == 0).then(3.0).otherwise(0.0),
            compute_s=pl.lit(0.1),
            backpressure_s=pl.lit(0.0),
            sync_s=pl.lit(0.0),
            unaccounted_s=pl.lit(0.0),
        )
        .with_columns(dur=pl.col("starvation_s") + 0.1)
    )
    binned = bin_iterations(it)
    assert binned.height == 300
    assert binned["iterations"].sum() == n
    assert binned["dur_max_s"].min() == pytest.approx(3.1)
    spec = json.dumps(timeline_chart(it).to_dict())
    assert len(spec) < 150_000


def test_timeline_spec_carries_bins_stats_and_left_out_band() -> None:
    spec = timeline_chart(_iters(), bins=2).to_dict()
    assert [p["title"] for p in spec["vconcat"]] == [
        "drafter: 2 iterations per bin",
        "target: 2 iterations per bin",
    ]
    rows = [r for values in spec["datasets"].values() for r in values]
    drafter = [r for r in rows if "max_ms" in r and r["iter_start"] in (0, 2)]
    assert sorted((r["iter_start"], r["max_ms"], r["p95_ms"]) for r in drafter) == [
        (0, 200.0, 185.0),
        (2, 400.0, 355.0),
    ]
    # warm-up bin 0 (half left out) is shaded from iteration 0 to 2
    assert {"from": 0, "to": 2} in rows


def test_timeline_cuts_warm_up_peaks_far_above_the_steady_state() -> None:
    it = _iters().filter(pl.col("stage") == "drafter")
    # iteration 0 of rank 0 (warm-up) takes 1 s: 2.5x the slowest steady bin (0.4 s)
    it = it.with_columns(
        dur=pl.when((pl.col("iter") == 0) & (pl.col("rank") == 0))
        .then(1.0)
        .otherwise(pl.col("dur"))
    )
    panel = timeline_chart(it, bins=2).to_dict()["vconcat"][0]
    assert panel["title"] == (
        "drafter: 2 iterations per bin; left-out peaks up to 1,000 ms cut at the top"
    )
    area = next(layer for layer in panel["layer"] if layer["mark"]["type"] == "area")
    assert area["encoding"]["y"]["scale"]["domain"] == [0, 440.0]
    # at 2x or less nothing is cut
    calm = timeline_chart(_iters(), bins=2).to_dict()["vconcat"][0]
    assert "cut" not in calm["title"]


def test_left_out_spans_merge_adjacent_bins() -> None:
    binned = pl.DataFrame(
        {
            "iter_start": [0, 10, 20, 30, 40],
            "iter_end": [9, 19, 29, 39, 49],
            "left_out": [1.0, 0.6, 0.0, 0.5, 0.4],
        }
    )
    spans = charts._left_out_spans(binned)
    assert spans.rows() == [(0, 20), (30, 40)]


def test_bin_queue_by_hand() -> None:
    queue = pl.DataFrame(
        {
            "name": ["hs"] * 5,
            "ts": [100.0, 101.0, 102.0, 103.0, 104.0],
            "depth": [0, 2, 4, 6, 8],
            "capacity": [8] * 5,
        }
    )
    got = bin_queue(queue, t0=99.0, bins=2)
    assert got.rows() == [("hs", 1.0, 3.0, 2, 1.0, 0, 2, 8), ("hs", 3.0, 5.0, 3, 6.0, 4, 8, 8)]


def test_queue_chart_marks_each_event_once_and_caps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = pl.DataFrame(
        {
            "name": ["hs"] * 3,
            "ts": [100.0, 150.0, 200.0],
            "depth": [1, 2, 3],
            "capacity": [None, 8, 8],
        }
    )
    events = pl.DataFrame(
        {
            "name": ["checkpoint"] * 3 + ["warmup_end", "eval"],
            "ts": [120.01, 120.02, 120.04, 105.0, 180.0],
            "dur": [4.0, 4.2, 4.1, 0.0, 1.0],
        }
    )
    spec = queue_chart(queue, events, t0=100.0).to_dict()
    rows = [r for values in spec["datasets"].values() for r in values]
    ev = sorted((r["name"], r["t_s"], r["dur_s"]) for r in rows if "dur_s" in r)
    assert ev == [("checkpoint", 20.01, 4.2), ("eval", 80.0, 1.0), ("warmup_end", 5.0, 0.0)]
    assert {"name": "hs", "capacity": 8} in rows
    assert sum(1 for layer in spec["layer"] if layer["mark"]["type"] == "text") == 1
    monkeypatch.setattr(charts, "MAX_EVENTS", 2)
    monkeypatch.setattr(charts, "MAX_EVENT_LABELS", 1)
    spec = queue_chart(queue, events, t0=100.0).to_dict()
    assert spec["title"] == (
        "queue depth; grey: checkpoint, eval (hover for details) (2 longest of 3 events shown)"
    )
    assert not any(layer["mark"]["type"] == "text" for layer in spec["layer"])
    rows = [r for values in spec["datasets"].values() for r in values]
    assert sorted(r["name"] for r in rows if "dur_s" in r) == ["checkpoint", "eval"]


def test_share_chart_rows_and_order() -> None:
    shares = pl.DataFrame(
        {
            "stage": ["d", "d", "d", "d"],
            "rank": [None, None, 3, 3],
            "category": ["compute", "starvation", "compute", "starvation"],
            "share": [0.75, 0.25, 0.5, 0.5],
        }
    )
    spec = category_share_chart(shares).to_dict()
    assert _axis_order(spec, spec["encoding"]["y"], "row") == ["d (all ranks)", "d · rank 3"]
    assert spec["encoding"]["color"]["scale"]["domain"] == [
        "starvation",
        "backpressure",
        "compute",
        "sync",
        "unaccounted",
    ]


def test_heatmap_orders_phases_by_time_and_caps_them() -> None:
    phases = pl.DataFrame(
        {
            "stage": ["d"] * 6,
            "rank": [0, 1, 0, 1, 0, 1],
            "phase": ["fwd", "fwd", "bwd", "bwd", "opt", "opt"],
            "seconds_per_iter": [0.02, 0.03, 0.04, 0.04, 0.001, 0.001],
        }
    )
    spec = rank_phase_heatmap(phases, max_phases=2).to_dict()
    panel = spec["vconcat"][0]
    assert _axis_order(spec, panel["layer"][0]["encoding"]["x"], "phase") == ["bwd", "fwd"]
    rows = [r for values in spec["datasets"].values() for r in values]
    assert sorted((r["phase"], r["rank"], r["ms"]) for r in rows) == [
        ("bwd", 0, 40.0),
        ("bwd", 1, 40.0),
        ("fwd", 0, 20.0),
        ("fwd", 1, 30.0),
    ]


def test_top_phases_in_milliseconds() -> None:
    top = pl.DataFrame(
        {
            "stage": ["d", "d"],
            "phase": ["hs_get", "forward"],
            "category": ["starvation", "compute"],
            "mean_s": [0.05, 0.02],
            "p50_s": [0.002, 0.019],
            "p95_s": [0.2, 0.025],
        }
    )
    spec = top_phases_chart(top).to_dict()
    rows = [r for values in spec["datasets"].values() for r in values]
    assert rows == [
        {
            "phase": "hs_get",
            "category": "starvation",
            "mean_ms": 50.0,
            "p50_ms": 2.0,
            "p95_ms": 200.0,
            charts.POSITION: 0,
        },
        {
            "phase": "forward",
            "category": "compute",
            "mean_ms": 20.0,
            "p50_ms": 19.0,
            "p95_ms": 25.0,
            charts.POSITION: 1,
        },
    ]


def test_contribution_chart_labels_direction_and_share() -> None:
    contributors = pl.DataFrame(
        {
            "stage": ["drafter", "drafter"],
            "phase": ["mask_build", "hs_get"],
            "category": ["compute", "starvation"],
            "delta_s_per_iter": [0.018, -0.001],
            "share_of_gap": [0.9, None],
        }
    )
    spec = contribution_chart(contributors).to_dict()
    rows = [r for values in spec["datasets"].values() for r in values if "item" in r]
    assert [(r["item"], r["delta_ms"], r["direction"]) for r in rows] == [
        ("drafter · mask_build (90% of gap)", 18.0, "slower"),
        ("drafter · hs_get", -1.0, "faster"),
    ]


def test_breakdown_rows_pair_runs_per_stage() -> None:
    bd = pl.DataFrame(
        {
            "run": ["baseline", "baseline", "candidate", "candidate"],
            "stage": ["t", "d", "t", "d"],
            "category": ["compute"] * 4,
            "seconds_per_iter": [0.05, 0.06, 0.05, 0.08],
        }
    )
    spec = breakdown_comparison_chart(bd).to_dict()
    assert _axis_order(spec, spec["encoding"]["y"], "row") == [
        "t · baseline",
        "t · candidate",
        "d · baseline",
        "d · candidate",
    ]


def test_many_ranks_and_queues_stay_within_the_point_budget() -> None:
    ranks, phases = 1000, [f"p{i}" for i in range(10)]
    heat = pl.DataFrame(
        {
            "stage": "d",
            "rank": [r for r in range(ranks) for _ in phases],
            "phase": phases * ranks,
            "seconds_per_iter": [0.001 * (i + 1) for _ in range(ranks) for i in range(len(phases))],
        }
    )
    spec = charts.spec(rank_phase_heatmap(heat))
    assert _axis_order(spec, spec["vconcat"][0]["layer"][0]["encoding"]["x"], "phase") == [
        "p9", "p8", "p7", "p6"]
    queues = pl.DataFrame(
        {
            "name": [f"q{k}" for k in range(40) for _ in range(1000)],
            "ts": [float(t) for _ in range(40) for t in range(1000)],
            "depth": 1,
            "capacity": 8,
        }
    )
    rows = [
        r
        for v in charts.spec(queue_chart(queues)).values()
        if isinstance(v, dict)
        for values in v.values()
        if isinstance(values, list)
        for r in values
    ]
    assert sum(1 for r in rows if "depth_mean" in r) == 40 * 100  # 4,000 / 40 queues
