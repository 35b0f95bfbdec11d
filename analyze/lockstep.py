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
iteration's end ``ts + dur`` is a boundary of its own (see "Untimed time"
for when the ranks' unaccounted seconds differ). Each iteration is
read in its own phase order (a trace may log ``collective_wait`` before or
after ``after_backward`` from one step to the next). Iterations are matched
across ranks by ``iter`` (data-parallel ranks run the same step numbers;
a rank on the same host as another whose numbers are a constant 1-3 off,
a logger counting from 1, is matched by time instead: ``_iter_shifts``); an
iteration missing on any rank is left out of both the detection and the
split, and a phase is judged (and split) only in the iterations where every
rank has it.

**Clocks.** Ranks on one host read one wall clock. Across hosts the clocks
may differ (NTP keeps them within milliseconds; a badly synced pair by far
more), so an offset per host is estimated from the data, never assumed zero:
at a candidate boundary, each rank's median over iterations of its
difference from the ranks' median end time, averaged over the ranks of its
host. A worker whose host is unknown has a clock of its own.

**Alignment test** (per stage with two or more workers). At a boundary
(the start or end of a top-level phase, the end of the last phase, the
iteration's end) the *spread* is the median over matched iterations of the
range across ranks (max - min) of the offset-corrected times. A collective
phase receives the ranks apart and lets them go together: its *arrival*
spread (its start) is large and its *exit* spread (its end) small. For the
iteration's unaccounted tail, arrival is the end of the last phase and exit
``ts + dur`` (a collective timed by no phase).
A phase (of category compute or sync) or the unaccounted tail of the
iteration holds a collective when

- arrival spread >= :data:`ALIGN_MIN_ARRIVAL` x the median iteration time
  (the ranks arrive measurably apart: there is a wait to find),
- exit spread <= :data:`ALIGN_MAX_EXIT` x the median iteration time, and
- exit spread <= arrival spread / :data:`ALIGN_CONTRAST` (far smaller).

Every phase that passes holds a collective (DDP broadcasts buffers at the
start of ``forward`` and all-reduces gradients in ``backward``: both align
the ranks). With several hosts the offsets are estimated at each candidate
boundary; those of the candidate with the highest contrast ``arrival /
max(exit, ALIGN_EXIT_FLOOR x median iteration)`` are kept (within 1% of it,
the one needing the smallest offsets: clocks differing by exactly a rank's
extra work are less likely than synced ones), and every phase is judged
with them.

**Untimed time.** The logs carry durations only, so where in the iteration
its unaccounted seconds ``u = dur - sum of top-level phases`` lie is unknown.
When ``u`` differs across ranks (its spread at least ``ALIGN_MIN_ARRIVAL``),
every phase is also tested with boundaries anchored at the iteration's end
(``ts + dur`` - the phases after: ``u`` assumed before the first phase, every
boundary ``u`` later). A rank running 100 ms of untimed code between
``forward`` and ``backward`` arrives late at backward's all-reduce: read
from the start its backward ends 100 ms early, backward fails the exit test,
and the tail after the last phase "aligns" (that rank waiting for its peers:
the roles inverted); read from the end backward aligns. The converse run
(a collective after the last phase, timed by no phase, and a slow forward)
is the mirror image: the tail aligns from the start, ``forward`` from the
end. The data cannot tell the two apart; the rule (tlog's choice): a phase
that aligns under either anchoring is a collective; when the tail aligns
and some phase aligns only from the end, the reading whose waits summed over
the ranks are larger is kept, i.e. the one in which fewer ranks are slow
(one straggler among waiting peers is the common case, one rank waiting for
all others the rare one); a tie keeps the named phase. A note says which
reading was taken. The waits themselves are durations (below) and do not
depend on the anchoring; ``Collective.anchor`` records it.

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
from tlog.analyze.attribution import carved_children, layout_ids
from tlog.analyze.load import COMPUTE, SYNC, RunData

from dflash_runtime.format import is_p2p_wait

#: The ranks must arrive at the collective at least this share of the median
#: iteration time apart (median over iterations of the range across ranks):
#: below it there is no wait worth carving. Source: tlog's choice (half a percent of a
#: step is within run-to-run noise on a shared machine).
ALIGN_MIN_ARRIVAL = 0.005
#: ... and leave it within this share of the median iteration time. Source:
#: tlog's choice: ranks leave a collective together to well under a
#: millisecond on an idle machine; on a loaded one (2 gloo ranks on 2 shared
#: cores, tests/ddp) the end of DDP's forward, whose buffer broadcast is at its
#: start, spread 10-12 ms of 220-250 ms steps. The contrast test below is the
#: sharper one.
ALIGN_MAX_EXIT = 0.10
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

#: Largest constant by which a rank's iteration numbers may differ from those
#: of another rank on its host and still be matched by time (``_iter_shifts``):
#: a logger counting from 1, or after ``step += 1``. Source: tlog's choice.
ITER_SHIFT_MAX = 3
#: ... and the shifted match's median start difference must be under this share
#: of the unshifted one's. Source: tlog's choice (ranks in lockstep start within
#: a collective's exit spread; one iteration apart is a whole step).
ITER_SHIFT_CONTRAST = 0.25

#: The words every text adds to a figure that rests on the inferred wait.
INFERRED_WORDS = "inferred from rank alignment"

METHOD_INFERRED = "inferred"
METHOD_MEASURED = "measured"
#: Phase boundaries estimated from the iteration's start (``ts`` + the phases
#: before), or from its end (``ts + dur`` - the phases after).
ANCHOR_START = "start"
ANCHOR_END = "end"


@dataclass(frozen=True)
class Collective:
    """One phase (or the iteration's unaccounted tail) where the ranks align.

    Attributes:
        phase: the phase, or None for the time after the last phase.
        pid: index of ``phase`` in ``RunData.phase_names`` (-1 for None).
        method: ``"inferred"`` (from rank alignment, carved into sync) or
            ``"measured"`` (a sync phase, or a phase holding a sync child).
        arrival_spread_s: median range across ranks of the (offset-corrected)
            arrival time at it, seconds.
        exit_spread_s: the same at its end.
        wait_s_per_iter: mean wait per steady iteration of each rank, seconds
            (inferred: the carved wait; measured: the sync seconds of the
            phase and its sync children).
        anchor: how its boundaries were placed: ``"start"`` (``ts`` + the
            phases before: untimed time after the last phase) or ``"end"``
            (``ts + dur`` - the phases after: untimed time before the first).
    """

    phase: str | None
    pid: int
    method: str
    arrival_spread_s: float
    exit_spread_s: float
    wait_s_per_iter: dict[int, float] = field(default_factory=dict)
    anchor: str = ANCHOR_START

    @property
    def where(self) -> str:
        """The phase, or ``(end of iteration)`` for unaccounted time."""
        return self.phase if self.phase is not None else "(end of iteration)"

    def to_dict(self) -> dict:
        """JSON form (``stages[].lockstep.collectives`` items)."""
        return {"phase": self.phase, "method": self.method,
                "arrival_spread_s": self.arrival_spread_s, "exit_spread_s": self.exit_spread_s,
                "anchor": self.anchor,
                "wait_s_per_iter": {str(r): w for r, w in sorted(self.wait_s_per_iter.items())}}


@dataclass(frozen=True)
class Lockstep:
    """Where one stage's ranks wait for each other.

    Attributes:
        stage: the stage.
        collectives: every phase where its ranks align (module docstring),
            the one holding the most wait first (DDP's forward buffer
            broadcast and its backward all-reduce are two; FSDP has more).
        iterations: iterations matched across all ranks (logged by every rank
            with the same phases).
        clock_offsets_s: estimated clock offset of each host against the
            first worker's host (seconds; ``"?<wid>"`` for an unknown host).
        wids: the stage's worker indices.
        iter_shifts: per worker index, the constant subtracted from its
            iteration numbers to match its peers' (``_iter_shifts``; absent: 0).
    """

    stage: str
    collectives: tuple[Collective, ...]
    iterations: int
    clock_offsets_s: dict[str, float]
    wids: tuple[int, ...] = ()
    iter_shifts: dict[int, int] = field(default_factory=dict)

    @property
    def primary(self) -> Collective:
        """The collective phase holding the most wait."""
        return self.collectives[0]

    @property
    def phase(self) -> str | None:
        """The primary collective's phase (None: the iteration's unaccounted tail)."""
        return self.primary.phase

    @property
    def method(self) -> str:
        """``"inferred"`` when any wait of the stage is inferred, else ``"measured"``."""
        return (METHOD_INFERRED if any(c.method == METHOD_INFERRED for c in self.collectives)
                else METHOD_MEASURED)

    @property
    def inferred(self) -> bool:
        """Whether some wait was inferred from rank alignment (not measured)."""
        return self.method == METHOD_INFERRED

    def inferred_in(self, phase: str | None) -> bool:
        """Whether the wait the texts name at ``phase`` is inferred: that of the
        collective in ``phase``, else the primary's. A measured wait in backward is
        never called inferred because a second, inferred collective of a few
        milliseconds was found elsewhere (e.g. 2 ms of untimed loss code after
        the last phase that aligned as one collective)."""
        c = next((c for c in self.collectives if c.phase == phase), self.primary)
        return c.method == METHOD_INFERRED

    @property
    def where(self) -> str:
        """The primary collective's phase, for texts."""
        return self.primary.where

    @property
    def wait_s_per_iter(self) -> dict[int, float]:
        """Each rank's wait per steady iteration over all collectives, seconds."""
        out: dict[int, float] = {}
        for c in self.collectives:
            for r, w in c.wait_s_per_iter.items():
                out[r] = out.get(r, 0.0) + w
        return out

    def to_dict(self) -> dict:
        """JSON form (``stages[].lockstep``)."""
        return {"phase": self.phase, "method": self.method, "iterations": self.iterations,
                "clock_offsets_s": dict(self.clock_offsets_s),
                "wait_s_per_iter": {str(r): w for r, w in sorted(self.wait_s_per_iter.items())},
                "collectives": [c.to_dict() for c in self.collectives]}


@dataclass
class LockstepResult:
    """Lockstep of every stage of a run.

    Attributes:
        stages: the stages found in lockstep.
        carves: the inferred waits to move into sync: ``(rows, pid, wait)``
            with iteration rows (``RunAnalysis.iterations`` order), the pid of
            the phase they come out of (-1: unaccounted time) and the seconds.
        notes: why a stage with two or more workers could not be checked.
        tested: the stages the alignment test ran on (two or more workers with
            phases and :data:`ALIGN_MIN_ITERS` iterations logged by every rank),
            found in lockstep or not: a tested stage not in :attr:`stages` has
            independent workers.
    """

    stages: list[Lockstep]
    carves: list[tuple[np.ndarray, int, np.ndarray]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tested: set[str] = field(default_factory=set)

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
    ascending) and, per array, the index of each of them in it (the first
    when a number repeats). Binary searches on the sorted arrays, no hashing
    (a run of contiguous step numbers, the usual case, is one slice)."""
    if any(len(x) == 0 for x in iters):
        return np.empty(0, dtype=np.int64), [np.empty(0, dtype=np.int64) for _ in iters]
    contiguous = all(int(x[-1] - x[0]) == len(x) - 1 and bool((np.diff(x) == 1).all())
                     for x in iters)
    if contiguous:
        lo, hi = max(int(x[0]) for x in iters), min(int(x[-1]) for x in iters)
        if hi < lo:
            return np.empty(0, dtype=np.int64), [np.empty(0, dtype=np.int64) for _ in iters]
        return (np.arange(lo, hi + 1, dtype=np.int64),
                [np.arange(lo - int(x[0]), hi - int(x[0]) + 1) for x in iters])
    common = np.unique(iters[0])
    for x in iters[1:]:
        i = np.searchsorted(x, common)
        common = common[(i < len(x)) & (x[np.minimum(i, len(x) - 1)] == common)]
    return common, [np.searchsorted(x, common) for x in iters]


def pp_stages(data: RunData, it: pl.DataFrame, slices: list[tuple[int, int, int]]
              ) -> frozenset[str]:
    """The pipeline-parallel stages of a run (module docstring, "Which stages").

    ``it`` is the iteration frame in ``data.iterations`` order with ``layout``
    and ``steady``; ``slices`` are ``(wid, start, end)`` of each worker's rows."""
    p2p_pids = {i for i, name in enumerate(data.phase_names) if is_p2p_wait(name)}
    if not p2p_pids or not data.layouts:
        return frozenset()
    with_p2p = {lid for lid, lay in data.layouts.items()
                if p2p_pids.intersection(lay.pid.tolist())}
    layout = it["layout"].to_numpy()
    steady = it["steady"].to_numpy()
    stage_of = dict(zip(data.workers["wid"].to_list(), data.workers["stage"].to_list(),
                        strict=True))
    has: dict[str, list[bool]] = {}
    for wid, a, b in slices:
        rows = layout[a:b][steady[a:b]]
        has.setdefault(stage_of[wid], []).append(
            bool(with_p2p.intersection(np.unique(rows).tolist())))
    return frozenset(s for s, flags in has.items() if len(flags) >= 2 and all(flags))


def find_lockstep(data: RunData, it: pl.DataFrame, slices: list[tuple[int, int, int]],
                  all_phases: pl.DataFrame, hosts: dict[int, str | None] | None = None
                  ) -> LockstepResult:
    """Find each stage's collective phase and the inferred waits (module docstring).

    The same as :func:`locate_lockstep` followed by :func:`measure_waits`.

    Args:
        data: the loaded run.
        it: the iteration frame in ``data.iterations`` order with ``steady``.
        slices: ``(wid, start, end)`` of each worker's rows.
        all_phases: per-phase sums (``RunAnalysis.all_phases``), for the
            measured waits reported.
        hosts: host of each worker (None: from ``data.hosts``).
    """
    return measure_waits(locate_lockstep(data, it, slices, hosts), data, it, all_phases)


@dataclass
class PendingLockstep:
    """What :func:`locate_lockstep` found, before the measured waits are summed
    (:func:`measure_waits`): the result (its stages' measured collectives
    without ``wait_s_per_iter`` yet, unsorted) and, per stage, its Lockstep."""

    result: LockstepResult
    found: list[Lockstep]


def locate_lockstep(data: RunData, it: pl.DataFrame, slices: list[tuple[int, int, int]],
                    hosts: dict[int, str | None] | None = None,
                    skip: frozenset[str] = frozenset()) -> PendingLockstep:
    """The part of :func:`find_lockstep` that reads the host phase times
    (``data.times.host``): which phase each stage's ranks wait in, and the
    inferred waits (``carves``). It needs no attribution, so ``diagnose`` runs
    it before the walk, which then frees the host times as it passes them
    (memory at scale). Arguments as :func:`find_lockstep`'s;
    ``skip``: stages left untested, the pipeline-parallel ones (:func:`pp_stages`:
    their ranks are not replicas whose phases align)."""
    result = LockstepResult([])
    pending = PendingLockstep(result, [])
    if data.workers.height < 2 or not data.layouts:
        return pending
    hosts = data.hosts if hosts is None else hosts
    stage_of = dict(zip(data.workers["wid"].to_list(), data.workers["stage"].to_list(),
                        strict=True))
    rank_of = dict(zip(data.workers["wid"].to_list(), data.workers["rank"].to_list(),
                       strict=True))
    by_stage: dict[str, list[tuple[int, int, int]]] = {}
    for wid, a, b in slices:
        by_stage.setdefault(stage_of[wid], []).append((wid, a, b))
    tops = _top_tuple(data)
    cols = {"layout": layout_ids(it["layout"]), "iter": it["iter"].to_numpy(),
            "steady": it["steady"].to_numpy(), "ts": it["ts"].to_numpy(),
            "dur": it["dur"].to_numpy(), "src": it["src"].to_numpy()}
    for stage, ws in by_stage.items():
        if len(ws) < 2 or stage in skip:
            continue
        found = _stage(stage, ws, tops, cols, data, hosts, result)
        if found is None:
            continue
        lock, rows, found_waits = found
        steady = cols["steady"][rows]
        done = []
        for col, w in zip(lock.collectives, found_waits, strict=True):
            if col.method == METHOD_INFERRED:
                result.carves.append((rows.ravel(), col.pid, w.ravel()))
                per_rank = {rank_of[wid]: float(w[j][steady[j]].mean()) if steady[j].any()
                            else 0.0 for j, wid in enumerate(lock.wids)}
                col = replace(col, wait_s_per_iter=per_rank)
            done.append(col)
        pending.found.append(replace(lock, collectives=tuple(done)))
    return pending


def measure_waits(pending: PendingLockstep, data: RunData, it: pl.DataFrame,
                  all_phases: pl.DataFrame) -> LockstepResult:
    """Finish :func:`locate_lockstep`: the measured collectives' waits per steady
    iteration from the per-phase sums (``RunAnalysis.all_phases``), each stage's
    collectives sorted by wait, largest first. ``it`` needs ``wid`` and ``steady``."""
    result = pending.result
    rank_of = dict(zip(data.workers["wid"].to_list(), data.workers["rank"].to_list(),
                       strict=True))
    for lock in pending.found:
        done = [col if col.method == METHOD_INFERRED else
                replace(col, wait_s_per_iter=_measured_waits(data, all_phases, col, lock.wids,
                                                             rank_of, it))
                for col in lock.collectives]
        done.sort(key=lambda c: -sum(c.wait_s_per_iter.values()))
        result.stages.append(replace(lock, collectives=tuple(done)))
    return result


def _measured_waits(data: RunData, all_phases: pl.DataFrame, col: Collective,
                    wids: tuple[int, ...], rank_of: dict[int, int], it: pl.DataFrame
                    ) -> dict[int, float]:
    """Sync seconds per steady iteration of the collective phase and its sync
    children, per rank."""
    prefix = f"{col.phase}/"
    pids = [i for i, n in enumerate(data.phase_names)
            if i == col.pid or (n.startswith(prefix) and "/" not in n[len(prefix):])]
    steady_n = dict(it.filter("steady").group_by("wid").agg(pl.len()).iter_rows())
    sums = dict(all_phases.filter(pl.col("wid").is_in(list(wids)) & pl.col("counted")
                                  & pl.col("pid").is_in(pids) & pl.col("part").is_not_null())
                .group_by("wid").agg(pl.col("sync_s").sum()).iter_rows())
    return {rank_of[w]: (float(sums.get(w, 0.0)) / steady_n[w] if steady_n.get(w) else 0.0)
            for w in wids}


def _gather(rows: np.ndarray, layout: np.ndarray, src_all: np.ndarray, t, tops: dict,
            names: list[str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Start offset (from ``ts``) and host seconds of each phase in ``names`` for the
    iteration ``rows`` (R, m), each in its own iteration's phase order (NaN where
    the iteration lacks the phase), and the sum of its top-level host seconds."""
    start = {nm: np.full(rows.shape, np.nan) for nm in names}
    dur = {nm: np.full(rows.shape, np.nan) for nm in names}
    total = np.zeros(rows.shape)
    lay_rows = layout[rows]
    for lid in np.unique(lay_rows):
        if int(lid) not in tops:
            continue
        seq, pos, _ = tops[int(lid)]
        m = lay_rows == lid
        src = src_all[rows[m]]
        idx = t.host_start[src][:, None] + pos[None, :]
        inside = pos[None, :] < t.length[src][:, None]
        h = np.where(inside, t.host[np.where(inside, idx, 0)], 0.0)
        before = np.cumsum(h, axis=1) - h
        total[m] = h.sum(axis=1)
        for j, nm in enumerate(seq):
            if nm in start:
                start[nm][m] = before[:, j]
                dur[nm][m] = h[:, j]
    return start, dur, total


def _spread(x: np.ndarray, off: np.ndarray) -> float:
    """Median over iterations (where every rank has a value) of the range across
    ranks of ``x - off`` (x: (R, m)); NaN with fewer than ALIGN_MIN_ITERS."""
    ok = np.isfinite(x).all(axis=0)
    if ok.sum() < ALIGN_MIN_ITERS:
        return float("nan")
    y = x[:, ok] - off[:, None]
    return float(np.median(y.max(axis=0) - y.min(axis=0)))


def _offsets(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Clock offset of each rank's host (against the first rank's) estimated at
    boundary ``x`` (R, m): per rank the median over iterations of its difference
    from the ranks' median, averaged over the ranks of its host."""
    ok = np.isfinite(x).all(axis=0)
    off = np.zeros(x.shape[0])
    if not ok.any():
        return off
    y = x[:, ok]
    diff = np.median(y - np.median(y, axis=0), axis=1)
    for g in np.unique(groups):
        off[groups == g] = diff[groups == g].mean()
    return off - off[0]


def _iter_shifts(iters: list[np.ndarray], ts: list[np.ndarray], groups: np.ndarray
                 ) -> list[int]:
    """Per rank the constant its iteration numbers are ahead of those of the first
    rank on its host (0 for that rank and for ranks alone on their host).

    Ranks on one host read one clock, and in lockstep they start an iteration
    together: for each shift ``s`` in ``-ITER_SHIFT_MAX..ITER_SHIFT_MAX``, rank
    ``j``'s iteration ``k + s`` is matched with the reference's ``k`` and the
    median ``|ts difference|`` taken over at most :data:`ALIGN_SAMPLE` matched
    pairs; the smallest wins when it is under :data:`ITER_SHIFT_CONTRAST` times
    that of ``s = 0`` (an unshifted pair, or ranks not in lockstep, keep 0).
    Across hosts the clock offset absorbs a shift; it is not looked for.
    ``iters``: each rank's iteration numbers, sorted; ``ts``: their starts (s)."""
    out = [0] * len(iters)
    for j in range(len(iters)):
        ref = int(np.flatnonzero(groups == groups[j])[0])
        if ref == j:
            continue
        med = {}
        for sh in range(-ITER_SHIFT_MAX, ITER_SHIFT_MAX + 1):
            common, (ia, ib) = matched_rows([iters[ref], iters[j] - sh])
            if len(common) < ALIGN_MIN_ITERS:
                continue
            if len(common) > ALIGN_SAMPLE:
                pick = np.linspace(0, len(common) - 1, ALIGN_SAMPLE).astype(np.int64)
                ia, ib = ia[pick], ib[pick]
            med[sh] = float(np.median(np.abs(ts[ref][ia] - ts[j][ib])))
        if 0 not in med:
            continue
        best = min(med, key=lambda sh: (med[sh], abs(sh)))
        if best != 0 and med[best] < ITER_SHIFT_CONTRAST * med[0]:
            out[j] = best
    return out


def _total_wait(x: np.ndarray) -> float:
    """Sum over ranks of the mean over iterations (where every rank has a value)
    of ``x - min over ranks`` (x: (R, m) seconds): the wait a collective in ``x``
    would imply, seconds per iteration."""
    ok = np.isfinite(x).all(axis=0)
    if not ok.any():
        return 0.0
    y = x[:, ok]
    return float((y - y.min(axis=0)).mean(axis=1).sum())


def _resolve(found: list[tuple[float, tuple[str | None, str], float, float]],
             dur: dict[str, np.ndarray], gap: np.ndarray, stage: str, result: LockstepResult
             ) -> list[tuple[float, str | None, str, float, float]]:
    """The collectives among the aligned boundaries ``found`` (``(score, (phase,
    anchor), arrival, exit)``): one per phase (anchored at the start when it aligns
    so), and either the tail or the phases aligned only from the iteration's end
    (module docstring, "Untimed time"), with a note in ``result`` when the latter
    rule chose. Returns ``(score, phase, anchor, arrival, exit)`` items."""
    by: dict[str | None, tuple[float, str | None, str, float, float]] = {}
    for score, (nm, anchor), arrival, exit_ in found:
        if nm not in by or (by[nm][2] == ANCHOR_END and anchor == ANCHOR_START):
            by[nm] = (score, nm, anchor, arrival, exit_)
    end_only = [nm for nm, f in by.items() if nm is not None and f[2] == ANCHOR_END]
    if end_only:
        names = ", ".join(end_only)
        if None in by:
            tail_w = _total_wait(gap)
            named_w = max(_total_wait(dur[nm]) for nm in end_only)
            if named_w >= tail_w:
                del by[None]
                result.notes.append(
                    f"stage {stage}: the ranks' time in no phase differs; read as untimed work "
                    f"of their own before {names} (where the others then wait, "
                    f"{named_w * 1e3:.1f} ms per iteration over all ranks) rather than a "
                    f"collective after the last phase ({tail_w * 1e3:.1f} ms): the reading in "
                    f"which fewer ranks are slow (an inference)")
            else:
                for nm in end_only:
                    del by[nm]
                result.notes.append(
                    f"stage {stage}: the ranks' time in no phase differs; read as a collective "
                    f"after the last phase (waits {tail_w * 1e3:.1f} ms per iteration over all "
                    f"ranks) rather than untimed work before {names} ({named_w * 1e3:.1f} ms): "
                    f"the reading in which fewer ranks are slow (an inference)")
        else:
            result.notes.append(
                f"stage {stage}: the ranks' untimed time (outside every phase) differs; "
                f"their ends of {names} line up when that time is read as coming before "
                f"{names} (its ends read back from the iteration's end): an inference "
                f"(docs/DIAGNOSIS.md, 'Untimed time')")
    return list(by.values())


def _stage(stage: str, ws: list[tuple[int, int, int]], tops: dict, cols: dict[str, np.ndarray],
           data: RunData, hosts: dict[int, str | None], result: LockstepResult
           ) -> tuple[Lockstep, np.ndarray, list[np.ndarray]] | None:
    """One stage's lockstep: (Lockstep, iteration rows (R, n), the waits (R, n)
    of each collective in ``Lockstep.collectives`` order) or None."""
    layout, t, src_all = cols["layout"], data.times, cols["src"]
    keep = [np.flatnonzero(layout[a:b] >= 0) + a for _, a, b in ws]
    if any(len(k) == 0 for k in keep):
        return None
    wids = [wid for wid, _, _ in ws]
    host_names = [hosts.get(w) or f"?{w}" for w in wids]
    _, groups = np.unique(host_names, return_inverse=True)
    # Views where every row of a worker has phases (the usual case), not copies
    # (memory at 10M iterations).
    whole = [len(k) == b - a for k, (_, a, b) in zip(keep, ws, strict=True)]
    iters = [cols["iter"][a:b] if w else cols["iter"][k]
             for k, w, (_, a, b) in zip(keep, whole, ws, strict=True)]
    shifts = _iter_shifts(iters, [cols["ts"][a:b] if w else cols["ts"][k]
                                  for k, w, (_, a, b) in zip(keep, whole, ws, strict=True)],
                          groups)
    if any(shifts):
        rank_of = dict(zip(data.workers["wid"].to_list(), data.workers["rank"].to_list(),
                           strict=True))
        for j, sh in enumerate(shifts):
            if sh:
                ref = int(np.flatnonzero(groups == groups[j])[0])
                result.notes.append(
                    f"stage {stage}: rank {rank_of[wids[j]]} numbers its iterations {sh:+d} "
                    f"from rank {rank_of[wids[ref]]} on the same host (its iteration k{sh:+d} "
                    f"starts with rank {rank_of[wids[ref]]}'s k): matched by time")
        iters = [x - sh for x, sh in zip(iters, shifts, strict=True)]
    common, idx = matched_rows(iters)
    if len(common) < ALIGN_MIN_ITERS:
        result.notes.append(
            f"stage {stage}: only {len(common)} iterations were logged by every rank (want "
            f"{ALIGN_MIN_ITERS}), so where its ranks wait for each other (lockstep) was not "
            f"looked for")
        return None
    result.tested.add(stage)
    rows = np.stack([k[i] for k, i in zip(keep, idx, strict=True)])
    # Candidate phases: top-level compute or sync phases of the stage's layouts.
    cat_of: dict[str, int] = {}
    for lid in np.unique(layout[rows]):
        seq, _, cats = tops.get(int(lid), ((), None, ()))
        for nm, c in zip(seq, cats, strict=True):
            cat_of.setdefault(nm, int(c))
    names = [nm for nm, c in cat_of.items() if c in (COMPUTE, SYNC)]
    steady = cols["steady"][rows].all(axis=0)
    sample = (np.flatnonzero(steady) if steady.sum() >= ALIGN_MIN_ITERS
              else np.arange(rows.shape[1]))
    if len(sample) > ALIGN_SAMPLE:
        sample = sample[np.linspace(0, len(sample) - 1, ALIGN_SAMPLE).astype(np.int64)]
    rs = rows[:, sample]
    # A candidate must be in ALIGN_MIN_ITERS sampled iterations of every rank to
    # be judged (``_spread``); one seen in fewer cells cannot be, and with a step
    # number in its name every iteration brings new ones: leave them out before
    # gathering (a names x iterations matrix otherwise).
    cells: dict[str, int] = {}
    lids, counts = np.unique(layout[rs], return_counts=True)
    for lid, c in zip(lids.tolist(), counts.tolist(), strict=True):
        for nm in tops.get(int(lid), ((),))[0]:
            cells[nm] = cells.get(nm, 0) + c
    names = [nm for nm in names if cells.get(nm, 0) >= ALIGN_MIN_ITERS * rows.shape[0]]
    ts, ds = cols["ts"][rs], cols["dur"][rs]
    med_iter = float(np.median(ds))
    if not med_iter > 0:
        return None
    start, dur, total = _gather(rs, layout, src_all, t, tops, names)
    # (arrival, exit) boundaries of each candidate on the ranks' clocks, anchored
    # at the iteration's start (gaps after the last phase; None: the tail after
    # it) and, where the ranks' untimed seconds differ, at its end (gaps before
    # the first phase: every boundary moves later by them).
    gap = ds - total
    bounds: dict[tuple[str | None, str], tuple[np.ndarray, np.ndarray]] = {
        (nm, ANCHOR_START): (ts + start[nm], ts + start[nm] + dur[nm]) for nm in names}
    bounds[(None, ANCHOR_START)] = (ts + total, ts + ds)
    if _spread(gap, np.zeros(len(ws))) >= ALIGN_MIN_ARRIVAL * med_iter:
        for nm in names:
            a, e = bounds[(nm, ANCHOR_START)]
            bounds[(nm, ANCHOR_END)] = (a + gap, e + gap)
    zero = np.zeros(len(wids))

    def test(off: np.ndarray) -> list[tuple[float, tuple[str | None, str], float, float]]:
        out = []
        for key, (arr, ext) in bounds.items():
            arrival, exit_ = _spread(arr, off), _spread(ext, off)
            if (arrival >= ALIGN_MIN_ARRIVAL * med_iter and exit_ <= ALIGN_MAX_EXIT * med_iter
                    and exit_ * ALIGN_CONTRAST <= arrival):
                out.append((arrival / max(exit_, ALIGN_EXIT_FLOOR * med_iter), key, arrival,
                            exit_))
        return out

    off = zero
    if len(set(host_names)) > 1:
        # The clocks' offsets: those of the best-aligned candidate (each estimated
        # at its own exit); every collective is then judged with them.
        tried = []
        for key, (_, ext) in bounds.items():
            of = _offsets(ext, groups)
            score = next((f[0] for f in test(of) if f[1] == key), None)
            if score is not None:
                tried.append((score, float(np.abs(of).max()), of))
        if not tried:
            return None
        top = max(tr[0] for tr in tried)
        off = min((tr for tr in tried if tr[0] >= 0.99 * top), key=lambda tr: tr[1])[2]
    found = _resolve(test(off), dur, gap, stage, result)
    if not found:
        return None
    order = {nm: i for i, nm in enumerate([*names, None])}
    found.sort(key=lambda f: order[f[1]])
    _, full_d, full_total = _gather(rows, layout, src_all, t, tops,
                                    [f[1] for f in found if f[1] is not None])
    collectives, waits = [], []
    for _, nm, anchor, arrival, exit_ in found:
        if nm is None:
            pid, method = -1, METHOD_INFERRED
            d = np.maximum(cols["dur"][rows] - full_total, 0.0)
        else:
            pid = data.phase_names.index(nm)
            measured_child = any(
                data.layouts[int(lid)].cat[ch] == SYNC
                for lid in np.unique(layout[rows])
                for ch, par in carved_children(data.layouts[int(lid)], data.phase_names)
                if data.phase_names[data.layouts[int(lid)].pid[par]] == nm)
            method = (METHOD_MEASURED if cat_of[nm] == SYNC or measured_child
                      else METHOD_INFERRED)
            d = full_d[nm]
        w = np.maximum(d - d.min(axis=0), 0.0)
        w[:, ~np.isfinite(d).all(axis=0)] = 0.0     # a rank lacks the phase: nothing inferred
        collectives.append(Collective(phase=nm, pid=pid, method=method,
                                      arrival_spread_s=arrival, exit_spread_s=exit_,
                                      anchor=anchor))
        waits.append(w)
    offsets: dict[str, float] = {}
    for name, o in zip(host_names, off, strict=True):
        offsets.setdefault(name, float(o))
    lock = Lockstep(stage=stage, collectives=tuple(collectives), iterations=int(rows.shape[1]),
                    clock_offsets_s=offsets, wids=tuple(wids),
                    iter_shifts={w: sh for w, sh in zip(wids, shifts, strict=True) if sh})
    return lock, rows, waits
