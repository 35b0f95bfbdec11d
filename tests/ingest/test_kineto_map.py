"""``ingest.kineto_map``: one trace mapped to v1 records (a trace written by hand:
two 10 ms steps, 4 ms in ``## forward ##`` and 3 ms in ``optimizer`` each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tlog.ingest.errors import TraceError
from tlog.ingest.kineto_map import annotation_phase, convert_trace

from tests.ingest.kineto_traces import span, steps, write_trace

BASE_NS = 1_764_403_200_000_000_000       # 2025-11-29 08:00 UTC in nanoseconds


def test_steps_become_iterations_and_annotations_phases(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "rank2.json", steps(2, [("## forward ##", 4000.0),
                                                       ("optimizer", 3000.0)]),
                    baseTimeNanoseconds=BASE_NS)
    conv = convert_trace(p)
    assert (conv.rank, conv.rank_source, conv.windows) == (2, "file name", "ProfilerStep")
    assert [r["iter"] for r in conv.records] == [0, 1]
    first, second = conv.records
    assert first["dur"] == pytest.approx(0.010)
    # trace microseconds after the base: 1000 us, then 11000 us
    assert first["ts"] == pytest.approx(BASE_NS / 1e9 + 0.001)
    assert second["ts"] - first["ts"] == pytest.approx(0.010)
    assert first["phases"] == {"forward": pytest.approx(0.004),
                               "optimizer": pytest.approx(0.003)}
    assert conv.meta["type"] == "meta" and conv.meta["rank"] == 2
    lines = [json.loads(x) for x in conv.lines()]
    assert lines[0] == conv.meta and lines[1:] == conv.records
    assert conv.to_jsonl().count("\n") == 3


def test_a_worker_name_and_a_forced_rank(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json", steps(1, [("fwd", 1000.0)]), rank=1)
    conv = convert_trace(p, rank=7, worker="host_b")
    assert conv.rank == 7 and conv.meta["worker"] == "host_b"


def test_without_steps_the_annotations_are_the_iterations(tmp_path: Path) -> None:
    events = [span("train_step", 1000.0 + 5000.0 * k, 4000.0) for k in range(3)]
    conv = convert_trace(write_trace(tmp_path / "t.json", events))
    assert conv.windows == "annotation" and len(conv.records) == 3
    assert conv.warnings and all("\n" not in w for w in conv.warnings)


def test_no_iterations_is_one_clear_error(tmp_path: Path) -> None:
    events = [span("aten::mm", 1000.0, 10.0, cat="cpu_op")]
    with pytest.raises(TraceError, match="schedule="):
        convert_trace(write_trace(tmp_path / "t.json", events))


@pytest.mark.parametrize(("name", "phase"), [("## forward ##", "forward"),
                                             ("  loss  ", "loss"), ("a/b", "a_b"),
                                             ("###", "###")])
def test_annotation_phase(name: str, phase: str) -> None:
    assert annotation_phase(name) == phase
