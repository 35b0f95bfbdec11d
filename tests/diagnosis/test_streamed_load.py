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
from tlog.analyze import attribute, diagnose, load, load_run


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


def _interleaved() -> RunBuilder:
    """Three train ranks of 600 iterations: ranks 0 and 2 share a layout with a
    carved child (``fwd/attn``), rank 1 has another, so the walk reads rank 0,
    then rank 2, then rank 1: device-time positions out of walk order."""
    b = RunBuilder("interleaved")
    for rank in range(3):
        for i in range(600):
            jit = 0.0001 * ((i * 7 + rank * 3) % 11)
            if rank == 1:
                phases = [("get", 0.004 + jit), ("fwd", 0.03, 0.035 + jit),
                          ("bwd", 0.02 + jit, 0.05), ("step", 0.003, 0.002 + jit)]
            else:
                phases = [("get", 0.005 + jit), ("fwd", 0.03 + jit, 0.04),
                          ("fwd/attn", 0.01, 0.012 + jit), ("loss_item", 0.02 + jit)]
            b.iteration(rank=rank, stage="train", iter=i, ts=1000.0 + 0.1 * i, dur=0.09,
                        phases=phases)
    return b


def test_device_times_released_during_the_walk(build, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attribution frees the device times it has walked past (issue 13); the
    released pages read as 0, so a position freed too early would change a
    figure. Small chunks make the walk release in many steps; the frames must
    equal those of a walk that frees nothing, and the releases must have freed
    pages before the walk's end."""
    from tlog.analyze import attribution

    con = build(_interleaved())
    monkeypatch.setattr(attribution, "CHUNK", 64)
    keep = attribute(con, "interleaved", keep_device_times=True)
    assert keep.data.times.gpu_valid.sum() == 600 * (2 + 3 + 2)   # device times written
    calls: list[tuple[int, float]] = []
    real = load.RunData.release_device_times_before

    def spy(self, pos: int) -> None:
        real(self, pos)
        # what is still readable at the end of the arrays vs. what was freed
        calls.append((pos, float(self.times.gpu[:pos].sum())))

    monkeypatch.setattr(load.RunData, "release_device_times_before", spy)
    freed = attribute(con, "interleaved")
    n_gpu = len(keep.data.times.gpu)
    positions = [p for p, _ in calls]
    assert positions == sorted(positions) and positions[-1] == n_gpu
    # Freed in steps before the walk ended, and the freed pages really read 0
    # (only whole 4 KiB pages are freed: 512 values).
    mid = [(p, s) for p, s in calls if 512 <= p < n_gpu]
    assert mid and any(s < float(keep.data.times.gpu[:p].sum()) for p, s in mid)
    assert freed.data.device_times is True
    assert len(freed.data.times.gpu) == 0
    assert freed.iterations.drop("src").equals(keep.iterations.drop("src"))
    assert freed.all_phases.equals(keep.all_phases)
    # gpu_s of rank 1, iteration 4: 0.035 + jit + 0.05 + 0.002 + jit, jit = 0.0001 * (31 % 11)
    it = freed.iterations
    row = it.filter((it["rank"] == 1) & (it["iter"] == 4))
    jit = 0.0001 * 9
    assert row["gpu_s"][0] == pytest.approx(0.035 + jit + 0.05 + 0.002 + jit, abs=1e-12)
