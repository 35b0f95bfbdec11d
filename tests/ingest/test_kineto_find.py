"""``ingest.kineto_find``: which files of a run are traces, and each one's rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tlog.ingest.kineto_find import (
    find_traces,
    plan_traces,
    rank_from_name,
    resolve_rank,
    trace_stem,
)

from tests.ingest.kineto_traces import steps, write_trace


@pytest.mark.parametrize(("name", "rank"), [("worker_rank3.pt.trace.json", 3),
                                            ("RANK-12.json", 12), ("rank_0", 0),
                                            ("host1.json", None), ("ranking.json", None)])
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_trace_stem() -> None:
    assert trace_stem("logs/host1.pt.trace.json.gz") == "host1"
    assert trace_stem("a.JSON") == "a"
    assert trace_stem(".json") == ".json"          # nothing would be left


def test_resolve_rank_header_then_name_then_zero() -> None:
    assert resolve_rank({"distributedInfo": {"rank": 5}}, "rank2.json") == (5,
                                                                            "distributedInfo")
    assert resolve_rank({"distributedInfo": {"rank": "5"}}, "rank2.json") == (2, "file name")
    assert resolve_rank({}, "trace.json") == (0, "default")


def test_plans_give_traces_of_one_rank_their_own_worker(tmp_path: Path) -> None:
    ev = steps(1, [("fwd", 1000.0)])
    a = write_trace(tmp_path / "host_a.pt.trace.json", ev)
    b = write_trace(tmp_path / "host_b.pt.trace.json", ev)
    r1 = write_trace(tmp_path / "x.json", ev, rank=1)
    plans = {p.path.name: p for p in plan_traces([a, b, r1])}
    assert (plans["host_a.pt.trace.json"].rank, plans["host_a.pt.trace.json"].worker) == (
        0, "host_a")
    assert plans["host_b.pt.trace.json"].worker == "host_b"
    assert (plans["x.json"].rank, plans["x.json"].rank_source, plans["x.json"].worker) == (
        1, "distributedInfo", None)


def test_find_traces_by_content_inside_the_run_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ev = steps(1, [("fwd", 1000.0)])
    t1 = write_trace(run / "prof" / "rank0.json", ev)
    t2 = write_trace(run / "rank1.trace", ev, gz=True)
    write_trace(run / ".hidden" / "t.json", ev)                 # hidden: not looked at
    (run / "rank0.jsonl").write_text("{}\n")                    # a tlog log
    (run / "notes.txt").write_text("not a trace\n")
    outside = write_trace(tmp_path / "elsewhere.json", ev)
    os.symlink(outside, run / "link_out.json")                  # out of the run: never read
    os.symlink(t1, run / "link_in.json")                        # inside: found once
    assert find_traces(run) == sorted([t1, t2])
    assert find_traces(t1) == [t1]
    assert find_traces(run / "notes.txt") == []
