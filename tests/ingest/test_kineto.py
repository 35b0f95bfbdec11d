"""``ingest.kineto``: the ``kineto`` source end to end through ``tlog ingest``'s
reader: traces found, decoded to v1 lines, their warnings kept in the database."""

from __future__ import annotations

import json
from pathlib import Path

from tlog.ingest import connect, ingest_run
from tlog.ingest.kineto import decode_trace, find_run_traces, source, stored_warnings

from tests.ingest.kineto_traces import span, steps, write_trace


def test_two_traces_of_one_rank_keep_their_own_workers(tmp_path: Path) -> None:
    run = tmp_path / "run"
    a = write_trace(run / "host_a.json", steps(2, [("fwd", 5000.0)]))
    b = write_trace(run / "host_b.json", steps(2, [("fwd", 5000.0)]))
    assert find_run_traces(run) == [a, b]
    lines = [json.loads(x) for x in decode_trace(a)]
    assert lines[0]["type"] == "meta" and lines[0]["worker"] == "host_a"
    assert [x["iter"] for x in lines[1:]] == [0, 1]
    assert source().kind == "kineto"


def test_ingested_traces_and_their_stored_warnings(tmp_path: Path) -> None:
    run = tmp_path / "run"
    on_the_clock = {"baseTimeNanoseconds": 1_764_403_200_000_000_000}
    write_trace(run / "steps.json", steps(3, [("fwd", 5000.0)]), **on_the_clock)
    write_trace(run / "annot.json",
                [span("train_step", 1000.0 + 5000.0 * k, 4000.0) for k in range(2)], rank=1,
                **on_the_clock)
    with connect(tmp_path / "t.duckdb") as con:
        report = ingest_run(con, run, run_id="k")
        assert report.records_loaded["iter"] == 5
        warnings = stored_warnings(con, "k")
        # only the trace without steps needed a fallback, said once with its file
        (only,) = warnings
        assert only.startswith("annot.json: no ProfilerStep spans: the 2 top-level "
                               "record_function annotations are the iterations")
        assert stored_warnings(con, "other") == []
