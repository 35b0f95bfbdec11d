"""Stragglers: ranks of a stage that do their own work more slowly than their peers.

DESIGN.md ("Verdict"): a rank's *iteration* time says nothing in a
data-parallel group, because the gradient all-reduce evens every rank out to
the slowest one. So each worker is judged on what is its own:

- **compute straggler**: the median over steady iterations of its attributed
  compute seconds (after the device-backlog walk; sync and collective waits
  excluded) against the median of its peers' medians. ``slowdown`` is
  ``own / peers - 1``.
- **input straggler**: its own starvation seconds per iteration (a mean over
  the steady state: a rank whose loader stalls every fourth step is an input
  straggler though its median wait is small) against the median of its
  peers'; ``slowdown`` is the extra wait as a fraction of the peers' median
  mean iteration time (peers often wait ~0, so a ratio of waits would explode).

A worker is a straggler when ``slowdown`` exceeds :data:`STRAGGLER_THRESHOLD`
and it and its peers have at least :data:`STRAGGLER_MIN_ITERS` steady
iterations. The phase named is the one whose attributed seconds per
iteration exceed the peers' median by the most. The peers' extra time in
sync phases (collectives) per iteration is reported as evidence: they wait
for the straggler at the next all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analyze.frames import RunAnalysis

#: Relative slowdown above which a rank is a straggler (15%). Source: between
#: TraceML's rank-skew warning (10%) and critical (20%) levels.
STRAGGLER_THRESHOLD = 0.15
#: Slowdown at which a straggler is critical: NVIDIA Resiliency Extension
#: (nvidia-resiliency-ext straggler detection) flags a rank whose performance
#: score is under 0.75 of the reference, i.e. 1/0.75 - 1 = 33% slower.
STRAGGLER_CRITICAL = 1 / 0.75 - 1
#: Fewest steady iterations a rank (and each peer) needs to be judged.
STRAGGLER_MIN_ITERS = 20


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

    def to_dict(self) -> dict:
        """JSON form (``stragglers`` items)."""
        return {"stage": self.stage, "rank": self.rank, "worker": self.worker, "kind": self.kind,
                "phase": self.phase, "slowdown": self.slowdown, "own_s": self.own_s,
                "peers_s": self.peers_s, "phase_excess_s": self.phase_excess_s,
                "peers_extra_sync_s": self.peers_extra_sync_s, "iterations": self.iterations,
                "gain_if_fixed": self.gain_if_fixed,
                "speedup_if_fixed": (None if self.gain_if_fixed is None
                                     else 1 + self.gain_if_fixed),
                # the multiplier the texts give ("2.5x its peers' time"); for a
                # compute straggler it is 1 + slowdown
                "own_over_peers": self.own_s / self.peers_s if self.peers_s > 0 else None}


def _phase_per_iter(analysis: RunAnalysis, counts: pl.DataFrame, column: str) -> pl.DataFrame:
    """Mean attributed seconds per steady iteration of each (worker, phase) in ``column``."""
    return (analysis.phases.group_by("wid", "pid").agg(pl.col(column).sum().alias("s"))
            .join(counts, on="wid").with_columns(per_iter=pl.col("s") / pl.col("n"))
            .select("wid", "pid", "per_iter"))


def find_stragglers(analysis: RunAnalysis, workers: pl.DataFrame) -> list[Straggler]:
    """Compute and input stragglers of every stage with two or more workers.

    Args:
        analysis: the attributed run.
        workers: ``analyze.pipeline.worker_table(analysis)``.
    """
    n = pl.col("n").cast(pl.Float64)
    med = (workers.select("wid", "stage", "rank", "worker", "n", compute="compute_med",
                          starvation=pl.col("starvation_s") / n, sync=pl.col("sync_s") / n,
                          dur=pl.col("dur") / n)
           .sort("stage", "rank", "worker"))
    names = analysis.data.phase_names
    out: list[Straggler] = []
    counts = workers.select("wid", "n")
    per_phase = {"compute": _phase_per_iter(analysis, counts, "compute_s"),
                 "input": _phase_per_iter(analysis, counts, "starvation_s")}
    for (stage,), grp in med.group_by("stage", maintain_order=True):
        if grp.height < 2:
            continue
        rows = grp.to_dicts()
        for row in rows:
            peers = [r for r in rows if r["wid"] != row["wid"]]
            if row["n"] < STRAGGLER_MIN_ITERS or any(p["n"] < STRAGGLER_MIN_ITERS for p in peers):
                continue
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
                if slowdown <= STRAGGLER_THRESHOLD:
                    continue
                pid, excess = _phase_differing_most(per_phase[kind], row["wid"],
                                                    [p["wid"] for p in peers])
                out.append(Straggler(stage=stage, rank=row["rank"], worker=row["worker"],
                                     kind=kind, phase=names[pid] if pid is not None else None,
                                     slowdown=float(slowdown), own_s=float(own),
                                     peers_s=float(ref), phase_excess_s=float(excess),
                                     peers_extra_sync_s=float(extra_sync), iterations=row["n"],
                                     wid=int(row["wid"])))
    out.sort(key=lambda s: (-s.slowdown, s.stage, s.rank))
    return out


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
