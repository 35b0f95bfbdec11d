"""Findings: what diagnose tells the engineer besides the verdict, each with its evidence.

A :class:`Finding` has a ``code`` (:class:`Code`), a ``severity``
(``info`` < ``warning`` < ``critical``), a one-line ``message`` with the
figures, and ``evidence`` (a dict of the figures, stage, phase, ranks). Every
threshold is a named constant whose docstring gives its source;
docs/DIAGNOSIS.md lists them all.

Severity: a category finding is ``critical`` when it is the verdict's
bottleneck, ``warning`` at :data:`analyze.pipeline.HIGH_SHARE` (20%) or more,
``info`` at :data:`analyze.pipeline.MODERATE_SHARE` (5%) or more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import polars as pl
from tlog.analyze.frames import PARTS, RunAnalysis
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.lockstep import INFERRED_WORDS, LockstepResult
from tlog.analyze.pipeline import (
    EPS,
    HIGH_SHARE,
    MODERATE_SHARE,
    Bottleneck,
    StageStats,
    part_medians,
)
from tlog.analyze.statistics import kendall_trend
from tlog.analyze.stragglers import Straggler
from tlog.analyze.text import in_phase, ms, pct, speedup, times


class Code(StrEnum):
    """Finding codes (stable: scripts match on them)."""

    STARVATION = "starvation"
    BACKPRESSURE = "backpressure"
    COMPUTE_BOUND = "compute_bound"
    SYNC_BOUND = "sync_bound"
    STRAGGLER = "straggler"
    DRIFT = "drift"
    UNACCOUNTED = "unaccounted"
    ALLOCATOR_THRASH = "allocator_thrash"
    HOST_BOUND = "host_bound"
    BLOCKED_IN_COMPUTE = "blocked_in_compute"
    NO_DEVICE_TIMES = "no_device_times"
    SHORT_RUN = "short_run"
    QUEUE_EMPTY = "queue_empty"
    QUEUE_FULL = "queue_full"


class Severity(StrEnum):
    """How much a finding matters."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}

#: Unaccounted time (no phase covers it) worth a warning: 10% of a stage's
#: time. Source: TraceML warns at 10%; below that it is Python glue.
UNACCOUNTED_WARN = 0.10
#: Fewest steady iterations per worker for a confident verdict. Source: tlog's
#: choice: the median of 20 samples has a 95% confidence interval spanning
#: the 6th..15th order statistics (binomial), about a quartile either way.
MIN_STEADY_ITERS = 20
#: Steady iteration time change (median of the last third vs the first) that
#: is drift. Source: TraceML's 10% warning level for step-time regressions.
DRIFT_THRESHOLD = 0.10
#: Fewest steady iterations per worker to judge drift (10 per third).
DRIFT_MIN_ITERS = 30
#: The trend test of ``drift`` runs on this many consecutive blocks of each
#: worker's steady iterations (their medians): a block median shrugs off single
#: slow iterations, and blocks make neighbouring iterations' shared noise (a
#: busy machine for a few seconds) one value instead of many correlated ones.
#: Source: tlog's choice, the batch-means idea of analyze.compare (Law & Kelton).
DRIFT_BLOCKS = 8
#: Two-sided p-value under which the block medians have a trend (exact
#: Mann-Kendall test: Kendall's tau against block order). Source: tlog's choice;
#: 1% keeps a noisy run's chance of a false drift finding at 1 in 100 per stage.
DRIFT_P = 0.01
#: Kendall's tau from which a significant drift is consistent enough for a
#: warning: 90% of block pairs ordered the same way ((1 + tau) / 2 >= 0.9).
#: A run that steps once (a neighbour's job starts at 60% of it) orders only
#: the pairs across the step and stays below it (info at most).
#: Source: tlog's choice.
DRIFT_CONSISTENT = 0.80
#: CPU time of the recording thread over its wall time at which the thread is
#: busy (host-bound). Source: DESIGN.md "cpu near dur"; 90% leaves room for
#: the GIL hand-offs and short blocking calls every loop has.
HOST_BOUND_CPU_SHARE = 0.90
#: ... but only while the device is idle for a good part of the time: device
#: seconds over wall seconds under this. A host thread spinning in
#: ``cudaStreamSynchronize`` also burns CPU, with the device busy.
HOST_BOUND_MAX_DEVICE_SHARE = 0.80
#: Device allocations (``mem.device_allocs``) per steady iteration that mean
#: the caching allocator is not reusing its blocks. Source: PyTorch's CUDA
#: caching allocator reuses cached blocks once shapes repeat, so a steady
#: loop allocates ~0 new segments; one per 100 iterations is already a leak
#: or a shape churn.
DEVICE_ALLOC_RATE = 0.01
#: ``blocked_in_compute``: the recording thread is off the CPU in its compute
#: phases, beyond what the run's best worker shows, for this share of its wall
#: time (:func:`blocked_findings`). Source: tlog's choice, the
#: 20% of HIGH_SHARE: blocked time that large, hidden in compute, could have
#: been the verdict's category; thread CPU time also misses short scheduler
#: delays and GIL hand-offs, a few percent in a busy loop.
BLOCKED_MARGIN = 0.20
#: ... a warning from this share (most of the "compute" then is not compute).
#: Source: tlog's choice, twice BLOCKED_MARGIN.
BLOCKED_WARN = 0.40
#: How many compute phases the ``blocked_in_compute`` message names.
BLOCKED_TOP_PHASES = 3
#: A throughput gain (fraction) below this is not worth a sentence: half a
#: percent is within run-to-run noise on a shared machine. Source: tlog's choice.
GAIN_WORTH_SAYING = 0.005
#: A queue is "always empty" / "always full" when this share of its samples
#: are at depth 0 / at capacity. Source: tlog's choice (nine in ten).
QUEUE_STATE_SHARE = 0.90


@dataclass
class Finding:
    """One observation with its figures."""

    code: str
    severity: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``findings`` items)."""
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "evidence": self.evidence}


def _severity(share: float, is_bottleneck: bool) -> str | None:
    if is_bottleneck:
        return Severity.CRITICAL
    if share >= HIGH_SHARE - EPS:
        return Severity.WARNING
    if share >= MODERATE_SHARE - EPS:
        return Severity.INFO
    return None


def category_findings(stages: list[StageStats], bottleneck: Bottleneck | None,
                      device_times: bool, queues: list[dict],
                      lock: LockstepResult | None = None) -> list[Finding]:
    """starvation, backpressure, sync_bound, unaccounted and compute_bound findings.

    A sync share that holds a collective wait inferred from rank alignment
    (``analyze.lockstep``) says so, with the wait per rank in the evidence."""
    out: list[Finding] = []
    names = [s.stage for s in stages]
    for st in stages:
        shares = st.shares
        idx = names.index(st.stage)
        for cat, code in (("starvation", Code.STARVATION), ("backpressure", Code.BACKPRESSURE),
                          ("sync", Code.SYNC_BOUND)):
            share = shares[cat]
            is_bn = bottleneck is not None and bottleneck.stage == st.stage and \
                bottleneck.category == cat
            sev = _severity(share, is_bn)
            if sev is None:
                continue
            phase, secs = st.top_phase(cat)
            per_iter = secs / st.iterations if st.iterations else 0.0
            ev = {"stage": st.stage, "share": share, "phase": phase,
                  "phase_seconds_per_iter": per_iter,
                  "phase_share": secs / st.seconds if st.seconds else 0.0}
            where = in_phase(phase, ev["phase_share"], share, per_iter, " per iteration")
            if cat == "starvation":
                source = (f"its producer {names[idx - 1]}" if idx > 0
                          else "its input (data loader or other unlogged source)")
                msg = f"{st.stage} waits for input {pct(share)} of its time{where}: starved by {source}"
            elif cat == "backpressure":
                sink = (f"its consumer {names[idx + 1]}" if idx + 1 < len(names)
                        else "an unlogged consumer")
                msg = f"{st.stage} is blocked handing output on {pct(share)} of its time{where}: held by {sink}"
            else:
                bound = "" if device_times else " (an upper bound: without device times it can hide queued GPU work)"
                found = lock.of(st.stage) if lock is not None else None
                if found is not None and found.inferred:
                    bound = (f" (the ranks' wait for each other at the collective in "
                             f"{found.where}, {INFERRED_WORDS})" + bound)
                    ev["lockstep"] = found.to_dict()
                msg = f"{st.stage} spends {pct(share)} of its time in sync waits{where}{bound}"
                ev["upper_bound"] = not device_times
            related = [q for q in queues if q.get("state") in ("empty", "full")]
            if related and cat in ("starvation", "backpressure"):
                ev["queues"] = related
            out.append(Finding(code, sev, msg, ev))
        un = shares["unaccounted"]
        is_bn = bottleneck is not None and bottleneck.stage == st.stage and \
            bottleneck.category == "unaccounted"
        if is_bn or un >= UNACCOUNTED_WARN - EPS:
            sev = Severity.CRITICAL if is_bn else Severity.WARNING
            per_iter = st.category_s["unaccounted"] / st.iterations if st.iterations else 0.0
            out.append(Finding(Code.UNACCOUNTED, sev,
                               f"{pct(un)} of {st.stage}'s time ({ms(per_iter)} per iteration) "
                               f"is in no phase: timers missing, or Python overhead between phases",
                               {"stage": st.stage, "share": un, "seconds_per_iter": per_iter}))
    if bottleneck is not None and bottleneck.category == "compute":
        st = next(s for s in stages if s.stage == bottleneck.stage)
        phase, secs = st.top_phase("compute")
        per_iter = secs / st.iterations if st.iterations else 0.0
        out.append(Finding(Code.COMPUTE_BOUND, Severity.INFO,
                           f"{st.stage} is compute-bound ({pct(st.shares['compute'])} compute); "
                           f"its largest phase is {phase} at {pct(bottleneck.phase_share)} "
                           f"({ms(per_iter)} per iteration)",
                           {"stage": st.stage, "share": st.shares["compute"], "phase": phase,
                            "phase_share": bottleneck.phase_share,
                            "phase_seconds_per_iter": per_iter}))
    return out


def in_straggler_phase(phase: str | None) -> str:
    """Where a compute straggler's excess lies, for the texts: ``", most in
    backward"``, or for the straggler's untimed time (``analyze.load.UNACCOUNTED_PHASE``)
    ``", most in time no phase covers (untimed code)"``; "" without a phase."""
    if not phase:
        return ""
    if phase == UNACCOUNTED_PHASE:
        return ", most in time no phase covers (untimed code)"
    return f", most in {phase}"


def straggler_findings(stragglers: list[Straggler]) -> list[Finding]:
    """One ``straggler`` finding per lagging worker; severity follows its gain
    if fixed (``Straggler.severity``)."""
    out = []
    for s in stragglers:
        sev = Severity(s.severity)
        if s.kind == "compute":
            msg = (f"rank {s.rank} of {s.stage} computes {times(1 + s.slowdown)} its peers' time "
                   f"({ms(s.own_s)} vs {ms(s.peers_s)} per iteration)")
            if s.phase:
                msg += in_straggler_phase(s.phase) + f" (+{ms(s.phase_excess_s)})"
        else:
            msg = (f"rank {s.rank} of {s.stage} waits for input {ms(s.own_s - s.peers_s)} longer "
                   f"per iteration than its peers ({pct(s.slowdown)} of an iteration)")
            if s.phase:
                msg += f", in {s.phase}"
        if s.peers_extra_sync_s > 0:
            if s.wait_method is not None:
                where = f" in {s.wait_phase}" if s.wait_phase else " at the end of the iteration"
                how = f" ({INFERRED_WORDS})" if s.wait_method == "inferred" else ""
                msg += (f"; its peers wait {ms(s.peers_extra_sync_s)} longer for it at the "
                        f"collective{where}{how}")
            else:
                msg += f"; its peers wait {ms(s.peers_extra_sync_s)} longer in sync phases for it"
        if s.gain_if_fixed is not None and s.gain_if_fixed > GAIN_WORTH_SAYING:
            msg += f"; at its peers' pace the pipeline would be {speedup(s.gain_if_fixed)} faster"
        elif s.gain_if_fixed is not None:
            msg += "; bringing it to its peers' pace would not speed the pipeline up"
        out.append(Finding(Code.STRAGGLER, sev, msg, s.to_dict()))
    return out


def block_medians(analysis: RunAnalysis, wids: list[int], blocks: int = DRIFT_BLOCKS
                  ) -> np.ndarray:
    """Median iteration time of each of ``blocks`` consecutive blocks of steady
    iterations per worker (block ``b`` holds positions ``p`` with
    ``p * blocks // n == b``), then the median over ``wids`` per block: shape (blocks,)."""
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    dur = it["dur"].to_numpy()
    per_worker = []
    for wid, a, b in analysis.slices:
        if wid not in wids:
            continue
        d = dur[a:b][steady[a:b]]
        if len(d) < blocks:
            continue
        block = np.arange(len(d)) * blocks // len(d)
        per_worker.append([float(np.median(d[block == k])) for k in range(blocks)])
    if not per_worker:
        return np.zeros(0)
    return np.median(np.array(per_worker), axis=0)


def drift_findings(analysis: RunAnalysis, workers: pl.DataFrame,
                   stage_names: list[str]) -> list[Finding]:
    """``drift``: a stage's steady iteration time trends over the run.

    The size is the change of the median iteration time from the first third
    to the last (more than :data:`DRIFT_THRESHOLD`); the trend must be
    significant: Kendall's tau of the :data:`DRIFT_BLOCKS` block medians
    against their order, exact p under :data:`DRIFT_P` (a single slow
    stretch, e.g. another job on a shared machine at the end, moves the
    thirds but not the order of the blocks). ``warning`` when the trend is
    also consistent (tau at least :data:`DRIFT_CONSISTENT`), else ``info``.
    """

    counts = workers.select("stage", "n")
    out = []
    meds = part_medians(analysis)
    last = PARTS - 1
    for stage in stage_names:
        c = counts.filter(pl.col("stage") == stage)
        if c.height == 0 or int(c["n"].min()) < DRIFT_MIN_ITERS:
            continue
        m = meds.filter(pl.col("stage") == stage)
        first_med = float(m.filter(pl.col("part") == 0)["median_dur"].item())
        last_med = float(m.filter(pl.col("part") == last)["median_dur"].item())
        if first_med <= 0:
            continue
        change = last_med / first_med - 1
        if abs(change) <= DRIFT_THRESHOLD:
            continue
        wids = workers.filter(pl.col("stage") == stage)["wid"].to_list()
        blocks = block_medians(analysis, wids)
        tau, p = kendall_trend(blocks)
        if not (p < DRIFT_P and tau * change > 0):
            continue   # no trend: a slow stretch or noise moved the thirds
        consistent = abs(tau) >= DRIFT_CONSISTENT - EPS
        phase, delta = _phase_change(analysis, stage, growing=change > 0)
        word = "slower" if change > 0 else "faster"
        how = "steadily" if consistent else "with a trend, unevenly"
        msg = (f"{stage} gets {pct(abs(change))} {word} over the run, {how} "
               f"({ms(first_med)} -> {ms(last_med)} median per iteration; Kendall's tau "
               f"{tau:.2f} over {len(blocks)} blocks, p {p:.1g})")
        if phase:
            msg += f"; {phase} changes most ({'+' if delta >= 0 else ''}{ms(delta)} per iteration)"
        out.append(Finding(Code.DRIFT, Severity.WARNING if consistent else Severity.INFO, msg,
                           {"stage": stage, "change": change, "first_median_s": first_med,
                            "last_median_s": last_med, "phase": phase,
                            "phase_change_s": delta, "tau": tau, "p_value": p,
                            "block_medians_s": [float(x) for x in blocks]}))
    return out


def _phase_change(analysis: RunAnalysis, stage: str, *, growing: bool) -> tuple[str | None, float]:
    last = PARTS - 1
    wids = analysis.data.workers.filter(pl.col("stage") == stage)["wid"]
    sub = analysis.steady.filter(pl.col("wid").is_in(wids.to_list())
                                 & pl.col("part").is_in([0, last]))
    n = sub.group_by("part").agg(n=pl.len())
    n_first = n.filter(pl.col("part") == 0)["n"].sum()
    n_last = n.filter(pl.col("part") == last)["n"].sum()
    ph = analysis.phases.filter(pl.col("wid").is_in(wids.to_list()))
    tot = pl.sum_horizontal("starvation_s", "backpressure_s", "compute_s", "sync_s")
    per = (ph.group_by("pid").agg(
        first=tot.filter(pl.col("part") == 0).sum() / max(n_first, 1),
        last=tot.filter(pl.col("part") == last).sum() / max(n_last, 1))
        .with_columns(delta=pl.col("last") - pl.col("first")))
    # Unaccounted time can drift too: compare it as a pseudo-phase.
    un = sub
    un_first = float(un.filter(pl.col("part") == 0)["unaccounted_s"].mean() or 0.0)
    un_last = float(un.filter(pl.col("part") == last)["unaccounted_s"].mean() or 0.0)
    if per.height == 0:
        return None, 0.0
    per = per.sort(["delta", "pid"], descending=[growing, False])
    top = per.row(0, named=True)
    un_delta = un_last - un_first
    if (growing and un_delta > top["delta"]) or (not growing and un_delta < top["delta"]):
        return UNACCOUNTED_PHASE, un_delta
    if (growing and top["delta"] <= 0) or (not growing and top["delta"] >= 0):
        return None, 0.0
    return analysis.data.phase_names[top["pid"]], float(top["delta"])


def allocator_findings(analysis: RunAnalysis) -> list[Finding]:
    """``allocator_thrash``: allocation retries, or device allocations rising,
    during the steady state of a worker."""
    it = analysis.steady
    out: list[Finding] = []
    if it.select(pl.col("mem_alloc_retries", "mem_device_allocs").null_count().sum()).row(0) \
            == (it.height, it.height):
        return out  # no allocator figures recorded
    for (stage, rank, worker), g in it.group_by("stage", "rank", "worker", maintain_order=True):
        g = g.sort("iter")
        retries = g["mem_alloc_retries"].drop_nulls()
        allocs = g["mem_device_allocs"].drop_nulls()
        ev: dict[str, Any] = {"stage": stage, "rank": rank, "worker": worker,
                              "iterations": g.height}
        reasons = []
        if len(retries) >= 2 and retries[-1] > retries[0]:
            d = int(retries[-1] - retries[0])
            ev["alloc_retries"] = d
            reasons.append(f"{d} allocator retries (cache flushes)")
            # Iterations in which the retry count rose, against the others.
            rose = g.with_columns(rose=pl.col("mem_alloc_retries").diff().fill_null(0) > 0)
            slow = rose.filter("rose")["dur"].mean()
            fast = rose.filter(~pl.col("rose"))["dur"].mean()
            if slow is not None and fast is not None:
                ev["dur_with_retry_s"] = float(slow)
                ev["dur_without_retry_s"] = float(fast)
        if len(allocs) >= 2:
            half = allocs[len(allocs) // 2:]
            rate = float(half[-1] - half[0]) / max(len(half) - 1, 1)
            if rate >= DEVICE_ALLOC_RATE:
                ev["device_allocs"] = int(allocs[-1] - allocs[0])
                ev["device_allocs_per_iter"] = rate
                reasons.append(f"{ev['device_allocs']} new device allocations "
                               f"({rate:.2f} per iteration in the second half)")
        if reasons:
            msg = f"rank {rank} of {stage}: {' and '.join(reasons)} during steady state"
            if "dur_with_retry_s" in ev:
                msg += (f"; iterations with a retry take {ms(ev['dur_with_retry_s'])} "
                        f"vs {ms(ev['dur_without_retry_s'])}")
            out.append(Finding(Code.ALLOCATOR_THRASH, Severity.WARNING, msg, ev))
    return out


def host_bound_findings(workers: pl.DataFrame) -> list[Finding]:
    """``host_bound``: the recording thread is busy (cpu near dur) on a worker
    with device work while the device idles."""
    out = []
    for w in workers.iter_rows(named=True):
        if not w["gpu_n"] or not w["cpu_dur"]:
            continue
        cpu_share = w["cpu"] / w["cpu_dur"]
        dev_share = (w["gpu"] or 0.0) / w["dur"] if w["dur"] else 0.0
        if cpu_share >= HOST_BOUND_CPU_SHARE and dev_share < HOST_BOUND_MAX_DEVICE_SHARE:
            out.append(Finding(
                Code.HOST_BOUND, Severity.WARNING,
                f"rank {w['rank']} of {w['stage']} is host-bound: its thread is on the CPU "
                f"{pct(cpu_share)} of the time while the device is busy only {pct(dev_share)} "
                f"(Python, kernel launches or data preparation on the training thread)",
                {"stage": w["stage"], "rank": w["rank"], "worker": w["worker"],
                 "cpu_share": cpu_share, "device_share": dev_share}))
    return out


def blocked_findings(analysis: RunAnalysis, workers: pl.DataFrame) -> list[Finding]:
    """``blocked_in_compute``: a worker without device times whose thread is off
    the CPU during its compute phases far more than the run's other workers.

    Per worker, over its steady iterations that carry ``cpu``: ``busy`` is
    wall time minus its waiting phases (starvation, backpressure, sync) and
    unaccounted time, i.e. the compute phases; ``on_cpu = cpu / busy`` is the
    share of them the thread spent on a CPU. A phase that blocks (a read, a
    sleep, a queue, a lock) lowers it; so does a busy machine (a runnable
    thread waiting for a core), for every worker alike. So the reference is
    the highest ``on_cpu`` among the run's workers with ``cpu`` and no device
    times (1.0 for a run with one such worker: a lone loop is assumed to have
    its core), and the blocked excess is ``(1 - on_cpu / reference) * busy /
    wall``. From :data:`BLOCKED_MARGIN` of wall time: info
    (:data:`BLOCKED_WARN`: warning). Names the worker's largest compute phases.
    Workers with device times are left out (a thread waiting in a synchronize
    is off the CPU with the device computing: ``host_bound`` covers them).

    Known limits: a run whose every worker blocks alike in compute shows
    nothing; a lone loop on a machine with more busy threads than cores is
    reported (the message names that cause too).
    """
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    cpu = it["cpu"].fill_null(0).to_numpy()
    cpu_ok = it["cpu"].is_not_null().to_numpy()
    dur = it["dur"].to_numpy()
    waits = sum(it[c].to_numpy() for c in ("starvation_s", "backpressure_s", "sync_s",
                                           "unaccounted_s"))
    bounds = {wid: (a, b) for wid, a, b in analysis.slices}
    figures = []
    for w in workers.iter_rows(named=True):
        if w["gpu_n"] or not w["cpu_dur"] or w["wid"] not in bounds:
            continue
        a, b = bounds[w["wid"]]
        m = steady[a:b] & cpu_ok[a:b]
        wall = float(dur[a:b][m].sum())
        busy = wall - float(waits[a:b][m].sum())
        if wall <= 0 or busy <= 0:
            continue
        on_cpu = min(float(cpu[a:b][m].sum()) / busy, 1.0)
        figures.append((w, int(m.sum()), wall, busy, on_cpu))
    if not figures:
        return []
    ref_w, ref = None, 1.0
    if len(figures) >= 2:
        best = max(figures, key=lambda f: f[4])
        ref_w, ref = best[0], best[4]
    names = analysis.data.phase_names
    out = []
    for w, n, wall, busy, on_cpu in figures:
        excess = (1 - on_cpu / ref) * busy / wall if ref > 0 else 0.0
        if excess < BLOCKED_MARGIN - EPS:
            continue
        top = (analysis.phases.filter((pl.col("wid") == w["wid"]) & (pl.col("compute_s") > 0))
               .group_by("pid").agg(pl.col("compute_s").sum())
               .sort(["compute_s", "pid"], descending=[True, False]).head(BLOCKED_TOP_PHASES))
        phases = [{"phase": names[r["pid"]], "seconds_per_iter": r["compute_s"] / w["n"]}
                  for r in top.iter_rows(named=True)]
        listed = ", ".join(f"{p['phase']} ({ms(p['seconds_per_iter'])})" for p in phases)
        peer = ("" if ref_w is None else
                f" (rank {ref_w['rank']} of {ref_w['stage']}: {pct(ref)})")
        sev = Severity.WARNING if excess >= BLOCKED_WARN - EPS else Severity.INFO
        msg = (f"rank {w['rank']} of {w['stage']} is blocked (off the CPU) in phases counted as "
               f"compute for {pct(excess)} of its time ({ms(excess * wall / n)} per iteration): "
               f"its thread is on the CPU {pct(on_cpu)} of its compute time{peer}"
               + (f"; largest compute phases {listed}" if listed else "")
               + "; if one of them waits (I/O, queue, lock), mark it kind='starvation' "
                 "(it.phase(name, kind=...), or phase_kinds in run.json and tlog ingest the "
                 "run again); else the thread "
                 "lacks a CPU (more busy threads than cores)")
        out.append(Finding(Code.BLOCKED_IN_COMPUTE, sev, msg,
                           {"stage": w["stage"], "rank": w["rank"], "worker": w["worker"],
                            "iterations": n, "excess_share": excess,
                            "blocked_s_per_iter": excess * wall / n,
                            "on_cpu_share": on_cpu, "reference_on_cpu_share": ref,
                            "reference_worker": None if ref_w is None else ref_w["worker"],
                            "wait_share": 1 - busy / wall, "phases": phases}))
    return out


def queue_states(queues: pl.DataFrame, steady_windows: list[tuple[float, float]]) -> list[dict]:
    """Summarise each queue's depth samples within the steady window(s).

    Returns:
        ``{name, samples, mean_depth, capacity, empty_share, full_share,
        state}`` per queue, ``state`` being ``"empty"`` (consumer starved by
        its producer), ``"full"`` (producer held by its consumer) or ``"mixed"``
        (:data:`QUEUE_STATE_SHARE`).
    """
    if queues.height == 0:
        return []
    q = queues
    if steady_windows:
        lo = min(a for a, _ in steady_windows)
        hi = max(b for _, b in steady_windows)
        inside = q.filter((pl.col("ts") >= lo) & (pl.col("ts") <= hi))
        if inside.height:
            q = inside
    out = []
    for (name,), g in q.group_by("name", maintain_order=True):
        depth = g["depth"].to_numpy()
        cap = g["capacity"].drop_nulls()
        capacity = int(cap.max()) if len(cap) else None
        empty = float(np.mean(depth <= 0))
        full = float(np.mean(depth >= capacity)) if capacity else 0.0
        state = ("empty" if empty >= QUEUE_STATE_SHARE else
                 "full" if full >= QUEUE_STATE_SHARE else "mixed")
        out.append({"name": name, "samples": len(depth), "mean_depth": float(depth.mean()),
                    "capacity": capacity, "empty_share": empty, "full_share": full,
                    "state": state})
    return out


def queue_findings(states: list[dict]) -> list[Finding]:
    """``queue_empty`` / ``queue_full`` (info): corroboration for the verdict."""
    out = []
    for q in states:
        if q["state"] == "empty":
            out.append(Finding(Code.QUEUE_EMPTY, Severity.INFO,
                               f"queue {q['name']} is empty in {pct(q['empty_share'])} of "
                               f"{q['samples']} samples: its consumer is starved by its producer",
                               dict(q)))
        elif q["state"] == "full":
            out.append(Finding(Code.QUEUE_FULL, Severity.INFO,
                               f"queue {q['name']} is full in {pct(q['full_share'])} of "
                               f"{q['samples']} samples: its producer is held by its consumer",
                               dict(q)))
    return out


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by code, stable otherwise."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[Severity(f.severity)])
