"""torch.profiler's device ``[memory]`` events feed ``memory_growth`` for a trace.

A trace made by hand in Kineto's layout (as tests/data/kineto_rules): 40
``ProfilerStep#N`` steps of 20 ms, each with an ``aten::linear`` op and one
device ``[memory]`` event per step whose ``Total Allocated`` grows 8 MiB a
step (a tensor kept every step). The truth is the trace's own events: 8 MiB
per step, 312 MiB from the first step's event to the last one's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tlog.analyze import diagnose
from tlog.ingest import ingest_run
from tlog.ingest.db import connect

MiB = 1 << 20
STEPS, STEP_US = 40, 20_000


def _trace(path: Path) -> None:
    events = []
    for k in range(STEPS):
        t = 1_000 + k * STEP_US
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1,
             "tid": 1, "ts": t, "dur": STEP_US - 100},
            {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1,
             "ts": t + 100, "dur": STEP_US - 1_000},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
             "ts": t + STEP_US // 2, "s": "t",
             "args": {"Device Type": 1, "Device Id": 0, "Bytes": 8 * MiB,
                      "Total Allocated": (100 + 8 * k) * MiB,
                      "Total Reserved": (128 + 8 * k) * MiB}},
        ]
    path.write_text(json.dumps({
        "schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "deviceProperties": [{"id": 0, "name": "hand-made GPU"}], "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": events}))


def test_a_leak_in_a_trace_s_memory_events_is_memory_growth(tmp_path: Path) -> None:
    run = tmp_path / "leaky"
    run.mkdir()
    _trace(run / "trace.json")
    con = connect(tmp_path / "t.duckdb")
    try:
        ingest_run(con, run)
        d = diagnose(con, "leaky")
    finally:
        con.close()
    [f] = [f for f in d.findings if f.code == "memory_growth"]
    assert f.evidence["memory"] == "device"
    assert f.evidence["rate_bytes_per_iter"] == pytest.approx(8 * MiB, rel=0.01)
