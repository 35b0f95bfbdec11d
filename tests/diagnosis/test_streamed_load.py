"""analyze.load streams the iterations in record batches (issue 13, bounded memory):
the batch size must change nothing.

A run with two stages, device times on some phases only (null elements), an
iteration without phases, null ``cpu``/``tokens`` on some rows and one
impossible phase time (left out) is loaded with batches of 1, 3 and 7 rows and
with the default; every array and the diagnosis must be identical, and the
phase times must be the ones written here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from runbuilder import RunBuilder

from analyze import attribute, diagnose, load, load_run


def _run() -> RunBuilder:
    b = RunBuilder("stream")
    for rank, stage in ((0, "load"), (0, "train"), (1, "train")):
        for i in range(30):
            ts = 1000.0 + 0.1 * i
            if stage == "load":
                phases = [("read", 0.02 + 0.001 * i), ("put", 0.01)]
            elif i == 5 and rank == 1:
                phases = []                                   # no phases at all
            else:
                fwd = 0.03 + 0.0001 * i * (rank + 1)
                bad = rank == 1 and i == 9
                phases = [("get", 0.005), ("fwd", math.nan if bad else fwd, 0.04),
                          ("loss_item", 0.02)]
            b.iteration(rank=rank, stage=stage, iter=i, ts=ts, dur=0.09,
                        phases=phases, cpu=None if i % 4 == 0 else 0.05,
                        tokens=None if i % 3 == 0 else 100)
    return b


def _arrays(data) -> dict[str, np.ndarray]:
    t = data.times
    out = {k: getattr(t, k) for k in ("host", "host_start", "length", "gpu", "gpu_valid",
                                      "gpu_start")}
    for col in data.iterations.columns:
        out[col] = data.iterations[col].to_numpy()
    return out


def test_batch_size_changes_nothing(build, monkeypatch: pytest.MonkeyPatch) -> None:
    con = build(_run())
    ref = load_run(con, "stream")
    ref_d = diagnose(con, "stream").to_dict()
    # What was written: rank 1 of train, iteration 7: fwd host 0.03 + 0.0014, device 0.04.
    it = ref.iterations
    row = it.filter((it["stage"] == "train") & (it["rank"] == 1) & (it["iter"] == 7))
    src = int(row["src"][0])
    a, n = int(ref.times.host_start[src]), int(ref.times.length[src])
    assert ref.times.host[a:a + n].tolist() == [0.005, 0.03 + 0.0001 * 7 * 2, 0.02]
    g = int(ref.times.gpu_start[src])
    assert ref.times.gpu_valid[g:g + n].tolist() == [False, True, False]
    assert ref.times.gpu[g + 1] == 0.04
    # The NaN phase leaves out exactly its iteration; the one without phases stays.
    assert ref.left_out.rows() == [(1, "train", "train-1", 9)]
    assert it.height == 89
    for rows in (1, 3, 7):
        monkeypatch.setattr(load, "BATCH_ROWS", rows)
        data = load_run(con, "stream")
        assert data.iterations.columns == ref.iterations.columns
        assert data.iterations.dtypes == ref.iterations.dtypes
        for key, want in _arrays(ref).items():
            np.testing.assert_array_equal(_arrays(data)[key], want, err_msg=f"{key} {rows}")
        assert data.left_out.rows() == ref.left_out.rows()
        assert diagnose(con, "stream").to_dict() == ref_d


def test_int64_positions_change_nothing(build, monkeypatch: pytest.MonkeyPatch) -> None:
    """Positions are int32 while they fit (memory at 10M iterations, issue 13) and
    int64 from 2^31 phase values on; forcing int64 must give the same figures."""
    con = build(_run())
    ref = load_run(con, "stream")
    ref_d = diagnose(con, "stream").to_dict()
    assert ref.times.host_start.dtype == np.int32
    assert ref.times.gpu_start.dtype == np.int32
    monkeypatch.setattr(load, "_index_type", lambda n: np.int64)
    data = load_run(con, "stream")
    assert data.times.host_start.dtype == np.int64
    assert data.times.gpu_start.dtype == np.int64
    for key, want in _arrays(ref).items():
        np.testing.assert_array_equal(_arrays(data)[key], want, err_msg=key)
    assert diagnose(con, "stream").to_dict() == ref_d


def test_device_times_released_after_attribution(build) -> None:
    """``attribute`` frees the per-phase device times once attributed; the run
    still reports that it has device times (fwd's 0.04 s written above), and
    gpu_s (the iteration's device seconds) keeps them."""
    con = build(_run())
    analysis = attribute(con, "stream")
    assert len(analysis.data.times.gpu) == 0
    assert (analysis.data.times.gpu_start == -1).all()
    assert analysis.data.device_times is True
    it = analysis.iterations
    row = it.filter((it["stage"] == "train") & (it["rank"] == 1) & (it["iter"] == 7))
    assert row["gpu_s"].to_list() == [0.04]
    load_row = it.filter(it["stage"] == "load")
    assert load_row["gpu_s"].null_count() == load_row.height   # no device time on "load"
