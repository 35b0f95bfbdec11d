"""Comparing result frames of two engines: the same rows in any order, floats to 1e-9 relative."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

#: Each stored query with the parameters the lake tests run it with.
QUERY_PARAMS: dict[str, list[dict[str, Any]]] = {
    "chronic_stragglers": [{}, {"min_runs": 3, "min_share": 0.5}],
    "phase_breakdown": [{"run_id": r} for r in ("pipe", "ddp", "restart")]
    + [{"run_id": "pipe", "warmup_iters": 10}],
    "queue_occupancy": [{"run_id": "pipe"}],
    "rank_skew": [{"run_id": "ddp"}, {"run_id": "job1"}],
    "regressions_vs_best": [{}, {"tag_key": "config", "tag_value": "a"}],
    "runs_by_throughput": [{}, {"warmup_iters": 5, "limit": 3}],
    "stage_shares_by_month": [{"tag_key": "config"}],
    "stage_utilization": [{"run_id": "pipe"}, {"run_id": "restart", "warmup_iters": 3}],
    "throughput_over_time": [{"run_id": "pipe", "bucket_s": 0.25}],
    "throughput_regressions": [{"tag_key": "config"}, {"tag_key": "config",
                                                       "drop_share": 0.001}],
}


def _key(row: tuple) -> tuple:
    # None first, then by value; floats rounded so that 1e-12 noise sorts alike
    return tuple((v is not None, round(v, 6) if isinstance(v, float) else v) for v in row)


def same_rows(a: pl.DataFrame, b: pl.DataFrame) -> str | None:
    """None when ``a`` and ``b`` hold the same rows (columns by name, rows in any
    order, floats to 1e-9 relative), else what differs."""
    if a.columns != b.columns:
        return f"columns {a.columns} != {b.columns}"
    if a.height != b.height:
        return f"{a.height} rows != {b.height} rows"
    ra = sorted(a.rows(), key=_key)
    rb = sorted(b.rows(), key=_key)
    for x, y in zip(ra, rb, strict=True):
        for col, u, v in zip(a.columns, x, y, strict=True):
            if isinstance(u, float) and isinstance(v, float):
                if not math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-12):
                    return f"{col}: {u!r} != {v!r} in {x} / {y}"
            elif u != v:
                return f"{col}: {u!r} != {v!r} in {x} / {y}"
    return None
