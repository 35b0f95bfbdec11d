"""Tiny hand-made runs (JSONL logs as the shim writes them), for tests that need
a run directory and not a particular workload.

- :data:`TINY_RUN`: one meta line and three 1 s iterations (0.5 s ``fwd``,
  0.25 s ``get``) of rank 0, stage ``s``.
- :func:`write_run`: a run directory of one log from records.
- :func:`write_lines` / :func:`iter_line`: a JSONL file from lines; a compact
  iteration record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: One meta record and three iterations of 1 s, each 0.5 s ``fwd`` and 0.25 s ``get``.
TINY_RUN: list[dict[str, Any]] = [
    {"type": "meta", "rank": 0, "stage": "s", "worker": "w"},
    {"iter": 0, "ts": 1000.0, "dur": 1.0, "phases": {"fwd": 0.5, "get": 0.25}},
    {"iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {"fwd": 0.5, "get": 0.25}},
    {"iter": 2, "ts": 1002.0, "dur": 1.0, "phases": {"fwd": 0.5, "get": 0.25}},
]


def write_run(root: Path, records: list[dict[str, Any] | str], manifest: str | None = None,
              name: str = "rank0.jsonl") -> Path:
    """Write ``records`` (dicts as JSON, strings as given) as ``root/name``, and
    ``manifest`` (text) as ``root/run.json`` when given; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    (root / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    if manifest is not None:
        (root / "run.json").write_text(manifest, encoding="utf-8")
    return root


def write_lines(path: Path, lines: list[str], *, newline_at_end: bool = True) -> Path:
    """Write ``lines`` (JSON text) as a JSONL file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + ("\n" if newline_at_end else "")
    path.write_text(text, encoding="utf-8")
    return path


def iter_line(i: int, *, ts: float | None = None, dur: float = 1.0, **extra: Any) -> str:
    """A compact iter record with two phases (0.25 s get, 0.5 s forward)."""
    rec = {"type": "iter", "iter": i, "ts": 1000.0 + i if ts is None else ts, "dur": dur,
           "phases": {"hs_get": 0.25, "forward": 0.5}}
    rec.update(extra)
    return json.dumps(rec, separators=(",", ":"))
