"""Hand-made runs for the service tests, with figures known by construction.

``write_small_run``: one stage ``main``, rank 0, ``n`` iterations back to back,
each ``load`` (a starvation word) then ``forward`` (compute), ``dur`` their
sum exactly, ``tokens`` per iteration. So, by hand: ``dur = load_s +
forward_s``; iterations/s ``1 / dur``; tokens/s ``tokens / dur``;
starvation share ``load_s / dur``, compute share ``forward_s / dur``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

T0 = 1_764_403_200.0


def write_small_run(root: Path, run_id: str, *, started: float = T0, n: int = 20,
                    load_s: float = 0.010, forward_s: float = 0.030, tokens: int = 100,
                    tags: dict[str, Any] | None = None, forward_name: str = "forward") -> Path:
    """Write the run directory ``root/run_id`` and return it."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    manifest = {"v": 1, "run_id": run_id, "name": "small", "started": started,
                "world_size": 1, "tags": tags if tags is not None else {"gpus": "1"}}
    (run_dir / "run.json").write_text(json.dumps(manifest), encoding="utf-8")
    lines = [{"type": "meta", "v": 1, "rank": 0, "stage": "main", "worker": "main-0",
              "host": "node-0", "pid": 1}]
    dur = round(load_s + forward_s, 6)
    ts = started
    for i in range(n):
        lines.append({"type": "iter", "iter": i, "ts": round(ts, 6), "dur": dur,
                      "tokens": tokens, "phases": {"load": load_s, forward_name: forward_s}})
        ts += dur
    with (run_dir / "rank0.main.jsonl").open("w", encoding="utf-8") as fh:
        for rec in lines:
            fh.write(json.dumps(rec) + "\n")
    return run_dir


def write_pair(root: Path) -> set[str]:
    """``small`` and ``small-b`` (an hour later, forward 50 ms instead of 30,
    the same tags: ``small`` is its default baseline); returns their ids."""
    write_small_run(root, "small")
    write_small_run(root, "small-b", started=T0 + 3600, forward_s=0.050)
    return {"small", "small-b"}
