"""``reports.data``: what a run report reads, from one diagnosis (a run written by
hand: two phases, system samples)."""

from __future__ import annotations

import polars as pl
import pytest
from tlog.reports.data import empty_system, load_report_data, system_samples

from tests.support.runbuilder import RunBuilder, loop


def test_empty_system_has_the_panels_columns() -> None:
    e = empty_system()
    assert e.height == 0
    assert e.columns == ["stage", "worker", "ts", "iter", "cpu_pct", "ncpu", "rss_bytes",
                         "gpu_util", "cuda_allocated", "gpu_mem_used"]


def test_system_samples_join_the_workers_stage() -> None:
    from tlog.analyze.system import SAMPLE_SCHEMA

    samples = pl.DataFrame([{c: None for c in SAMPLE_SCHEMA} | r for r in (
        {"worker": "w0", "ts": 0.0, "cpu_s": 1.0}, {"worker": "w0", "ts": 2.0, "cpu_s": 2.0},
        {"worker": "gone", "ts": 1.0, "cpu_s": 0.0})], schema=SAMPLE_SCHEMA)
    its = pl.DataFrame({"worker": ["w0", "w0"], "stage": ["main", "main"]})
    got = system_samples(samples, its)
    assert got["worker"].to_list() == ["w0", "w0"]            # no iterations: left out
    assert got["stage"].to_list() == ["main", "main"]
    assert got["cpu_pct"].to_list() == [None, pytest.approx(50.0)]   # 1 s of CPU in 2 s
    assert system_samples(samples.head(0), its).equals(empty_system())


def test_load_report_data(build) -> None:
    b = RunBuilder("rep")
    loop(b, 30, [("next_batch", 0.03), ("forward", 0.07)], tokens=128)
    b.queue(name="q", ts=1001.0, depth=2, capacity=4, rank=0, stage="main")
    b.event(name="checkpoint", ts=1001.55, dur=0.01)
    b.sys_sample(ts=1001.0, worker="main-0", cpu_s=1.0, rss_bytes=2**20)
    data = load_report_data(build(b), "rep")
    assert data.run_id == "rep"
    assert data.diagnosis["run_id"] == "rep" and data.diagnosis["verdict"].startswith("Bottleneck")
    assert data.iterations.height == 30
    assert data.iterations.filter("steady")["compute_s"].mean() == pytest.approx(0.07)
    by_phase = dict(zip(data.phases["phase"], data.phases["seconds_per_iter"], strict=True))
    assert by_phase == {"next_batch": pytest.approx(0.03), "forward": pytest.approx(0.07)}
    assert data.queues.rows() == [("q", 1001.0, 2, 4)]
    assert data.events.rows() == [("checkpoint", 1001.55, 0.01)]
    assert data.system["worker"].to_list() == ["main-0"]
