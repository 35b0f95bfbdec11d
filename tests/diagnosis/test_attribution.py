"""Device-aware attribution: the device-backlog walk, FIFO credit, and the attributed frames.

Every expected value is worked out by hand in the comments (milliseconds).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from tlog.analyze import attribute
from tlog.analyze.attribution import attribute_matrix, backlog_walk, fifo_credit
from tlog.analyze.load import COMPUTE, STARVATION, SYNC

from tests.support.runbuilder import RunBuilder, loop

MS = 1e-3


def col(*values: float) -> np.ndarray:
    """One iteration as a phase-major (K, 1) matrix, from milliseconds."""
    return np.array([[v * MS] for v in values])


def test_issue5_example_queued_device_work_makes_the_item_compute() -> None:
    # host forward 30, backward 60, loss_item 45, optimizer 5; device 55, 80, -, 4.
    # backlog: fwd 55-30 = 25; bwd 25+80-60 = 45; item drains min(45, 45) = 45, b = 0;
    # opt: max(0, 0+4-5) = 0. So the .item() is all compute, sync 0.
    host, gpu = col(30, 60, 45, 5), col(55, 80, 0, 4)
    backlog, drained = backlog_walk(host, gpu)
    assert backlog[:, 0] * 1e3 == pytest.approx([25, 45, 0, 0])
    assert drained[:, 0] * 1e3 == pytest.approx([30, 60, 45, 4])
    a = attribute_matrix(host, gpu, np.array([COMPUTE, COMPUTE, SYNC, COMPUTE]))
    assert a.sync[0] == pytest.approx(0.0)
    assert a.compute[0] == pytest.approx(0.140)
    # FIFO: device queue fwd (0, 55], bwd (55, 135]; retired before the item = 135 - 45 = 90,
    # so the item retires (90, 135]: all of it backward's work.
    assert a.credit[:, 0] * 1e3 == pytest.approx([0, 45, 0, 0])


def test_issue5_example_item_after_13_ms_of_launches() -> None:
    # Launches: forward 5 ms (device 20), backward 8 ms (device 25), then a 100 ms .item().
    # Backlog 15 then 32; the item drains 32 -> compute 32, sync 68.
    host, gpu = col(5, 8, 100), col(20, 25, 0)
    a = attribute_matrix(host, gpu, np.array([COMPUTE, COMPUTE, SYNC]))
    assert a.sync[0] == pytest.approx(0.068)
    assert a.moved[:, 0] * 1e3 == pytest.approx([0, 0, 32])
    # FIFO: queue fwd (0, 20], bwd (20, 45]; retired before the item 13; item retires
    # (13, 45] -> forward 7, backward 25.
    assert a.credit[:, 0] * 1e3 == pytest.approx([7, 25, 0])
    assert a.compute[0] == pytest.approx(0.013 + 0.032)


def test_a_collective_wait_is_not_split_by_the_walk() -> None:
    # The issue-5 launches again (forward 5 ms with device 20, backward 8 with 25),
    # then a 100 ms wait: as '.item()' it drains the 32 ms backlog (compute 13 + 32,
    # sync 68, above); as a collective (gloo all-reduce, torchrec's blocking copy on
    # a communication stream) the host waited for peers, not for that backlog: all
    # 100 ms stay sync, compute is the 13 ms of launches, nothing is credited.
    host, gpu = col(5, 8, 100), col(20, 25, 0)
    a = attribute_matrix(host, gpu, np.array([COMPUTE, COMPUTE, SYNC]),
                         np.array([False, False, True]))
    assert a.sync[0] == pytest.approx(0.100)
    assert a.compute[0] == pytest.approx(0.013)
    assert a.moved is None and a.credit is None
    # A collective flag on a compute phase changes nothing: only sync phases drain.
    b = attribute_matrix(host, gpu, np.array([COMPUTE, COMPUTE, SYNC]),
                         np.array([True, False, False]))
    assert b.sync[0] == pytest.approx(0.068)


def test_two_sync_phases_share_the_backlog_in_order() -> None:
    # forward 5 (device 50) -> backlog 45; item1 20 ms drains 20 (compute), backlog 25;
    # item2 40 ms drains 25 (compute) and waits 15 beyond it (sync).
    host, gpu = col(5, 20, 40), col(50, 0, 0)
    a = attribute_matrix(host, gpu, np.array([COMPUTE, SYNC, SYNC]))
    assert a.moved[:, 0] * 1e3 == pytest.approx([0, 20, 25])
    assert a.sync[0] == pytest.approx(0.015)
    assert a.credit[:, 0] * 1e3 == pytest.approx([45, 0, 0])


def test_sync_before_any_device_work_is_all_sync() -> None:
    host, gpu = col(30, 10), col(0, 8)
    a = attribute_matrix(host, gpu, np.array([SYNC, COMPUTE]))
    assert a.sync[0] == pytest.approx(0.030)
    assert a.compute[0] == pytest.approx(0.010)


def test_a_sync_phase_with_its_own_device_work_is_credited_itself() -> None:
    # A .cpu() copy: host 10 ms with a 4 ms device copy and nothing queued before it.
    host, gpu = col(10), col(4)
    a = attribute_matrix(host, gpu, np.array([SYNC]))
    assert a.moved[0, 0] == pytest.approx(0.004)
    assert a.credit[0, 0] == pytest.approx(0.004)
    assert a.sync[0] == pytest.approx(0.006)


def test_starvation_keeps_its_time_while_the_device_drains() -> None:
    # The loader wait overlaps 40 ms of queued device work but still held the loop.
    host, gpu = col(5, 40, 10), col(50, 0, 0)
    a = attribute_matrix(host, gpu, np.array([COMPUTE, STARVATION, SYNC]))
    assert a.starvation[0] == pytest.approx(0.040)
    # backlog 45 -> 5 after the wait; the item drains the last 5.
    assert a.sync[0] == pytest.approx(0.005)
    assert a.credit[:, 0] * 1e3 == pytest.approx([5, 0, 0])


def test_credit_equals_moved_and_drained_never_exceeds_host() -> None:
    rng = np.random.default_rng(7)
    host = rng.uniform(0, 0.05, (6, 500))
    gpu = rng.uniform(0, 0.08, (6, 500)) * (rng.uniform(size=(6, 500)) > 0.3)
    cat = np.array([STARVATION, COMPUTE, COMPUTE, SYNC, COMPUTE, SYNC])
    backlog, drained = backlog_walk(host, gpu)
    assert (drained <= host + 1e-12).all()
    assert (backlog >= 0).all()
    credit = fifo_credit(gpu, backlog, cat == SYNC)
    moved = drained * (cat == SYNC)[:, None]
    np.testing.assert_allclose(credit.sum(axis=0), moved.sum(axis=0), atol=1e-12)
    a = attribute_matrix(host, gpu, cat)
    total = a.starvation + a.backpressure + a.compute + a.sync
    np.testing.assert_allclose(total, host.sum(axis=0), atol=1e-12)


def test_iteration_frame_applies_the_walk_per_iteration(build) -> None:
    b = RunBuilder()
    loop(b, 2, [("forward", 0.005, 0.020), ("backward", 0.008, 0.025), ("loss_item", 0.100)],
         dur=0.120)
    loop(b, 2, [("forward", 0.030), ("loss_item", 0.045)], stage="cpu", dur=0.080)
    con = build(b)
    it = attribute(con, "r").iteration_frame()
    assert it.columns == ["run_id", "rank", "stage", "worker", "iter", "ts", "dur", "cpu",
                          "tokens", "samples", "steady", "excluded", "starvation_s",
                          "backpressure_s", "compute_s", "sync_s", "unaccounted_s", "gpu_s"]
    cpu = it.filter(stage="cpu").row(0, named=True)
    # No device times: the item stays sync (an upper bound); 80 - 75 = 5 unaccounted.
    assert (cpu["compute_s"], cpu["sync_s"], cpu["unaccounted_s"]) == pytest.approx(
        (0.030, 0.045, 0.005))
    assert cpu["gpu_s"] is None
    main = it.filter(stage="main").row(0, named=True)
    assert (main["compute_s"], main["sync_s"], main["unaccounted_s"]) == pytest.approx(
        (0.045, 0.068, 0.007))
    assert main["gpu_s"] == pytest.approx(0.045)


def test_phase_frame_credits_drained_time_to_the_forward_and_backward(build) -> None:
    b = RunBuilder()
    loop(b, 2, [("forward", 0.005, 0.020), ("backward", 0.008, 0.025), ("loss_item", 0.100)])
    con = build(b)
    ph = attribute(con, "r").phase_frame().sort("phase")
    rows = {r["phase"]: r for r in ph.iter_rows(named=True)}
    # Two iterations: forward 5 + 7 credited = 12 ms each; backward 8 + 25 = 33; item 68 sync.
    assert rows["forward"]["compute_s"] == pytest.approx(0.024)
    assert rows["backward"]["compute_s"] == pytest.approx(0.066)
    assert rows["loss_item"]["sync_s"] == pytest.approx(0.136)
    assert rows["loss_item"]["compute_s"] == pytest.approx(0.0)
    assert rows["loss_item"]["host_s"] == pytest.approx(0.200)
    assert rows["backward"]["seconds_per_iter"] == pytest.approx(0.033)
    assert rows["forward"]["gpu_s"] == pytest.approx(0.040)
    assert rows["loss_item"]["gpu_s"] is None


def test_children_are_inside_their_parent(build) -> None:
    b = RunBuilder()
    loop(b, 3, [("step", 0.100), ("step/mask_build", 0.030), ("step/hs_get", 0.020),
                ("data_wait", 0.010)], dur=0.120)
    con = build(b)
    it = attribute(con, "r").iteration_frame().row(0, named=True)
    # mask_build (compute, like its parent) stays inside step. hs_get is starvation
    # inside a compute step: carved out of it (docs/DIAGNOSIS.md section 1): step
    # 100 - 20 = 80 compute, hs_get 20 + data_wait 10 = 30 starvation, 120 - 110 = 10
    # unaccounted.
    assert (it["compute_s"], it["starvation_s"], it["unaccounted_s"]) == pytest.approx(
        (0.080, 0.030, 0.010))
    ph = attribute(con, "r").phase_frame()
    child = ph.filter(phase="step/hs_get").row(0, named=True)
    assert child["parent"] == "step"
    assert child["category"] == "starvation"
    assert child["host_s"] == pytest.approx(0.060)
    assert child["starvation_s"] == pytest.approx(0.060)
    step = ph.filter(phase="step").row(0, named=True)
    assert (step["host_s"], step["compute_s"]) == pytest.approx((0.300, 0.240))
    mask = ph.filter(phase="step/mask_build").row(0, named=True)
    assert mask["compute_s"] == pytest.approx(0.090)       # in no total: inside step
    top = ph.filter(pl.col("parent").is_null())
    assert top["attributed_s"].sum() == pytest.approx(0.270)
    assert top["attributed_s"].sum() + child["attributed_s"] == pytest.approx(0.330)


def test_phases_over_dur_leave_no_negative_unaccounted(build) -> None:
    b = RunBuilder()
    loop(b, 1, [("forward", 0.060), ("backward", 0.060)], dur=0.100)
    con = build(b)
    row = attribute(con, "r").iteration_frame().row(0, named=True)
    assert row["unaccounted_s"] == 0.0
    assert row["compute_s"] == pytest.approx(0.120)


def test_iterations_of_several_layouts(build) -> None:
    # Every third iteration has an extra eval phase with a sync: three layouts interleave
    # (two worker layouts plus a second worker of another stage).
    b = RunBuilder()
    loop(b, 9, lambda i: [("forward", 0.010, 0.030), ("loss_item", 0.025)]
         + ([("eval_item", 0.040)] if i % 3 == 2 else []))
    loop(b, 3, [("q_get", 0.020), ("work", 0.030)], stage="other", rank=1)
    con = build(b)
    it = attribute(con, "r").iteration_frame().filter(stage="main")
    # forward 10 (device 30): backlog 20; loss_item 25 drains 20 -> compute 30, sync 5;
    # eval_item 40 with an empty backlog: all sync.
    assert it["compute_s"].to_list() == pytest.approx([0.030] * 9)
    assert it["sync_s"].to_list() == pytest.approx([0.005, 0.005, 0.045] * 3)
    other = attribute(con, "r").iteration_frame().filter(stage="other")
    assert other["starvation_s"].to_list() == pytest.approx([0.020] * 3)
    ph = attribute(con, "r").phase_frame().filter(stage="main")
    rows = {r["phase"]: r for r in ph.iter_rows(named=True)}
    assert rows["eval_item"]["iterations"] == 3
    assert rows["eval_item"]["sync_s"] == pytest.approx(0.120)
    assert rows["forward"]["compute_s"] == pytest.approx(9 * 0.030)


def test_a_host_only_parent_queues_its_childrens_device_work(build) -> None:
    # step (host 20) holds step/forward (host 15, device 60) and step/mask (host 5, no
    # device): the step queued 60 ms of device work, so the backlog is 40 after it and the
    # 50 ms loss_item drains 40 (compute, credited to step) and waits 10 (sync).
    b = RunBuilder()
    loop(b, 3, [("step", 0.020), ("step/forward", 0.015, 0.060), ("step/mask", 0.005),
                ("loss_item", 0.050)])
    con = build(b)
    it = attribute(con, "r").iteration_frame().row(0, named=True)
    assert (it["compute_s"], it["sync_s"], it["gpu_s"]) == pytest.approx((0.060, 0.010, 0.060))
    rows = {r["phase"]: r for r in attribute(con, "r").phase_frame().iter_rows(named=True)}
    assert rows["step"]["compute_s"] == pytest.approx(3 * 0.060)
    assert rows["step/forward"]["gpu_s"] == pytest.approx(3 * 0.060)
