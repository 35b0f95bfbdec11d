"""Fixtures of the history tests: a tiny hand-made database, filled by direct INSERTs.

All durations and timestamps are dyadic fractions (0.5, 0.25, 0.125, 0.0625 s),
so sums are exact in floating point and expected rows can be compared exactly.
Every expected figure in the tests is derived by hand from the tables below
(the derivation is written beside each test).

Runs (steady = leave out the first iteration of each worker, warmup_iters=1,
and iterations overlapping the event of r1 at 1002.25 s lasting 0.25 s):

======  =======  =====================  ========================================
run     started  tags                   workers
======  =======  =====================  ========================================
r1      1000.0   config=a, gpus=2       target-0 (rank 0), drafter-1, drafter-2
r3      1500.0   config=b               main-0, no tokens
r2      2000.0   config=a, gpus=4       main-0
r4      3000.0   config=a               main-0
======  =======  =====================  ========================================
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tlog.ingest.db import connect

from dflash_runtime.format import categorize
from tests.support.phase_rows import insert_phase_rows

# (run, rank, stage, worker, iter, ts, dur, tokens, phases [(name, host_s, gpu_s)])
ITERATIONS: list[tuple] = [
    # r1 target-0: iter0 warm-up; iter3 overlaps the checkpoint event.
    ("r1", 0, "target", "target-0", 0, 1000.0, 1.0, 1000,
     [("batch_get", 0.5, None), ("target_forward", 0.5, None)]),
    ("r1", 0, "target", "target-0", 1, 1001.0, 0.5, 1000,
     [("batch_get", 0.125, None), ("target_forward", 0.25, 0.375), ("hs_put", 0.0625, None)]),
    ("r1", 0, "target", "target-0", 2, 1001.5, 0.5, 1000,
     [("batch_get", 0.125, None), ("target_forward", 0.25, 0.375), ("hs_put", 0.125, None)]),
    ("r1", 0, "target", "target-0", 3, 1002.0, 0.5, 1000,
     [("batch_get", 0.25, None), ("target_forward", 0.25, None)]),
    # r1 drafter-1: iter0 warm-up; iter2 (1001.5..1002.0) ends before the event; iter3
    # starts at 1002.5, exactly when the event ends: kept.
    ("r1", 1, "drafter", "drafter-1", 0, 1000.0, 1.0, 500,
     [("hs_get", 0.5, None), ("forward", 0.25, None), ("grad_allreduce", 0.25, None)]),
    ("r1", 1, "drafter", "drafter-1", 1, 1001.0, 0.5, 500,
     [("hs_get", 0.125, None), ("forward", 0.25, None), ("forward/mask_build", 0.0625, None),
      ("grad_allreduce", 0.0625, None)]),
    ("r1", 1, "drafter", "drafter-1", 2, 1001.5, 0.5, 500,
     [("hs_get", 0.125, None), ("forward", 0.25, None), ("forward/mask_build", 0.0625, None),
      ("grad_allreduce", 0.125, None)]),
    ("r1", 1, "drafter", "drafter-1", 3, 1002.5, 0.5, 500,
     [("hs_get", 0.0, None), ("forward", 0.25, None), ("forward/mask_build", 0.0625, None),
      ("grad_allreduce", 0.25, None)]),
    # r1 drafter-2 computes twice as long; iter2 overlaps the event.
    ("r1", 2, "drafter", "drafter-2", 0, 1000.0, 1.0, 500,
     [("hs_get", 0.5, None), ("forward", 0.5, None)]),
    ("r1", 2, "drafter", "drafter-2", 1, 1001.0, 1.0, 500,
     [("hs_get", 0.125, None), ("forward", 0.5, None), ("forward/mask_build", 0.25, None),
      ("grad_allreduce", 0.25, None)]),
    ("r1", 2, "drafter", "drafter-2", 2, 1002.0, 1.0, 500,
     [("hs_get", 0.125, None), ("forward", 0.5, None), ("grad_allreduce", 0.375, None)]),
    # r3: no tokens, 0.5 s per iteration -> 2 iterations/s.
    *[("r3", 0, "main", "main-0", k, 1500.0 + 0.5 * k, 0.5, None,
       [("next_batch", 0.25, None), ("step", 0.25, None)]) for k in range(3)],
    # r2: 0.25 s and 1000 tokens per iteration -> 4000 tokens/s.
    *[("r2", 0, "main", "main-0", k, 2000.0 + 0.25 * k, 0.25, 1000,
       [("next_batch", 0.125, None), ("step", 0.125, None)]) for k in range(3)],
    # r4: 0.5 s and 1000 tokens per iteration -> 2000 tokens/s.
    *[("r4", 0, "main", "main-0", k, 3000.0 + 0.5 * k, 0.5, 1000,
       [("next_batch", 0.25, None), ("step", 0.25, None)]) for k in range(3)],
]

RUNS: list[tuple] = [
    # (run_id, name, started, tags)
    ("r1", "first", 1000.0, {"config": "a", "gpus": "2"}),
    ("r3", None, 1500.0, {"config": "b"}),
    ("r2", "fast", 2000.0, {"config": "a", "gpus": "4"}),
    ("r4", None, 3000.0, {"config": "a"}),
]

EVENTS: list[tuple] = [("r1", 0, "target", "target-0", "checkpoint", 1002.25, 0.25)]

QUEUE_SAMPLES: list[tuple] = [
    ("r1", 0, "target", "target-0", "hs_queue", 1001.0, 0, 4),
    ("r1", 0, "target", "target-0", "hs_queue", 1001.5, 0, 4),
    ("r1", 0, "target", "target-0", "hs_queue", 1002.0, 2, 4),
    ("r1", 0, "target", "target-0", "hs_queue", 1002.5, 4, 4),
    ("r1", 0, "target", "target-0", "batch_queue", 1001.0, 1, None),
    ("r1", 0, "target", "target-0", "batch_queue", 1002.0, 3, None),
    ("r2", 0, "main", "main-0", "hs_queue", 2000.0, 7, 8),
]


def make_history_db(path: Path) -> Path:
    """Create the tiny database at ``path`` (closed on return) and return the path."""
    con = connect(path)
    try:
        for run_id, name, started, tags in RUNS:
            con.execute("INSERT INTO runs (run_id, name, started, tags) VALUES (?, ?, ?, ?)",
                        [run_id, name, started, json.dumps(tags)])
        phase_rows = []
        for run_id, rank, stage, worker, it, ts, dur, tokens, phases in ITERATIONS:
            con.execute("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, tokens)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [run_id, rank, stage, worker, it, ts, dur, tokens])
            for seq, (phase, host_s, gpu_s) in enumerate(phases):
                parent = phase.rsplit("/", 1)[0] if "/" in phase else None
                phase_rows.append((run_id, rank, stage, worker, it, seq, phase, parent, host_s,
                                   gpu_s, categorize(phase)))
        insert_phase_rows(con, phase_rows)
        for row in EVENTS:
            con.execute("INSERT INTO events (run_id, rank, stage, worker, name, ts, dur)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)", list(row))
        for row in QUEUE_SAMPLES:
            con.execute("INSERT INTO queue_samples (run_id, rank, stage, worker, name, ts, depth,"
                        " capacity) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", list(row))
    finally:
        con.close()
    return path


@pytest.fixture(scope="session")
def _history_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_history_db(tmp_path_factory.mktemp("history") / "template.duckdb")


@pytest.fixture
def history_db(_history_template: Path, tmp_path: Path) -> Path:
    """Path of a fresh copy of the tiny history database (closed)."""
    return Path(shutil.copy(_history_template, tmp_path / "history.duckdb"))


@pytest.fixture
def ro_con(history_db: Path):
    """A locked-down read-only connection to the tiny history database."""
    from tlog.queries import read_only_connection

    with read_only_connection(history_db) as con:
        yield con


# --- synthetic pipeline runs for compare and runs ---------------------------------

#: Baseline phase times (seconds) of the two-stage pipeline runs below.
DRAFTER_PHASES = {"hs_get": 0.001, "mask_build": 0.004, "draft_forward": 0.012,
                  "backward": 0.018, "grad_allreduce": 0.003, "optimizer": 0.002}
TARGET_PHASES = {"batch_get": 0.002, "target_forward": 0.020}
TOKENS_PER_DRAFTER_ITER = 4096


def add_pipeline_run(con, run_id: str, *, started: float, tags: dict | None = None,
                     n: int = 60, noise: float = 0.0, seed: int = 0,
                     stall_every: int | None = None, stall_s: float = 0.0,
                     name: str | None = None, nest_mask: bool = False,
                     **drafter_phases: float) -> None:
    """Insert a DFlash-style run: one target worker (rank 0) feeding two drafter
    ranks (1, 2) in lockstep.

    Drafter phases are DRAFTER_PHASES with ``drafter_phases`` overrides, each
    times ``1 + noise * N(0, 1)`` (numpy seed ``seed``); every ``stall_every``-th
    iteration the drafters' hs_get waits ``stall_s`` more (a periodic loader
    stall). The faster drafter rank waits for the slower in grad_allreduce, so
    both have the same dur. The target's hs_put blocks until the drafters take
    the batch, so its iterations last as long as theirs. With ``nest_mask`` the
    mask is built inside the forward pass: phase ``draft_forward`` includes it and
    ``draft_forward/mask_build`` is its child. Without noise every duration is
    exact and the figures can be checked by hand.
    """
    rng = np.random.default_rng(seed)
    phases = {**DRAFTER_PHASES, **drafter_phases}

    def jitter(mean: float) -> float:
        return max(mean * (1.0 + noise * rng.standard_normal()), 0.0) if noise else mean

    con.execute("INSERT INTO runs (run_id, name, started, tags) VALUES (?, ?, ?, ?)",
                [run_id, name, started, json.dumps(tags or {})])
    iters: list[tuple] = []
    phase_rows: list[tuple] = []
    clock = {0: started, 1: started, 2: started}
    for k in range(n):
        per_rank = {}
        for rank in (1, 2):
            p = {name_: jitter(v) for name_, v in phases.items()}
            if stall_every and k % stall_every == stall_every - 1:
                p["hs_get"] += stall_s
            per_rank[rank] = p
        pre = {r: sum(v for key, v in p.items() if key not in ("grad_allreduce", "optimizer"))
               for r, p in per_rank.items()}
        slowest = max(pre.values())
        for rank, p in per_rank.items():
            p["grad_allreduce"] += slowest - pre[rank]
        dur = {r: sum(p.values()) for r, p in per_rank.items()}
        tp = {name_: jitter(v) for name_, v in TARGET_PHASES.items()}
        tp["hs_put"] = max(max(dur.values()) - sum(tp.values()), 0.0)
        work = [(0, "target", tp, 2 * TOKENS_PER_DRAFTER_ITER)]
        work += [(r, "drafter", per_rank[r], TOKENS_PER_DRAFTER_ITER) for r in (1, 2)]
        for rank, stage, p, tokens in work:
            d = sum(p.values())
            worker = f"{stage}-{rank}"
            iters.append((run_id, rank, stage, worker, k, clock[rank], d, tokens))
            clock[rank] += d
            items = list(p.items())
            if nest_mask and stage == "drafter":
                mask = p["mask_build"]
                items = [(name_, v + mask if name_ == "draft_forward" else v)
                         for name_, v in items if name_ != "mask_build"]
                items.append(("draft_forward/mask_build", mask))
            for seq, (phase, host_s) in enumerate(items):
                parent = phase.rsplit("/", 1)[0] if "/" in phase else None
                phase_rows.append((run_id, rank, stage, worker, k, seq, phase, parent, host_s,
                                   None, categorize(phase)))
    cols = ("run_id", "rank", "stage", "worker", "iter", "ts", "dur", "tokens")
    table = pa.table({c: list(v) for c, v in zip(cols, zip(*iters, strict=True), strict=True)})
    con.register("_new_iterations", table)
    con.execute(f"INSERT INTO iterations ({', '.join(cols)}) SELECT * FROM _new_iterations")
    con.unregister("_new_iterations")
    insert_phase_rows(con, phase_rows)


@pytest.fixture
def pipeline_db(tmp_path: Path):
    """A function ``build(runs: list[dict]) -> Path``: a database holding one
    :func:`add_pipeline_run` per dict of keyword arguments (closed on return)."""
    def build(runs: list[dict]) -> Path:
        path = tmp_path / "pipeline.duckdb"
        con = connect(path)
        try:
            for kwargs in runs:
                add_pipeline_run(con, **kwargs)
        finally:
            con.close()
        return path
    return build
