"""Lockstep: collective waits found from rank alignment, stragglers named right.

Each run is simulated (``lockstep_sim``): every rank's own work per phase is
chosen, the gradient all-reduce at the end of ``backward`` releases all ranks
at ``max(arrival) + c``, and ``ts`` is read on each host's clock. The true
waits, the run's true wall time and its wall time with the straggler's own
work replaced by its peers' median (re-simulated) come from the construction,
never from tlog.
"""

from __future__ import annotations

import numpy as np
import pytest
from lockstep_sim import fixed_total, simulate, true_total
from tlog.analyze import diagnose

from tests.support.runbuilder import RunBuilder, loop

BASE = (0.005, 0.020, 0.040, 0.010)     # data_wait, forward, backward (own), optimizer


def _lock(d):
    st = d.to_dict()["stages"][0]
    return st["lockstep"]


def _inferred_wait(d, rank: int) -> float:
    return d.analysis.lockstep.stages[0].wait_s_per_iter[rank]


def test_healthy_ranks_wait_little_and_no_one_is_named(build) -> None:
    sim = simulate([BASE] * 4, seed=1)
    d = diagnose(build(sim.builder), "r")
    assert d.stragglers == ()
    assert d.bottleneck.category == "compute"
    # Whatever wait is found is the jitter's: under 2% of a ~79 ms step per rank.
    lock = _lock(d)
    if lock is not None:
        for w in lock["wait_s_per_iter"].values():
            assert w < 0.02 * 0.079


@pytest.mark.parametrize(("slow", "phase"), [
    ((0.005, 0.048, 0.040, 0.010), "forward"),      # forward 2.4x
    ((0.005, 0.020, 0.040, 0.030), "optimizer"),    # optimizer 3x (after the collective)
])
def test_a_compute_straggler_is_named_with_its_peers_wait_and_the_true_gain(
        build, slow, phase) -> None:
    sim = simulate([BASE, slow, BASE, BASE], seed=2)
    d = diagnose(build(sim.builder), "r")
    lock = _lock(d)
    assert (lock["phase"], lock["method"]) == ("backward", "inferred")
    # The inferred waits are the constructed ones (mean per rank, 0.5 ms).
    for rank in range(4):
        assert _inferred_wait(d, rank) == pytest.approx(sim.wait[rank].mean(), abs=5e-4)
    [s] = d.stragglers
    assert (s.rank, s.kind, s.phase) == (1, "compute", phase)
    assert s.wait_phase == "backward" and s.wait_method == "inferred"
    assert s.peers_extra_sync_s == pytest.approx(np.median(sim.wait[[0, 2, 3]].mean(axis=1)),
                                                    abs=1e-3)
    truth = true_total(sim) / fixed_total(sim, 1)
    assert s.speedup_if_fixed == pytest.approx(truth, rel=0.03)
    assert s.severity in ("warning", "critical")
    # worth a warning or more, it leads the verdict (critical) or the verdict names it
    assert ("Bottleneck: rank 1 of train is a straggler - " in d.verdict
            or "; rank 1 is a straggler" in d.verdict), d.verdict
    assert len(d.verdict) <= 160
    # The waiting ranks' own compute no longer holds their wait.
    f = next(f for f in d.findings if f.code == "straggler")
    assert "at the collective in backward (inferred from rank alignment)" in f.message
    # The sim records each rank's CPU time (its own work): without the split, the
    # waiting ranks' backward would read as 'blocked in compute' (kind='starvation').
    assert not any(f.code == "blocked_in_compute" for f in d.findings)


def test_the_what_if_model_agrees_with_the_lockstep_gain(build) -> None:
    # Removing the straggler's extra forward time on every rank: forward gone on all
    # ranks gives the constructed loop without forward (re-simulated).
    sim = simulate([BASE, (0.005, 0.048, 0.040, 0.010)], seed=3, jitter=0.0)
    d = diagnose(build(sim.builder), "r")
    fwd = next(w for w in d.what_if if w.phase == "forward")
    own = sim.own.copy()
    own[:, :, 1] = 0.0
    from lockstep_sim import _timeline
    r, n, _ = own.shape
    start, _, _, end = _timeline(own, sim.c, np.zeros((r, n)))
    truth = true_total(sim) / float(end.max() - start.min())
    assert fwd.speedup == pytest.approx(truth, rel=0.01)
    [s] = d.stragglers
    assert s.speedup_if_fixed == pytest.approx(true_total(sim) / fixed_total(sim, 1),
                                                  rel=0.01)


def test_an_input_straggler_is_the_only_rank_named(build) -> None:
    sim = simulate([BASE, (0.060, 0.020, 0.040, 0.010), BASE, BASE], seed=4)
    d = diagnose(build(sim.builder), "r")
    [s] = d.stragglers
    assert (s.rank, s.kind, s.phase) == (1, "input", "data_wait")
    assert s.speedup_if_fixed == pytest.approx(true_total(sim) / fixed_total(sim, 1),
                                                  rel=0.03)
    # The waiting ranks are not compute stragglers, and their wait is sync, not compute.
    for rank in (0, 2, 3):
        assert _inferred_wait(d, rank) == pytest.approx(sim.wait[rank].mean(), abs=5e-4)
    assert d.verdict.startswith("Bottleneck: rank 1 of train is an input straggler - ")
    # the top phases say how much of backward is the wait for peers (the mean over ranks)
    back = next(p for p in d.stages[0].top_phases if p.phase == "backward")
    assert back.category == "compute"
    assert back.waiting_s_per_iter == pytest.approx(sim.wait.mean(), abs=5e-4)
    # the verdict's cause is the first finding; its symptom (the peers' sync) after it
    assert (d.findings[0].code, d.findings[0].evidence["rank"]) == ("straggler", 1)
    # the inference says what it cannot see, and how to measure it
    assert any("the collective's own time, which every rank pays alike, stays in backward"
               in n and "rec.watch_ddp(model)" in n for n in d.notes), d.notes
    assert not any(f.code == "blocked_in_compute" for f in d.findings)


def test_all_ranks_input_bound_is_starvation_without_a_straggler(build) -> None:
    # Every loader waits 60 ms +- 25% (its own jitter each step): the slowest rank of
    # each step holds the others, a different one each time.
    sim = simulate([(0.060, 0.020, 0.040, 0.010)] * 4, seed=5, data_jitter=0.25)
    d = diagnose(build(sim.builder), "r")
    assert d.bottleneck.category == "starvation"
    assert d.bottleneck.phase == "data_wait"
    assert d.stragglers == ()
    for rank in range(4):
        assert _inferred_wait(d, rank) == pytest.approx(sim.wait[rank].mean(), abs=1e-3)


@pytest.mark.parametrize("hosts", [["a", "b"], ["a", "a", "b", "b"]])
def test_two_hosts_with_a_50_ms_clock_offset(build, hosts) -> None:
    means = [BASE, (0.005, 0.048, 0.040, 0.010), BASE, BASE][:len(hosts)]
    sim = simulate(means, seed=6, hosts=hosts, offsets={"b": 0.050})
    d = diagnose(build(sim.builder), "r")
    lock = _lock(d)
    assert lock["phase"] == "backward"
    assert lock["clock_offsets_s"]["b"] == pytest.approx(0.050, abs=1e-3)
    assert lock["clock_offsets_s"]["a"] == 0.0
    for rank in range(len(hosts)):
        assert _inferred_wait(d, rank) == pytest.approx(sim.wait[rank].mean(), abs=5e-4)
    [s] = d.stragglers
    assert (s.rank, s.kind, s.phase) == (1, "compute", "forward")


def test_a_straggler_worth_3_percent_is_info_and_off_the_verdict_line(build) -> None:
    # Every rank waits 150 ms for data; rank 3's forward takes 16 ms instead of 10:
    # compute 41 vs 35 ms (slowdown 17%, a straggler) but its own work per step is
    # 191 vs 185 ms: fixing it gains about 3%.
    slow = (0.150, 0.016, 0.020, 0.005)
    sim = simulate([(0.150, 0.010, 0.020, 0.005)] * 3 + [slow], seed=7, jitter=0.0)
    d = diagnose(build(sim.builder), "r")
    [s] = d.stragglers
    truth = true_total(sim) / fixed_total(sim, 3)
    assert truth == pytest.approx(1.03, abs=0.01)
    assert s.rank == 3 and s.speedup_if_fixed == pytest.approx(truth, rel=0.01)
    assert s.severity == "info"
    assert next(f for f in d.findings if f.code == "straggler").severity == "info"
    assert "straggler" not in d.verdict
    assert d.bottleneck.category == "starvation"


def test_too_few_iterations_says_why_stragglers_were_not_judged(build) -> None:
    sim = simulate([BASE, (0.005, 0.048, 0.040, 0.010)], n=12, seed=8)
    d = diagnose(build(sim.builder), "r")
    assert d.stragglers == ()
    assert any("stragglers of train not judged: a worker has fewer than 20 steady iterations"
               in n for n in d.notes), d.notes


def test_a_stage_with_one_live_worker_says_why(build) -> None:
    b = RunBuilder()
    loop(b, 30, [("forward", 0.050)], stage="train", rank=0)
    b.iteration(iter=0, ts=1002.0, dur=0.05, phases=[("forward", 0.05)], stage="train", rank=1)
    b.event(name="crash", ts=1002.01, dur=0.0)   # rank 1's only iteration is left out
    d = diagnose(build(b), "r")
    assert any("stragglers of train not judged: only 1 of its 2 workers" in n for n in d.notes), \
        d.notes


def test_a_measured_wait_child_wins_over_the_inference(build) -> None:
    """The shim's DDP hook writes backward/ddp_allreduce_wait (kind sync). It is
    carved out of backward into sync (docs/DIAGNOSIS.md section 1) and nothing is
    inferred for backward. By hand: rank 0 backward 70 ms holding a 30 ms measured
    wait, rank 1 backward 40 ms holding 0.5 ms; forward 50 (rank 1: 80)."""
    b = RunBuilder()
    for rank in range(2):
        fwd, bwd, wait = (0.050, 0.0700, 0.0300) if rank == 0 else (0.080, 0.0400, 0.0005)
        t0 = 1000.0
        for i in range(30):
            b.iteration(iter=i, ts=t0 + i * 0.125, dur=0.125, rank=rank, stage="train",
                        host="h", phases=[("data_wait", 0.005), ("forward", fwd),
                                          ("backward", bwd), ("backward/ddp_allreduce_wait", wait),
                                          ("optimizer", 0.000)],
                        kinds={"backward/ddp_allreduce_wait": "sync"})
    d = diagnose(build(b), "r")
    lock = _lock(d)
    assert (lock["phase"], lock["method"]) == ("backward", "measured")
    assert lock["wait_s_per_iter"] == {"0": pytest.approx(0.030), "1": pytest.approx(0.0005)}
    it = d.analysis.iterations
    r0 = it.filter(rank=0).row(0, named=True)
    assert (r0["compute_s"], r0["sync_s"]) == pytest.approx((0.050 + 0.040, 0.030))
    [s] = d.stragglers
    assert (s.rank, s.phase, s.wait_method) == (1, "forward", "measured")
    assert "inferred" not in d.verdict


def test_untimed_work_before_the_collective_phase_is_the_straggler_s_not_a_wait(build) -> None:
    """Rank 2 runs 60 ms of code no phase times between forward and backward (its
    peers 1 ms): it arrives last at the all-reduce in backward and its peers wait
    there. Read from the iteration's start, rank 2's backward would end 60 ms early
    and the unaccounted tail would 'align' (rank 2 waiting for its peers): the
    roles inverted. Truth from the construction."""
    sim = simulate([BASE] * 4, seed=9, gap=[0.001, 0.001, 0.060, 0.001])
    d = diagnose(build(sim.builder), "r")
    lock = _lock(d)
    assert (lock["phase"], lock["method"]) == ("backward", "inferred")
    assert lock["collectives"][0]["anchor"] == "end"
    assert [c["phase"] for c in lock["collectives"]] == ["backward"]
    for rank in range(4):
        assert _inferred_wait(d, rank) == pytest.approx(sim.wait[rank].mean(), abs=5e-4)
    assert sim.wait[[0, 1, 3]].mean() > 0.05 and sim.wait[2].mean() < 1e-3
    [s] = d.stragglers
    assert (s.rank, s.kind, s.phase) == (2, "compute", "(unaccounted)")
    assert s.phase_excess_s == pytest.approx(0.059, abs=1e-3)
    assert s.wait_phase == "backward"
    truth = true_total(sim) / fixed_total(sim, 2)
    assert truth > 1.5
    assert s.speedup_if_fixed == pytest.approx(truth, rel=0.03)
    assert "Bottleneck: rank 2 of train is a straggler - " in d.verdict
    f = next(f for f in d.findings if f.code == "straggler")
    assert "most in time no phase covers (untimed code)" in f.message   # not "(unaccounted)"
    assert any("untimed work of their own before backward" in n for n in d.notes), d.notes


def test_a_collective_after_the_last_phase_stays_the_tail_when_untimed_time_differs(
        build) -> None:
    """The mirror case: the all-reduce is timed by no phase (after optimizer), rank 1's
    forward is 2.4x. Read from the iteration's end, forward would 'align' (rank 1
    waiting in it); the tail reading makes the fewer ranks slow and is kept."""
    sim = simulate([BASE, (0.005, 0.048, 0.040, 0.010), BASE, BASE], seed=10, tail=True)
    d = diagnose(build(sim.builder), "r")
    lock = _lock(d)
    assert lock["phase"] is None and [c["phase"] for c in lock["collectives"]] == [None]
    for rank in range(4):
        assert _inferred_wait(d, rank) == pytest.approx(sim.wait[rank].mean(), abs=5e-4)
    [s] = d.stragglers
    assert (s.rank, s.kind, s.phase) == (1, "compute", "forward")
    assert s.speedup_if_fixed == pytest.approx(true_total(sim) / fixed_total(sim, 1),
                                                  rel=0.03)
    assert any("read as a collective after the last phase" in n for n in d.notes), d.notes


@pytest.mark.parametrize("shifted", [3, 1])
def test_a_rank_numbering_its_iterations_from_1_is_matched_by_time(build, shifted) -> None:
    """Rank ``shifted`` logs ``iter = i + 1`` on the same host as its peers: matched by
    ``iter`` each of its iterations would pair with its peers' previous one and
    nothing aligns. Rank 1's forward is 2.4x (it is the shifted rank too in one case)."""
    shift = [0, 0, 0, 0]
    shift[shifted] = 1
    sim = simulate([BASE, (0.005, 0.048, 0.040, 0.010), BASE, BASE], seed=11, iter_shift=shift)
    d = diagnose(build(sim.builder), "r")
    lock = _lock(d)
    assert (lock["phase"], lock["method"]) == ("backward", "inferred")
    assert lock["iterations"] == 40
    for rank in range(4):
        assert _inferred_wait(d, rank) == pytest.approx(sim.wait[rank].mean(), abs=5e-4)
    [s] = d.stragglers
    assert (s.rank, s.kind, s.phase) == (1, "compute", "forward")
    assert s.speedup_if_fixed == pytest.approx(true_total(sim) / fixed_total(sim, 1),
                                                  rel=0.03)
    assert any(f"rank {shifted} numbers its iterations +1 from rank 0 on the same host" in n
               and "matched by time" in n for n in d.notes), d.notes


def test_ranks_on_two_hosts_keep_their_iteration_numbers(build) -> None:
    # One rank per host: no shared clock to match by time; the unshifted run is
    # unchanged (no note about numbering).
    sim = simulate([BASE, (0.005, 0.048, 0.040, 0.010)], seed=12, hosts=["a", "b"])
    d = diagnose(build(sim.builder), "r")
    assert _lock(d)["phase"] == "backward"
    assert not any("numbers its iterations" in n for n in d.notes), d.notes


def _run_queue_samples(sim, ranks: int, share: float, stage: str = "train") -> None:
    """Samples every 40 ms over the whole run for each rank: 2 usable cores, load 3.5,
    the thread's run-queue delay (``cpu_wait_s``) growing ``share`` s per wall s."""
    t0 = 1.7e9
    for rank in range(ranks):
        for k in range(int(sim.total_s / 0.040) + 2):
            ts = t0 + 0.040 * k
            sim.builder.sys_sample(ts=ts, worker=f"{stage}-{rank}", ncpu=2, running=1,
                                   load1=3.5, cpu_s=0.8 * 0.040 * k,
                                   cpu_wait_s=5.0 + share * 0.040 * k)


def test_a_straggler_gain_where_the_ranks_wait_for_a_core_is_called_rough(build) -> None:
    """tests/ddp/README.md "Run them alone": where ranks share cores, a straggler's
    extra work slows its peers too and the lockstep gain is rough; the verdict and
    the finding say so, with the measured run-queue share (here 20% by construction)."""
    slow = (0.005, 0.048, 0.040, 0.010)
    sim = simulate([BASE, slow], seed=2)
    plain = diagnose(build(sim.builder), "r")
    [s] = plain.stragglers
    assert "rough" not in plain.verdict
    assert "shared CPU cores" not in next(f for f in plain.findings
                                          if f.code == "straggler").message
    sim = simulate([BASE, slow], seed=2, run_id="crowded")
    _run_queue_samples(sim, 2, 0.20)
    d = diagnose(build(sim.builder), "crowded")
    [c] = d.stragglers
    assert c.speedup_if_fixed == pytest.approx(s.speedup_if_fixed)   # the figure stays
    assert "faster (rough: the ranks shared CPU cores)" in d.verdict
    f = next(f for f in d.findings if f.code == "straggler")
    assert f.evidence["ranks_lacked_cpu_share"] == pytest.approx(0.20, abs=0.01)
    assert ("(rough: the ranks shared CPU cores, waiting for one up to 20% of their time"
            in f.message)
    # both ranks waited for a core: one finding listing them
    [crowded] = [f for f in d.findings if f.code == "cpu_contention"]
    assert sorted(crowded.evidence["ranks"]) == [0, 1]
