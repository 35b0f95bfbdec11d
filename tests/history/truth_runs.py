"""Three runs whose diagnosis differs from the host rules and from a fixed warm-up,
for the one-truth tests (test_one_truth.py). Nothing of tlog is used to make
them; the truth they are checked against is ``tlog diagnose --json``'s.

- ``pipe``: a two-stage pipeline (target rank 0 -> drafter rank 1) with device
  times: each stage's sync phase waits for queued device work, which the
  device-backlog walk moves into compute; the first 4 iterations of each
  worker are slow (a detected warm-up, not the fixed 10); a checkpoint event
  hits two iterations; the drafter starves on hs_get; hs_queue depth samples
  fall inside the steady window.
- ``ddp``: two data-parallel ranks in lockstep (tests/diagnosis/lockstep_sim.py):
  rank 1's forward is 50% slower, so rank 0 waits in ``backward`` (a compute
  phase) and diagnose carves that wait into sync.
- ``restart``: two ranks, a first attempt of 30 iterations, a restart after a
  pause, a second attempt of 60 (workers ``main-0.1``, ``main-1.1``): diagnose
  judges the second attempt only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "diagnosis"))

from lockstep_sim import simulate

from tests.support.runbuilder import RunBuilder

#: run id -> (started epoch s, tags)
STARTED = {"pipe": (1.7e9, {"config": "a"}), "ddp": (1.7e9 + 3600, {"config": "a"}),
           "restart": (1.7e9 + 7200, {"config": "a"})}

KINDS = {"batch_get": "starvation", "target_forward": "compute", "hs_put": "backpressure",
         "cuda_sync": "sync", "hs_get": "starvation", "forward": "compute", "sync": "sync"}


def pipeline_run(n: int = 60, *, run_id: str = "pipe", t0: float = 1.7e9, seed: int = 1,
                 warm: int = 4) -> RunBuilder:
    """The ``pipe`` run (module docstring); ``n`` iterations per worker."""
    rng = np.random.default_rng(seed)
    b = RunBuilder(run_id)
    for rank, stage in ((0, "target"), (1, "drafter")):
        ts = t0
        for i in range(n):
            slow = 3.0 if i < warm else 1.0
            j = 1 + 0.05 * rng.random()
            if stage == "target":
                phases = [("batch_get", 0.002 * j), ("target_forward", 0.003 * slow * j, 0.012 * j),
                          ("cuda_sync", 0.010 * slow * j), ("hs_put", 0.001 * j)]
                tokens = None
            else:
                phases = [("hs_get", 0.006 * j), ("forward", 0.004 * slow * j, 0.015 * j),
                          ("sync", 0.013 * slow * j)]
                tokens = 1000
            dur = sum(p[1] for p in phases) + 0.0005
            b.iteration(iter=i, ts=ts, dur=dur, phases=phases, rank=rank, stage=stage,
                        tokens=tokens, kinds=KINDS)
            ts += dur
    end = t0 + 0.02 * n
    b.event(name="checkpoint", ts=t0 + 0.02 * (n // 2), dur=0.001)
    for k in range(20):
        b.queue(name="hs_queue", ts=t0 + 0.02 * 15 + (end - t0 - 0.02 * 20) * k / 20,
                depth=k % 3, capacity=2)
    return b


def ddp_run(n: int = 60, *, run_id: str = "ddp", t0: float = 1.7e9 + 3600) -> RunBuilder:
    """The ``ddp`` run (module docstring)."""
    return simulate([(0.010, 0.030, 0.030, 0.005), (0.010, 0.045, 0.030, 0.005)], n=n,
                    run_id=run_id, t0=t0, stage="train").builder


def restart_run(*, run_id: str = "restart", t0: float = 1.7e9 + 7200, n1: int = 30,
                n2: int = 60, seed: int = 2) -> RunBuilder:
    """The ``restart`` run (module docstring)."""
    rng = np.random.default_rng(seed)
    b = RunBuilder(run_id)
    start = t0
    for suffix, n in (("", n1), (".1", n2)):
        t = start
        for i in range(n):
            fwd = 0.030 * (1 + 0.05 * rng.random(2))
            arrival = 0.010 + fwd + 0.020
            cycle = float(arrival.max() + 0.005 + 0.005)
            for r in range(2):
                backward = float(arrival.max() + 0.005 - (0.010 + fwd[r]))
                b.iteration(iter=i, ts=t, dur=cycle, tokens=500, rank=r, stage="main",
                            worker=f"main-{r}{suffix}",
                            phases=[("data_load", 0.010), ("forward", float(fwd[r])),
                                    ("backward", backward), ("optimizer", 0.005)])
            t += cycle
        start = t + 30.0      # the restart: a pause, then iter counts from 0 again
    return b


def write_runs(db: Path, builders: list[RunBuilder]) -> Path:
    """Write ``builders`` into the database at ``db``, with started and tags; closed."""
    for b in builders:
        con = b.write(db)
        started, tags = STARTED.get(b.run_id, (None, {}))
        con.execute("UPDATE runs SET started = ?, tags = ? WHERE run_id = ?",
                    [started, json.dumps(tags), b.run_id])
        con.close()
    return db
