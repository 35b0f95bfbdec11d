"""``analyze.persist_rows``: one run's stored-diagnosis rows, from its diagnosis
(a run written by hand: one warm-up iteration, one in an event)."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest
from tlog.analyze import diagnose
from tlog.analyze.persist import TABLES
from tlog.analyze.persist_rows import diagnosis_rows, rows_of

from tests.support.runbuilder import RunBuilder, loop


@pytest.fixture
def con(build):
    b = RunBuilder("r")
    b.iteration(iter=0, ts=999.0, dur=1.0, phases=[("forward", 0.5)])        # warm-up
    loop(b, 11, [("forward", 0.1)], t0=1000.0)
    b.iteration(iter=0, ts=999.0, dur=0.1, phases=[("forward", 0.1)], rank=1)  # another worker
    b.iterations = b.iterations[:1] + [(*r[:4], r[4] + 1, *r[5:]) for r in b.iterations[1:12]] \
        + b.iterations[12:]
    b.phases = b.phases[:1] + [(*p[:4], p[4] + 1, *p[5:]) for p in b.phases[1:12]] \
        + b.phases[12:]
    b.event(name="checkpoint", ts=1000.55, dur=0.01)          # inside iteration 6 of rank 0
    return build(b)


def test_iteration_rows_carry_the_flags_and_the_time_base(con) -> None:
    rows = diagnosis_rows(diagnose(con, "r"), "key", datetime(2026, 1, 1))
    assert set(rows) == set(TABLES)
    it = rows["attribution"].sort("rank", "iter")
    rank0 = it.filter(rank=0)
    assert rank0["pos"].to_list() == list(range(1, 13))
    assert rank0["warmup"].to_list() == [True] + [False] * 11
    assert rank0["in_event"].to_list() == [False] * 6 + [True] + [False] * 5
    assert rank0["excluded"].to_list() == ["warmup"] + [None] * 5 + ["event"] + [None] * 5
    assert rank0["steady"].sum() == 10
    assert rank0["base_s"].to_list() == pytest.approx([1.0] + [0.1] * 11)
    run = rows["attribution_runs"].row(0, named=True)
    assert (run["data_key"], run["iterations"], run["verdict"][:11]) == ("key", 13,
                                                                        "Bottleneck:")
    assert rows["attribution_stages"].rows() == [("r", "main", 1)]
    ph = rows["attribution_phases"].filter(rank=0)
    assert ph["iterations"].to_list() == [10] and ph["host_s"][0] == pytest.approx(1.0)


def test_a_run_without_iterations_gets_a_run_row_only(build) -> None:
    con = build(RunBuilder("empty"))
    rows = rows_of(con, "empty", "k")
    run = rows["attribution_runs"].row(0, named=True)
    assert (run["verdict"], run["iterations"], run["diagnosis"]) == ("no iterations", 0, None)
    assert all(rows[t].height == 0 for t in TABLES if t != "attribution_runs")


def test_a_diagnosis_without_its_analysis_is_refused(con) -> None:
    d = dataclasses.replace(diagnose(con, "r"), analysis=None)
    with pytest.raises(ValueError, match="needs a Diagnosis with its analysis"):
        diagnosis_rows(d, "k", datetime(2026, 1, 1))
