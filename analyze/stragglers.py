"""Stragglers: ranks of a stage that do their own work more slowly than their peers.

DESIGN.md ("Verdict"): a rank's *iteration* time says nothing in a
data-parallel group, because the gradient all-reduce evens every rank out to
the slowest one. So each worker is judged on what is its own:

- **compute straggler**: the median over steady iterations of its own work,
  attributed compute seconds (after the device-backlog walk; sync and
  collective waits excluded) plus unaccounted seconds (untimed code is its
  own work; a collective wait found there is already sync), against the
  median of its peers' medians, all over the same steps where the workers
  ran them together (:func:`_own_work_median`). ``slowdown`` is ``own / peers - 1``.
- **input straggler**: its own starvation seconds per iteration (a mean over
  the steady state: a rank whose loader stalls every fourth step is an input
  straggler though its median wait is small) against the median of its
  peers'; ``slowdown`` is the extra wait as a fraction of the peers' median
  mean iteration time (peers often wait ~0, so a ratio of waits would explode).

**By what its fix is worth, under lockstep.** In a lockstep stage whose
per-step matrices the pipeline model holds (``analyze.pipeline.PipelineModel.parts``:
the ranks' own work on the steps steady on all of them; four ranks or
more), a straggler is named by what fixing it would buy: at 256 ranks a
rank 10% slower costs the whole job ~10% while its own-work ratio stays
under any fixed bar. For each kind of own time (compute; input: its
starvation), rank ``r``'s excess on step ``t`` is its seconds of that kind
less its peers' median on that step; the **step-to-step noise** is the
median over the stage's ranks of each rank's spread of that excess over the
steps (1.4826 x MAD, a robust standard deviation). Rank ``r`` is named when
its fix's lockstep what-if (``analyze.pipeline.fix_gain``: each step loses
the rank's excess, the stage's cycle is the slowest rank's) is worth at
least :data:`STRAGGLER_MIN_GAIN` and either the median of its excess is at
least :data:`STRAGGLER_NOISE_Z` times that noise (a shift no rank's jitter
makes) or ``slowdown`` exceeds :data:`STRAGGLER_THRESHOLD` (the ratio that
names it in a small stage: where every phase jitters 50% a step, a rank
50% slower stays ~2 times the noise while its fix is worth ~30%), for a
compute straggler with a median excess of at least
:data:`STRAGGLER_RATIO_MIN_Z` times the noise. Healthy ranks (noise only) shift by a
fraction of the noise, their medians stay within the ratio, and they are
never named, however many there are. An input straggler's excess is a
median here, so a loader that stalls every fourth step is found by the
ratio of its mean wait.

Elsewhere (independent workers, no per-step matrices, or a stage of 2-3
ranks) a worker is a straggler when ``slowdown`` exceeds
:data:`STRAGGLER_THRESHOLD`; it and its peers need at least :data:`STRAGGLER_MIN_ITERS`
steady iterations. The phase named is the one whose attributed seconds per
iteration exceed the peers' median by the most (for a compute straggler,
time in no phase competes as :data:`analyze.load.UNACCOUNTED_PHASE`). The peers' extra time in
sync phases (collectives) per iteration is reported as evidence: they wait
for the straggler at the next all-reduce.

**Under lockstep** (``analyze.lockstep`` found where the stage's ranks wait
for each other, or the pipeline model holds them in lockstep), the
straggler is the rank that makes the others wait: its peers' collective
wait (measured, or inferred from rank alignment and already moved into
sync) must cover at least :data:`STRAGGLER_WAIT_MATCH` of its excess own
seconds. A rank is never named for a long wait of its own: the waits are
sync, not compute. An excess the peers do not wait for is not named, and a
note says so (the wait could not be found).

When the check cannot run in a stage with two or more workers (a worker
with fewer than :data:`STRAGGLER_MIN_ITERS` steady iterations, or only one
worker with steady iterations), a note says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from tlog.analyze.frames import RunAnalysis
from tlog.analyze.load import UNACCOUNTED_PHASE
from tlog.analyze.lockstep import matched_rows
from tlog.analyze.pipeline import PipelineModel, fix_gain
from tlog.analyze.text import ms

#: Relative slowdown above which a rank is a straggler (15%). Source: between
#: TraceML's rank-skew warning (10%) and critical (20%) levels.
STRAGGLER_THRESHOLD = 0.15
#: Slowdown at which a straggler is critical: NVIDIA Resiliency Extension
#: (nvidia-resiliency-ext straggler detection) flags a rank whose performance
#: score is under 0.75 of the reference, i.e. 1/0.75 - 1 = 33% slower.
STRAGGLER_CRITICAL = 1 / 0.75 - 1
#: Fewest steady iterations a rank (and each peer) needs to be judged.
STRAGGLER_MIN_ITERS = 20
#: Share of the iterations matched by number across a stage's workers that must
#: overlap in time on all of them for their own work to be compared on those
#: iterations only (:func:`_own_work_median`): then they are the same steps of a
#: group moving together. Source: tlog's choice (a data-parallel group's steps
#: all overlap; independent workers drift apart within a few iterations).
SAME_STEP_SHARE = 0.5
#: Under lockstep, the peers' extra collective wait per iteration must be at
#: least this share of a rank's excess own seconds for it to be named: the
#: straggler is the rank the others wait for. Source: tlog's choice (half:
#: the wait is a median over peers and the excess a median over iterations,
#: and jitter in the collective phase moves either a little).
STRAGGLER_WAIT_MATCH = 0.5
#: Under lockstep, a rank's median excess per step (compute, or starvation for
#: an input straggler) must be at least this many times the step-to-step noise
#: of the stage's ranks, unless its slowdown exceeds :data:`STRAGGLER_THRESHOLD`
#: (module docstring). Source: tlog's choice, the usual three-sigma bar; the median of
#: 20 or more steps of a healthy rank moves by about 1.25 / sqrt(20) = 0.28 of
#: the noise, so even the largest of 256 healthy ranks stays far under it
#: (benchmarks/bench_stragglers.py: none named in the healthy runs).
STRAGGLER_NOISE_Z = 3.0

#: Under lockstep, a compute straggler named by :data:`STRAGGLER_THRESHOLD`
#: rather than by the noise must still have a median excess of at least this
#: many times the step-to-step noise (one standard deviation of a step).
#: Source: tlog's choice: in benchmarks/bench_accuracy.py's noisiest profile
#: (a shared machine's steps, jittering by a third in runs of slow steps) a
#: healthy rank's median own work over 60 steps strayed 15.6% above its
#: peers' at 0.5 times the noise, while a rank 50% slower stood at 2.2.
STRAGGLER_RATIO_MIN_Z = 1.0

#: Fewest ranks of a lockstep stage for the noise rule; a stage of fewer
#: judges its ranks by :data:`STRAGGLER_THRESHOLD` alone. Source: tlog's
#: choice: with two ranks each rank's excess is the other's mirror, and on a
#: shared machine the step-to-step spread of that one difference hid a rank
#: 30-60% slower (the real gloo DDP scenario, tests/ddp) that the ratio names.
STRAGGLER_NOISE_MIN_RANKS = 4
#: ... and its fix must be worth at least this throughput gain (1%), whichever
#: of the two named it: a shift that buys less is a difference between
#: machines, not a cost. Source: tlog's choice.
STRAGGLER_MIN_GAIN = 0.01
#: A straggler whose fix (``gain_if_fixed``) is worth less than this is
#: ``info`` and stays off the verdict line; from it, ``warning``. Source:
#: tlog's choice, XProf's 5% "moderately" level (``MODERATE_SHARE``).
STRAGGLER_GAIN_WARN = 0.05
#: ... and ``critical`` from this gain: NVIDIA Resiliency Extension flags a
#: rank scoring under 0.75 of the reference; a lockstep group held to 0.75 of
#: its pace runs 1 / 0.75 = 1.33x faster once fixed.
STRAGGLER_GAIN_CRITICAL = 1 / 0.75 - 1


@dataclass(frozen=True)
class Straggler:
    """One lagging worker."""

    stage: str
    rank: int
    worker: str
    kind: str                 # "compute" or "input"
    phase: str | None
    slowdown: float           # see the module docstring
    own_s: float              # median seconds per iteration (compute or starvation)
    peers_s: float            # the peers' median of the same
    phase_excess_s: float     # the named phase's extra seconds per iteration
    peers_extra_sync_s: float  # how much longer the peers wait in sync phases per iteration
    iterations: int
    wid: int = -1                        # worker index (analyze.load.RunData.workers)
    #: pipeline throughput gain (a fraction: new / old - 1) if it worked at its peers'
    #: median pace; texts show the multiplier 1 + gain (``speedup_if_fixed`` in the JSON)
    gain_if_fixed: float | None = None
    #: where the peers wait for it (the stage's collective phase, ``analyze.lockstep``;
    #: None: not in lockstep, or at the end of the iteration) and how that wait is known
    #: (``"inferred"`` from rank alignment, ``"measured"``, or None)
    wait_phase: str | None = None
    wait_method: str | None = None
    #: under lockstep, its median excess own work per step over the step-to-step
    #: noise of the stage's ranks (module docstring); None where not judged so
    excess_over_noise: float | None = None

    @property
    def severity(self) -> str:
        """``info`` / ``warning`` / ``critical`` by the gain if fixed
        (:data:`STRAGGLER_GAIN_WARN`, :data:`STRAGGLER_GAIN_CRITICAL`); by the
        slowdown when no gain could be computed (``STRAGGLER_CRITICAL``)."""
        if self.gain_if_fixed is None:
            return "critical" if self.slowdown >= STRAGGLER_CRITICAL else "warning"
        if self.gain_if_fixed >= STRAGGLER_GAIN_CRITICAL - 1e-9:
            return "critical"
        return "warning" if self.gain_if_fixed >= STRAGGLER_GAIN_WARN - 1e-9 else "info"

    def to_dict(self) -> dict:
        """JSON form (``stragglers`` items)."""
        return {"stage": self.stage, "rank": self.rank, "worker": self.worker, "kind": self.kind,
                "phase": self.phase, "slowdown": self.slowdown, "own_s": self.own_s,
                "peers_s": self.peers_s, "phase_excess_s": self.phase_excess_s,
                "peers_extra_sync_s": self.peers_extra_sync_s, "iterations": self.iterations,
                "gain_if_fixed": self.gain_if_fixed, "severity": self.severity,
                "wait_phase": self.wait_phase, "wait_method": self.wait_method,
                "speedup_if_fixed": self.speedup_if_fixed,
                "own_over_peers": self.own_over_peers,
                "excess_over_noise": self.excess_over_noise}

    @property
    def speedup_if_fixed(self) -> float | None:
        """The pipeline's throughput multiplier if it worked at its peers' pace
        (``1 + gain_if_fixed``), or None."""
        return None if self.gain_if_fixed is None else 1 + self.gain_if_fixed

    @property
    def own_over_peers(self) -> float | None:
        """``own_s / peers_s``: the multiplier the texts give ("2.5x its peers'
        time"; for a compute straggler ``1 + slowdown``), or None when the
        peers' figure is 0."""
        return self.own_s / self.peers_s if self.peers_s > 0 else None


def _phase_per_iter(analysis: RunAnalysis, counts: pl.DataFrame, column: str) -> pl.DataFrame:
    """Mean attributed seconds per steady iteration of each (worker, phase) in ``column``."""
    return (analysis.phases.group_by("wid", "pid").agg(pl.col(column).sum().alias("s"))
            .join(counts, on="wid").with_columns(per_iter=pl.col("s") / pl.col("n"))
            .select("wid", "pid", "per_iter"))


def noise_shifts(own: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Each rank's shift against the step-to-step noise of a lockstep stage.

    Args:
        own: (ranks, steps) seconds of own work on the steps common to all (two
            ranks or more).

    Returns:
        ``(z, shift, noise)``: per rank the median over steps of its excess
        over the other ranks' median on each step (``shift``, seconds) and that
        over ``noise`` (``z``; ``inf`` for a positive shift with no noise, 0
        for none), and ``noise``: the median over ranks of each rank's robust
        spread of its excess over the steps (1.4826 x MAD, seconds).
    """
    r = own.shape[0]
    excess = np.empty_like(own)
    for i in range(r):
        excess[i] = own[i] - np.median(np.delete(own, i, axis=0), axis=0)
    shift = np.median(excess, axis=1)
    spread = 1.4826 * np.median(np.abs(excess - shift[:, None]), axis=1)
    noise = float(np.median(spread))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(noise > 0, shift / noise if noise > 0 else 0.0,
                     np.where(shift > 0, np.inf, 0.0))
    return z, shift, noise


def find_stragglers(analysis: RunAnalysis, workers: pl.DataFrame,
                    lockstep: set[str] | None = None, notes: list[str] | None = None,
                    model: PipelineModel | None = None) -> list[Straggler]:
    """Compute and input stragglers of every stage with two or more workers, except
    the pipeline-parallel ones (``analysis.pp_stages``: their ranks are not
    replicas; ``analyze.pp`` judges them, a note says so).

    Args:
        analysis: the attributed run.
        workers: ``analyze.pipeline.worker_table(analysis)``.
        lockstep: stages whose workers move in lockstep (the pipeline model's);
            stages ``analysis.lockstep`` found are always in it.
        notes: where to say why a stage's check could not run, or why an
            excess was not named (appended to).
        model: the pipeline model (``analyze.pipeline.pipeline_model``): with
            per-step matrices of a lockstep stage, its compute stragglers are
            named by their fix's gain against the noise (module docstring).
    """
    notes = notes if notes is not None else []
    found = analysis.lockstep
    lockstep = set(lockstep or ()) | ({s.stage for s in found.stages} if found else set())
    n = pl.col("n").cast(pl.Float64)
    med = (workers.select("wid", "stage", "rank", "worker", "n",
                          starvation=pl.col("starvation_s") / n, sync=pl.col("sync_s") / n,
                          dur=pl.col("dur") / n)
           .join(_own_work_median(analysis), on="wid", how="left")
           .with_columns(pl.col("compute").fill_null(0.0))
           .sort("stage", "rank", "worker"))
    names = analysis.data.phase_names
    out: list[Straggler] = []
    counts = workers.select("wid", "n")
    unaccounted = (workers.select("wid", pid=pl.lit(-1, pl.Int64),
                                  per_iter=pl.col("unaccounted_s") / n))
    compute_phases = _phase_per_iter(analysis, counts, "compute_s")
    per_phase = {"compute": pl.concat([compute_phases,
                                       unaccounted.cast(compute_phases.schema)]),
                 "input": _phase_per_iter(analysis, counts, "starvation_s")}
    all_workers = analysis.data.workers.group_by("stage").agg(pl.len().alias("k"))
    size = dict(all_workers.iter_rows())
    for stage, k in sorted(size.items()):
        have = med.filter(pl.col("stage") == stage).height
        if k >= 2 and have < 2:
            notes.append(f"stragglers of {stage} not judged: only {have} of its {k} workers "
                         f"have steady iterations")
    for (stage,), grp in med.group_by("stage", maintain_order=True):
        if grp.height < 2:
            continue
        if stage in analysis.pp_stages:
            notes.append(f"stage {stage} is pipeline-parallel (each rank waits on its "
                         f"neighbours' send/recv): its ranks hold different layers, so none "
                         f"is judged a straggler against the others; the limiting rank and "
                         f"the gain of balancing them are in pipeline_parallel")
            continue
        rows = grp.to_dicts()
        short = [r for r in rows if r["n"] < STRAGGLER_MIN_ITERS]
        if short:
            few = ", ".join(f"rank {r['rank']}: {r['n']}" for r in short[:4])
            notes.append(f"stragglers of {stage} not judged: a worker has fewer than "
                         f"{STRAGGLER_MIN_ITERS} steady iterations ({few})")
            continue
        lock = found.of(stage) if found else None
        # the noise across ranks needs a few ranks to be measured; fewer keep the ratio rule
        judged = (_lockstep_judged(model, stage) if len(rows) >= STRAGGLER_NOISE_MIN_RANKS
                  else None)
        for row in rows:
            peers = [r for r in rows if r["wid"] != row["wid"]]
            peer_compute = float(np.median([p["compute"] for p in peers]))
            peer_starv = float(np.median([p["starvation"] for p in peers]))
            peer_dur = float(np.median([p["dur"] for p in peers]))
            peer_sync = float(np.median([p["sync"] for p in peers]))
            extra_sync = max(peer_sync - row["sync"], 0.0)
            candidates = []
            if peer_compute > 0:
                candidates.append(("compute", row["compute"] / peer_compute - 1,
                                   row["compute"], peer_compute))
            if peer_dur > 0:
                candidates.append(("input", (row["starvation"] - peer_starv) / peer_dur,
                                   row["starvation"], peer_starv))
            for kind, slowdown, own, ref in candidates:
                z = gain = None
                marks = judged.get(kind) if judged is not None else None
                if marks is not None and row["wid"] in marks:
                    z, shift = marks[row["wid"]]
                    gain = fix_gain(model, stage, row["wid"], kind)
                    worth = gain is not None and gain >= STRAGGLER_MIN_GAIN
                    beyond_noise = shift > 0 and z >= STRAGGLER_NOISE_Z
                    # a compute ratio is a ratio of medians: its shift must clear one
                    # step's noise too; an input ratio is of means (periodic stalls)
                    by_ratio = slowdown > STRAGGLER_THRESHOLD and (
                        kind == "input" or z >= STRAGGLER_RATIO_MIN_Z)
                    if not (worth and (beyond_noise or by_ratio)):
                        if slowdown > STRAGGLER_THRESHOLD:
                            notes.append(
                                f"rank {row['rank']} of {stage} has {ms(own - ref)} more "
                                f"{kind} per iteration than its peers, but its fix would be "
                                f"worth {0.0 if gain is None else gain:.1%} ({z:.1f} times "
                                f"the step-to-step noise): not named a straggler")
                        continue
                elif slowdown <= STRAGGLER_THRESHOLD:
                    continue
                if stage in lockstep and extra_sync < STRAGGLER_WAIT_MATCH * (own - ref):
                    where = (f" in {lock.where}" if lock is not None else "")
                    notes.append(
                        f"rank {row['rank']} of {stage} has {ms(own - ref)} more {kind} per "
                        f"iteration than its peers, but they wait only {ms(extra_sync)} more "
                        f"for it{where}: not named a straggler (in lockstep its extra work "
                        f"should hold them; the wait was not found)")
                    continue
                pid, excess = _phase_differing_most(per_phase[kind], row["wid"],
                                                    [p["wid"] for p in peers])
                phase = (None if pid is None else UNACCOUNTED_PHASE if pid < 0 else names[pid])
                out.append(Straggler(stage=stage, rank=row["rank"], worker=row["worker"],
                                     kind=kind, phase=phase,
                                     slowdown=float(slowdown), own_s=float(own),
                                     peers_s=float(ref), phase_excess_s=float(excess),
                                     peers_extra_sync_s=float(extra_sync), iterations=row["n"],
                                     wid=int(row["wid"]),
                                     wait_phase=lock.phase if lock is not None else None,
                                     wait_method=(lock.primary.method if lock is not None
                                                  else None),
                                     gain_if_fixed=gain,
                                     excess_over_noise=None if z is None else float(z)))
    out.sort(key=lambda s: (-s.slowdown, s.stage, s.rank))
    return out


def _lockstep_judged(model: PipelineModel | None, stage: str
                     ) -> dict[str, dict[int, tuple[float, float]]] | None:
    """Per kind (``"compute"``, ``"input"``: the parts of the model's per-step
    own work), ``wid -> (z, shift)`` of :func:`noise_shifts` for a lockstep
    stage whose per-step own work the model holds (two ranks or more, at least
    :data:`STRAGGLER_MIN_ITERS` common steps); None otherwise."""
    if model is None or stage not in model.lockstep:
        return None
    parts = model.parts.get(stage, {})
    out: dict[str, dict[int, tuple[float, float]]] = {}
    wids = model.arrays(stage)[0].tolist()
    for kind in ("compute", "input"):
        part = parts.get(kind)
        if part is None or part.shape[0] < 2 or part.shape[1] < STRAGGLER_MIN_ITERS:
            continue
        z, shift, _ = noise_shifts(part)
        out[kind] = {int(w): (float(z[i]), float(shift[i])) for i, w in enumerate(wids)}
    return out or None


def _own_work_median(analysis: RunAnalysis) -> pl.DataFrame:
    """Per worker (``wid``) the median of its own work per iteration (``compute``):
    attributed compute + unaccounted seconds (time in no phase is the rank's own,
    e.g. untimed code between phases; a collective wait found there is already
    sync, ``analyze.lockstep``). The same part the straggler's fix takes from
    (``analyze.pipeline.fix_gain``).

    Over the **same steps** for every worker of a stage: the iterations steady on
    all of them, matched by ``iter`` (as the lockstep model matches them,
    ``analyze.pipeline.lockstep_steps``), when there are at least
    :data:`STRAGGLER_MIN_ITERS` of them and at least :data:`SAME_STEP_SHARE` of
    them ran at the same time on every worker (their spans overlap: one step of
    a data-parallel group); else over each worker's own steady iterations. A
    rank is slow against its peers at the same moments: warm-up detection can
    leave out 2 leading steps on one rank and 8 on the other, and on a machine
    whose load changes that alone moved the ratio of two DDP ranks' medians by
    15 points (a healthy trace run on 2 shared cores: 0.90 over each rank's own
    steady steps, 1.06 over the common ones; by the script's timers 1.06).
    """
    it = analysis.iterations
    steady = it["steady"].to_numpy()
    iters = it["iter"].to_numpy()
    own = (it["compute_s"] + it["unaccounted_s"]).to_numpy()
    start = it["ts"].to_numpy()
    end = start + it["dur"].to_numpy()
    stage_of = dict(analysis.data.workers.select("wid", "stage").iter_rows())
    by_stage: dict[str, list[tuple[int, np.ndarray]]] = {}
    for wid, a, b in analysis.slices:
        rows = np.flatnonzero(steady[a:b]) + a
        if len(rows):
            by_stage.setdefault(stage_of[wid], []).append((wid, rows))
    wids: list[int] = []
    medians: list[float] = []
    for members in by_stage.values():
        chosen = [rows for _, rows in members]
        if len(members) >= 2:
            common, idx = matched_rows([iters[rows] for rows in chosen])
            if len(common) >= STRAGGLER_MIN_ITERS:
                matched = np.stack([rows[i] for rows, i in zip(chosen, idx, strict=True)])
                together = start[matched].max(axis=0) < end[matched].min(axis=0)
                if together.mean() >= SAME_STEP_SHARE:
                    chosen = list(matched)
        for (wid, _), rows in zip(members, chosen, strict=True):
            wids.append(wid)
            medians.append(float(np.median(own[rows])))
    return pl.DataFrame({"wid": wids, "compute": medians},
                        schema={"wid": it.schema["wid"], "compute": pl.Float64})


def _phase_differing_most(per_phase: pl.DataFrame, wid: int, peers: list[int]
                          ) -> tuple[int | None, float]:
    own = per_phase.filter(pl.col("wid") == wid).select("pid", own="per_iter")
    ref = (per_phase.filter(pl.col("wid").is_in(peers))
           .group_by("pid").agg(ref=pl.col("per_iter").median()))
    # A phase the peers lack counts as 0 for them; one the rank lacks, 0 for it.
    both = (own.join(ref, on="pid", how="full", coalesce=True)
            .with_columns(pl.col("own").fill_null(0.0), pl.col("ref").fill_null(0.0))
            .with_columns(excess=pl.col("own") - pl.col("ref"))
            .sort(["excess", "pid"], descending=[True, False]))
    if both.height == 0 or both["excess"][0] <= 0:
        return None, 0.0
    return int(both["pid"][0]), float(both["excess"][0])
