"""The ``kineto`` log source: ``tlog ingest`` reads torch.profiler traces.

Ties discovery (:mod:`tlog.ingest.kineto_find`: which files are traces, their
ranks) to the mapping (:mod:`tlog.ingest.kineto_map`: one trace -> v1 records,
``docs/KINETO.md``) and to ingest (:func:`source`: the
:class:`tlog.ingest.sources.Source` whose decoder yields the v1 JSONL lines the
JSONL reader loads). The public names of both rooms are importable from here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tlog.ingest.kineto_find import (
    TracePlan,
    find_traces,
    plan_traces,
    rank_from_name,
    resolve_rank,
    trace_stem,
)
from tlog.ingest.kineto_map import (
    COPY_OPS,
    FRAMEWORK_SPANS,
    SYNC_CALLS,
    TraceConversion,
    convert_columns,
    convert_trace,
)
from tlog.ingest.kineto_read import looks_like_trace

if TYPE_CHECKING:
    from tlog.ingest.sources import Source

__all__ = [
    "COPY_OPS",
    "FRAMEWORK_SPANS",
    "SYNC_CALLS",
    "TraceConversion",
    "TracePlan",
    "convert_columns",
    "convert_trace",
    "find_traces",
    "looks_like_trace",
    "plan_traces",
    "rank_from_name",
    "resolve_rank",
    "source",
    "stored_warnings",
    "trace_stem",
]

#: Plans of the traces found by the last :func:`find_run_traces` per run root
#: (resolved path -> plan), read by :func:`decode_trace`.
_PLANS: dict[Path, TracePlan] = {}


def find_run_traces(root: Path) -> list[Path]:
    """The ingest finder: :func:`find_traces`, remembering each trace's
    :class:`TracePlan` (worker names for ranks shared by several traces)."""
    paths = find_traces(root)
    for plan in plan_traces(paths):
        _PLANS[plan.path.resolve()] = plan
    return paths


def decode_trace(path: Path) -> Iterator[str]:
    """The ingest decoder: v1 JSONL text of one trace, a line per chunk.

    Conversion warnings travel in the ``meta`` record (``warnings``), which
    ingest keeps in ``files.meta``.

    Raises:
        TraceError: as :func:`convert_trace` (no iterations, invalid JSON).
    """
    plan = _PLANS.get(Path(path).resolve())
    conv = convert_trace(path, worker=plan.worker if plan is not None else None)
    if conv.warnings:
        conv.meta["warnings"] = conv.warnings
    for line in conv.lines():
        yield line + "\n"


def stored_warnings(con: Any, run_id: str) -> list[str]:
    """The conversion warnings of a run's traces, as the database keeps them
    (``files.meta`` -> ``extra.warnings``, written by :func:`decode_trace`):
    one line each, ``"<file>: <warning>"``, in file order; [] when none (or
    the run has no traces). ``con``: a DuckDB connection to the tlog database."""
    rows = con.execute(
        "SELECT path, json_extract(meta, '$.extra.warnings')::VARCHAR FROM files "
        "WHERE run_id = ? AND source = 'kineto' ORDER BY path", [run_id]).fetchall()
    out: list[str] = []
    for path, raw in rows:
        for w in json.loads(raw) if raw else []:
            out.append(f"{path}: {w}")
    return out


def source() -> Source:
    """The ``kineto`` log source: ``tlog ingest`` reads traces with it (the
    ``tlog.sources`` entry point ``kineto``, ``ingest.sources``;
    ``runs.source = 'kineto'``)."""
    from tlog.ingest.sources import Source

    return Source(kind="kineto", find=find_run_traces, decode=decode_trace,
                  run_source="kineto", converts=True)
