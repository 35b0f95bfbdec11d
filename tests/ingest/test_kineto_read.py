"""``ingest.kineto_read``: a trace recognised by its content, its header, and its
events read into columns (traces written by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.ingest.errors import TraceError
from tlog.ingest.kineto_read import looks_like_trace, read_columns, read_header, sniff

from tests.ingest.kineto_traces import span, steps, write_trace


def test_recognised_by_content_not_name(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "anything.txt", steps(1, [("fwd", 5000.0)]), rank=1)
    packed = write_trace(tmp_path / "t.json.gz", steps(1, [("fwd", 5000.0)]), gz=True)
    log = tmp_path / "rank0.jsonl"
    log.write_text('{"iter": 0, "ts": 1.0, "dur": 1.0, "phases": {}}\n')
    early = tmp_path / "early.json"     # PyTorch 1.8's bare array of events
    early.write_text('[{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 2}]')
    assert looks_like_trace(trace) and looks_like_trace(packed) and looks_like_trace(early)
    assert not looks_like_trace(log)
    assert not looks_like_trace(tmp_path / "missing.json")
    assert sniff(packed, 15) == b'{"schemaVersion'


def test_the_header_before_the_events(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json", steps(1, [("fwd", 5000.0)]), rank=3,
                    deviceProperties=[{"id": 0, "name": "hand-made GPU"}])
    assert read_header(p) == {"schemaVersion": 1,
                              "deviceProperties": [{"id": 0, "name": "hand-made GPU"}],
                              "distributedInfo": {"backend": "gloo", "rank": 3,
                                                  "world_size": 2}}
    assert read_header(tmp_path / "missing.json") == {}


def test_columns_of_host_spans_and_device_activities(tmp_path: Path) -> None:
    events = steps(2, [("## forward ##", 4000.0), ("optimizer", 3000.0)])
    events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
                   "ts": 1500.0, "dur": 800.0, "args": {"correlation": 11, "device": 0,
                                                        "stream": 7}})
    events.append({"ph": "i", "cat": "cpu_instant_event", "name": "marker", "ts": 1.0})
    cols = read_columns(write_trace(tmp_path / "t.json", events))
    assert cols.events_read == 8
    # 2 steps + 2 x 2 phases, in file order, times in microseconds
    assert cols.host_count == 6 and cols.device_count == 1
    assert [cols.names[i] for i in cols.h_name] == [
        "ProfilerStep#0", "## forward ##", "optimizer", "ProfilerStep#1", "## forward ##",
        "optimizer"]
    assert list(cols.h_ts) == [1000.0, 1000.0, 5000.0, 11000.0, 11000.0, 15000.0]
    assert list(cols.h_dur) == [10000.0, 4000.0, 3000.0, 10000.0, 4000.0, 3000.0]
    assert (cols.d_ts[0], cols.d_dur[0], cols.d_corr[0]) == (1500.0, 800.0, 11)
    assert cols.rejected == {} and cols.notes == []


def test_events_over_the_limits_are_counted_and_skipped(tmp_path: Path) -> None:
    # a duration that is text, not a number
    events = steps(1, [("fwd", 5000.0)]) + [span("bad", 1.0, "long")]
    cols = read_columns(write_trace(tmp_path / "t.json", events))
    assert cols.host_count == 2
    assert cols.rejected == {"field": 1}
    assert cols.notes == [("1 event over the reader's limits was left out: 1 with a field of "
                          "the wrong type or out of range (docs/KINETO.md, Limits)")]


@pytest.mark.parametrize(("text", "says"), [
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph":',
     "is not valid JSON after 1 events"),
    ('{"schemaVersion": 1, "traceEvents": []}', "holds no traceEvents"),
])
def test_unreadable_traces(tmp_path: Path, text: str, says: str) -> None:
    p = tmp_path / "t.json"
    p.write_text(text)
    with pytest.raises(TraceError, match=says):
        read_columns(p)
