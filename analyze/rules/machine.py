"""Findings from the machine's samples (``sys`` records, ``analyze.system``):
``memory_growth``, ``cpu_contention``, ``gpu_underused``, ``gpu_throttled``.
docs/DIAGNOSIS.md section 7.

Each reads one worker's system samples in its steady window
(:func:`tlog.analyze.system.steady_samples`); a run without samples gives
none of them (``memory_growth`` also reads the iterations' ``mem`` figures).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from tlog.analyze.findings import Code, Finding, Headline, Severity, and_list, merge_ranks
from tlog.analyze.pipeline import EPS
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.statistics import block_medians, kendall_trend, theil_sen
from tlog.analyze.system import (
    THROTTLE_MASK,
    on_cpu_shares,
    process_cores,
    run_queue_share,
    steady_samples,
    throttle_names,
)
from tlog.analyze.text import ms, num, pct, size

if TYPE_CHECKING:
    from tlog.analyze.rules.drift import DriftPolicy

_MIB = float(1 << 20)


@dataclass(frozen=True)
class MachinePolicy:
    """The limits of the findings from the machine's samples: ``memory_growth``,
    ``cpu_contention``, ``gpu_underused``, ``gpu_throttled``."""

    #: ``memory_growth``: fewest memory readings (system samples, or the
    #: iterations' ``mem`` figures) in a worker's steady window to judge a trend:
    #: one per block of the trend test (``DriftPolicy.blocks``). The trend itself is
    #: ``drift``'s: Kendall's tau of the block medians with an exact p under
    #: ``DriftPolicy.p`` and tau at least ``DriftPolicy.consistent`` (a leak
    #: orders every block pair). Source: tlog's choice.
    memory_min_samples: int = 8
    #: ``memory_growth``: smallest rise over the steady window (the Theil-Sen
    #: rate times the iterations it spans) worth a finding, in bytes. Source:
    #: tlog's choice, 64 MiB: above the noise of a Python process's heap and
    #: the caching allocator's 2 MiB/20 MiB segments, below any leak that
    #: ends a run (8 MiB per step is 64 MiB in 8 steps).
    memory_min_rise: int = 64 << 20
    #: ``memory_growth``: the rate over the second half of the window must be at
    #: least this share of the whole window's: memory that grew early and then
    #: levelled off (a warm-up, caches filling, a plateau) is not a leak.
    #: Source: tlog's choice (a leak's rate is constant: the ratio is ~1).
    memory_still_growing: float = 0.50
    #: ``cpu_contention``: share of a worker's wall time its recording thread was
    #: off the CPU inside compute phases, with more runnable threads than usable
    #: cores (or the load above them), from which the finding is made. Source:
    #: tlog's choice, ``HostPolicy.blocked_margin`` (the two rules read the same
    #: figure; the system samples tell the cause).
    contention_margin: float = 0.20
    #: ``gpu_underused``: median GPU utilisation (NVML, percent of time a kernel
    #: ran) under which the device is underused. Source: tlog's choice: under
    #: half the time busy, the device waits for the host more than it works.
    gpu_underused_util: float = 50.0
    #: ``gpu_underused``: the host is busy when the process uses at least this
    #: many cores' worth of CPU (CPU seconds per second over the steady window)
    #: or its recording thread's CPU time is ``HostPolicy.cpu_share`` of its wall
    #: time. Source: tlog's choice, ``HostPolicy.cpu_share`` of one core: the
    #: training thread alone saturating its core.
    gpu_host_busy_cores: float = 0.90
    #: ``gpu_throttled``: share of the steady samples of a GPU at work (utilisation
    #: above 0) with an NVML slowdown reason (``analyze.system.THROTTLE_REASONS``),
    #: or busy (utilisation at least ``gpu_underused_util``) with an SM clock under
    #: ``gpu_clock_ratio`` of its maximum. Source: tlog's choice (one in ten).
    gpu_throttled_share: float = 0.10
    #: ``gpu_throttled``: an SM clock under this share of its maximum is slowed.
    #: Source: tlog's choice; boost clocks move a few percent with temperature
    #: and load without a slowdown reason.
    gpu_clock_ratio: float = 0.90


def memory_trend(x: np.ndarray, y: np.ndarray, policy: MachinePolicy,
                 trend: DriftPolicy) -> dict[str, Any] | None:
    """Whether memory readings ``y`` (bytes) rise steadily with iteration ``x``.

    A leak, when all hold: at least ``policy.memory_min_samples`` readings; the
    medians of ``trend.blocks`` consecutive blocks ordered upwards (Kendall's
    tau at least ``trend.consistent``, exact Mann-Kendall p under ``trend.p``:
    ``analyze.statistics.kendall_trend``); the Theil-Sen rate positive and
    its rise over the readings' span at least ``memory_min_rise``; the rate
    over the second half still ``memory_still_growing`` of the whole one (a
    plateau after a warm-up is not a leak).

    Returns:
        None, or ``rate_bytes_per_iter``, ``rate_low``, ``rate_high`` (the 95%
        interval), ``second_half_rate``, ``first_bytes``, ``last_bytes`` (first
        and last block medians), ``iterations`` (span of ``x``), ``tau``,
        ``p_value``, ``blocks``.
    """
    ok = ~np.isnan(y)
    x, y = x[ok], y[ok]
    if len(y) < policy.memory_min_samples:
        return None
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    blocks = block_medians(y, trend.blocks)
    tau, p = kendall_trend(blocks)
    if not (p < trend.p and tau >= trend.consistent - EPS):
        return None
    slope, low, high = theil_sen(x, y)
    span = float(x[-1] - x[0])
    if slope <= 0 or slope * span < policy.memory_min_rise:
        return None
    half = len(x) // 2
    late = theil_sen(x[half:], y[half:])[0]
    if late < policy.memory_still_growing * slope:
        return None
    return {"rate_bytes_per_iter": slope, "rate_low": low, "rate_high": high,
            "second_half_rate": late, "first_bytes": float(blocks[0]),
            "last_bytes": float(blocks[-1]), "iterations": span, "tau": tau, "p_value": p,
            "blocks": len(blocks)}


def _limit(values: pl.Series) -> float | None:
    v = values.drop_nulls()
    v = v.filter(v > 0) if v.len() else v
    return float(v.median()) if v.len() else None  # type: ignore[arg-type]


class MemoryGrowthRule(Rule):
    """``memory_growth`` (warning; critical when the limit is reached within as
    many iterations again as the window spans): a worker's RSS or device memory
    rises steadily through its steady state (:func:`memory_trend`), with the
    rate in MiB per iteration and, where the limit is known, the iterations
    left until it is reached: the machine's memory (``machines.mem_total``)
    for RSS; the allocator's limit (``cuda_limit``), else the device's memory
    (``gpu_mem_total``), for device memory.

    Readings: the system samples' ``rss_bytes`` and ``cuda_allocated``; for a
    worker whose samples carry no device figures, its iterations' ``mem``
    ``allocated`` (every 100 iterations by default). Several ranks of a stage
    growing alike are one finding per kind of memory listing them.
    """

    code = Code.MEMORY_GROWTH

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """At most two findings per stage (RSS, device memory), in worker-table order."""
        policy, trend_policy = ctx.policies.machine, ctx.policies.drift
        analysis = ctx.analysis
        machines = analysis.data.system.machines
        mem = (analysis.steady.select("wid", "iter", "mem_allocated")
               .filter(pl.col("mem_allocated").is_not_null()))
        mem_of = mem.partition_by("wid", as_dict=True)
        out = []
        for w, s in _per_worker(ctx):
            own = machines.filter(pl.col("worker") == w["worker"])
            host_limit = _limit((own if own.height else machines)["mem_total"])
            device_limit = _limit(s["cuda_limit"]) or _limit(s["gpu_mem_total"])
            series = [("RSS", "rss", s["x"], s["rss_bytes"], host_limit, "the machine's")]
            if s["cuda_allocated"].drop_nulls().len():
                series.append(("device memory", "device", s["x"], s["cuda_allocated"],
                               device_limit, "the device's"))
            else:
                m = mem_of.get((w["wid"],), mem.clear())
                series.append(("device memory", "device", m["iter"], m["mem_allocated"],
                               device_limit, "the device's"))
            for label, kind, x, y, limit, whose in series:
                trend = memory_trend(x.cast(pl.Float64).to_numpy(),
                                     y.cast(pl.Float64).fill_null(np.nan).to_numpy(), policy,
                                     trend_policy)
                if trend is not None:
                    out.append(self._finding(w, label, kind, trend, limit, whose))
        return merge_ranks(out, by=("stage", "memory"),
                           figure=lambda ev: f"{size(ev['rate_bytes_per_iter'])}/iter")

    def _finding(self, w: dict[str, Any], label: str, kind: str, t: dict[str, Any],
                 limit: float | None, whose: str) -> Finding:
        rate = t["rate_bytes_per_iter"]
        left = max((limit - t["last_bytes"]) / rate, 0.0) if limit else None
        msg = (f"rank {w['rank']} of {w['stage']}: {label} grows {size(rate)} per iteration "
               f"through the steady state ({size(t['first_bytes'])} -> {size(t['last_bytes'])} "
               f"over {num(round(t['iterations']))} iterations; Kendall's tau {t['tau']:.2f} "
               f"over {t['blocks']} blocks, p {t['p_value']:.1g}): a leak, or a buffer that "
               f"keeps every step (tensors kept for logging, a growing list, a cache)")
        if left is not None:
            msg += f"; at this rate it reaches {whose} {size(limit)} in {num(round(left))} iterations"
        sev = (Severity.CRITICAL if left is not None and left <= t["iterations"]
               else Severity.WARNING)
        return Finding(self.code, sev, msg, {
            "stage": w["stage"], "rank": w["rank"], "worker": w["worker"], "memory": kind,
            **t, "rate_mib_per_iter": rate / _MIB, "limit_bytes": limit,
            "iterations_left": left})


def cpu_waits(ctx: RuleContext) -> list[dict[str, Any]]:
    """Where each worker's off-CPU time in compute went: a wait for a core, or blocking.

    Per worker without device times, with ``cpu`` recorded (``analyze.system.
    on_cpu_shares``): ``off_share = (1 - on_cpu) * busy / wall``, the share of
    its wall time its thread was off the CPU inside compute phases; with
    system samples in its steady window, ``run_queue`` is
    :func:`tlog.analyze.system.run_queue_share` (the share of its wall time
    the thread was runnable with no core free; None without ``cpu_wait_s``)
    and ``blocked_share = max(off_share - run_queue, 0)`` the rest: asleep,
    in I/O, on a lock, waiting for the GIL or a device (not contention).
    Without ``run_queue``, ``blocked_share`` is None (the two cannot be told
    apart). ``running`` and ``load1`` are the samples' medians, ``ncpu`` the
    smallest usable core count sampled (None without samples); ``crowded``:
    ``running`` or ``load1`` above ``ncpu``; ``cores`` the process's own CPU
    use in cores (``analyze.system.process_cores``; None with fewer than two
    samples).

    Returns:
        One dict per such worker, in worker-table order: the
        :func:`on_cpu_shares` figures (``w``, ``n``, ``wall``, ``busy``,
        ``cpu``, ``on_cpu``) plus ``off_share``, ``run_queue``,
        ``blocked_share``, ``running``, ``load1``, ``ncpu``, ``crowded``, ``cores``.
    """
    shares = on_cpu_shares(ctx.analysis, ctx.workers)
    if not shares:
        return []
    samples = steady_samples(ctx.analysis)
    parts = samples.partition_by("wid", as_dict=True)
    out = []
    for f in shares:
        w = f["w"]
        if w["gpu_n"]:
            continue
        s = parts.get((w["wid"],), samples.clear())
        usable = s["ncpu"].drop_nulls()
        ncpu = int(usable.min()) if usable.len() else None  # type: ignore[arg-type]
        running, load = s["running"].drop_nulls(), s["load1"].drop_nulls()
        run_med = float(running.median()) if running.len() else None  # type: ignore[arg-type]
        load_med = float(load.median()) if load.len() else None  # type: ignore[arg-type]
        crowded = ncpu is not None and ((run_med is not None and run_med > ncpu)
                                        or (load_med is not None and load_med > ncpu))
        off = (1 - f["on_cpu"]) * f["busy"] / f["wall"]
        queue = run_queue_share(s)
        out.append({**f, "off_share": off, "run_queue": queue,
                    "blocked_share": None if queue is None else max(off - queue, 0.0),
                    "running": run_med, "load1": load_med, "ncpu": ncpu, "crowded": crowded,
                    "cores": process_cores(s)})
    return out


def contention(ctx: RuleContext) -> list[dict[str, Any]]:
    """The workers whose recording thread lacked a CPU (``cpu_contention``).

    From :func:`cpu_waits`. Measured (``guess`` False), where the samples
    carry the run-queue delay: ``share = run_queue`` is at least
    ``MachinePolicy.contention_margin``; the thread was then ready to run and
    had no core for that share of its wall time (the direct evidence; time
    off the CPU for any other reason is blocking, ``blocked_in_compute``).
    ``leads``: the worker is in the verdict's bottleneck stage, that stage
    is not input- or output-bound (its category is not starvation or
    backpressure: a loop that waits for its input every iteration runs at
    its producer's pace, so a faster thread would only wait longer; seen on
    a real loop whose DataLoader needed 960 ms per step and whose thread
    waited 43% for a core), and ``share`` is at least each waiting
    category's share of that stage (starvation, backpressure, sync; not
    unaccounted, which the run-queue delay overlaps: it is measured over the
    whole wall time, time in no phase included) and the worker's
    ``blocked_share`` (it explains the largest loss).

    A guess (``guess`` True), where they do not (not Linux, a log from
    before ``cpu_wait``): the thread off the CPU in compute phases for at
    least ``contention_margin`` of its wall time (``share = off_share``) on
    a crowded machine (the median of the process's runnable threads or the
    load average above the usable cores). Off-CPU time may as well be
    blocking, so a guess never ``leads``.

    Returns:
        One dict per such worker, in worker-table order: the
        :func:`cpu_waits` figures plus ``share``, ``guess``, ``leads``.
    """
    margin = ctx.policies.machine.contention_margin
    bn = ctx.bottleneck
    waits = {}
    if bn is not None:
        st = next(s for s in ctx.stages if s.stage == bn.stage)
        # Unaccounted time is no rival: the run-queue delay is measured over the
        # thread's whole wall time, untimed time included (a thread that loses its
        # core at a system call between phases waits there: contention_truth's
        # crowded loop, 64-81% unaccounted, all of it off the CPU).
        waits = {c: v for c, v in st.shares.items() if c not in ("compute", "unaccounted")}
    out = []
    for c in cpu_waits(ctx):
        if c["ncpu"] is None:
            continue
        guess = c["run_queue"] is None
        share = c["off_share"] if guess else c["run_queue"]
        if share < margin - EPS or (guess and not c["crowded"]):
            continue
        # A stage bound by its input or output (its largest loss a wait of at
        # least the bottleneck share) runs at its neighbour's pace: a faster
        # thread would only wait longer, so its contention never leads.
        leads = (not guess and bn is not None and c["w"]["stage"] == bn.stage
                 and bn.category not in ("starvation", "backpressure")
                 and share >= max([*waits.values(), c["blocked_share"]], default=0.0) - EPS)
        out.append({**c, "share": share, "guess": guess, "leads": leads})
    return out


def lacked_cpu(ctx: RuleContext) -> dict[str, float]:
    """Per stage, the largest *measured* share of its wall time a worker's thread
    waited runnable for a core (:func:`contention`, ``guess`` False; stages
    without such a worker are absent).

    Where a stage's ranks share cores, one rank's work slows the others', so a
    straggler's excess and its peers' wait for it are not its alone and the
    lockstep gain if it were fixed is rough: tests/ddp/README.md "Shared cores"
    measured a 2-rank gloo job (8 extra matmuls in rank 1's forward) beside two
    busy loops, each rank waiting for a core 21-23% of its time, where tlog gave
    2.59x (wait inferred) and 2.49x (wait measured) while the lockstep model on
    the script's own timers gave 2.08x and 2.38x and the same loop without the
    fault, run in the same ranks just before and after, 2.35x and 2.05x.
    """
    out: dict[str, float] = {}
    for c in contention(ctx):
        if not c["guess"]:
            stage = c["w"]["stage"]
            out[stage] = max(out.get(stage, 0.0), float(c["share"]))
    return out


#: How a straggler's gain is qualified where its stage's ranks lacked a CPU
#: (:func:`lacked_cpu`); the verdict says the first part, the finding all.
SHARED_CORES_WORDS = "rough: the ranks shared CPU cores"


def shared_cores_note(share: float) -> str:
    """The straggler finding's words after its gain where the ranks lacked a CPU
    (``share``: :func:`lacked_cpu` of its stage)."""
    return (f" ({SHARED_CORES_WORDS}, waiting for one up to {pct(share)} of their time: "
            "each rank's work slowed the others', which the model does not see)")


def contention_words(c: dict[str, Any]) -> str:
    """What crowded the CPU, as the finding and the verdict say it:
    ``"3 runnable threads on 1 usable core, load 2.9"``."""
    cores = f"{c['ncpu']} usable core{'s' if c['ncpu'] != 1 else ''}"
    parts = []
    if c["running"] is not None:
        n = round(c["running"], 1)
        parts.append(f"{num(n)} runnable thread{'' if n == 1 else 's'} of the process on {cores}")
    else:
        parts.append(cores)
    if c["load1"] is not None:
        parts.append(f"load {c['load1']:.1f}")
    return ", ".join(parts)


#: What to do about contention (the finding's and the verdict's advice).
CONTENTION_ADVICE = ("more busy threads than cores: run fewer threads or DataLoader workers "
                     "(torch.set_num_threads, OMP_NUM_THREADS, num_workers), or give the job "
                     "the machine to itself")
#: What to do when the process's own runnable threads are fewer than its usable
#: cores: the crowd is other processes (seen on a shared machine at load 7.6 with
#: 1 runnable thread of the process on 2 cores, where "run fewer threads" misled).
OTHERS_ADVICE = ("the process's own runnable threads do not fill its cores, other processes "
                 "do (the load counts every process of the machine, DataLoader workers "
                 "included): run fewer of them, or give the job the machine to itself")


def contention_advice(c: dict[str, Any]) -> str:
    """The advice of a ``cpu_contention`` finding or verdict for its evidence
    ``c`` (``running``, ``ncpu``): :data:`OTHERS_ADVICE` when the median of
    the process's runnable threads is below its usable cores, else
    :data:`CONTENTION_ADVICE`."""
    running, ncpu = c.get("running"), c.get("ncpu")
    if running is not None and ncpu and running < ncpu:
        return OTHERS_ADVICE
    return CONTENTION_ADVICE


#: How a ``cpu_contention`` finding without run-queue figures says it is a guess.
GUESS_WORDS = "tlog's guess: no run-queue figures"


class CpuContentionRule(Rule):
    """``cpu_contention``: the recording thread waited runnable for a CPU
    (the scheduler's run-queue delay) for at least
    ``MachinePolicy.contention_margin`` of its wall time (:func:`contention`).
    Critical when it explains the largest loss of the bottleneck stage (the
    verdict then leads with it), else warning. Its figure is the run-queue
    share, never wall minus CPU time: the rest of the time off the CPU is
    blocking, reported by ``blocked_in_compute``.

    Without run-queue figures (not Linux, logs before ``cpu_wait``), the
    old evidence, a thread off the CPU in compute on a crowded machine, gives
    a warning whose message says it is a guess (:data:`GUESS_WORDS`); it never
    leads the verdict and replaces ``blocked_in_compute`` for the worker (the
    same figure, its cause unknown).

    Several ranks of a stage are one finding listing them (measured and
    guessed apart). When contention is the bottleneck's cause
    (``analyze.rules.cause``), the finding of its stage carries the verdict's
    headline and, as its gain, ``share / (1 - share)`` of its leading rank:
    the iteration without its wait for a core (tlog's estimate, an upper
    bound: the pipeline model is not run for it; it orders the findings and
    is never printed)."""

    code = Code.CPU_CONTENTION

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage with contended workers (measured and guessed
        apart), in worker-table order."""
        out = []
        for c in contention(ctx):
            w = c["w"]
            per_iter = c["share"] * c["wall"] / c["n"]
            if c["guess"]:
                msg = (f"rank {w['rank']} of {w['stage']} may lack a CPU ({GUESS_WORDS}): its "
                       f"thread is off the CPU {pct(1 - c['on_cpu'])} of its compute time "
                       f"({pct(c['share'])} of its time, {ms(per_iter)} per iteration) with "
                       f"{contention_words(c)}; it may as well be blocked (a sleep, I/O, a "
                       f"lock); if it is contention: {contention_advice(c)}")
            else:
                msg = (f"rank {w['rank']} of {w['stage']} lacks a CPU: its thread waited "
                       f"runnable for a core {pct(c['share'])} of its time ({ms(per_iter)} per "
                       f"iteration, the scheduler's run-queue delay) with {contention_words(c)}"
                       + (f"; a further {pct(c['blocked_share'])} off the CPU is blocking, not "
                          f"contention" if c["blocked_share"]
                          >= ctx.policies.machine.contention_margin - EPS else "")
                       + f"; {contention_advice(c)}")
            out.append(Finding(self.code, Severity.CRITICAL if c["leads"] else Severity.WARNING,
                               msg, {"stage": w["stage"], "rank": w["rank"],
                                     "worker": w["worker"], "iterations": c["n"],
                                     "contention_share": c["share"],
                                     "contention_s_per_iter": per_iter,
                                     "run_queue_share": c["run_queue"],
                                     "guess": c["guess"],
                                     "on_cpu_share": c["on_cpu"], "off_cpu_share": c["off_share"],
                                     "blocked_share": c["blocked_share"],
                                     "running": c["running"], "load1": c["load1"],
                                     "ncpu": c["ncpu"], "leads": c["leads"]}))
        merged = merge_ranks(out, by=("stage", "guess"),
                             figure=lambda ev: pct(ev["contention_share"]))
        cause = ctx.cause
        if cause is not None and cause.kind == "cpu_contention":
            for f in merged:
                if f.evidence["leads"] and f.evidence["stage"] == cause.stage:
                    f.headline = _contention_headline(ctx, f.evidence)
                    share = f.evidence["contention_share"]
                    f.gain = share / (1 - share) if share < 1 else None
                    break
        return merged


def _contention_headline(ctx: RuleContext, ev: dict[str, Any]) -> Headline:
    """The verdict when the bottleneck stage's thread lacked a CPU: its leading
    rank's run-queue share (``ev``: a ``cpu_contention`` finding's evidence)."""
    stage = ev["stage"]
    where = f"stage {stage}" if len(ctx.stages) > 1 else stage
    ranks = [e["rank"] for e in ev.get("per_rank", [ev]) if e["leads"]]
    if len(ranks) > 1:
        who = (f"Bottleneck: {where} (ranks {and_list(ranks)}) lacks CPU - rank {ev['rank']}'s "
               f"thread waited runnable for a core {pct(ev['contention_share'])} of its time")
    else:
        who = (f"Bottleneck: {where} (rank {ev['rank']}) lacks CPU - its thread waited "
               f"runnable for a core {pct(ev['contention_share'])} of its time")
    return Headline.of(
        who, (f" ({ms(ev['contention_s_per_iter'])}/iter)", 2),
        (f", with {contention_words(ev)}", 3))


def _per_worker(ctx: RuleContext) -> Iterator[tuple[dict[str, Any], pl.DataFrame]]:
    """Each worker-table row with its steady samples (:func:`steady_samples`)."""
    parts = steady_samples(ctx.analysis).partition_by("wid", as_dict=True)
    empty = steady_samples(ctx.analysis).clear()
    for w in ctx.workers.iter_rows(named=True):
        yield w, parts.get((w["wid"],), empty)


def _host_only_share(ctx: RuleContext, w: dict[str, Any]) -> float:
    """The share of a worker's steady wall time in compute phases that carry no
    device time (host work only: Python, data preparation, or a wait for a core
    to do it)."""
    ph = ctx.analysis.phases.filter((pl.col("wid") == w["wid"]) & (pl.col("gpu_n") == 0))
    return float(ph["compute_s"].sum()) / w["dur"] if w["dur"] else 0.0


def _top_host_phases(ctx: RuleContext, wid: int, n: int, k: int) -> list[dict[str, Any]]:
    """The worker's ``k`` phases with the most host time per steady iteration
    (their device time beside it)."""
    top = (ctx.analysis.phases.filter(pl.col("wid") == wid)
           .group_by("pid").agg(pl.col("host_s").sum(), pl.col("gpu_s").sum())
           .sort(["host_s", "pid"], descending=[True, False]).head(k))
    names = ctx.analysis.data.phase_names
    return [{"phase": names[r["pid"]], "host_s_per_iter": r["host_s"] / n,
             "gpu_s_per_iter": (r["gpu_s"] or 0.0) / n} for r in top.iter_rows(named=True)]


class GpuUnderusedRule(Rule):
    """``gpu_underused`` (warning): the GPU's median utilisation (NVML) is under
    ``MachinePolicy.gpu_underused_util`` while the host is busy: the process uses
    at least ``gpu_host_busy_cores`` of CPU, or the recording thread's CPU time
    is ``host_bound_cpu_share`` of its wall time, or that share of its wall
    time is in compute phases without device time (host work, or a wait for a
    core to do it on a crowded machine), or the thread's CPU share plus its
    measured run-queue share reach ``host_bound_cpu_share`` (a thread waiting
    for a core wants the host as much as one on it: beside other work the loop
    of tests/diagnosis/test_machine_loops.py ran on the CPU 56-70% and waited
    for a core 38-51% of its time, 11-17% of it between phases, and the finding
    was missed). Host-bound: names the
    ``HostPolicy.top_phases`` phases with the most host time. Several ranks of a
    stage are one finding listing them."""

    code = Code.GPU_UNDERUSED

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage with an underused GPU, in worker-table order."""
        policy, host = ctx.policies.machine, ctx.policies.host
        out = []
        for w, s in _per_worker(ctx):
            util = s["gpu_util"].drop_nulls()
            if util.len() == 0:
                continue
            med = float(util.median())  # type: ignore[arg-type]
            if med >= policy.gpu_underused_util:
                continue
            cores = process_cores(s)
            thread = w["cpu"] / w["cpu_dur"] if w["cpu_dur"] else None
            host_work = _host_only_share(ctx, w)
            # A thread runnable with no core free wants the host as much as one on it:
            # on the CPU + waiting for a core (measured) counts as busy.
            queue = run_queue_share(s)
            wanting = None if thread is None or queue is None else thread + queue
            busy = ((cores is not None and cores >= policy.gpu_host_busy_cores - EPS)
                    or (thread is not None and thread >= host.cpu_share - EPS)
                    or host_work >= host.cpu_share - EPS
                    or (wanting is not None and wanting >= host.cpu_share - EPS))
            if not busy:
                continue
            phases = _top_host_phases(ctx, w["wid"], w["n"], host.top_phases)
            listed = ", ".join(f"{p['phase']} ({ms(p['host_s_per_iter'])} host, "
                               f"{ms(p['gpu_s_per_iter'])} device)" for p in phases)
            how = "; ".join(x for x in (
                f"the process uses {cores:.2f} cores" if cores is not None else "",
                f"its thread is on the CPU {pct(thread)} of the time" if thread is not None
                else "",
                f"waits for a core {pct(queue)} of it" if queue is not None
                and queue >= policy.contention_margin - EPS else "",
                f"{pct(host_work)} of its time in host-only compute phases") if x)
            msg = (f"rank {w['rank']} of {w['stage']}: the GPU is busy only {med:.0f}% of the "
                   f"time while the host is busy ({how}): host-bound"
                   + (f"; the host's time per iteration goes to {listed}" if listed else "")
                   + "; move that work off the training thread (DataLoader workers, "
                     "pinned-memory copies) or onto the device")
            out.append(Finding(self.code, Severity.WARNING, msg, {
                "stage": w["stage"], "rank": w["rank"], "worker": w["worker"],
                "gpu_util": med, "process_cpu_cores": cores, "thread_cpu_share": thread,
                "host_only_share": host_work,
                "samples": util.len(), "phases": phases}))
        return merge_ranks(out, figure=lambda ev: f"{ev['gpu_util']:.0f}%")


class GpuThrottledRule(Rule):
    """``gpu_throttled`` (warning): in at least ``MachinePolicy.gpu_throttled_share``
    of a worker's steady samples with its GPU at work (utilisation above 0;
    every sample when utilisation is not sampled), NVML reports a slowdown
    reason (``analyze.system.THROTTLE_REASONS``: power cap, thermal, hardware
    slowdown, power brake), or the GPU is busy (utilisation at least
    ``gpu_underused_util``) with its SM clock under ``gpu_clock_ratio`` of its
    maximum (a GPU idle for part of the sample clocks down without a slowdown).
    Several ranks of a stage are one finding listing them."""

    code = Code.GPU_THROTTLED

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage with a throttled GPU, in worker-table order."""
        th = ctx.policies.machine
        out = []
        for w, s in _per_worker(ctx):
            s = s.filter((pl.col("gpu_throttle").is_not_null()
                          | pl.col("gpu_sm_clock_mhz").is_not_null())
                         & (pl.col("gpu_util").is_null() | (pl.col("gpu_util") > 0)))
            if s.height == 0:
                continue
            busy = pl.col("gpu_util").is_null() | (pl.col("gpu_util") >= th.gpu_underused_util)
            reason = (pl.col("gpu_throttle").fill_null(0) & THROTTLE_MASK) > 0
            slow_clock = ((pl.col("gpu_sm_clock_mhz")
                           < th.gpu_clock_ratio * pl.col("gpu_sm_clock_max_mhz")) & busy
                          ).fill_null(False)
            flags = s.select(reason=reason, clock=slow_clock)
            slowed = flags["reason"] | flags["clock"]
            share = float(slowed.mean())  # type: ignore[arg-type]
            if share < th.gpu_throttled_share - EPS:
                continue
            mask = 0
            for v in s["gpu_throttle"].drop_nulls().to_list():
                mask |= int(v) & THROTTLE_MASK
            reasons = throttle_names(mask)
            clk = s["gpu_sm_clock_mhz"].drop_nulls()
            top = s["gpu_sm_clock_max_mhz"].drop_nulls()
            temp = s["gpu_temp_c"].drop_nulls()
            power = s["gpu_power_w"].drop_nulls()
            figures = [f"SM clock median {clk.median():.0f}"
                       + (f" of {top.median():.0f} MHz" if top.len() else " MHz")] if clk.len() else []
            figures += [f"{temp.median():.0f} °C"] if temp.len() else []
            figures += [f"{power.median():.0f} W"] if power.len() else []
            msg = (f"rank {w['rank']} of {w['stage']}: the GPU runs slowed in {pct(share)} of "
                   f"its samples at work"
                   + (f" ({', '.join(reasons)})" if reasons else " (clock under "
                      f"{pct(th.gpu_clock_ratio)} of its maximum)")
                   + (f"; {', '.join(figures)}" if figures else "")
                   + "; its compute phases are slower than the device can run: check cooling, "
                     "power limits (nvidia-smi -q -d PERFORMANCE)")
            out.append(Finding(self.code, Severity.WARNING, msg, {
                "stage": w["stage"], "rank": w["rank"], "worker": w["worker"],
                "throttled_share": share, "reasons": reasons, "throttle_mask": mask,
                "samples": s.height,
                "sm_clock_mhz": float(clk.median()) if clk.len() else None,  # type: ignore[arg-type]
                "sm_clock_max_mhz": float(top.median()) if top.len() else None,  # type: ignore[arg-type]
                "temp_c": float(temp.median()) if temp.len() else None,  # type: ignore[arg-type]
                "power_w": float(power.median()) if power.len() else None}))  # type: ignore[arg-type]
        return merge_ranks(out, figure=lambda ev: pct(ev["throttled_share"]))
