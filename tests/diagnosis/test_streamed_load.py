"""analyze.load streams the iterations in record batches (bounded memory):
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
from tlog.analyze import attribute, diagnose, load, load_run

from tests.support.runbuilder import RunBuilder


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
    """Positions are int32 while they fit (memory at 10M iterations) and
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
    """Attribution frees the device times it has walked past; the
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


def test_device_times_read_as_the_walk_reaches_them(build, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    """``attribute`` reads the device lists a second time, batch by batch, only as
    far as the walk has reached (never the whole run's device times at
    once): with batches of 50 lists (200 values) and chunks of 64 iterations,
    every read stops within a batch of the position the walk asks for, and the
    first leaves most of the run unread. The frames equal those of an eager
    read, and rank 0's iteration 3 has the device times written above."""
    from tlog.analyze import attribution

    con = build(_interleaved())
    monkeypatch.setattr(attribution, "CHUNK", 64)
    monkeypatch.setattr(load, "BATCH_ROWS", 50)
    eager = attribute(con, "interleaved", keep_device_times=True)
    n_gpu = len(eager.data.times.gpu)
    assert n_gpu == 3 * 600 * 4
    asked: list[tuple[int, int, int]] = []   # (position asked, written before, after)
    real = load.RunData.fill_device_times

    def spy(self, pos: int) -> None:
        before = self._gpu_reader.filled
        real(self, pos)
        asked.append((pos, before, self._gpu_reader.filled))

    monkeypatch.setattr(load.RunData, "fill_device_times", spy)
    lazy = attribute(con, "interleaved")
    assert asked[0][2] < n_gpu / 2
    for pos, before, after in asked:
        assert after >= pos
        assert after == before or after - pos < 200   # read no batch beyond the one needed
    assert asked[-1][2] == n_gpu
    assert lazy.iterations.drop("src").equals(eager.iterations.drop("src"))
    assert lazy.all_phases.equals(eager.all_phases)
    it = lazy.iterations
    row = it.filter((it["rank"] == 0) & (it["iter"] == 3))
    # gpu_s counts top-level phases: fwd's 0.04 (not its child fwd/attn)
    assert row["gpu_s"][0] == 0.04


def test_host_times_released_during_the_walk(build, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attribution frees the host times it has walked past (the lockstep
    test, their other reader, runs before the walk). Released pages read 0, so a
    position freed too early would change a figure: the frames equal those of a
    walk that frees nothing, and pages were freed before the walk's end."""
    from tlog.analyze import attribution

    con = build(_interleaved())
    monkeypatch.setattr(attribution, "CHUNK", 64)
    keep = attribute(con, "interleaved", keep_device_times=True)
    host = keep.data.times.host.copy()
    assert len(host) == 3 * 600 * 4
    calls: list[tuple[int, float]] = []
    real = load.RunData.release_host_times_before

    def spy(self, pos: int) -> None:
        real(self, pos)
        calls.append((pos, float(self.times.host[:pos].sum())))

    monkeypatch.setattr(load.RunData, "release_host_times_before", spy)
    freed = attribute(con, "interleaved")
    positions = [p for p, _ in calls]
    assert positions == sorted(positions) and positions[-1] == len(host)
    mid = [(p, s) for p, s in calls if 512 <= p < len(host)]
    assert mid and any(s < float(host[:p].sum()) for p, s in mid)
    assert len(freed.data.times.host) == 0
    assert freed.iterations.drop("src").equals(keep.iterations.drop("src"))
    assert freed.all_phases.equals(keep.all_phases)


def test_a_run_changed_between_the_two_reads_is_an_error(build, monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The device lists are read a second time; if another connection added an
    iteration to the run in between, the lists no longer line up with the
    first read's and loading fails with a DatabaseError instead of attributing
    device times to the wrong iterations."""
    from tlog.ingest.errors import DatabaseError

    con = build(_run())
    real = load._DeviceTimes.__init__

    def changed(self, con_, run_id, times, *rest) -> None:
        con_.execute("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, "
                     "layout, phase_host_s, phase_gpu_s) SELECT run_id, rank, stage, worker, "
                     "iter + 1000, ts + 100, dur, layout, phase_host_s, phase_gpu_s "
                     "FROM iterations WHERE run_id = 'stream' AND iter = 1")
        real(self, con_, run_id, times, *rest)

    monkeypatch.setattr(load._DeviceTimes, "__init__", changed)
    with pytest.raises(DatabaseError, match="changed while they were read"):
        load_run(con, "stream")
