"""Verdict rules on small hand-built runs: shares, bottleneck, findings, the JSON contract."""

from __future__ import annotations

import json

import pytest
from tlog.analyze import Diagnosis, diagnose
from tlog.ingest.errors import RunNotFoundError

from tests.support.runbuilder import RunBuilder, loop

#: Keys of ``tlog diagnose --json`` other helpers code against (the brief's contract).
CONTRACT = {
    "run_id", "iterations", "throughput", "categories", "stages", "bottleneck", "stragglers",
    "findings", "what_if", "device_times", "verdict",
}


def codes(d: Diagnosis) -> set[str]:
    return {f.code for f in d.findings}


def test_shares_are_time_weighted_not_means_of_ratios(build) -> None:
    # Iteration A: 90 ms wait of 100. Iteration B: no wait, 900 ms compute (x20 each).
    # Time-weighted starvation: 20*0.09 / (20*0.1 + 20*0.9) = 0.09; a mean of ratios would say 0.45.
    b = RunBuilder()
    loop(b, 40, lambda i: [("next_batch", 0.090), ("forward", 0.010)] if i % 2 == 0
         else [("next_batch", 0.0), ("forward", 0.900)])
    d = diagnose(build(b), "r")
    assert d.categories.starvation == pytest.approx(0.09)
    assert d.bottleneck.category == "compute"


def test_json_contract(build) -> None:
    b = RunBuilder()
    loop(b, 30, [("next_batch", 0.030), ("forward", 0.070)], tokens=100, samples=2)
    d = diagnose(build(b), "r").to_dict()
    assert CONTRACT <= set(d)
    assert set(d["iterations"]) >= {"total", "steady", "excluded"}
    assert set(d["throughput"]) >= {"iters_per_s", "tokens_per_s", "samples_per_s"}
    assert set(d["categories"]) == {"starvation", "backpressure", "compute", "sync", "unaccounted"}
    assert sum(d["categories"].values()) == pytest.approx(1.0)
    stage = d["stages"][0]
    assert set(stage) >= {"stage", "workers", "iterations", "throughput", "categories", "top_phases"}
    assert set(stage["top_phases"][0]) >= {"phase", "category", "seconds_per_iter", "share"}
    assert set(d["bottleneck"]) >= {"stage", "category", "phase", "share"}
    assert set(d["findings"][0]) == {"code", "severity", "message", "evidence"}
    assert set(d["what_if"][0]) >= {"stage", "phase", "throughput_gain"}
    # 100 tokens and 2 samples per 0.1 s step.
    assert d["throughput"]["tokens_per_s"] == pytest.approx(1000.0)
    assert d["throughput"]["samples_per_s"] == pytest.approx(20.0)
    json.dumps(d, allow_nan=False)


def test_unknown_run(build) -> None:
    b = RunBuilder()
    loop(b, 3, [("forward", 0.1)])
    con = build(b)
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        diagnose(con, "nope")


def test_a_run_without_iterations(build) -> None:
    con = build(RunBuilder("empty"))
    with pytest.raises(RunNotFoundError, match="holds no iterations"):
        diagnose(con, "empty")


def test_the_stage_that_waits_least_is_the_bottleneck_and_the_others_show_it(build) -> None:
    # producer: put 60 of 100 ms (held by its consumer); consumer: 2 of 100 waiting.
    b = RunBuilder()
    loop(b, 30, [("produce", 0.040), ("q_put", 0.060)], stage="producer", rank=0)
    loop(b, 30, [("q_get", 0.002), ("consume", 0.098)], stage="consumer", rank=1)
    d = diagnose(build(b), "r")
    assert d.bottleneck.stage == "consumer"
    assert d.bottleneck.category == "compute"
    assert d.bottleneck.phase == "consume"
    assert d.bottleneck.margin == pytest.approx(0.58)
    bp = next(f for f in d.findings if f.code == "backpressure")
    assert bp.evidence["stage"] == "producer"
    assert "held by its consumer consumer" in bp.message


def test_a_close_call_lowers_the_confidence(build) -> None:
    # Stages wait 10% and 12%: 2 points apart, under CLOSE_MARGIN (5 points).
    b = RunBuilder()
    loop(b, 30, [("a_put", 0.010), ("work", 0.090)], stage="a", rank=0)
    loop(b, 30, [("b_get", 0.012), ("work", 0.088)], stage="b", rank=1)
    d = diagnose(build(b), "r")
    assert d.bottleneck.stage == "a"
    assert d.confidence == "medium"
    assert any("waits almost as little" in r for r in d.confidence_reasons)


def test_manifest_phase_kinds_override_the_name_rules(build) -> None:
    # 'fetch_weights' reads as starvation by name; the manifest says it is compute.
    b = RunBuilder(phase_kinds={"fetch_weights": "compute"})
    loop(b, 30, [("fetch_weights", 0.050), ("forward", 0.050)])
    d = diagnose(build(b), "r")
    assert d.categories.starvation == 0.0
    assert d.bottleneck.category == "compute"


def test_host_bound_needs_a_busy_thread_and_an_idle_device(build) -> None:
    b = RunBuilder()
    # Worker 0: cpu 95 of 100 ms, device busy 30 ms -> host-bound.
    loop(b, 30, [("forward", 0.050, 0.010), ("backward", 0.050, 0.020)], cpu=0.095,
         stage="train", rank=0)
    # Worker 1: cpu 95 ms too, but the device is busy 90 ms: a spin-wait, not host-bound.
    loop(b, 30, [("forward", 0.050, 0.040), ("backward", 0.050, 0.050)], cpu=0.095,
         stage="train", rank=1)
    d = diagnose(build(b), "r")
    hb = [f for f in d.findings if f.code == "host_bound"]
    assert [f.evidence["rank"] for f in hb] == [0]
    assert hb[0].evidence["cpu_share"] == pytest.approx(0.95)
    assert hb[0].evidence["device_share"] == pytest.approx(0.30)
    assert "no_device_times" not in codes(d)


def test_events_are_left_out_and_counted(build) -> None:
    b = RunBuilder()
    loop(b, 40, [("forward", 0.050), ("backward", 0.050)])
    b.event(name="checkpoint", ts=1000.0 + 2.01, dur=0.25)  # iterations 20, 21, 22
    d = diagnose(build(b), "r")
    assert d.iterations.to_dict() == {"total": 40, "steady": 37, "excluded": 3, "warmup": 0, "event": 3,
                            "attempt": 0}


def test_queue_states_corroborate(build) -> None:
    b = RunBuilder()
    loop(b, 30, [("hs_get", 0.050), ("train", 0.050)], stage="drafter")
    for j in range(20):
        b.queue(name="hs_queue", ts=1000.0 + 0.1 * j, depth=0, capacity=8)
        b.queue(name="other", ts=1000.0 + 0.1 * j, depth=8 if j % 2 else 3, capacity=8)
    d = diagnose(build(b), "r")
    states = {q.name: q.state for q in d.queues}
    assert states == {"hs_queue": "empty", "other": "mixed"}
    assert "queue_empty" in codes(d)
    starving = next(f for f in d.findings if f.code == "starvation")
    assert starving.evidence["queues"][0]["name"] == "hs_queue"


def test_a_warmup_does_not_move_the_shares(build) -> None:
    # Five slow (compile) iterations of 1 s in forward, then 30 normal ones.
    b = RunBuilder()
    loop(b, 35, lambda i: [("next_batch", 0.030), ("forward", 1.0 if i < 5 else 0.070)])
    d = diagnose(build(b), "r")
    assert d.iterations.warmup == 5
    assert d.categories.starvation == pytest.approx(0.30)


def test_a_rank_whose_loader_stalls_every_fourth_step_is_an_input_straggler(build) -> None:
    # Normal step on every rank: next_batch 5, forward 30, backward 60, grad_allreduce 5,
    # optimizer 5 = 105 ms. Every fourth step rank 1's next_batch takes 205 ms and the
    # other ranks wait 205 ms in grad_allreduce: 305 ms steps. A median would see 5 ms on
    # every rank; the time-weighted mean sees rank 1 wait (3*5 + 205)/4 = 55 ms per step
    # against 5: 50 ms extra over the peers' mean step of (3*105 + 305)/4 = 155 ms = 0.3226.
    b = RunBuilder()
    for rank in range(4):
        def phases(i: int, rank: int = rank) -> list[tuple]:
            stall = i % 4 == 3
            data = 0.205 if (stall and rank == 1) else 0.005
            wait = 0.205 if (stall and rank != 1) else 0.005
            return [("next_batch", data), ("forward", 0.030), ("backward", 0.060),
                    ("grad_allreduce", wait), ("optimizer", 0.005)]
        loop(b, 40, phases, stage="train", rank=rank)
    d = diagnose(build(b), "r")
    assert len(d.stragglers) == 1
    s = d.stragglers[0]
    assert (s.rank, s.kind, s.phase) == (1, "input", "next_batch")
    assert s.slowdown == pytest.approx(50 / 155)
    assert s.peers_extra_sync_s == pytest.approx(0.050)


def test_no_phases_at_all_is_all_unaccounted(build) -> None:
    b = RunBuilder()
    loop(b, 30, [], dur=0.1)
    d = diagnose(build(b), "r")
    assert d.bottleneck.category == "unaccounted"
    assert d.bottleneck.phase is None
    assert d.categories.unaccounted == pytest.approx(1.0)
    assert d.what_if == ()


def test_nothing_left_to_judge(build) -> None:
    b = RunBuilder()
    loop(b, 1, [("forward", 1.0)])
    b.event(name="checkpoint", ts=1000.2, dur=0.1)  # inside the only iteration
    d = diagnose(build(b), "r")
    assert d.verdict == "Bottleneck: unknown - no steady-state iterations to judge."
    assert d.bottleneck is None
    assert d.confidence == "low"
    assert "short_run" in codes(d)
    json.dumps(d.to_dict(), allow_nan=False)


def test_starvation_is_followed_upstream_to_the_loader(build) -> None:
    # target: batch_get 60, target_forward 30, hs_put 10 (waits 70%); drafter: hs_get 50,
    # train 50 (waits 50%). The drafter waits least, but it waits for the target, which
    # waits for its loader: the input upstream of both is the bottleneck, at batch_get.
    b = RunBuilder()
    loop(b, 30, [("batch_get", 0.060), ("target_forward", 0.030), ("hs_put", 0.010)],
         stage="target", rank=0)
    loop(b, 30, [("hs_get", 0.050), ("train", 0.050)], stage="drafter", rank=1)
    d = diagnose(build(b), "r")
    bn = d.bottleneck
    assert (bn.stage, bn.category, bn.phase) == ("target", "starvation", "batch_get")
    assert bn.share == pytest.approx(0.60)
    assert bn.seen_from == "drafter"
    assert d.verdict.startswith("Bottleneck: input - target waits for data 60% of its time "
                                "in batch_get (60 ms/iter)")


def test_a_wait_followed_upstream_has_no_margin_to_doubt(build) -> None:
    """drafter waits least (86% vs 87.5%) but it waits, through target, on the
    loader: the verdict names target/batch_get. The 1.5-point margin between
    the two said 'target waits almost as little as target' and cut the
    confidence; following the wait settles it."""
    b = RunBuilder()
    loop(b, 40, [("batch_get", 0.087), ("target_forward", 0.012), ("hs_put", 0.0005)],
         stage="target", rank=0, dur=0.1)
    loop(b, 40, [("hs_get", 0.086), ("fwd", 0.0135)], stage="drafter", rank=1, dur=0.1)
    d = diagnose(build(b), "r")
    bn = d.bottleneck
    assert (bn.stage, bn.phase, bn.seen_from) == ("target", "batch_get", "drafter")
    assert bn.margin is None and bn.runner_up is None
    assert d.confidence == "high", d.confidence_reasons


def test_a_category_share_is_not_told_as_one_phase_s(build) -> None:
    """Two waits: the verdict and the finding give the category's share and the
    named phase's own (found by a new user: '46% of its time, in batch_get' read
    as batch_get's share, which was 27%). By hand: 30 + 20 ms of 110 = 45.5%;
    batch_get 30/110 = 27.3%; shard_io 20/110 = 18.2%."""
    b = RunBuilder()
    loop(b, 40, [("batch_get", 0.030), ("compute", 0.060), ("shard_io", 0.020)],
         kinds={"shard_io": "starvation"})
    d = diagnose(build(b), "r")
    assert d.verdict.startswith("Bottleneck: input - main waits for data 45% of its time, "
                                "27% in batch_get (30 ms/iter)")
    f = next(f for f in d.findings if f.code == "starvation")
    assert f.message.startswith("main waits for input 45% of its time, 27% in batch_get "
                                "(30 ms per iteration)")


def test_a_compute_straggler_is_told_as_a_ratio_and_every_gain_agrees(build) -> None:
    # 3 ranks in lockstep, 128 ms steps: draft_forward 38 ms and grad_allreduce 90 ms on
    # ranks 0 and 1; rank 2 computes 123 ms and waits 5 ms. Rank 2's compute is
    # 123/38 = 3.24x its peers' (slowdown 2.2368, critical). Sync share (90+90+5)/384 =
    # 0.4818, 185/3 = 61.7 ms per iteration. Lockstep cycle max(own) + min(sync) =
    # 123 + 5 = 128 ms; rank 2 at its peers' pace: 38 + 5 = 43 ms -> throughput
    # multiplier 128/43 = 2.9767 (gain 1.9767), the same figure in headline and finding.
    b = RunBuilder()
    for rank in range(3):
        slow = rank == 2
        loop(b, 30, [("draft_forward", 0.123 if slow else 0.038),
                     ("grad_allreduce", 0.005 if slow else 0.090)], stage="train", rank=rank)
    d = diagnose(build(b), "r")
    s = d.stragglers[0]
    assert (s.rank, s.kind, s.phase) == (2, "compute", "draft_forward")
    assert s.slowdown == pytest.approx(123 / 38 - 1)
    assert s.own_over_peers == pytest.approx(123 / 38)    # the "3.2x" of the texts
    assert s.gain_if_fixed == pytest.approx(128 / 43 - 1)
    assert s.speedup_if_fixed == pytest.approx(128 / 43)
    # Critical (2.98x): the straggler leads, the stage's sync is its symptom.
    assert d.verdict == (
        "Bottleneck: rank 2 of train is a straggler - its compute is 3.2x its peers', most in "
        "draft_forward; at its peers' pace: 2.98x faster. (confidence: medium)")
    finding = next(f for f in d.findings if f.code == "straggler")
    assert finding.severity == "critical"
    # the cause before its symptom: the straggler, then the peers' sync wait for it
    assert [f.code for f in d.findings][:2] == ["straggler", "sync_bound"]
    assert d.findings[1].severity == "critical" and d.findings[1].gain is None
    assert finding.message == (
        "rank 2 of train computes 3.2x its peers' time (123 ms vs 38 ms per iteration), most "
        "in draft_forward (+85 ms); its peers wait 85 ms longer for it at the collective in "
        "grad_allreduce; at its peers' pace the pipeline would be 2.98x faster")
    assert finding.evidence["speedup_if_fixed"] == pytest.approx(128 / 43)
    # What-if: the same multiplier definition (speedup = 1 + throughput_gain).
    for w in d.what_if:
        assert w.speedup == pytest.approx(1 + w.throughput_gain)
        assert w.speedup_halved == pytest.approx(1 + w.throughput_gain_halved)


def _blocked(d: Diagnosis) -> list:
    return [f for f in d.findings if f.code == "blocked_in_compute"]


def test_a_sleeping_phase_named_like_compute_is_reported(build) -> None:
    # The user's loop: augment sleeps 40 ms (a read), forward computes 60 ms; the thread
    # is on the CPU 50 ms of each 100 ms step. No waiting phase: the verdict is compute, but
    # 50 of 100 ms are blocked: on_cpu = 0.05 / 0.10 = 0.5 against 1.0 for a lone loop ->
    # excess (1 - 0.5) * 1.0 = 50% of wall time (>= 40%: warning).
    b = RunBuilder()
    loop(b, 30, [("augment", 0.040), ("forward", 0.060)], cpu=0.050)
    d = diagnose(build(b), "r")
    assert d.bottleneck.category == "compute"
    [f] = _blocked(d)
    assert f.severity == "warning"
    assert f.evidence["excess_share"] == pytest.approx(0.5)
    assert f.evidence["on_cpu_share"] == pytest.approx(0.5)
    assert f.evidence["reference_on_cpu_share"] == 1.0
    assert [p["phase"] for p in f.evidence["phases"]] == ["forward", "augment"]
    assert f.message == (
        "rank 0 of main is blocked (off the CPU) in phases counted as compute for 50% of its "
        "time (50 ms per iteration): its thread is on the CPU 50% of its compute time; largest "
        "compute phases forward (60 ms), augment (40 ms); if one of them waits (I/O, queue, "
        "lock), mark it kind='starvation' (it.phase(name, kind=...), or phase_kinds in "
        "run.json and tlog ingest the run again); else the thread lacks a CPU (more busy "
        "threads than cores)")


def test_marking_the_phase_as_starvation_explains_the_blocked_time(build) -> None:
    # Same loop with augment marked starvation: busy 60 ms, on_cpu 50/60 -> excess
    # (1 - 0.8333) * 0.6 = 10% < 20%: no finding; the verdict is now input (40%).
    b = RunBuilder(phase_kinds={"augment": "starvation"})
    loop(b, 30, [("augment", 0.040), ("forward", 0.060)], cpu=0.050)
    d = diagnose(build(b), "r")
    assert _blocked(d) == []
    assert (d.bottleneck.category, d.bottleneck.phase) == ("starvation", "augment")


def test_a_busy_machine_is_judged_against_the_runs_best_worker(build) -> None:
    # Three ranks on a busy machine, 100 ms of compute each. Ranks 0 and 1 get half a core
    # (cpu 50 ms): on_cpu 0.5, the reference. Rank 2 also sleeps in its compute (cpu 20 ms):
    # on_cpu 0.2 -> excess (1 - 0.2 / 0.5) * 1.0 = 60% (warning); ranks 0 and 1: 0.
    b = RunBuilder()
    for rank in range(3):
        loop(b, 30, [("forward", 0.100)], cpu=0.020 if rank == 2 else 0.050, rank=rank,
             stage="train")
    d = diagnose(build(b), "r")
    [f] = _blocked(d)
    assert (f.evidence["rank"], f.severity) == (2, "warning")
    assert f.evidence["excess_share"] == pytest.approx(0.6)
    assert f.evidence["reference_on_cpu_share"] == pytest.approx(0.5)
    assert f.evidence["reference_worker"] == "train-0"
    assert "its thread is on the CPU 20% of its compute time (rank 0 of train: 50%)" in f.message
    # Without cpu figures there is nothing to judge.
    b = RunBuilder("nocpu")
    loop(b, 30, [("augment", 0.040), ("forward", 0.060)])
    assert _blocked(diagnose(build(b), "nocpu")) == []


@pytest.mark.parametrize(("seconds", "text"), [
    (1.5, "1.50 s"), (0.061, "61 ms"), (0.0043, "4.3 ms"), (0.00012, "120 µs"),
    (0.00006, "60 µs"),      # 60 and 120 µs both read "0.1 ms" before
    (0.00004, "40 µs"),      # was "0.0 ms" next to a non-zero share
    (0.0000004, "0.4 µs"), (0.0, "0 µs"), (-0.0, "0 µs"),
    (0.9996, "1.00 s"), (0.00999, "10 ms"), (0.000999, "1.0 ms"), (1e-12, "0.0 µs"),
])
def test_short_durations_read_in_microseconds(seconds, text) -> None:
    from tlog.analyze.text import ms

    assert ms(seconds) == text


@pytest.mark.parametrize(("tags", "exact"), [
    ({"device": "cpu"}, True),              # the reference pipeline's tag
    ({"torch": "2.13.0+cpu"}, True),        # the shim's tag: a CPU-only torch build
    ({"torch": "2.13.0+cu124"}, False),     # could have used a GPU: upper bound
    ({}, False),
])
def test_a_host_only_run_has_exact_sync(build, tags, exact) -> None:
    """Two users found the GPU caveats on CPU runs: 'sync is an upper bound that
    can hide queued GPU work' where no GPU was used. By hand: sync 30 of 100 ms."""
    b = RunBuilder()
    loop(b, 30, [("forward", 0.070), ("grad_allreduce", 0.030)])
    con = build(b)
    con.execute("UPDATE runs SET tags = ?", [json.dumps(tags)])
    d = diagnose(con, "r")
    assert d.bottleneck.category == "sync" and d.categories.sync == pytest.approx(0.3)
    assert d.host_only is exact and d.to_dict()["host_only"] is exact
    assert ("no_device_times" in codes(d)) is not exact
    assert ("(an upper bound: no device times)" in d.verdict) is not exact
    assert ("sync is an upper bound without device times" in d.confidence_reasons) is not exact


def test_ranks_are_compared_on_the_same_steps(build) -> None:
    # Two ranks do the same work at every step: forward rises from 100 to 400 ms over
    # 60 steps (the machine getting busier), backward 50, grad_allreduce 5. Rank 1's
    # log holds steps 40-59 only (its logging started late). Warm-up detection leaves
    # out rank 0's first 15 steps (its steps are far under its second half's median;
    # at most 25% of them, WARMUP_MAX_SHARE) and none of rank 1's. Over its own steady
    # steps rank 1's median own work would be forward(49.5) + 50 = 401.7 ms against
    # rank 0's forward(37) + 50 = 338.1 ms: 1.19x, a compute straggler by the 15%
    # threshold (STRAGGLER_THRESHOLD), made by the windows alone. On the steps steady
    # on both, 40-59, both medians are 401.7 ms: no straggler.
    b = RunBuilder()

    def forward(i: float) -> float:
        return 0.100 + 0.300 * i / 59

    for rank in range(2):
        ts = 1000.0
        for i in range(60):
            dur = forward(i) + 0.055
            if rank == 0 or i >= 40:
                b.iteration(iter=i, ts=ts, dur=dur, rank=rank, stage="train",
                            phases=[("forward", forward(i)), ("backward", 0.050),
                                    ("grad_allreduce", 0.005)])
            ts += dur
    d = diagnose(build(b), "r")
    assert (d.iterations.steady, d.iterations.warmup) == (45 + 20, 15), d.iterations
    assert d.stragglers == (), d.stragglers


def _four_ranks(build, forward: dict[int, float]) -> Diagnosis:
    """Four independent ranks (no collective): next_batch 5, forward (by rank),
    backward 60, optimizer 5 ms."""
    b = RunBuilder()
    for rank in range(4):
        loop(b, 40, [("next_batch", 0.005), ("forward", forward.get(rank, 0.030)),
                     ("backward", 0.060), ("optimizer", 0.005)], stage="train", rank=rank)
    return diagnose(build(b), "r")


def test_two_stragglers_of_a_stage_are_one_finding_listing_them(build) -> None:
    # Own work (compute) per iteration: peers 30 + 60 + 5 = 95 ms; rank 1 80 + 65 = 145
    # (1.53x), rank 3 65 + 65 = 130 (130/95 = 1.37x): two stragglers, one finding.
    d = _four_ranks(build, {1: 0.080, 3: 0.065})
    assert [(s.rank, s.severity) for s in d.stragglers] == [(1, "warning"), (3, "warning")]
    [f] = [f for f in d.findings if f.code == "straggler"]
    assert f.evidence["ranks"] == [1, 3]
    assert f.evidence["rank"] == 1                       # the lead's figures at the top
    assert [e["slowdown"] for e in f.evidence["per_rank"]] == [
        pytest.approx(145 / 95 - 1), pytest.approx(130 / 95 - 1)]
    assert f.message.startswith("rank 1 of train computes 1.53x its peers' time (145 ms vs "
                                "95 ms per iteration)")
    assert f.message.endswith("; also rank 3 (1.37x)")
    # not worth removing forward or backward outright: the verdict is the category's and
    # names both ranks
    assert d.bottleneck.category == "compute" and d.bottleneck.straggler is None
    assert d.verdict.startswith("Bottleneck: train is compute-bound; backward takes 49%")
    assert d.verdict.endswith("; ranks 1 and 3 are stragglers.")


def test_two_stragglers_that_lead_the_verdict_are_named_together(build) -> None:
    # Rank 1's forward takes 2 s, rank 3's 1.5 s: iterations of 100 ms, 2.07 s and
    # 1.57 s. Independent ranks: the stage's rate is the sum of theirs, 10 + 10 +
    # 1/2.07 + 1/1.57 per second; rank 1 at its peers' pace adds 10 - 1/2.07.
    d = _four_ranks(build, {1: 2.0, 3: 1.5})
    rates = 20 + 1 / 2.07 + 1 / 1.57
    gain = (30 + 1 / 1.57) / rates - 1                  # 0.4506: critical (>= 1/0.75 - 1)
    s = d.stragglers[0]
    assert (s.rank, s.severity) == (1, "critical")
    assert s.gain_if_fixed == pytest.approx(gain, rel=1e-3)
    [f] = [f for f in d.findings if f.code == "straggler"]
    assert d.findings[0] is f and f.evidence["ranks"] == [1, 3]
    assert d.bottleneck.straggler.rank == 1
    assert d.verdict == ("Bottleneck: ranks 1 and 3 of train are stragglers - rank 1's compute "
                         "is 21.7x its peers', most in forward; at its peers' pace: 1.45x "
                         "faster.")
