"""A restarted job's attempts are judged one at a time (analyze.steady "Attempts"),
and independent workers stay independent once the alignment test ran
(analyze.pipeline.pipeline_model).

The runs are simulated here, nothing of tlog used for the truth: a lockstep
loop in which every rank starts iteration ``i`` together, runs ``data_load``,
``forward`` and the own part of ``backward``, waits in ``backward`` for the
last rank to arrive, then the all-reduce takes ``C`` and all leave together,
then ``optimizer``. The true cycle of iteration ``i`` is
``max_r arrival_r,i + C + optimizer``. A restart is logged the way the shim
logs it (RUNTIME.md): the second process of rank ``r`` is worker
``main-r.1`` and counts ``iter`` from 0 again.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from tlog.analyze import diagnose
from tlog.analyze.history import list_runs

from tests.support.runbuilder import RunBuilder

C = 0.005          # the all-reduce itself (s)
OPT = 0.005        # optimizer (s)
DATA = 0.010       # data_load (s)
BWD = 0.030        # backward's own work (s)
TOKENS = 1000


def _forward(rng: np.random.Generator, ranks: int, n: int, slow: int | None) -> np.ndarray:
    """Forward seconds (ranks, n): 30 ms (60 ms on ``slow``) times 1 + U(0, 5%)."""
    base = np.full((ranks, 1), 0.030)
    if slow is not None:
        base[slow] = 0.060
    return base * (1 + 0.05 * rng.random((ranks, n)))


def _attempt(b: RunBuilder, fwd: np.ndarray, t0: float, suffix: str = "") -> np.ndarray:
    """Log one attempt of the lockstep loop; returns its true cycles (n,)."""
    ranks, n = fwd.shape
    arrival = DATA + fwd + BWD                    # (ranks, n), from the iteration's start
    cycle = arrival.max(axis=0) + C + OPT
    t = t0
    for i in range(n):
        for r in range(ranks):
            backward = arrival[:, i].max() + C - (DATA + fwd[r, i])
            b.iteration(iter=i, ts=t, dur=float(cycle[i]), tokens=TOKENS, rank=r,
                        worker=f"main-{r}{suffix}", host="h0",
                        phases=[("data_load", DATA), ("forward", float(fwd[r, i])),
                                ("backward", float(backward)), ("optimizer", OPT)])
        t += float(cycle[i])
    return cycle


def _restarted(n1: int = 100, n2: int = 100, seed: int = 0) -> tuple[RunBuilder, tuple]:
    rng = np.random.default_rng(seed)
    f1, f2 = _forward(rng, 4, n1, 2), _forward(rng, 4, n2, 2)
    b = RunBuilder("r")
    c1 = _attempt(b, f1, 1.7e9)
    c2 = _attempt(b, f2, 1.7e9 + 60 + float(c1.sum()), suffix=".1")
    return b, (f1, c1, f2, c2)


def _truth(fwd: np.ndarray, cycle: np.ndarray) -> dict[str, float]:
    """Tokens/s, the gain of rank 2 at its peers' median forward, and of
    removing backward (its own work and the all-reduce) - all by construction."""
    fixed = fwd.copy()
    fixed[2] = np.median(np.delete(fwd, 2, axis=0), axis=0)
    fixed_cycle = (DATA + fixed + BWD).max(axis=0) + C + OPT
    no_bwd = (DATA + fwd).max(axis=0) + OPT
    return {"tokens_per_s": fwd.shape[0] * TOKENS * len(cycle) / float(cycle.sum()),
            "straggler": float(cycle.sum() / fixed_cycle.sum()),
            "remove_backward": float(cycle.sum() / no_bwd.sum())}


def _what_if(d, phase: str) -> float:
    return next(w.speedup for w in d.what_if if w.phase == phase)


def test_a_restarted_job_is_judged_on_one_attempt(build) -> None:
    b, (_, _, f2, c2) = _restarted()
    d = diagnose(build(b), "r")
    truth = _truth(f2, c2)
    # 8 workers, but two attempts of 4 ranks that ran one after the other.
    assert d.throughput.tokens_per_s == pytest.approx(truth["tokens_per_s"], rel=0.03)
    assert d.pipeline.model_throughput == pytest.approx(truth["tokens_per_s"], rel=0.03)
    [s] = [s for s in d.stragglers if s.severity != "info"]
    assert (s.rank, s.worker, s.severity) == (2, "main-2.1", "critical")
    assert s.speedup_if_fixed == pytest.approx(truth["straggler"], rel=0.03)
    assert _what_if(d, "backward") == pytest.approx(truth["remove_backward"], rel=0.03)
    assert d.to_dict()["stages"][0]["lockstep"]["iterations"] == 100
    assert d.verdict.startswith("Bottleneck: rank 2 of main is a straggler")
    # The earlier attempt's 400 iterations are left out, with their own reason.
    it = d.iterations
    assert it.attempt == 400
    assert it.total == 800 and it.excluded == it.warmup + it.event + 400
    [note] = [n for n in d.notes if "attempts" in n]
    assert "2 attempts of stage main" in note and "judged on the last" in note
    assert "400 iterations of the earlier attempt left out" in note
    frame = d.analysis.iterations
    assert set(frame.filter(pl.col("excluded") == "attempt")["worker"].unique().to_list()) == {
        "main-0", "main-1", "main-2", "main-3"}
    assert "too short" not in " ".join(f.message for f in d.findings)


def test_tlog_runs_lists_the_judged_attempts_throughput(build) -> None:
    b, (_, _, f2, c2) = _restarted()
    [row] = list_runs(build(b))
    assert row.throughput["tokens_per_s"] == pytest.approx(_truth(f2, c2)["tokens_per_s"],
                                                           rel=0.03)
    assert row.iterations == {"total": 800, "steady": 400}


def test_the_judged_attempt_reads_as_that_attempt_alone(build) -> None:
    """A run without restarts is unchanged: the restarted run's figures are those
    of its last attempt logged alone, which has no attempts to leave out."""
    b, (_, _, f2, _) = _restarted()
    alone = RunBuilder("a")
    _attempt(alone, f2, 1.7e9)
    d, a = diagnose(build(b), "r"), diagnose(build(alone), "a")
    assert a.iterations.attempt == 0 and not [n for n in a.notes if "attempts" in n]
    assert a.analysis.attempts == []
    assert d.throughput.tokens_per_s == pytest.approx(a.throughput.tokens_per_s, rel=1e-9)
    assert d.stragglers[0].speedup_if_fixed == pytest.approx(
        a.stragglers[0].speedup_if_fixed, rel=1e-9)
    assert [(w.phase, round(w.speedup, 9)) for w in d.what_if] == \
        [(w.phase, round(w.speedup, 9)) for w in a.what_if]
    assert d.categories == pytest.approx(a.categories)


def test_the_attempt_with_more_steady_iterations_is_judged(build) -> None:
    b, (f1, c1, _, _) = _restarted(n1=120, n2=30)
    d = diagnose(build(b), "r")
    truth = _truth(f1, c1)
    [att] = d.analysis.attempts
    assert att.kept == 0 and att.iterations == (480, 120)
    assert d.iterations.attempt == 120
    assert d.throughput.tokens_per_s == pytest.approx(truth["tokens_per_s"], rel=0.03)
    assert any("judged on the first" in n and "later attempt" in n for n in d.notes)


def test_workers_that_overlap_in_time_are_not_attempts(build) -> None:
    """Two recorders of the same rank and stage at once (the shim names the
    second ``main-0.1`` too): they ran together, so their rates add up."""
    rng = np.random.default_rng(3)
    b = RunBuilder("o")
    rate = 0.0
    for k, worker in enumerate(("main-0", "main-0.1")):
        d = 0.050 + 0.010 * k + 0.005 * rng.random(60)
        ts = 1.7e9 + 0.013 * k + np.concatenate([[0.0], np.cumsum(d)[:-1]])
        for i in range(60):
            b.iteration(iter=i, ts=float(ts[i]), dur=float(d[i]), tokens=TOKENS, rank=0,
                        worker=worker, phases=[("forward", float(d[i]))])
        rate += 60 * TOKENS / float(d.sum())
    d = diagnose(build(b), "o")
    assert d.analysis.attempts == [] and d.iterations.attempt == 0
    assert d.throughput.tokens_per_s == pytest.approx(rate, rel=1e-6)


def test_independent_workers_with_similar_means_are_not_modelled_in_lockstep(build) -> None:
    """4 workers, no collective, forward 60 ms + Exp(20 ms) jitter, a 10 ms sync
    phase: their means agree within 5%, but the alignment test ran on 300
    matched iterations and found none, so each runs at its own pace."""
    rng = np.random.default_rng(5)
    b = RunBuilder("i")
    rate = rate_no_fwd = rate_no_sync = 0.0
    for r in range(4):
        fwd = 0.060 + rng.exponential(0.020, 300)
        dur = 0.005 + fwd + 0.010 + 0.005
        ts = 1.7e9 + 0.013 * r + np.concatenate([[0.0], np.cumsum(dur)[:-1]])
        for i in range(300):
            b.iteration(iter=i, ts=float(ts[i]), dur=float(dur[i]), tokens=TOKENS, rank=r,
                        stage="target",
                        phases=[("batch_get", 0.005), ("forward", float(fwd[i])),
                                ("loss_item", 0.010), ("optimizer", 0.005)],
                        kinds={"batch_get": "starvation", "loss_item": "sync"})
        rate += 300 * TOKENS / float(dur.sum())
        rate_no_fwd += 300 * TOKENS / float(dur.sum() - fwd.sum())
        rate_no_sync += 300 * TOKENS / float(dur.sum() - 3.0)
    d = diagnose(build(b), "i")
    means = d.analysis.iterations.group_by("wid").agg(pl.col("dur").mean())["dur"]
    assert means.max() / means.min() - 1 <= 0.05      # the 5% fallback would apply
    assert d.to_dict()["stages"][0]["lockstep"] is None
    assert d.pipeline.lockstep == ()
    # (a warm-up rule may leave a few jittery first iterations out: 0.5%)
    assert d.throughput.tokens_per_s == pytest.approx(rate, rel=0.005)
    # The model explains the measured throughput (in lockstep it was 18% below).
    assert d.pipeline.model_throughput == pytest.approx(d.throughput.tokens_per_s,
                                                           rel=1e-9)
    assert _what_if(d, "forward") == pytest.approx(rate_no_fwd / rate, rel=0.01)
    assert _what_if(d, "loss_item") == pytest.approx(rate_no_sync / rate, rel=0.01)


def test_the_lockstep_fallback_applies_when_the_alignment_test_cannot_run(build) -> None:
    """Two workers that share no iteration number (the test needs 8 matched):
    mean times within 5% and sync time - the fallback takes them as lockstep."""
    b = RunBuilder("f")
    for r, first in enumerate((0, 1000)):
        for i in range(40):
            dur = 0.100 + 0.002 * r
            b.iteration(iter=first + i, ts=1.7e9 + i * dur, dur=dur, tokens=TOKENS, rank=r,
                        phases=[("forward", dur - 0.010), ("loss_item", 0.010)],
                        kinds={"loss_item": "sync"})
    d = diagnose(build(b), "f")
    assert any("only 0 iterations were logged by every rank" in n for n in d.notes)
    assert d.pipeline.lockstep == ("main",)
