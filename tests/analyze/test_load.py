"""``analyze.load``: one run's rows read into the frames and flat arrays analysis
uses (a run written by hand, every value known)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from tlog.analyze.load import (
    CAT_CODE,
    COMPUTE,
    STARVATION,
    SYNC,
    impossible_rows,
    load_run,
    releasable,
)
from tlog.ingest.errors import RunNotFoundError

from tests.support.runbuilder import RunBuilder


@pytest.fixture
def con(build):
    b = RunBuilder("r", phase_kinds={"step": "sync"})
    # worker main-1 listed first to see the frame sorted by (stage, rank, worker, iter)
    for i in (1, 0):
        b.iteration(iter=i, ts=1000.0 + i, dur=1.0, rank=1,
                    phases=[("get", 0.25), ("fwd", 0.5, 0.4), ("fwd/attn", 0.2)], tokens=8)
    for i in range(2):
        b.iteration(iter=i, ts=1000.0 + i, dur=1.0, rank=0, phases=[("get", 0.3), ("step", 0.6)])
    b.queue(name="hs", ts=1000.5, depth=2, capacity=4, rank=0, stage="main")
    b.event(name="checkpoint", ts=1001.5, dur=0.1)
    return build(b)


def test_iterations_workers_and_phase_names(con) -> None:
    data = load_run(con, "r")
    it = data.iterations
    assert it.select("rank", "iter").rows() == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert data.workers.select("wid", "rank", "worker").rows() == [(0, 0, "main-0"),
                                                                   (1, 1, "main-1")]
    assert it["wid"].to_list() == [0, 0, 1, 1]
    assert data.phase_names == ["fwd", "fwd/attn", "get", "step"]
    assert it["tokens"].to_list() == [None, None, 8, 8]
    assert data.queues.select("name", "depth", "capacity").rows() == [("hs", 2, 4)]
    assert data.events.select("name", "ts", "dur").rows() == [("checkpoint", 1001.5, 0.1)]
    assert data.left_out.height == 0 and data.run["phase_kinds"] == {"step": "sync"}


def test_layouts_and_flat_phase_times(con) -> None:
    data = load_run(con, "r")
    it, t = data.iterations, data.times
    names = data.phase_names
    by_layout = {}
    for row in it.iter_rows(named=True):
        lay = data.layouts[row["layout"]]
        start, n = int(t.host_start[row["src"]]), int(t.length[row["src"]])
        by_layout[(row["rank"], row["iter"])] = (
            [names[p] for p in lay.pid], t.host[start:start + n].tolist())
    assert by_layout[(0, 1)] == (["get", "step"], [0.3, 0.6])
    assert by_layout[(1, 0)] == (["get", "fwd", "fwd/attn"], [0.25, 0.5, 0.2])
    rank1 = data.layouts[it.filter(pl.col("rank") == 1)["layout"][0]]
    # categories by the host rules: get starvation, fwd compute; step by phase_kinds
    assert rank1.cat.tolist() == [STARVATION, COMPUTE, COMPUTE]
    assert rank1.top.tolist() == [True, True, False]
    assert rank1.parent == [None, None, "fwd"]
    rank0 = data.layouts[it.filter(pl.col("rank") == 0)["layout"][0]]
    assert rank0.cat.tolist() == [STARVATION, SYNC] and len(rank0) == 2
    assert CAT_CODE == {"starvation": 0, "backpressure": 1, "compute": 2, "sync": 3,
                        "unaccounted": 4}
    # the device time of fwd (0.4 s): the only one measured
    assert data.device_times
    assert t.gpu[t.gpu_valid].tolist() == [0.4, 0.4]


def test_a_window_and_an_unknown_run(con) -> None:
    data = load_run(con, "r", since=1001.0)
    assert data.iterations["iter"].to_list() == [1, 1]
    assert data.queues.height == 0                  # sampled before the window
    with pytest.raises(RunNotFoundError, match="nope"):
        load_run(con, "nope")


def test_impossible_rows() -> None:
    scalars = pl.DataFrame({"ts": [0.0, 1.0, np.inf, 3.0, 4.0], "dur": [1.0, -1.0, 1.0, 1.0, 1.0],
                            "cpu": [None, 0.5, 0.5, 0.5, np.nan]})
    # rows 0 and 3 have two host phases each; row 3's second is 1e308 s (over a day)
    host = np.array([0.5, 0.5, 0.5, 1e308])
    host_start = np.array([0, 2, 2, 2, 4])
    length = np.array([2, 0, 0, 2, 0])
    gpu = np.array([0.1, -0.2])
    gpu_valid = np.array([True, True])
    gpu_start = np.array([0, -1, -1, -1, -1])
    # row 1: negative dur; row 2: ts not finite; row 3: a phase of 1e308 s; row 4:
    # cpu not finite; row 0: a negative device time
    assert impossible_rows(scalars, host, host_start, length, gpu, gpu_valid,
                           gpu_start).tolist() == [0, 1, 2, 3, 4]
    gpu_valid[1] = False           # a device time not measured is no value at all
    assert impossible_rows(scalars, host, host_start, length, gpu, gpu_valid,
                           gpu_start).tolist() == [1, 2, 3, 4]


def test_releasable_arrays_are_plain_arrays_to_their_readers() -> None:
    a = releasable(1000, np.float64)
    a[:] = 2.0
    assert a.dtype == np.float64 and a.shape == (1000,) and float(a.sum()) == 2000.0
    assert releasable(0, np.int32).shape == (0,)


#: Runs of tests/data beside a run holding only iterations: queue samples and
#: events, system samples, a trace, timer logs (intervals), pipeline stages.
GROUP_SCENARIOS = ("ingest_every_kind", "ingest_sys", "kineto_loader_1",
                   "timer_logs/deepspeed_2024", "ddp_measured_tail/run", "report_slow_loader")


def _same(a: object, b: object) -> bool:
    """Whether two values of a :class:`RunData` field hold the same (frames
    with their dtypes, arrays with theirs, dataclasses field by field)."""
    import dataclasses

    if isinstance(a, pl.DataFrame):
        return isinstance(b, pl.DataFrame) and a.schema == b.schema and a.equals(b)
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b, equal_nan=True))
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            _same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
            if not f.name.startswith("_"))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(
            _same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_a_group_read_gives_each_run_the_data_of_its_own_read(tmp_path) -> None:
    """``group_reads`` (the diagnoses of ``tlog ingest DIR DIR ...``) reads the
    small tables of several runs at once: each run's RunData is, field by
    field, the one ``load_run`` reads for it alone, for runs holding queue
    samples, events, system samples, traces and timer logs and for one
    holding iterations alone; a run outside the group is read alone."""
    import json
    from pathlib import Path

    from tlog.analyze.load import _GroupReads, group_reads
    from tlog.ingest import connect, ingest_run

    data = Path(__file__).resolve().parents[1] / "data"
    con = connect(tmp_path / "g.duckdb")
    ids = [ingest_run(con, data / s).run_id for s in GROUP_SCENARIOS]
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "rank0.jsonl").write_text("".join(json.dumps(
        {"type": "iter", "v": 1, "iter": i, "ts": 1000.0 + i, "dur": 1.0,
         "phases": {"get": 0.3, "step": 0.6}}) + "\n" for i in range(4)))
    ids.append(ingest_run(con, plain).run_id)
    alone = {r: load_run(con, r) for r in ids}
    read: list[str] = []
    covers = _GroupReads.covers

    def counted(self, c, run_id):
        hit = covers(self, c, run_id)
        if hit:
            read.append(run_id)
        return hit

    _GroupReads.covers = counted
    try:
        with group_reads(con, ids[1:]):
            grouped = {r: load_run(con, r) for r in ids}
    finally:
        _GroupReads.covers = covers
    assert read == ids[1:]
    for r in ids:
        assert _same(alone[r], grouped[r]), r
    con.close()
