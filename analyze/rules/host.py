"""Findings on the recording thread's CPU time: ``host_bound`` (busy on the
CPU while the device idles) and ``blocked_in_compute`` (off the CPU in
phases counted as compute). docs/DIAGNOSIS.md section 7. Several ranks of a
stage are one finding listing them (``analyze.findings.merge_ranks``)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from tlog.analyze.findings import Code, Finding, Severity, merge_ranks
from tlog.analyze.pipeline import EPS
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.rules.machine import contention, cpu_waits
from tlog.analyze.system import on_cpu_shares
from tlog.analyze.text import ms, pct


@dataclass(frozen=True)
class HostPolicy:
    """The limits of the findings on the recording thread's CPU time:
    ``host_bound`` and ``blocked_in_compute``."""

    #: CPU time of the recording thread over its wall time at which the thread is
    #: busy (host-bound). Source: DESIGN.md "cpu near dur"; 90% leaves room for
    #: the GIL hand-offs and short blocking calls every loop has.
    cpu_share: float = 0.90
    #: ... but only while the device is idle for a good part of the time: device
    #: seconds over wall seconds under this. Source: tlog's choice: a host thread
    #: spinning in ``cudaStreamSynchronize`` also burns CPU, with the device busy.
    max_device_share: float = 0.80
    #: ``blocked_in_compute``: the recording thread is off the CPU in its compute
    #: phases, beyond what the run's best worker shows, for this share of its wall
    #: time. Source: tlog's choice, the 20% of HIGH_SHARE: blocked time that
    #: large, hidden in compute, could have been the verdict's category; thread
    #: CPU time also misses short scheduler delays and GIL hand-offs, a few
    #: percent in a busy loop.
    blocked_margin: float = 0.20
    #: ... a warning from this share (most of the "compute" then is not compute).
    #: Source: tlog's choice, twice ``blocked_margin``.
    blocked_warn: float = 0.40
    #: How many phases the ``blocked_in_compute`` and ``gpu_underused`` messages
    #: name. Source: tlog's choice (a line's worth).
    top_phases: int = 3
    #: ``blocked_in_compute``: the process fills its usable cores when its own CPU
    #: use (cores) is at least this share of them. Source: tlog's choice (nine in
    #: ten: the sampler's own reads and short idle gaps keep a busy process under 1).
    full_cores: float = 0.9


class HostBoundRule(Rule):
    """``host_bound`` (warning): the recording thread is busy (cpu near dur:
    ``HostPolicy.cpu_share``) on a worker with device work while the device
    idles (device time under ``HostPolicy.max_device_share`` of wall)."""

    code = Code.HOST_BOUND

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage with host-bound workers, in worker-table order."""
        out = []
        th = ctx.policies.host
        for w in ctx.workers.iter_rows(named=True):
            if not w["gpu_n"] or not w["cpu_dur"]:
                continue
            cpu_share = w["cpu"] / w["cpu_dur"]
            dev_share = (w["gpu"] or 0.0) / w["dur"] if w["dur"] else 0.0
            if cpu_share >= th.cpu_share and dev_share < th.max_device_share:
                out.append(Finding(
                    self.code, Severity.WARNING,
                    f"rank {w['rank']} of {w['stage']} is host-bound: its thread is on the CPU "
                    f"{pct(cpu_share)} of the time while the device is busy only {pct(dev_share)} "
                    f"(Python, kernel launches or data preparation on the training thread)",
                    {"stage": w["stage"], "rank": w["rank"], "worker": w["worker"],
                     "cpu_share": cpu_share, "device_share": dev_share}))
        return merge_ranks(out, figure=lambda ev: pct(ev["cpu_share"]))


class BlockedInComputeRule(Rule):
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
        wall``. From ``HostPolicy.blocked_margin`` of wall time: info
        (``blocked_warn``: warning). Names the worker's largest compute phases.
        Workers with device times are left out (a thread waiting in a synchronize
        is off the CPU with the device computing: ``host_bound`` covers them).

        Where the system samples carry the run-queue delay (``cpu_wait_s``,
        Linux; ``analyze.rules.machine.cpu_waits``), the wait for a core is
        measured, not inferred from peers: the blocked share is the time off
        the CPU in compute minus the run-queue share of wall time,
        ``max((1 - on_cpu) * busy / wall - run_queue, 0)``, against the same
        thresholds; ``cpu_contention`` reports the run-queue part. Blocked
        then means asleep, in I/O, on a lock, in a device sync or waiting for
        the GIL (CPython parks a thread that waits for it: it is not
        runnable, so it is blocking, not CPU contention, even when the
        process's own threads fill every core). When the process itself
        uses at least ``HostPolicy.full_cores`` of its usable cores, the message
        says so: its own threads hold the cores, and the blocking may be
        waits for the GIL or for them.

        Without run-queue figures, a worker that ``cpu_contention`` reports
        as a guess (off the CPU on a crowded machine) is left to it: the same
        figure, its cause unknown.

        In a stage of two or more ranks whose collective wait is not measured
        (no lockstep found, or only inferred), the message adds that the rank
        may be waiting for a peer at a collective inside a compute phase, and
        that ``rec.watch_ddp`` measures it. Several ranks of a stage are one
        finding listing them.

        Known limits: without run-queue figures, a run whose every worker
        blocks alike in compute shows nothing, and a lone loop on a machine
        with more busy threads than cores, recorded without system samples,
        is reported (the message names that cause too).
        """

    code = Code.BLOCKED_IN_COMPUTE

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage with blocked workers, in worker-table order."""
        analysis, workers, th = ctx.analysis, ctx.workers, ctx.policies.host
        guessed = {c["w"]["wid"] for c in contention(ctx) if c["guess"]}
        measured = {c["w"]["wid"]: c for c in cpu_waits(ctx)}
        figures = [(f["w"], f["n"], f["wall"], f["busy"], f["on_cpu"])
                   for f in on_cpu_shares(analysis, workers) if not f["w"]["gpu_n"]]
        if not figures:
            return []
        ref_w, ref = None, 1.0
        if len(figures) >= 2:
            best = max(figures, key=lambda f: f[4])
            ref_w, ref = best[0], best[4]
        names = analysis.data.phase_names
        # Data-parallel stages whose collective wait is not measured: a rank blocked
        # in compute may be waiting for a peer inside the phase holding the collective
        # (rank 1's extra work inside backward, ddp=False: rank 0 on the CPU
        # 32% of its compute time, read as blocking with no word of the peer).
        ranks = {st.stage: st.workers for st in ctx.stages}
        lock = ctx.lockstep
        measured_sync = {st.stage: not st.inferred_in(st.phase)
                         for st in (lock.stages if lock else [])}
        out = []
        for w, n, wall, busy, on_cpu in figures:
            if w["wid"] in guessed:
                continue      # cpu_contention's guess: the same figure
            m = measured.get(w["wid"])
            q = None if m is None else m["run_queue"]
            if q is not None:   # measured: the wait for a core is not blocking
                excess = max((1 - on_cpu) * busy / wall - q, 0.0)
            else:
                excess = (1 - on_cpu / ref) * busy / wall if ref > 0 else 0.0
            if excess < th.blocked_margin - EPS:
                continue
            top = (analysis.phases.filter((pl.col("wid") == w["wid"]) & (pl.col("compute_s") > 0))
                   .group_by("pid").agg(pl.col("compute_s").sum())
                   .sort(["compute_s", "pid"], descending=[True, False]).head(th.top_phases))
            phases = [{"phase": names[r["pid"]], "seconds_per_iter": r["compute_s"] / w["n"]}
                      for r in top.iter_rows(named=True)]
            listed = ", ".join(f"{p['phase']} ({ms(p['seconds_per_iter'])})" for p in phases)
            peer = ("" if ref_w is None or q is not None else
                    f" (rank {ref_w['rank']} of {ref_w['stage']}: {pct(ref)})")
            if q is not None:
                peer += (f"; it waited for a core {pct(q)} of its time (the run-queue delay): "
                         f"the rest is blocking (a sleep, I/O, a lock, the GIL, a device sync), "
                         f"not CPU contention")
                if m["cores"] is not None and m["ncpu"] and m["cores"] >= th.full_cores * m["ncpu"]:
                    peer += (f"; the process itself uses {m['cores']:.2f} of its {m['ncpu']} "
                             f"usable core{'s' if m['ncpu'] != 1 else ''}: its own threads "
                             f"hold them (waits for the GIL count here)")
            sev = Severity.WARNING if excess >= th.blocked_warn - EPS else Severity.INFO
            msg = (f"rank {w['rank']} of {w['stage']} is blocked (off the CPU) in phases counted as "
                   f"compute for {pct(excess)} of its time ({ms(excess * wall / n)} per iteration): "
                   f"its thread is on the CPU {pct(on_cpu)} of its compute time{peer}"
                   + (f"; largest compute phases {listed}" if listed else "")
                   + "; if one of them waits (I/O, queue, lock), mark it kind='starvation' "
                     "(it.phase(name, kind=...), or phase_kinds in run.json and tlog ingest the "
                     "run again)"
                   + ("" if q is not None else
                      "; else the thread lacks a CPU (more busy threads than cores)"))
            if ranks.get(w["stage"], 0) >= 2 and not measured_sync.get(w["stage"], False):
                msg += (f"; with {ranks[w['stage']]} ranks in {w['stage']} it may also wait for "
                        f"a peer at a collective inside a compute phase (DDP's all-reduce "
                        f"runs inside backward): rec.watch_ddp(model) measures that wait")
            out.append(Finding(self.code, sev, msg,
                               {"stage": w["stage"], "rank": w["rank"], "worker": w["worker"],
                                "iterations": n, "excess_share": excess,
                                "blocked_s_per_iter": excess * wall / n,
                                "on_cpu_share": on_cpu,
                                "reference_on_cpu_share": 1.0 if q is not None else ref,
                                "reference_worker": (None if ref_w is None or q is not None
                                                     else ref_w["worker"]),
                                "run_queue_share": q,
                                "process_cpu_cores": None if m is None else m["cores"],
                                "wait_share": 1 - busy / wall, "phases": phases}))
        return merge_ranks(out, figure=lambda ev: pct(ev["excess_share"]))
