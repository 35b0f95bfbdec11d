"""docs/DESIGN.md "Where a change goes": a new chart, added as a newcomer adds
one, and shown in the run report with figures checked by hand.

The builder follows the pattern of reports/charts.py: a polars frame of
analyze's results in (here ``RunReportData.iterations``: attributed seconds per
iteration with the diagnosis's ``steady`` flag), its columns checked with
``_require``, the display aggregation done in polars and bounded (one row per
worker), an Altair chart out; ``charts.spec`` gives its Vega-Lite spec. In the
product it goes in reports/charts.py, a ``NamedChart`` in
``run_report.run_charts`` and a line in docs/REPORTS.md; here it is handed to
``run_page`` beside the report's own charts, as ``run_charts`` would.

The run is tests/reports/conftest.py's scenario, whose durations are known by
construction: target 40 ms of phases + 1 ms unaccounted; drafter 67 ms
(rank 2: 73 ms, a 26 ms draft_forward), plus 198 ms on every fourth iteration
(hs_get 200 ms instead of 2 ms); the first 5 iterations 3x as long.
"""

from __future__ import annotations

import json
import re

import altair as alt
import polars as pl
import pytest
from tlog.reports import charts
from tlog.reports.charts import WIDTH, _require
from tlog.reports.data import load_report_data
from tlog.reports.run_report import NamedChart, run_charts, run_page


def worker_time_chart(iters: pl.DataFrame) -> alt.Chart:
    """Mean milliseconds per steady iteration of each worker, one bar per worker.

    Args:
        iters: one row per iteration: ``stage``, ``rank`` (int), ``worker``,
            ``dur`` (s), ``steady`` (bool), as ``RunReportData.iterations``.
    """
    _require(iters, ["stage", "rank", "worker", "dur", "steady"], "worker_time_chart")
    data = (
        iters.filter(pl.col("steady"))
        .group_by("stage", "rank", "worker")
        .agg((pl.col("dur").mean() * 1000).round(4).alias("mean_ms"),
             pl.len().alias("iterations"))
        .sort("stage", "rank", "worker")
    )
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(y=alt.Y("worker:N", sort=None, title=None),
                x=alt.X("mean_ms:Q", title="ms per steady iteration"),
                color=alt.Color("stage:N"),
                tooltip=["stage:N", "rank:O", "worker:N", "mean_ms:Q", "iterations:Q"])
        .properties(width=WIDTH - 160, height=alt.Step(22))
    )


def scenario_dur_ms(stage: str, rank: int, i: int) -> float:
    """Iteration ``i``'s wall time (ms) in the scenario, by construction."""
    base = 41.0 if stage == "target" else 67.0 + (6.0 if rank == 2 else 0.0) + (
        198.0 if i % 4 == 3 else 0.0)
    return base * (3.0 if i < 5 else 1.0)


def test_a_new_chart_carries_hand_figures_into_the_report(scenario_db) -> None:
    con, run_id = scenario_db()
    data = load_report_data(con, run_id)

    spec = charts.spec(worker_time_chart(data.iterations))
    (rows,) = spec["datasets"].values()
    steady = data.iterations.filter(pl.col("steady"))
    assert steady["iter"].min() >= 5              # the 3x warm-up is left out
    expected = []
    for stage, rank, worker in (("drafter", 1, "drafter-1"), ("drafter", 2, "drafter-2"),
                                ("target", 0, "target-0")):
        its = steady.filter(pl.col("worker") == worker)["iter"].to_list()
        assert len(its) >= 60, worker
        mean = sum(scenario_dur_ms(stage, rank, i) for i in its) / len(its)
        expected.append({"stage": stage, "rank": rank, "worker": worker,
                         "mean_ms": pytest.approx(mean, abs=1e-3), "iterations": len(its)})
    assert rows == expected
    assert rows[2]["mean_ms"] == pytest.approx(41.0, abs=1e-3)   # target: every iteration

    own = run_charts(data)
    new = NamedChart("worker-time", "Time per iteration, per worker",
                     "Mean milliseconds per steady iteration of each worker.",
                     worker_time_chart(data.iterations))
    html = run_page(data, [*own, new]).render()
    assert 'id="chart-worker-time"' in html
    specs = json.loads(re.search(r'<script type="application/json" id="tlog-specs">(.*?)</script>',
                                 html, re.DOTALL).group(1))
    assert list(specs) == [*(c.key for c in own), "worker-time"]
    (page_rows,) = specs["worker-time"]["datasets"].values()
    assert page_rows == expected
