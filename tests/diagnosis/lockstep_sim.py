"""Simulated data-parallel runs whose collective waits are known by construction.

Each rank ``r`` of iteration ``i`` does its own work, in order: ``data_wait``
(starvation), ``forward``, the own part of ``backward``, then joins the
gradient all-reduce that ends ``backward`` (DDP's place for it), then
``optimizer``. The collective releases every rank at ``max over ranks of the
arrival + c`` plus a tiny per-rank exit jitter (the moment each process is
scheduled again). The logged ``backward`` is therefore its own part + the wait
+ ``c``; the wait is ``max arrival - own arrival``. Each rank's ``ts`` is read on
its host's clock (``offsets``). Nothing of tlog is used: the truth (waits,
total time, and the total time when one rank's own work is replaced by its
peers' median per iteration) comes from this construction alone.

Variants: ``gap`` seconds of untimed own work between ``forward`` and
``backward`` (code no phase times: the rank arrives later, nothing logs it);
``tail=True`` puts the collective after ``optimizer``, timed by no phase (the
iteration's unaccounted tail); ``iter_shift`` adds a constant to a rank's
logged iteration numbers (a rank that counts from 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.support.runbuilder import RunBuilder

PHASES = ("data_wait", "forward", "backward", "optimizer")


@dataclass
class Sim:
    """A simulated run: what was logged and what is true."""

    builder: RunBuilder
    own: np.ndarray          # (R, n, 4) own seconds per phase (backward: its own part)
    wait: np.ndarray         # (R, n) true collective wait (seconds)
    total_s: float           # wall time of the run (first start to last end, true clock)
    c: float
    gap: np.ndarray | None = None    # (R, n) untimed own seconds before backward
    tail: bool = False               # the collective after the last phase


def _timeline(own: np.ndarray, c: float, exit_jitter: np.ndarray, gap: np.ndarray | None = None,
              tail: bool = False) -> tuple[np.ndarray, ...]:
    """Run the lockstep loop: returns start (R, n), arrival (R, n), release (R, n), end (R, n)."""
    r, n, _ = own.shape
    gap = np.zeros((r, n)) if gap is None else gap
    start = np.zeros((r, n))
    arrival = np.zeros((r, n))
    release = np.zeros((r, n))
    end = np.zeros((r, n))
    t = np.zeros(r)
    for i in range(n):
        start[:, i] = t
        arrival[:, i] = t + own[:, i, 0] + own[:, i, 1] + gap[:, i] + own[:, i, 2]
        if tail:
            arrival[:, i] += own[:, i, 3]
        release[:, i] = arrival[:, i].max() + c + exit_jitter[:, i]
        end[:, i] = release[:, i] + (0.0 if tail else own[:, i, 3])
        t = end[:, i]
    return start, arrival, release, end


def simulate(means: list[tuple[float, float, float, float]], *, n: int = 40, c: float = 0.004,
             jitter: float = 0.02, exit_jitter_s: float = 50e-6, seed: int = 0,
             hosts: list[str] | None = None, offsets: dict[str, float] | None = None,
             stage: str = "train", t0: float = 1.7e9, run_id: str = "r",
             data_jitter: float | None = None, gap: list[float] | None = None,
             tail: bool = False, iter_shift: list[int] | None = None) -> Sim:
    """Simulate ranks with these mean own seconds (data_wait, forward, backward
    own part, optimizer), each times ``1 + jitter * N(0, 1)`` per iteration
    (``data_jitter`` for data_wait if given), clipped at 0; ``gap``: each rank's
    untimed seconds before backward (the same every iteration); ``tail``: the
    collective after optimizer; ``iter_shift``: added to each rank's logged
    iteration numbers."""
    rng = np.random.default_rng(seed)
    r = len(means)
    m = np.array(means)[:, None, :].repeat(n, axis=1)
    rel = np.full(4, jitter)
    if data_jitter is not None:
        rel[0] = data_jitter
    own = np.maximum(m * (1 + rel * rng.standard_normal(m.shape)), 0.0)
    ej = rng.uniform(0, exit_jitter_s, (r, n))
    g = None if gap is None else np.array(gap, dtype=float)[:, None].repeat(n, axis=1)
    start, arrival, release, end = _timeline(own, c, ej, g, tail)
    shift = iter_shift or [0] * r
    hosts = hosts or ["node-0"] * r
    offsets = offsets or {}
    b = RunBuilder(run_id)
    for rank in range(r):
        off = offsets.get(hosts[rank], 0.0)
        for i in range(n):
            before = start[rank, i] + own[rank, i, 0] + own[rank, i, 1] + (
                0.0 if g is None else g[rank, i])
            bw = own[rank, i, 2] if tail else release[rank, i] - before
            phases = [("data_wait", own[rank, i, 0]), ("forward", own[rank, i, 1]),
                      ("backward", bw), ("optimizer", own[rank, i, 3])]
            # The thread is on the CPU for its own forward, backward and optimizer work
            # and its untimed code (it sleeps in data_wait and blocks in the collective).
            cpu = own[rank, i, 1] + own[rank, i, 2] + own[rank, i, 3] + (
                0.0 if g is None else g[rank, i])
            b.iteration(iter=i + shift[rank], ts=t0 + off + start[rank, i],
                        dur=end[rank, i] - start[rank, i], phases=phases, rank=rank, stage=stage, host=hosts[rank], cpu=cpu)
    wait = arrival.max(axis=0)[None, :] - arrival
    return Sim(builder=b, own=own, wait=wait, total_s=float(end.max() - start.min()), c=c,
               gap=g, tail=tail)


def fixed_total(sim: Sim, rank: int) -> float:
    """True wall time had ``rank``'s own work taken its peers' median, per
    iteration and phase... as a whole: its own seconds of the iteration are
    scaled to the peers' median own seconds of that iteration."""
    own = sim.own.copy()
    r, n, _ = own.shape
    gap = np.zeros((r, n)) if sim.gap is None else sim.gap.copy()
    work = own.sum(axis=2) + gap            # each rank's own seconds per iteration
    want = np.median(np.delete(work, rank, axis=0), axis=0)
    own[rank] *= (want / work[rank])[:, None]
    gap[rank] *= want / work[rank]
    start, _, _, end = _timeline(own, sim.c, np.zeros((r, n)), gap, sim.tail)
    return float(end.max() - start.min())


def true_total(sim: Sim) -> float:
    """True wall time with no exit jitter (the same loop as :func:`fixed_total` runs)."""
    r, n, _ = sim.own.shape
    start, _, _, end = _timeline(sim.own, sim.c, np.zeros((r, n)), sim.gap, sim.tail)
    return float(end.max() - start.min())
