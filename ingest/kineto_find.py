"""Find the torch.profiler (Kineto) traces of a run and plan their ranks.

Discovery only (no mapping): which files below a run directory are traces
(sniffed by content, :func:`tlog.ingest.kineto_read.looks_like_trace`), and
each trace's rank and worker name from its header and file name
(``docs/KINETO.md`` "Ranks"). The mapping of a trace to v1 records is
:mod:`tlog.ingest.kineto_map`; the ingest source tying both together is
:mod:`tlog.ingest.kineto`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tlog.ingest.kineto_read import looks_like_trace, read_header

#: Rank in a file name: ``rank3``, ``rank-3``, ``rank_3`` (torch.profiler's
#: ``tensorboard_trace_handler`` and HTA name traces this way).
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(name: str) -> int | None:
    """The rank written in a trace's file name (``rank-3``, ``rank3``), else None."""
    m = RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def trace_stem(path: str | Path) -> str:
    """A trace file's name without ``.gz``, ``.json`` and ``.pt.trace``
    (``host1.pt.trace.json.gz`` -> ``host1``)."""
    name = Path(path).name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name


def resolve_rank(header: dict[str, Any], name: str) -> tuple[int, str]:
    """``(rank, where it came from)``: ``distributedInfo.rank`` of the trace's
    header, else the rank in the file ``name`` (:func:`rank_from_name`), else 0."""
    dist = header.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        return dist["rank"], "distributedInfo"
    r = rank_from_name(name)
    if r is not None:
        return r, "file name"
    return 0, "default"


def _rank_of(path: Path) -> tuple[int, str]:
    return resolve_rank(read_header(path), path.name)


@dataclass(frozen=True)
class TracePlan:
    """How one trace of a run will be read: its rank, and its worker name when
    its rank is shared with another trace of the run (else None: the default
    ``<stage>-<rank>``)."""

    path: Path
    rank: int
    rank_source: str
    worker: str | None


def plan_traces(paths: Iterable[str | Path]) -> list[TracePlan]:
    """Ranks of the traces of one run, read from their headers and names only.

    Traces that resolve to the same rank (say, several traces without
    ``distributedInfo`` or a rank in the name) each get their file's name
    (:func:`trace_stem`) as worker, so their iterations stay
    apart instead of being taken for duplicates.
    """
    items = [(Path(p), *_rank_of(Path(p))) for p in paths]
    count = Counter(rank for _, rank, _ in items)
    return [TracePlan(p, rank, src, trace_stem(p) if count[rank] > 1 else None)
            for p, rank, src in items]


def find_traces(root: str | Path) -> list[Path]:
    """Trace files below ``root`` (recursive, sorted), found by content.

    Every regular, non-hidden file that is not a JSONL log (``*.jsonl``,
    ``*.jsonl.gz``) or the manifest ``run.json`` is sniffed with
    :func:`looks_like_trace` (its first 64 KB, decompressed). A symbolic link
    whose target lies outside ``root`` is never opened; a trace reached by a
    link inside ``root`` is found once.
    """
    base = Path(root)
    if base.is_file():
        return [base] if looks_like_trace(base) else []
    inside = os.path.realpath(base) + os.sep
    out: list[Path] = []
    seen: set[str] = set()
    # Real files first, so a link inside the run names a trace only if its target
    # is not found under its own name; a link out of the run is never opened
    # (ingest's own walk, ingest.sources.survey, warns about it).
    for p in sorted(base.rglob("*"), key=lambda q: (q.is_symlink(), str(q))):
        rel = p.relative_to(base)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        real = os.path.realpath(p)
        if not real.startswith(inside) or real in seen:
            continue
        name = p.name.lower()
        if name.endswith((".jsonl", ".jsonl.gz")) or name == "run.json":
            continue
        if looks_like_trace(p):
            seen.add(real)
            out.append(p)
    return sorted(out)
