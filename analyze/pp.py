"""Pipeline parallelism: ranks that are pipeline stages, their bubbles, the limiting
rank and the gain of balancing them (docs/DIAGNOSIS.md "Pipeline parallelism").

A pipeline-parallel job (``torch.distributed.pipelining``, a hand-written
``send``/``recv`` pipeline) runs one model split across ranks: rank 0 holds the
first layers, rank 1 the next, and each waits on its neighbours' sends. Its
ranks are not replicas of one another, as data-parallel ranks are: the heavier
rank is not a straggler to bring to its peers' pace, and its neighbours' waits
are the schedule's *bubble*, not a collective to align.

Rules (tlog's choices, each measured against the scripts' own timers in
tests/pp/):

- **Which stages.** A stage (a ``TLOG_STAGE`` name) whose every worker, two or
  more, logged a point-to-point wait (:data:`dflash_runtime.format.P2P_WAIT_PHASES`:
  the shim's ``rec.watch_p2p``/``rec.instrument``, or a trace's gloo/NCCL
  ``send``/``recv`` spans) in a steady iteration:
  :func:`tlog.analyze.lockstep.pp_stages`. The
  rank-alignment inference (``analyze.lockstep``) and the straggler test skip
  it; the pipeline model runs it in lockstep (every rank finishes a step with
  the others: each step's last gradient reaches rank 0 only after every rank's
  backward).
- **Bubble share** of a rank: its point-to-point wait seconds over its steady
  time (the stage's time base, docs/DIAGNOSIS.md section 3). In a GPipe
  schedule of ``S`` stages and ``M`` micro-batches the ideal bubble is
  ``(S - 1) / (M + S - 1)`` of a balanced stage's step (GPipe, Huang et al.
  2019); an unbalanced pipeline adds the light ranks' wait for the heavy one.
- **Limiting rank**: the rank with the most own work per iteration (compute and
  time in no phase: everything but its waits), which waits least.
- **Balanced**: the what-if of moving work between the ranks until each does
  the mean of their own work, per iteration, by the lockstep model
  (``analyze.pipeline.lockstep_cycle``: ``max own + min wait``, where the
  least-waiting rank's wait is the transfer and the pipeline's fill): the cycle
  now over that cycle. It keeps the fill-and-drain bubble and the transfers as
  they are, so it is what balancing alone buys, not more micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from tlog.analyze.pipeline import PipelineModel, lockstep_cycle

from dflash_runtime.format import is_p2p_wait


@dataclass(frozen=True)
class PPRank:
    """One rank of a pipeline-parallel stage, per steady iteration (means, seconds).

    Attributes:
        rank, worker: the rank and its worker name.
        own_s: its own work (all but its sync waits).
        wait_s: its point-to-point waits (the bubble it sits in).
        bubble_share: ``wait_s`` over its time per iteration.
    """

    rank: int
    worker: str
    own_s: float
    wait_s: float
    bubble_share: float

    def to_dict(self) -> dict[str, Any]:
        """An item of ``ranks`` in ``pipeline_parallel`` of ``tlog diagnose --json``."""
        return {"rank": self.rank, "worker": self.worker, "own_s": self.own_s,
                "wait_s": self.wait_s, "bubble_share": self.bubble_share}


@dataclass(frozen=True)
class PPStage:
    """A pipeline-parallel stage: its ranks, the limiting one, the balanced what-if.

    Attributes:
        stage: the stage name.
        ranks: its ranks in rank order.
        limiting_rank: the rank with the most own work (it waits least).
        speedup_if_balanced: the lockstep model's cycle now over its cycle with
            every rank doing the mean own work (a multiplier, 1.0: balanced);
            None when the model has no matched steady iterations.
    """

    stage: str
    ranks: tuple[PPRank, ...]
    limiting_rank: int
    speedup_if_balanced: float | None

    @property
    def limiting(self) -> PPRank:
        """The limiting rank's figures."""
        return next(r for r in self.ranks if r.rank == self.limiting_rank)

    @property
    def most_idle(self) -> PPRank:
        """The rank with the largest bubble share."""
        return max(self.ranks, key=lambda r: (r.bubble_share, -r.rank))

    def to_dict(self) -> dict[str, Any]:
        """An item of ``pipeline_parallel`` in ``tlog diagnose --json``."""
        return {"stage": self.stage, "ranks": [r.to_dict() for r in self.ranks],
                "limiting_rank": self.limiting_rank,
                "speedup_if_balanced": self.speedup_if_balanced}


def balanced_speedup(own: np.ndarray, sync: np.ndarray) -> float | None:
    """The lockstep cycle of ``(own, sync)`` over that with each iteration's own work
    spread evenly over the ranks (module docstring, "Balanced"). ``own``, ``sync``:
    (ranks, iterations) seconds. None without iterations.

    >>> round(balanced_speedup(np.array([[1.0], [3.0]]), np.array([[2.0], [0.0]])), 3)
    1.5
    """
    if own.size == 0:
        return None
    now = lockstep_cycle(own, sync)
    even = lockstep_cycle(np.broadcast_to(own.mean(axis=0), own.shape), sync)
    return now / even if even > 0 else None


def pipeline_parallel(analysis: Any, workers: pl.DataFrame,
                      model: PipelineModel | None) -> list[PPStage]:
    """The :class:`PPStage` of each pipeline-parallel stage of an attributed run
    (``analysis.pp_stages``), in stage-name order; ``workers`` is
    ``analyze.pipeline.worker_table``'s frame, ``model`` the pipeline model."""
    out = []
    names = analysis.data.phase_names
    p2p = [i for i, n in enumerate(names) if is_p2p_wait(n)]
    ph = analysis.all_phases.filter(pl.col("counted") & pl.col("part").is_not_null()
                                    & pl.col("pid").is_in(p2p))
    waits = dict(ph.group_by("wid").agg(pl.col("host_s").sum()).iter_rows())
    steady = analysis.steady
    base = steady.group_by("wid").agg(
        n=pl.len(),
        total=pl.sum_horizontal("starvation_s", "backpressure_s", "compute_s", "sync_s",
                                "unaccounted_s").sum(),
        sync=pl.col("sync_s").sum())
    for stage in sorted(analysis.pp_stages):
        w = workers.filter((pl.col("stage") == stage) & (pl.col("n") > 0)).sort("rank")
        ranks = []
        for row in w.iter_rows(named=True):
            b = base.filter(pl.col("wid") == row["wid"])
            if b.height == 0:
                continue
            n, total, sync = b["n"][0], float(b["total"][0]), float(b["sync"][0])
            wait = float(waits.get(row["wid"], 0.0))
            ranks.append(PPRank(rank=int(row["rank"]), worker=str(row["worker"]),
                                own_s=(total - sync) / n, wait_s=wait / n,
                                bubble_share=wait / total if total > 0 else 0.0))
        if len(ranks) < 2:
            continue
        limiting = max(ranks, key=lambda r: (r.own_s, -r.rank))
        gain = None
        if model is not None and stage in model.steps:
            gain = balanced_speedup(*model.steps[stage])
        out.append(PPStage(stage=stage, ranks=tuple(ranks), limiting_rank=limiting.rank,
                           speedup_if_balanced=gain))
    return out
