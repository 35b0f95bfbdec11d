"""Tiny torch.profiler traces written by hand, for the kineto modules' unit tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def span(name: str, ts: float, dur: float, cat: str = "user_annotation", tid: int = 100,
         **args: Any) -> dict[str, Any]:
    """A complete host span (``ph: X``), times in trace microseconds."""
    ev = {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def steps(n: int, phases: list[tuple[str, float]], step_us: float = 10_000.0,
          t0: float = 1000.0) -> list[dict[str, Any]]:
    """``n`` ``ProfilerStep#k`` spans of ``step_us`` each, holding ``phases``
    (``(name, microseconds)``, one after the other from the step's start)."""
    out = []
    for k in range(n):
        start = t0 + k * step_us
        out.append(span(f"ProfilerStep#{k}", start, step_us))
        t = start
        for name, us in phases:
            out.append(span(name, t, us))
            t += us
    return out


def write_trace(path: Path, events: list[dict[str, Any]], *, rank: int | None = None,
                gz: bool = False, **header: Any) -> Path:
    """A trace file: the header (``distributedInfo`` when ``rank`` is given) and events."""
    doc: dict[str, Any] = {"schemaVersion": 1, **header}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": 2}
    doc["traceEvents"] = events
    data = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path
