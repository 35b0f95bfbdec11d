"""Turn torch.profiler (Kineto) traces into tlog v1 records.

Every profiled PyTorch job already has what tlog needs: ``ProfilerStep#N``
spans mark iterations, host spans name the phases, and the device activities
linked to them by correlation ids give real device times. This module maps
one trace file (one rank) to the records of the JSONL format v1
(``docs/FORMAT.md``): one ``meta`` record, then one ``iter`` record per
iteration. The exact rules are in ``docs/KINETO.md``; in short:

- iteration = each ``ProfilerStep#N`` span on the *stepping thread* (the host
  thread with the most of them): ``iter`` N, ``ts`` its start on the wall
  clock, ``dur`` its length. Without steps: one iteration per top-level
  ``record_function`` annotation (descending through a lone enclosing one),
  else :class:`~ingest.errors.TraceError` saying how to add ``schedule=`` and
  ``prof.step()``;
- phases = the top-level host spans inside the step on that thread:
  annotations by their own name, well-known framework spans by
  :data:`FRAMEWORK_SPANS` (``enumerate(DataLoader)#...__next__`` ->
  ``data_loader_next``, starvation), plain operators grouped into ``h2d``,
  ``forward`` and ``after_backward``, the main thread's wait in ``backward()``
  while the autograd thread runs -> ``backward``;
- sync: the host-blocking runtime calls of :data:`SYNC_CALLS` nested in a
  phase are taken out of it into ``<phase>_sync`` (category sync), placed
  right after it, so top-level phases never overlap and still sum to the
  spans' wall time; a top-level one is the phase ``sync``;
- ``gpu``: kernels, memcpys and memsets linked to the phase that launched
  them (``args.correlation``), merged as a union per stream, summed over
  streams.

The converter reads a trace once, streaming (:mod:`ingest.kineto_read`), and
keeps compact columns of one trace only. It does not touch the database:
:func:`convert_trace` returns a :class:`TraceConversion` whose
:meth:`~TraceConversion.lines` are v1 JSONL lines ready for the JSONL reader.
"""

from __future__ import annotations

import json
import re
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest.categories import Category, split_words
from ingest.errors import TraceError
from ingest.kineto_read import (
    KIND_ANNOTATION,
    KIND_OP,
    KIND_RUNTIME,
    TraceColumns,
    looks_like_trace,
    read_columns,
    read_header,
)

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
    "register",
    "resolve_rank",
    "trace_stem",
]

#: ``ProfilerStep#N``: the span torch.profiler opens at each ``prof.step()``.
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

#: Well-known framework spans: (name pattern, phase name, category). Sources:
#: torch/utils/data/dataloader.py (``enumerate(DataLoader)#{iterator class}.__next__``),
#: torch/optim/optimizer.py (``Optimizer.step#{class}.step``,
#: ``Optimizer.zero_grad#{class}.zero_grad``), torch/nn/parallel/distributed.py
#: and torch/distributed/fsdp (``DistributedDataParallel.forward``,
#: ``FullyShardedDataParallel.forward``), and the autograd engine's
#: ``autograd::engine::evaluate_function: <Node>`` (backward run on the stepping thread).
FRAMEWORK_SPANS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"^enumerate\(DataLoader\)#.*__next__$"), "data_loader_next",
     Category.STARVATION.value),
    (re.compile(r"^Optimizer\.step#"), "optimizer_step", Category.COMPUTE.value),
    (re.compile(r"^Optimizer\.zero_grad#"), "zero_grad", Category.COMPUTE.value),
    (re.compile(r"^(DistributedDataParallel|FullyShardedDataParallel)\.forward$"), "forward",
     Category.COMPUTE.value),
    (re.compile(r"^autograd::engine::evaluate_function"), "backward", Category.COMPUTE.value),
)
#: Index in :data:`FRAMEWORK_SPANS` of the autograd engine's spans (they also
#: identify the autograd thread).
_AUTOGRAD = 4

#: Runtime/driver calls that block the host until the device (or a copy) is
#: done: CUDA runtime and driver API, HIP (ROCm). A synchronous ``cudaMemcpy``
#: blocks; ``cudaMemcpyAsync`` does not (PyTorch follows it with
#: ``cudaStreamSynchronize`` when it must wait, which is listed). ROCm PyTorch
#: uses the blocking ``hipMemcpyWithStream`` for synchronous copies. Sources:
#: CUDA Runtime API "API synchronization behavior"; HIP runtime API reference.
#: Names are matched after removing ``_v2``-style and ``_ptds``/``_ptsz`` suffixes.
SYNC_CALLS: frozenset[str] = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpy2D", "cuMemcpy3D",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipCtxSynchronize",
    "hipMemcpy", "hipMemcpyWithStream", "hipMemcpy2D", "hipMemcpy3D", "hipMemcpyDtoH",
    "hipMemcpyHtoD", "hipMemcpyFromSymbol", "hipMemcpyToSymbol",
})
_CALL_SUFFIX = re.compile(r"(_v\d+)?(_pt(ds|sz))?$")

#: Operators that copy a tensor (``x.to(device)``, ``x.cuda()``, ``copy_``). A
#: top-level one that launches a host-to-device memcpy before the backward is
#: the ``h2d`` phase (the input copy).
COPY_OPS: frozenset[str] = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::cuda"})

#: Phase names this converter makes up (besides framework spans and annotations).
PHASE_FORWARD = "forward"
PHASE_BACKWARD = "backward"
PHASE_AFTER_BACKWARD = "after_backward"
PHASE_H2D = "h2d"
PHASE_SYNC = "sync"
SYNC_SUFFIX = "_sync"
#: gpu-only key: device work launched from another thread at a moment no phase covers.
GPU_OTHER_THREADS = "other_threads"

#: Nesting tolerance (µs): Kineto rounds to 1 ns, so a span that starts within
#: 2 ns of its predecessor's end is its sibling, not its child.
NEST_EPS_US = 0.002

#: Rank in a file name: ``rank3``, ``rank-3``, ``rank_3`` (torch.profiler's
#: ``tensorboard_trace_handler`` and HTA name traces this way).
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

#: How to make a trace tlog can read (the message of a trace without iterations).
HOW_TO_STEP = (
    "profile with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, "
    "active=5), ...) and call prof.step() once per training iteration, or wrap each "
    "iteration in torch.profiler.record_function(\"step\")"
)

_NO_STEP = -1


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
    :func:`looks_like_trace` (its first 64 KB, decompressed).
    """
    base = Path(root)
    if base.is_file():
        return [base] if looks_like_trace(base) else []
    out: list[Path] = []
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        name = p.name.lower()
        if name.endswith((".jsonl", ".jsonl.gz")) or name == "run.json":
            continue
        if looks_like_trace(p):
            out.append(p)
    return out


@dataclass
class TraceConversion:
    """One trace turned into v1 records.

    Attributes:
        path: the trace file.
        rank: the rank of its records; ``rank_source`` says where it came from
            (``"distributedInfo"``, ``"file name"`` or ``"default"``).
        world_size: ``distributedInfo.world_size`` if present.
        windows: ``"ProfilerStep"`` or ``"annotation"`` (what the iterations are).
        meta: the ``meta`` record (rank, pid, host, world_size, source, trace).
        records: the ``iter`` records, in time order.
        warnings: what the mapping had to guess or leave out, one line each.
        events, host_spans, device_ops: counts read from the file.
    """

    path: Path
    rank: int
    rank_source: str
    world_size: int | None
    windows: str
    meta: dict[str, Any]
    records: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    events: int = 0
    host_spans: int = 0
    device_ops: int = 0

    def lines(self) -> Iterator[str]:
        """The records as JSONL lines (no newline): the ``meta`` line first."""
        yield json.dumps(self.meta, separators=(",", ":"))
        for rec in self.records:
            yield json.dumps(rec, separators=(",", ":"))

    def to_jsonl(self) -> str:
        """All lines joined, each ending with a newline."""
        return "".join(line + "\n" for line in self.lines())


def convert_trace(path: str | Path, *, rank: int | None = None,
                  worker: str | None = None) -> TraceConversion:
    """Read one Kineto trace file and map it to v1 records.

    Args:
        path: the trace (``.json`` or gzip, detected by content).
        rank: force the rank (else ``distributedInfo.rank``, else the file
            name, else 0).
        worker: the worker name written in ``meta`` (None: the v1 default).

    Raises:
        TraceError: unreadable or invalid JSON, or no iterations can be found
            (no ``ProfilerStep#N`` and no ``record_function`` annotation).
    """
    p = Path(path)
    cols = read_columns(p)
    conv = convert_columns(cols, path=p, rank=rank)
    if worker is not None:
        conv.meta["worker"] = worker
    return conv


# --------------------------------------------------------------------------- names


def _base_call(name: str) -> str:
    return _CALL_SUFFIX.sub("", name, count=1)


def annotation_phase(name: str) -> str:
    """Phase name of a ``record_function`` annotation: its own name, trimmed.

    Surrounding ``#`` and spaces are removed (``"## forward ##"`` -> ``forward``)
    and ``/`` becomes ``_`` (a ``/`` would make it a child phase in v1).
    """
    s = name.strip().strip("#").strip().replace("/", "_")
    return s or name.replace("/", "_") or "annotation"


@dataclass
class _NameInfo:
    """What the rules need to know about each distinct span name."""

    step: list[int]          # ProfilerStep number per name id, or _NO_STEP
    framework: list[int]     # index into FRAMEWORK_SPANS, or -1
    sync: list[bool]         # a host-blocking runtime call
    copy: list[bool]         # a copy operator (COPY_OPS)


def _name_info(names: list[str]) -> _NameInfo:
    step, fw, sync, copy = [], [], [], []
    for name in names:
        m = STEP_RE.match(name)
        step.append(int(m.group(1)) if m else _NO_STEP)
        idx = -1
        for k, (pat, _, _) in enumerate(FRAMEWORK_SPANS):
            if pat.match(name):
                idx = k
                break
        fw.append(idx)
        sync.append(_base_call(name) in SYNC_CALLS)
        copy.append(name in COPY_OPS)
    return _NameInfo(step, fw, sync, copy)


# --------------------------------------------------------------------------- windows


@dataclass
class _Window:
    """One iteration's time window on the stepping thread."""

    iter: int
    t0: float
    t1: float
    dur: float            # µs, as written (t1 - t0 loses digits at epoch scale)
    event: int            # host span index of the step/annotation itself
    name: str | None      # annotation name (annotation windows only)
    tops: list[_Top] = field(default_factory=list)
    autograd: list[tuple[float, float]] = field(default_factory=list)


@dataclass(eq=False)
class _Top:
    """A top-level host span inside a window (or a synthesized backward gap)."""

    window: int
    t0: float
    t1: float             # end, clipped to the window
    host: float           # µs of host wall time (the span's dur, clipped to the window)
    name: int             # name id, -1 for a synthesized span
    kind: int             # KIND_* or -1 synthesized
    sync_us: float = 0.0  # host-blocking runtime calls nested in it
    htod: bool = False    # launched a host-to-device memcpy
    phase: str = ""
    category: str = ""


def _thread_events(cols: TraceColumns) -> dict[int, array]:
    """Host span indices per thread (typed arrays: 8 bytes per span)."""
    by: dict[int, array] = {}
    for i, t in enumerate(cols.h_thread):
        arr = by.get(t)
        if arr is None:
            arr = by[t] = array("q")
        arr.append(i)
    return by


def _sorted(cols: TraceColumns, idx: Iterable[int]) -> list[int]:
    """Indices by start, the longer (enclosing) span first at equal starts.

    Two stable sorts on single float keys instead of one on ``(ts, -dur)``
    tuples: a tuple key costs ~100 bytes per span while sorting.
    """
    out = list(idx)
    out.sort(key=cols.h_dur.__getitem__, reverse=True)
    out.sort(key=cols.h_ts.__getitem__)
    return out


def _top_level(cols: TraceColumns, idx: list[int]) -> list[int]:
    """Spans of ``idx`` (sorted by start, longest first) not nested in another."""
    ts, dur = cols.h_ts, cols.h_dur
    out: list[int] = []
    end = float("-inf")
    for i in idx:
        if ts[i] >= end - NEST_EPS_US:
            out.append(i)
            end = ts[i] + dur[i]
    return out


def _step_windows(cols: TraceColumns, info: _NameInfo, by_thread: dict[int, list[int]],
                  warnings: list[str]) -> tuple[int, list[_Window]] | None:
    per_thread: dict[int, list[int]] = defaultdict(list)
    for i, nm in enumerate(cols.h_name):
        if info.step[nm] != _NO_STEP and cols.h_kind[i] != KIND_RUNTIME:
            per_thread[cols.h_thread[i]].append(i)
    if not per_thread:
        return None
    thread = max(per_thread, key=lambda t: (len(per_thread[t]),
                                            -min(cols.h_ts[i] for i in per_thread[t])))
    others = sum(len(v) for t, v in per_thread.items() if t != thread)
    if others:
        warnings.append(f"{others} ProfilerStep spans on other threads were left out; "
                        f"iterations come from thread {cols.threads[thread][1]}")
    steps = sorted(per_thread[thread], key=lambda i: cols.h_ts[i])
    windows = [_Window(info.step[cols.h_name[i]], cols.h_ts[i], cols.h_ts[i] + cols.h_dur[i],
                       cols.h_dur[i], i, None) for i in steps]
    return thread, windows


def _annotation_windows(cols: TraceColumns, by_thread: dict[int, list[int]],
                        warnings: list[str]) -> tuple[int, list[_Window]] | None:
    best: tuple[int, list[int]] | None = None
    for thread, idx in by_thread.items():
        ann = _sorted(cols, [i for i in idx if cols.h_kind[i] == KIND_ANNOTATION])
        tops = _top_level(cols, ann)
        # Descend through a lone enclosing annotation to the first level with several.
        while len(tops) == 1:
            outer = tops[0]
            o0, o1 = cols.h_ts[outer], cols.h_ts[outer] + cols.h_dur[outer]
            inner = [i for i in ann if i != outer and o0 <= cols.h_ts[i] < o1]
            if not inner:
                break
            tops = _top_level(cols, inner)
        if tops and (best is None or len(tops) > len(best[1])):
            best = (thread, tops)
    if best is None:
        return None
    thread, tops = best
    warnings.append(f"no ProfilerStep spans: the {len(tops)} top-level record_function "
                    f"annotations are the iterations; for one iteration per training step, "
                    f"{HOW_TO_STEP}")
    windows = [_Window(k, cols.h_ts[i], cols.h_ts[i] + cols.h_dur[i], cols.h_dur[i], i,
                       cols.names[cols.h_name[i]]) for k, i in enumerate(tops)]
    return thread, windows


def _window_of(starts: list[float], windows: list[_Window], t: float) -> int:
    k = bisect_right(starts, t) - 1
    if k >= 0 and t < windows[k].t1:
        return k
    return -1


# --------------------------------------------------------------------------- mapping


def convert_columns(cols: TraceColumns, *, path: Path, rank: int | None = None) -> TraceConversion:
    """Map the columns of one trace to v1 records (see the module docstring).

    Raises:
        TraceError: no iterations can be found in the trace.
    """
    warnings: list[str] = []
    info = _name_info(cols.names)
    by_thread = _thread_events(cols)

    found = _step_windows(cols, info, by_thread, warnings)
    windows_kind = "ProfilerStep"
    if found is None:
        found = _annotation_windows(cols, by_thread, warnings)
        windows_kind = "annotation"
    if found is None:
        msg = (f"trace {path} has no ProfilerStep#N spans and no record_function annotations, "
               f"so it has no iterations: {HOW_TO_STEP}")
        raise TraceError(msg)
    thread, windows = found
    starts = [w.t0 for w in windows]

    launch_main: dict[int, _Top] = {}                  # corr -> launching top
    launch_other: dict[int, tuple[int, float]] = {}    # corr -> (window, launch ts)
    _walk_stepping_thread(cols, info, _sorted(cols, by_thread[thread]), windows, launch_main)
    autograd_threads = {t for t, idx in by_thread.items() if t != thread
                        and any(info.framework[cols.h_name[i]] == _AUTOGRAD for i in idx)}
    for t, idx in by_thread.items():
        if t == thread:
            continue
        _walk_other_thread(cols, info, idx, windows, starts, launch_other,
                           autograd=t in autograd_threads)

    # Host-to-device copies mark the top that launched them (for ``h2d``).
    for j, corr in enumerate(cols.d_corr):
        if cols.d_htod[j] and corr >= 0:
            top = launch_main.get(corr)
            if top is not None:
                top.htod = True

    for k, w in enumerate(windows):
        _add_backward_gaps(w, k)
        _classify(w, cols, info)

    gpu_by_window = _device_time(cols, windows, launch_main, launch_other)

    # Rank, world size, clock.
    if rank is None:
        rank, rank_source = resolve_rank(cols.header, path.name)
    else:
        rank_source = "argument"
    dist = cols.header.get("distributedInfo")
    world = dist.get("world_size") if isinstance(dist, dict) else None
    world_size = world if isinstance(world, int) else None
    base_s = cols.base_ns / 1e9 if cols.base_ns is not None else 0.0
    if windows and base_s == 0.0 and windows[0].t0 < 946_684_800e6:
        warnings.append("timestamps are not on the wall clock (no baseTimeNanoseconds and "
                        "ts before the year 2000): iteration ts are trace-relative")
    has_device = len(cols.d_ts) > 0
    mem = _memory_at(cols, [w.t1 for w in windows])

    records: list[dict[str, Any]] = []
    for k, w in enumerate(windows):
        phases: dict[str, float] = {}
        kinds: dict[str, str] = {}
        for top in w.tops:
            host = max(top.host, 0.0)
            sync = min(top.sync_us, host)
            phases[top.phase] = phases.get(top.phase, 0.0) + (host - sync) / 1e6
            if top.category:
                kinds[top.phase] = top.category
            if sync > 0.0:
                sname = top.phase + SYNC_SUFFIX
                phases[sname] = phases.get(sname, 0.0) + sync / 1e6
                kinds[sname] = Category.SYNC.value
        rec: dict[str, Any] = {"type": "iter", "iter": w.iter,
                               "ts": base_s + w.t0 / 1e6, "dur": _seconds(w.dur),
                               "phases": {name: _seconds(v * 1e6) for name, v in phases.items()}}
        if has_device:
            gpu = {name: 0.0 for name in phases}
            for name, us in gpu_by_window.get(k, {}).items():
                gpu[name] = _seconds(us)
            if gpu:
                rec["gpu"] = gpu
        if kinds:
            rec["kinds"] = kinds
        if mem[k] is not None:
            rec["mem"] = mem[k]
        if w.name is not None:
            rec["name"] = w.name
        records.append(rec)

    pid = cols.threads[thread][0]
    meta: dict[str, Any] = {"type": "meta", "v": 1, "rank": rank, "source": "kineto",
                            "trace": path.name}
    if isinstance(pid, int):
        meta["pid"] = pid
    host = cols.header.get("host_name") or cols.header.get("hostname")
    if isinstance(host, str):
        meta["host"] = host
    if world_size is not None:
        meta["world_size"] = world_size
    return TraceConversion(path=path, rank=rank, rank_source=rank_source, world_size=world_size,
                           windows=windows_kind, meta=meta, records=records, warnings=warnings,
                           events=cols.events_read, host_spans=cols.host_count,
                           device_ops=cols.device_count)


def _device_time(cols: TraceColumns, windows: list[_Window], launch_main: dict[int, _Top],
                 launch_other: dict[int, tuple[int, float]]) -> dict[int, dict[str, float]]:
    """Device µs per window and phase: each activity goes to the phase that
    launched it (by correlation id); a launch from another thread goes to the
    stepping thread's phase at that moment, else to :data:`GPU_OTHER_THREADS`."""
    # Owner (window, phase) of every device activity.
    owner_ids: dict[tuple[int, str], int] = {}
    owners: list[tuple[int, str]] = []
    top_starts = [[t.t0 for t in w.tops] for w in windows]
    d_owner = array("l", [-1]) * len(cols.d_corr)
    for j, corr in enumerate(cols.d_corr):
        if corr < 0:
            continue
        key: tuple[int, str] | None = None
        top = launch_main.get(corr)
        if top is not None:
            key = (top.window, top.phase)
        else:
            o = launch_other.get(corr)
            if o is not None:
                k, t = o
                w = windows[k]
                pos = bisect_right(top_starts[k], t) - 1
                if pos >= 0 and t < w.tops[pos].t1 + NEST_EPS_US:
                    key = (k, w.tops[pos].phase)
                else:
                    key = (k, GPU_OTHER_THREADS)
        if key is None:
            continue
        oid = owner_ids.get(key)
        if oid is None:
            oid = owner_ids[key] = len(owners)
            owners.append(key)
        d_owner[j] = oid
    gpu_us = _device_union(cols, d_owner, len(owners))

    gpu_by_window: dict[int, dict[str, float]] = defaultdict(dict)
    for oid, (k, phase) in enumerate(owners):
        gpu_by_window[k][phase] = gpu_by_window[k].get(phase, 0.0) + gpu_us[oid]
    return gpu_by_window


def _seconds(us: float) -> float:
    """Microseconds to seconds, rounded to Kineto's resolution (1 ns)."""
    return round(us / 1e6, 9)


def _walk_stepping_thread(cols: TraceColumns, info: _NameInfo, idx: list[int],
                          windows: list[_Window], launch_main: dict[int, _Top]) -> None:
    """Find each window's top-level spans, their nested sync time and launches."""
    ts, dur, names, kinds, corrs = cols.h_ts, cols.h_dur, cols.h_name, cols.h_kind, cols.h_corr
    step_events = {w.event for w in windows}
    ev_starts = [ts[i] for i in idx]
    for k, w in enumerate(windows):
        lo = bisect_left(ev_starts, w.t0)
        hi = bisect_left(ev_starts, w.t1)
        end = float("-inf")
        cur: _Top | None = None
        for pos in range(lo, hi):
            i = idx[pos]
            if i in step_events:
                continue
            t0 = ts[i]
            if t0 >= end - NEST_EPS_US:
                if info.step[names[i]] != _NO_STEP:
                    continue  # a step nested in an annotation window: not a phase
                end = t0 + dur[i]
                host = dur[i] if end <= w.t1 else w.t1 - t0
                cur = _Top(k, t0, min(end, w.t1), host, names[i], kinds[i])
                w.tops.append(cur)
            elif kinds[i] == KIND_RUNTIME and info.sync[names[i]] and cur is not None:
                cur.sync_us += max(min(t0 + dur[i], cur.t1) - t0, 0.0)
            if kinds[i] == KIND_RUNTIME and corrs[i] >= 0 and cur is not None:
                launch_main[corrs[i]] = cur


def _walk_other_thread(cols: TraceColumns, info: _NameInfo, idx: list[int],
                       windows: list[_Window], starts: list[float],
                       launch_other: dict[int, tuple[int, float]], *, autograd: bool) -> None:
    """Launches of another thread inside a window, and the autograd thread's activity."""
    ts, dur, names, kinds, corrs = cols.h_ts, cols.h_dur, cols.h_name, cols.h_kind, cols.h_corr
    for i in idx:
        is_launch = kinds[i] == KIND_RUNTIME and corrs[i] >= 0
        is_bwd = autograd and info.framework[names[i]] == _AUTOGRAD
        if not (is_launch or is_bwd):
            continue
        k = _window_of(starts, windows, ts[i])
        if k < 0:
            continue
        if is_launch:
            launch_other[corrs[i]] = (k, ts[i])
        if is_bwd:
            windows[k].autograd.append((ts[i], ts[i] + dur[i]))


def _add_backward_gaps(w: _Window, k: int) -> None:
    """Turn the stepping thread's idle gaps that overlap autograd-thread work into
    synthesized ``backward`` spans: the main thread was blocked in ``backward()``."""
    if not w.autograd:
        return
    spans = sorted(w.autograd)
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    new: list[_Top] = []
    prev_end = w.t0
    m = 0  # first merged interval that may still overlap a later gap (both sorted)
    for top in [*w.tops, None]:
        gap_end = top.t0 if top is not None else w.t1
        while m < len(merged) and merged[m][1] <= prev_end:
            m += 1
        if gap_end > prev_end and m < len(merged) and merged[m][0] < gap_end:
            new.append(_Top(k, prev_end, gap_end, gap_end - prev_end, -1, -1))
        if top is not None:
            new.append(top)
            prev_end = max(prev_end, top.t1)
    w.tops = new


def _classify(w: _Window, cols: TraceColumns, info: _NameInfo) -> None:
    """Give every top of the window its phase name and category."""
    tops = w.tops
    # Where the backward starts: the first backward-like top.
    bwd_start = float("inf")
    for top in tops:
        if top.kind == -1:
            top.phase, top.category = PHASE_BACKWARD, Category.COMPUTE.value
        elif info.framework[top.name] >= 0:
            _, top.phase, top.category = FRAMEWORK_SPANS[info.framework[top.name]]
        elif top.kind == KIND_ANNOTATION:
            top.phase = annotation_phase(cols.names[top.name])
        elif top.kind == KIND_RUNTIME and info.sync[top.name]:
            top.phase, top.category = PHASE_SYNC, Category.SYNC.value
            top.sync_us = 0.0
        if top.phase == PHASE_BACKWARD or (top.kind == KIND_ANNOTATION
                                           and "backward" in split_words(top.phase)):
            bwd_start = min(bwd_start, top.t0)
    for top in tops:
        if top.phase:
            continue
        before = top.t0 < bwd_start
        if before and top.kind == KIND_OP and info.copy[top.name] and top.htod:
            top.phase = PHASE_H2D
        else:
            top.phase = PHASE_FORWARD if before else PHASE_AFTER_BACKWARD
        top.category = Category.COMPUTE.value


def _device_union(cols: TraceColumns, owner: array, n_owners: int) -> list[float]:
    """Device µs per owner: the union of its activities' intervals on each stream,
    summed over streams (overlapping kernels on one stream count once)."""
    out = [0.0] * n_owners
    ts, dur, stream = cols.d_ts, cols.d_dur, cols.d_stream
    # Stable sorts on single keys (ts, then stream, then owner) give the
    # (owner, stream, ts) order without a tuple key per activity.
    order = [j for j in range(len(owner)) if owner[j] >= 0]
    order.sort(key=ts.__getitem__)
    order.sort(key=stream.__getitem__)
    order.sort(key=owner.__getitem__)
    key = None
    cur0 = cur1 = 0.0
    for j in order:
        k = (owner[j], stream[j])
        a, b = ts[j], ts[j] + max(dur[j], 0.0)
        if k != key:
            if key is not None:
                out[key[0]] += cur1 - cur0
            key, cur0, cur1 = k, a, b
        elif a > cur1:
            out[key[0]] += cur1 - cur0
            cur0, cur1 = a, b
        elif b > cur1:
            cur1 = b
    if key is not None:
        out[key[0]] += cur1 - cur0
    return out


def _memory_at(cols: TraceColumns, ends: list[float]) -> list[dict[str, int] | None]:
    """Allocator totals at each window end: the last ``[memory]`` sample at or
    before it, of the device with the most samples."""
    if not len(cols.m_ts):
        return [None] * len(ends)
    # One device: the one with the most samples (a process normally drives one GPU).
    device = Counter(cols.m_device).most_common(1)[0][0]
    order = [j for j in range(len(cols.m_ts)) if cols.m_device[j] == device]
    order.sort(key=cols.m_ts.__getitem__)
    mts = [cols.m_ts[j] for j in order]
    out: list[dict[str, int] | None] = []
    for t in ends:
        pos = bisect_right(mts, t) - 1
        if pos < 0:
            out.append(None)
            continue
        j = order[pos]
        m = {"allocated": int(cols.m_alloc[j])}
        if cols.m_reserved[j] >= 0:
            m["reserved"] = int(cols.m_reserved[j])
        out.append(m)
    return out


# --------------------------------------------------------------------------- ingest seam

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


def register() -> None:
    """Make ``tlog ingest`` read traces: register the ``kineto`` source
    (:func:`ingest.sources.register_source`; ``runs.source = 'kineto'``)."""
    from ingest.sources import Source, register_source

    register_source(Source(kind="kineto", find=find_run_traces, decode=decode_trace,
                           run_source="kineto"))
