"""``analyze.system``: the machine and its load over a run's steady state (samples
written by hand, each figure worked out from them)."""

from __future__ import annotations

import polars as pl
import pytest
from tlog.analyze.frames import attribute
from tlog.analyze.pipeline import worker_table
from tlog.analyze.results import MachineInfo
from tlog.analyze.system import (
    MACHINE_SCHEMA,
    SAMPLE_SCHEMA,
    cpu_percent,
    load_system,
    machine_info,
    on_cpu_shares,
    process_cores,
    run_queue_share,
    steady_samples,
    system_summary,
    throttle_names,
)

from tests.support.runbuilder import RunBuilder, loop

GiB = 1 << 30


def _samples(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([{c: r.get(c) for c in SAMPLE_SCHEMA} for r in rows],
                        schema=SAMPLE_SCHEMA)


def test_run_queue_share_sums_the_rises_of_the_wait() -> None:
    # waits 0, 0.5, 0.4 (a thread ended: no rise), 1.4 over 0..10 s: (0.5 + 1.0) / 10
    s = _samples([{"worker": "w", "ts": t, "cpu_wait_s": q}
                  for t, q in ((0.0, 0.0), (4.0, 0.5), (6.0, 0.4), (10.0, 1.4))])
    assert run_queue_share(s) == pytest.approx(0.15)
    # capped at 1: two threads that waited all the time
    both = _samples([{"worker": "w", "ts": 0.0, "cpu_wait_s": 0.0},
                     {"worker": "w", "ts": 2.0, "cpu_wait_s": 4.0}])
    assert run_queue_share(both) == 1.0
    assert run_queue_share(s.head(1)) is None
    assert run_queue_share(_samples([{"worker": "w", "ts": 1.0}, {"worker": "w", "ts": 2.0}])) \
        is None


def test_process_cores_and_cpu_percent() -> None:
    s = _samples([{"worker": "w", "ts": 0.0, "cpu_s": 1.0}, {"worker": "w", "ts": 2.0, "cpu_s": 4.0},
                  {"worker": "w", "ts": 4.0, "cpu_s": 5.0},
                  {"worker": "v", "ts": 1.0, "cpu_s": 9.0}, {"worker": "v", "ts": 2.0, "cpu_s": 8.0}])
    # w: 4 CPU seconds over 4 s
    assert process_cores(s.filter(pl.col("worker") == "w")) == pytest.approx(1.0)
    assert process_cores(s.filter(pl.col("worker") == "v").head(1)) is None
    pct = cpu_percent(s)
    assert pct["worker"].to_list() == ["v", "v", "w", "w", "w"]
    # v: a fall (a restarted process) is no figure; w: 3 s of CPU in 2 s, then 1 in 2
    assert pct["cpu_pct"].to_list() == [None, None, None, pytest.approx(150.0),
                                        pytest.approx(50.0)]


def test_throttle_names_keep_only_slowdowns() -> None:
    # 0x1 idle and 0x10 sync boost are not slowdowns; 0x4 and 0x40 are
    assert throttle_names(0x1 | 0x4 | 0x10 | 0x40) == ["software power cap",
                                                      "hardware thermal slowdown"]
    assert throttle_names(0) == []


def test_machine_info_lists_distinct_names_and_the_smallest_counts() -> None:
    rows = pl.DataFrame([
        {"worker": "a", "host": "node-b", "cpu_model": "EPYC", "ncpu": 64, "mem_total": 4 * GiB,
         "gpu_name": "H100", "gpu_count": 8, "driver": "550", "cuda": "12.4"},
        {"worker": "b", "host": "node-a", "cpu_model": "EPYC", "ncpu": 32, "mem_total": None,
         "gpu_name": "H100", "gpu_count": 4, "driver": "550", "cuda": None},
    ], schema=MACHINE_SCHEMA)
    assert machine_info(rows) == MachineInfo(host="node-a, node-b", cpu_model="EPYC", ncpu=32,
                                             mem_total=4 * GiB, gpu_name="H100", gpu_count=4,
                                             driver="550", cuda="12.4")
    assert machine_info(rows.head(0)) is None


def test_summary_over_the_steady_samples_of_a_built_run(build, tmp_path) -> None:
    # 20 iterations of 100 ms from t=1000 s, each on the CPU 40 of its 100 ms of compute;
    # samples every 0.5 s: load 3.0 then 5.0, 2 and 4 runnable threads, 1 core, the
    # process's CPU +0.25 s per 0.5 s (0.5 cores); one sample after the run (left out)
    b = RunBuilder("sys")
    loop(b, 20, [("forward", 0.1)], cpu=0.04)
    for k in range(5):
        b.sys_sample(ts=1000.0 + 0.5 * k, ncpu=1, load1=3.0 if k < 3 else 5.0,
                     running=2 if k < 3 else 4, cpu_s=10.0 + 0.25 * k, rss_bytes=2**20)
    b.sys_sample(ts=1010.0, ncpu=1, load1=50.0)
    b.machine(host="box", cpu_model="EPYC", ncpu=1)
    con = build(b)
    assert load_system(con, "sys").samples.height == 6
    analysis = attribute(con, "sys")
    # the iteration each sample fell in: 0.5 s is 5 iterations; the last sample, at the
    # end of the run (1002 s), belongs to its last iteration
    assert steady_samples(analysis)["x"].to_list() == pytest.approx([0.0, 5.0, 10.0, 15.0,
                                                                     19.0], abs=1e-9)
    workers = worker_table(analysis)
    (share,) = on_cpu_shares(analysis, workers)
    assert (share["n"], share["on_cpu"]) == (20, pytest.approx(0.4))
    s = system_summary(analysis, workers)
    assert (s.samples, s.ncpu, s.load1, s.running) == (5, 1, 3.0, 2.0)
    assert s.process_cpu_cores == pytest.approx(0.5)
    assert s.on_cpu_share == pytest.approx(0.4)
    assert s.run_queue_share is None and s.throttled_share is None
    assert s.machine.host == "box"
