"""Lockstep: where the ranks of a data-parallel stage wait for each other.

In data-parallel lockstep (DDP, FSDP, an explicit all-reduce) every rank
leaves a collective at about the same wall-clock moment, so a rank that
arrives early waits inside whatever phase holds the collective: DDP runs the
gradient all-reduce inside ``loss.backward()``, and the wait sits in the
rank's own ``backward`` (a compute phase by its name). This module finds
that phase from what the logs carry and splits the wait out.

**End times on a common clock.** Per rank and iteration the logs give the
wall-clock start ``ts`` and the top-level phases in the order they ran
(``seq``) with their host durations; ``ts + cumulative durations`` estimates
each phase's end. *Assumption*: phases follow each other without gaps (the
unaccounted time of an iteration is taken to lie after its last phase); the
iteration's end ``ts + dur`` is a boundary of its own. Iterations are
matched across ranks by ``iter`` (data-parallel ranks run the same step
numbers); an iteration missing on any rank, or logged with another phase
sequence, is left out of both the detection and the split.

**Clocks.** Ranks on one host read one wall clock. Across hosts the clocks
may differ (NTP keeps them within milliseconds; a badly synced pair by far
more), so an offset per host is estimated from the data, never assumed zero:
at a candidate boundary, each rank's median over iterations of its
difference from the ranks' median end time, averaged over the ranks of its
host. A worker whose host is unknown has a clock of its own.

**Alignment test** (per stage with two or more workers). At each boundary
``b`` (iteration start, end of each top-level phase, iteration end) the
*spread* ``s_b`` is the median over matched iterations of the range across
ranks (max - min) of the offset-corrected end times. A collective phase
receives the ranks apart and lets them go together: its *arrival* spread
(the boundary before it) is large and its *exit* spread (its end) small.
A phase (of category compute or sync) or the unaccounted tail of the
iteration holds the collective when

- arrival spread >= :data:`ALIGN_MIN_ARRIVAL` x the median iteration time
  (the ranks arrive measurably apart: there is a wait to find),
- exit spread <= :data:`ALIGN_MAX_EXIT` x the median iteration time, and
- exit spread <= arrival spread / :data:`ALIGN_CONTRAST` (far smaller).

Among such candidates the one with the highest contrast ``arrival /
max(exit, ALIGN_EXIT_FLOOR x median iteration)`` wins; within 1% of it, the
one needing the smallest clock offsets (a host pair whose clocks differ by
exactly a rank's extra work is less likely than synced clocks).

**The wait.** For iteration ``i`` and the collective phase ``p``, rank
``r``'s wait is ``w_{r,i} = d_{r,i} - min_r' d_{r',i}`` (clipped at 0): the
rank that arrived last has the shortest collective phase, and that minimum
is the collective itself, which stays where it is (in the phase's
category). ``w`` moves from the phase's compute (or from unaccounted time)
into sync (``analyze.frames``), so each rank's own work excludes it.

**Measured wins.** When the phase is itself a sync phase (a timed
collective) or holds a *carved child* of category sync (the shim's DDP
communication hook records ``backward/ddp_allreduce_wait``; see
``analyze.attribution``), its wait is measured and nothing is inferred:
``method`` is ``"measured"``.

**Known limit.** When a rank's own extra work lies inside the very phase that
holds the collective (a slow backward whose all-reduce runs at its end),
every rank's phase ends together *and* starts together: the durations are
equal and tell nothing; that straggler is invisible here (the measured hook
sees it: the peers' measured waits grow).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from analyze.attribution import carved_children
from analyze.load import COMPUTE, SYNC, RunData

#: The ranks must arrive at the collective at least this share of the median
#: iteration time apart (median over iterations of the range across ranks):
#: below it there is no wait worth carving. Source: tlog's choice (half a percent of a
#: step is within run-to-run noise on a shared machine).
ALIGN_MIN_ARRIVAL = 0.005
#: ... and leave it within this share of the median iteration time. Source:
#: tlog's choice: ranks leave a collective together to well under a
#: millisecond on one machine; 5% leaves room for a loaded host's scheduler.
ALIGN_MAX_EXIT = 0.05
#: ... and the exit spread must be at most the arrival spread over this
#: ("far smaller"). Source: tlog's choice.
ALIGN_CONTRAST = 3.0
#: Exit spreads below this share of the median iteration time count as this
#: much when candidates are ranked (the clocks' and timers' resolution).
#: Source: tlog's choice.
ALIGN_EXIT_FLOOR = 0.001
#: Fewest iterations matched across every rank of a stage to look for
#: alignment. Source: tlog's choice (a median of 8 shrugs off 3 outliers).
ALIGN_MIN_ITERS = 8
#: The detection reads at most this many matched iterations, evenly spaced
#: (the split itself uses all): it keeps diagnose's 1M-iteration budget.
ALIGN_SAMPLE = 4096

#: The words every text adds to a figure that rests on the inferred wait.
INFERRED_WORDS = "inferred from rank alignment"

METHOD_INFERRED = "inferred"
METHOD_MEASURED = "measured"


@dataclass(frozen=True)
class Lockstep:
    """Where one stage's ranks wait for each other.

    Attributes:
        stage: the stage.
        phase: the phase holding the collective, or None when the ranks align
            at the iteration's end after the last phase (the wait was in
            unaccounted time).
        pid: index of ``phase`` in ``RunData.phase_names`` (-1 for None).
        method: ``"inferred"`` (from rank alignment, carved into sync) or
            ``"measured"`` (the phase is a sync phase or holds a sync child).
        iterations: iterations matched across all ranks (logged by every rank
            with the same phases).
        arrival_spread_s: median range across ranks of the arrival time at
            the phase (seconds, offset-corrected).
        exit_spread_s: the same at its end.
        clock_offsets_s: estimated clock offset of each host against the
            first worker's host (seconds; ``"?<worker>"`` for an unknown host).
        wait_s_per_iter: mean wait per steady iteration of each rank
            (seconds): the inferred wait, or the measured sync time of the
            phase (and its sync children).
        wids: the stage's worker indices.
    """

    stage: str
    phase: str | None
    pid: int
    method: str
    iterations: int
    arrival_spread_s: float
    exit_spread_s: float
    clock_offsets_s: dict[str, float]
    wait_s_per_iter: dict[int, float] = field(default_factory=dict)
    wids: tuple[int, ...] = ()

    @property
    def inferred(self) -> bool:
        """Whether the wait was inferred from rank alignment (not measured)."""
        return self.method == METHOD_INFERRED

    @property
    def where(self) -> str:
        """The phase, or ``(end of iteration)`` for unaccounted time."""
        return self.phase if self.phase is not None else "(end of iteration)"

    def to_dict(self) -> dict:
        """JSON form (``stages[].lockstep``)."""
        return {"phase": self.phase, "method": self.method, "iterations": self.iterations,
                "arrival_spread_s": self.arrival_spread_s,
                "exit_spread_s": self.exit_spread_s,
                "clock_offsets_s": dict(self.clock_offsets_s),
                "wait_s_per_iter": {str(r): w for r, w in sorted(self.wait_s_per_iter.items())}}


@dataclass
class LockstepResult:
    """Lockstep of every stage of a run.

    Attributes:
        stages: the stages found in lockstep.
        wait: float64 per iteration row (``RunAnalysis.iterations`` order):
            the inferred collective wait carved into sync (0 elsewhere).
        phase_pid: int32 per iteration row: the pid of the phase the wait is
            carved from, -1 for unaccounted time (or no wait).
        notes: why a stage with two or more workers could not be checked.
    """

    stages: list[Lockstep]
    wait: np.ndarray
    phase_pid: np.ndarray
    notes: list[str] = field(default_factory=list)

    def of(self, stage: str) -> Lockstep | None:
        """The lockstep of ``stage``, or None."""
        return next((s for s in self.stages if s.stage == stage), None)


def _top_tuple(data: RunData) -> dict[int, tuple[tuple[str, ...], np.ndarray, np.ndarray]]:
    """Per layout: its top-level phase names, their positions and categories."""
    out = {}
    for lid, lay in data.layouts.items():
        pos = np.flatnonzero(lay.top)
        out[lid] = (tuple(data.phase_names[lay.pid[p]] for p in pos), pos, lay.cat[pos])
    return out


def matched_rows(iters: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Iteration numbers present in every array of ``iters`` (each sorted
    ascending) and, per array, the index of each of them in it."""
    common = iters[0]
    for x in iters[1:]:
        common = np.intersect1d(common, x, assume_unique=False)
    return common, [np.searchsorted(x, common) for x in iters]


def _spreads(x: np.ndarray, groups: np.ndarray, at: int | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """Spread at every boundary of ``x`` (R, m, B) after correcting each host
    group's clock by its offset estimated at boundary ``at`` (None: one host,
    no correction). Returns (spreads (B,), offsets per rank (R,))."""
    r = x.shape[0]
    off = np.zeros(r)
    if at is not None:
        col = x[:, :, at]
        diff = np.median(col - np.median(col, axis=0), axis=1)
        for g in np.unique(groups):
            off[groups == g] = diff[groups == g].mean()
        off -= off[0]
        x = x - off[:, None, None]
    rng = x.max(axis=0) - x.min(axis=0)
    return np.median(rng, axis=0), off


def find_lockstep(data: RunData, it: pl.DataFrame, slices: list[tuple[int, int, int]],
                  all_phases: pl.DataFrame, hosts: dict[int, str | None] | None = None
                  ) -> LockstepResult:
    """Find each stage's collective phase and the inferred waits (module docstring).

    Args:
        data: the loaded run.
        it: the iteration frame in ``data.iterations`` order with ``steady``.
        slices: ``(wid, start, end)`` of each worker's rows.
        all_phases: per-phase sums (``RunAnalysis.all_phases``), for the
            measured waits reported.
        hosts: host of each worker (None: from ``data.hosts``).
    """
    n_rows = it.height
    wait = np.zeros(n_rows)
    phase_pid = np.full(n_rows, -1, dtype=np.int32)
    result = LockstepResult([], wait, phase_pid)
    if data.workers.height < 2 or not data.layouts:
        return result
    hosts = data.hosts if hosts is None else hosts
    stage_of = dict(zip(data.workers["wid"].to_list(), data.workers["stage"].to_list(),
                        strict=True))
    rank_of = dict(zip(data.workers["wid"].to_list(), data.workers["rank"].to_list(),
                       strict=True))
    by_stage: dict[str, list[tuple[int, int, int]]] = {}
    for wid, a, b in slices:
        by_stage.setdefault(stage_of[wid], []).append((wid, a, b))
    tops = _top_tuple(data)
    layout = it["layout"].fill_null(-1).to_numpy()
    iters_all = it["iter"].to_numpy()
    steady_all = it["steady"].to_numpy()
    ts_all = it["ts"].to_numpy()
    dur_all = it["dur"].to_numpy()
    src_all = it["src"].to_numpy()
    t = data.times
    for stage, ws in by_stage.items():
        if len(ws) < 2:
            continue
        found = _stage(stage, ws, tops, layout, iters_all, steady_all, ts_all, dur_all,
                       src_all, t, data, hosts, result)
        if found is None:
            continue
        lock, rows, w = found
        if lock.inferred:
            wait[rows] = w
            phase_pid[rows] = lock.pid
            steady = steady_all[rows]
            per_rank = {rank_of[wid]: float(w[j][steady[j]].mean()) if steady[j].any() else 0.0
                        for j, wid in enumerate(lock.wids)}
        else:
            per_rank = _measured_waits(data, all_phases, lock, rank_of, it)
        result.stages.append(replace(lock, wait_s_per_iter=per_rank))
    return result


def _measured_waits(data: RunData, all_phases: pl.DataFrame, lock: Lockstep,
                    rank_of: dict[int, int], it: pl.DataFrame) -> dict[int, float]:
    """Sync seconds per steady iteration of the collective phase and its sync
    children, per rank."""
    prefix = f"{lock.phase}/"
    pids = [i for i, n in enumerate(data.phase_names)
            if i == lock.pid or (n.startswith(prefix) and "/" not in n[len(prefix):])]
    steady_n = dict(it.filter("steady").group_by("wid").agg(pl.len()).iter_rows())
    sums = dict(all_phases.filter(pl.col("wid").is_in(list(lock.wids)) & pl.col("counted")
                                  & pl.col("pid").is_in(pids) & pl.col("part").is_not_null())
                .group_by("wid").agg(pl.col("sync_s").sum()).iter_rows())
    return {rank_of[w]: (float(sums.get(w, 0.0)) / steady_n[w] if steady_n.get(w) else 0.0)
            for w in lock.wids}


def _stage(stage: str, ws: list[tuple[int, int, int]], tops: dict, layout: np.ndarray,
           iters_all: np.ndarray, steady_all: np.ndarray, ts_all: np.ndarray,
           dur_all: np.ndarray, src_all: np.ndarray, t, data: RunData,
           hosts: dict[int, str | None], result: LockstepResult
           ) -> tuple[Lockstep, np.ndarray, np.ndarray] | None:
    """One stage's lockstep: (Lockstep, iteration rows (R, n), waits (R, n)) or None."""
    wanted = None
    per_worker = []
    for wid, a, b in ws:
        lays = layout[a:b]
        lays = lays[lays >= 0]
        if len(lays) == 0:
            return None
        values, counts = np.unique(lays, return_counts=True)
        names = tops[int(values[np.argmax(counts)])][0] if int(values[np.argmax(counts)]) in tops \
            else None
        if names is None or not names:
            return None
        if wanted is None:
            wanted = names
        elif names != wanted:
            result.notes.append(
                f"stage {stage}: its ranks log different phase sequences, so where they wait "
                f"for each other (lockstep) was not looked for")
            return None
        ok_lays = [lid for lid, (nm, _, _) in tops.items() if nm == wanted]
        ok = np.isin(layout[a:b], ok_lays)
        per_worker.append((wid, a, ok))
    common, idx = matched_rows([iters_all[a:a + len(ok)][ok] for _, a, ok in per_worker])
    if len(common) < ALIGN_MIN_ITERS:
        result.notes.append(
            f"stage {stage}: only {len(common)} iterations were logged by every rank with the "
            f"same phases (want {ALIGN_MIN_ITERS}), so where its ranks wait for each other "
            f"(lockstep) was not looked for")
        return None
    rows = np.stack([a + np.flatnonzero(ok)[ix] for (_, a, ok), ix in zip(per_worker, idx,
                                                                         strict=True)])
    k = len(wanted)
    # Host seconds of the top-level phases, (R, n, K), gathered layout by layout.
    host = np.zeros((*rows.shape, k))
    lay_rows = layout[rows]
    for lid in np.unique(lay_rows):
        pos = tops[int(lid)][1]
        m = lay_rows == lid
        src = src_all[rows[m]]
        start = t.host_start[src][:, None] + pos[None, :]
        inside = pos[None, :] < t.length[src][:, None]
        host[m] = np.where(inside, t.host[np.where(inside, start, 0)], 0.0)
    cats = tops[int(lay_rows.flat[0])][2]
    ts, dur = ts_all[rows], dur_all[rows]
    steady = steady_all[rows].all(axis=0)
    sample = np.flatnonzero(steady) if steady.sum() >= ALIGN_MIN_ITERS else np.arange(rows.shape[1])
    if len(sample) > ALIGN_SAMPLE:
        sample = sample[np.linspace(0, len(sample) - 1, ALIGN_SAMPLE).astype(np.int64)]
    hs, tss, ds = host[:, sample], ts[:, sample], dur[:, sample]
    # Boundaries: start, end of each phase, iteration end -> (R, m, K + 2).
    x = np.concatenate([tss[:, :, None], tss[:, :, None] + np.cumsum(hs, axis=2),
                        (tss + ds)[:, :, None]], axis=2)
    med_iter = float(np.median(ds))
    if not med_iter > 0:
        return None
    wids = [wid for wid, _, _ in ws]
    host_names = [hosts.get(w) or f"?{w}" for w in wids]
    _, groups = np.unique(host_names, return_inverse=True)
    one_clock = len(set(host_names)) == 1
    base_spread, base_off = _spreads(x, groups, None) if one_clock else (None, None)
    candidates = []
    for c in range(1, k + 2):            # boundary c ends phase c-1 (c = k + 1: the iteration)
        if c <= k and cats[c - 1] not in (COMPUTE, SYNC):
            continue
        spread, off = (base_spread, base_off) if one_clock else _spreads(x, groups, c)
        arrival, exit_ = float(spread[c - 1]), float(spread[c])
        if not (arrival >= ALIGN_MIN_ARRIVAL * med_iter and exit_ <= ALIGN_MAX_EXIT * med_iter
                and exit_ * ALIGN_CONTRAST <= arrival):
            continue
        score = arrival / max(exit_, ALIGN_EXIT_FLOOR * med_iter)
        candidates.append((score, float(np.abs(off).max()), c, arrival, exit_, off))
    if not candidates:
        return None
    best = max(s for s, *_ in candidates)
    score, _, c, arrival, exit_, off = min((cd for cd in candidates if cd[0] >= 0.99 * best),
                                           key=lambda cd: (cd[1], cd[2]))
    at_end = c == k + 1
    pid = -1
    phase = None
    method = METHOD_INFERRED
    if not at_end:
        phase = wanted[c - 1]
        pid = data.phase_names.index(phase)
        measured_child = any(
            data.layouts[int(lid)].cat[ch] == SYNC
            for lid in np.unique(lay_rows)
            for ch, par in carved_children(data.layouts[int(lid)], data.phase_names)
            if data.phase_names[data.layouts[int(lid)].pid[par]] == phase)
        if cats[c - 1] == SYNC or measured_child:
            method = METHOD_MEASURED
    if at_end:
        d = np.maximum(dur - host.sum(axis=2), 0.0)
    else:
        d = host[:, :, c - 1]
    w = np.maximum(d - d.min(axis=0), 0.0)
    offsets = {}
    for name, o in zip(host_names, off, strict=True):
        offsets.setdefault(name, float(o))
    lock = Lockstep(stage=stage, phase=phase, pid=pid, method=method,
                    iterations=int(rows.shape[1]), arrival_spread_s=arrival,
                    exit_spread_s=exit_, clock_offsets_s=offsets, wids=tuple(wids))
    return lock, rows, w
