"""A small two-stage scenario run for the report tests, written as a v1 run directory.

``target`` (rank 0) feeds ``drafter`` (ranks 1 and 2) through ``hs_queue``.
Round numbers, by design:

- target, each iteration: batch_get 2 ms, target_forward 30 ms, hs_extract 5 ms,
  hs_put 3 ms; dur 41 ms (1 ms unaccounted); 4,096 tokens.
- drafter, each iteration: hs_get 2 ms (200 ms every fourth iteration: the
  loader stall), mask_build 4, draft_forward 20 (26 on rank 2: a straggler),
  backward 30, grad_allreduce 5, grad_norm_item 4, optimizer 2; dur = their sum.
- the first 5 iterations of every worker take 3x as long (warm-up);
- one ``checkpoint`` event of 1 s after 60% of the run; queue samples every 0.5 s.

``mask_build_s`` sets the drafter's mask_build time (the comparison tests grow
it from 4 to 22 ms). ``drafter_phase`` renames ``backward``, the drafter's largest compute phase
(the XSS test gives it a script tag).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

T0 = 1_764_403_200.0
N_ITERS = 120


def _target_phases(i: int) -> dict[str, float]:
    return {"batch_get": 0.002, "target_forward": 0.030, "hs_extract": 0.005, "hs_put": 0.003}


def _drafter_phases(i: int, rank: int, backward: str, mask_build_s: float) -> dict[str, float]:
    return {
        "hs_get": 0.200 if i % 4 == 3 else 0.002,
        "mask_build": mask_build_s,
        "draft_forward": 0.026 if rank == 2 else 0.020,
        backward: 0.030,
        "grad_allreduce": 0.005,
        "grad_norm_item": 0.004,
        "optimizer": 0.002,
    }


def write_scenario(
    root: Path,
    run_id: str = "two-stage",
    *,
    n: int = N_ITERS,
    drafter_phase: str = "backward",
    tags: dict | None = None,
    mask_build_s: float = 0.004,
) -> Path:
    """Write the scenario's run directory under ``root`` and return it."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    manifest = {
        "v": 1,
        "run_id": run_id,
        "name": "report scenario",
        "started": T0,
        "world_size": 3,
        "tags": tags or {"branch": "perf/report", "gpus": "3xCPU"},
    }
    (run_dir / "run.json").write_text(json.dumps(manifest), encoding="utf-8")
    checkpoint_at = None
    for rank, stage in ((0, "target"), (1, "drafter"), (2, "drafter")):
        lines = [
            {
                "type": "meta",
                "v": 1,
                "rank": rank,
                "stage": stage,
                "worker": f"{stage}-{rank}",
                "host": "node-0",
                "pid": 100 + rank,
            }
        ]
        ts = T0
        for i in range(n):
            phases = (
                _target_phases(i)
                if stage == "target"
                else _drafter_phases(i, rank, drafter_phase, mask_build_s)
            )
            warm = 3.0 if i < 5 else 1.0
            phases = {k: round(v * warm, 6) for k, v in phases.items()}
            dur = round(sum(phases.values()) + (0.001 if stage == "target" else 0.0), 6)
            rec = {"type": "iter", "iter": i, "ts": round(ts, 6), "dur": dur, "phases": phases}
            if stage == "target":
                rec["tokens"] = 4096
            lines.append(rec)
            ts += dur
            if rank == 0 and i == int(n * 0.6):
                checkpoint_at = ts
                lines.append(
                    {"type": "event", "name": "checkpoint", "ts": round(ts, 6), "dur": 1.0}
                )
                ts += 1.0
        if rank == 0:
            t = T0
            k = 0
            while t < ts:
                lines.append(
                    {
                        "type": "queue",
                        "name": "hs_queue",
                        "ts": round(t, 6),
                        "depth": (k * 3) % 9,
                        "capacity": 8,
                    }
                )
                t += 0.5
                k += 1
        with (run_dir / f"rank{rank}.{stage}.jsonl").open("w", encoding="utf-8") as fh:
            for rec in lines:
                fh.write(json.dumps(rec) + "\n")
    assert checkpoint_at is not None
    return run_dir


@pytest.fixture
def scenario_db(tmp_path: Path) -> Callable[..., tuple[object, str]]:
    """``make(run_id="two-stage", **kw) -> (connection, run_id)``: the scenario,
    written as a run directory and ingested into a fresh database."""
    from tlog.ingest import ingest_run
    from tlog.ingest.db import connect

    con = connect(tmp_path / "tlog.duckdb")

    def make(run_id: str = "two-stage", **kw: object) -> tuple[object, str]:
        run_dir = write_scenario(tmp_path / "runs", run_id, **kw)  # type: ignore[arg-type]
        report = ingest_run(con, run_dir)
        assert not report.to_dict()["errors"], report.to_dict()["errors"]
        return con, run_id

    yield make
    con.close()
