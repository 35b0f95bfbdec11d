"""The report's system panel: a real shim loop that keeps 8 MiB per iteration,
sampled every 20 ms, ingested and reported; the panel's figures against the
sys records in the log, its axis against the timeline's, and the page drawn
offline in Chromium."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest
from tlog.ingest import ingest_run
from tlog.ingest.db import connect
from tlog.reports import charts, write_run_report
from tlog.reports.data import load_report_data
from tlog.reports.run_report import run_charts

from dflash_runtime import Recorder
from tests.support.browser import Browser, find_chromium

MiB = 1 << 20
ITERS = 16


@pytest.fixture(scope="module")
def leak_run(tmp_path_factory) -> tuple[Path, str, list[dict]]:
    """A loop that retains 8 MiB per iteration, recorded with sys samples."""
    root = tmp_path_factory.mktemp("system")
    run = root / "leak"
    keep: list[bytes] = []
    rec = Recorder(run, sys_interval=0.02, install_handlers=False)
    for _ in range(ITERS):
        with rec.iteration() as it:
            keep.append(b"\x01" * (8 * MiB))
            it.lap("retain")
            time.sleep(0.04)
    rec.close()
    lines = [json.loads(x) for x in rec.path.read_text().splitlines()]
    samples = [r for r in lines if r.get("type") == "sys"]
    con = connect(root / "t.duckdb")
    try:
        run_id = ingest_run(con, run).run_id
    finally:
        con.close()
    return root, run_id, samples


@pytest.fixture(scope="module")
def leak_data(leak_run):
    """The report data of the leak run."""
    root, run_id, _ = leak_run
    con = connect(root / "t.duckdb", read_only=True)
    try:
        return load_report_data(con, run_id)
    finally:
        con.close()


def test_panel_figures_are_the_samples_of_each_iteration(leak_run, leak_data) -> None:
    """With fewer iterations than bins, a bin is one iteration: its RSS mean,
    least and largest are those of the sys records whose iter is that one."""
    samples, data = leak_run[2], leak_data
    binned = charts.bin_system(data.system, data.iterations)
    rss = binned.filter(pl.col("metric") == "rss").sort("iter_start")
    by_iter: dict[int, list[float]] = {}
    for s in samples:
        if s["iter"] is not None:
            by_iter.setdefault(s["iter"], []).append(s["rss"] / MiB)
    assert rss["iter_start"].to_list() == sorted(by_iter)
    for row in rss.iter_rows(named=True):
        values = by_iter[row["iter_start"]]
        assert row["iter_end"] == row["iter_start"]
        assert row["mean"] == pytest.approx(sum(values) / len(values))
        assert (row["low"], row["high"]) == (pytest.approx(min(values)), pytest.approx(max(values)))
        assert row["samples"] == len(values)
    # 8 MiB retained per iteration: the panel rises by that much (least squares)
    xs, ys = rss["iter_start"].to_list(), rss["mean"].to_list()
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
             / sum((x - mx) ** 2 for x in xs))
    assert slope == pytest.approx(8.0, rel=0.10)
    # CPU: 100 * delta cpu / delta ts of consecutive records
    cpu = data.system.sort("ts")["cpu_pct"].to_list()
    assert cpu[0] is None
    assert cpu[1] == pytest.approx(100 * (samples[1]["cpu"] - samples[0]["cpu"])
                                   / (samples[1]["ts"] - samples[0]["ts"]), rel=1e-3)
    assert {m for m in binned["metric"]} == {"cpu", "rss"}   # no GPU here: no GPU rows


def test_panel_shares_the_timelines_axis(leak_data) -> None:
    data = leak_data
    keys = [c.key for c in run_charts(data)]
    assert keys[:2] == ["timeline", "system"]
    spec = charts.spec(charts.system_chart(data.system, data.iterations))
    domains = {json.dumps(layer["encoding"]["x"]["scale"]["domain"])
               for panel in spec["vconcat"] for layer in panel["layer"]
               if "x" in layer.get("encoding", {})}
    assert domains == {json.dumps([0, ITERS])}   # iterations 0..15, one past the last
    assert {p["width"] for p in spec["vconcat"]} == {charts.WIDTH}


@pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")
def test_system_panel_draws_offline(leak_run) -> None:
    root, run_id, _ = leak_run
    con = connect(root / "t.duckdb")
    try:
        files = write_run_report(con, run_id, root / "out" / "index.html")
    finally:
        con.close()
    with Browser() as browser:
        result = browser.open(files.html, timeout_s=60)
    assert not result.timed_out and result.console_errors == [] and result.requests == []
    assert result.status.get("errors") == []
    system = result.status["charts"]["system"]
    assert system["width"] > 100 and system["height"] > 40 and system["marks"] > 0
