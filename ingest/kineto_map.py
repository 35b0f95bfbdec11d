"""Map one torch.profiler (Kineto) trace to tlog v1 records.

Every profiled PyTorch job already has what tlog needs: ``ProfilerStep#N``
spans mark iterations, host spans name the phases, and the device activities
linked to them by correlation ids give real device times. This module maps
one trace file (one rank) to the records of the JSONL format v1
(``docs/FORMAT.md``): one ``meta`` record, then one ``iter`` record per
iteration. The exact rules are in ``docs/KINETO.md``; in short:

- iteration = each ``ProfilerStep#N`` span on the *stepping thread* (the host
  thread with the most of them): ``iter`` N, ``ts`` its start on the wall
  clock, ``dur`` its length. Without steps: cut at the training loop's
  boundary (each DataLoader fetch, else each ``Optimizer.zero_grad``, else
  each ``Optimizer.step``'s end), else one iteration per top-level
  ``record_function`` annotation (descending through a lone enclosing one),
  else :class:`~ingest.errors.TraceError` saying how to add ``schedule=`` and
  ``prof.step()``; every such fallback is a warning;
- phases = the top-level host spans inside the step on that thread:
  annotations by their own name, well-known framework spans by
  :data:`FRAMEWORK_SPANS` (``enumerate(DataLoader)#...__next__`` ->
  ``data_loader_next``, starvation), plain operators grouped into ``h2d``,
  ``forward`` and ``after_backward``, the main thread's wait in ``backward()``
  while the autograd thread runs (``...Backward`` ops, ``AccumulateGrad``,
  ``evaluate_function``) -> ``backward``, its wait while collectives run on
  other threads (``gloo:``, ``nccl:``, ``c10d::``), and all its time after
  launching DDP's last gradient bucket from inside backward, -> ``collective_wait`` (sync);
- sync: the host-blocking runtime calls (:data:`SYNC_CALLS`, and async copies
  that returned only after their copy ran: :func:`_blocking`) nested in a
  phase are taken out of it into ``<phase>_sync`` (category sync), placed
  right after it, so top-level phases never overlap and still sum to the
  spans' wall time; a top-level one is the phase ``sync``; what stays in such
  a phase is host work (dispatch, launches), so it is compute even where the
  phase's name is a collective's (``## sparse_data_dist ##``);
- ``gpu``: kernels, memcpys and memsets linked to the phase that launched
  them (``args.correlation``), merged as a union per stream, summed over
  streams.

Finding the traces of a run and their ranks is :mod:`tlog.ingest.kineto_find`;
the ingest source is :mod:`tlog.ingest.kineto`.

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
from itertools import pairwise
from pathlib import Path
from typing import Any

from tlog.ingest.errors import TraceError
from tlog.ingest.kineto_find import resolve_rank
from tlog.ingest.kineto_read import (
    DKIND_MEMCPY,
    KIND_ANNOTATION,
    KIND_OP,
    KIND_RUNTIME,
    TraceColumns,
    read_columns,
)

from dflash_runtime.format import P2P_RECV_WAIT, P2P_SEND_WAIT, Category, categorize, split_words

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
#: Indices in :data:`FRAMEWORK_SPANS`: the DataLoader fetch, the optimizer's
#: ``zero_grad`` and ``step`` (the loop marks of traces without steps) and the
#: autograd engine's spans.
_DATALOADER, _OPT_STEP, _ZERO_GRAD, _AUTOGRAD = 0, 1, 2, 4

#: Names of backward work, whatever the PyTorch generation: the autograd
#: engine's ``autograd::engine::evaluate_function: <Node>`` (PyTorch >= 1.9),
#: the autograd nodes themselves (``AddmmBackward0``, ``CudnnConvolutionBackward``
#: in 2021 traces; ``XxxBackward<N>`` since 1.10), and the gradient
#: accumulation node ``torch::autograd::AccumulateGrad``. Source: the node
#: names of torch/csrc/autograd (generated ``*Backward*`` classes) as Kineto
#: records them; the 2021 TensorBoard-plugin samples have only the node names.
BACKWARD_OP_RE = re.compile(r"^autograd::engine::evaluate_function|AccumulateGrad$"
                            r"|^[A-Za-z0-9_:]*Backward\d*$")

#: Host spans of collective communication: the backend's span
#: (``gloo:all_reduce``, ``nccl:all_to_all``, written by ``record_param_comms``
#: since PyTorch 2.1), the dispatcher ops ``c10d::allreduce_`` etc., and
#: ``record_param_comms`` itself. Source: torch/csrc/distributed/c10d
#: (ProcessGroup*.cpp, ParamCommsUtils) as the HTA sample traces show them.
COLLECTIVE_RE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl|hccl):|^c10d::|^record_param_comms$")

#: Backend spans of point-to-point transfers (``gloo:recv``, ``gloo:send``,
#: ``nccl:recv``, ``nccl:send``): written by ``record_param_comms`` at the call and
#: ended when the work completes, so such a span outlives the call that opened it
#: (a ``gloo:recv`` of 50 ms inside a 0.1 ms ``c10d::recv_``, torch 2.13). Source:
#: torch/csrc/distributed/c10d (ProcessGroupGloo.cpp, ProcessGroupNCCL.cpp) as
#: ``torch.distributed.pipelining`` traces show them.
P2P_SPAN_RE = re.compile(r"^(gloo|nccl|mpi|ucc|xccl|hccl):(send|recv)\b")
#: The dispatcher ops of point-to-point calls (``c10d::send``, ``c10d::recv_``,
#: ``c10d::recv_any_source_``): the host inside the backend's call, which blocks
#: there when the transfer cannot start (a blocking ``dist.send`` of 14.8 ms in a
#: hand-written pipeline's trace, torch 2.13). Their time is a wait too.
P2P_OP_RE = re.compile(r"^c10d::(send|recv)(_any_source)?_?$")
#: A transfer ending up to this many µs after an idle stretch of the thread still
#: ends it (the span's end and the thread's next span are read on one clock; tlog's
#: choice: rounding and the wake-up's first op).
P2P_END_SLACK_US = 50.0
#: :attr:`_NameInfo.p2p` values.
_P2P_NONE, _P2P_RECV, _P2P_SEND = 0, 1, 2

#: Spans of DDP's gradient reducer (``torch.distributed.ddp.reducer::copy_bucket_to_grad``,
#: ``torch::distributed::reducer::copy_``): after the last bucket's all-reduce,
#: backward's return copies each finished bucket back into the gradients.
#: Source: torch/csrc/distributed/c10d/reducer.cpp as torch 2.13's traces show it.
DDP_REDUCER_RE = re.compile(r"^torch(\.|::)distributed(\.|::)(ddp(\.|::))?reducer::")

#: Asynchronous copy calls (CUDA runtime and driver API, HIP). Such a call
#: blocks the host when the copy cannot be asynchronous (pageable host memory,
#: e.g. ``tensor.cpu()`` into a non-pinned tensor): it returns only after the
#: copy ran. Source: CUDA Runtime API, "API synchronization behavior"
#: ("for transfers from device memory to pageable host memory, the function
#: will return only once the copy has completed").
ASYNC_COPY_RE = re.compile(r"^(cuda|cu|hip)Memcpy\w*Async$")
#: A copy call is a host block when its copy's device activity ended by the
#: time the call returned (allowing :data:`BLOCKING_COPY_SKEW_US` of host/device
#: clock skew) and the call took at least :data:`BLOCKING_COPY_MIN_US`: an
#: asynchronous launch returns before its copy runs; a launch costs a few µs.
#: Both thresholds are tlog's choice (10x a typical ~5 µs launch; Kineto's
#: device timestamps are aligned to the host clock within a few µs).
BLOCKING_COPY_MIN_US = 50.0
BLOCKING_COPY_SKEW_US = 5.0

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
#: The stepping thread's idle time while collectives run on other threads.
PHASE_COLLECTIVE_WAIT = "collective_wait"
SYNC_SUFFIX = "_sync"
#: gpu-only key: device work launched from another thread at a moment no phase covers.
GPU_OTHER_THREADS = "other_threads"

#: Nesting tolerance (µs): Kineto rounds to 1 ns, so a span that starts within
#: 2 ns of its predecessor's end is its sibling, not its child.
NEST_EPS_US = 0.002

#: How to make a trace tlog can read (the message of a trace without iterations).
HOW_TO_STEP = (
    "profile with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, "
    "active=5), ...) and call prof.step() once per training iteration, or wrap each "
    "iteration in torch.profiler.record_function(\"step\")"
)

_NO_STEP = -1
#: A trace cut at the loop boundary (no ``ProfilerStep``, so no profiler
#: schedule skipped the warm-up) drops its first iteration when it is longer
#: than this many times the median of the others: one-time initialization
#: (cuDNN autotuning, lazy allocation). tlog's choice; the analysis's own
#: warm-up detection needs 8 iterations per worker, more than such traces hold.
WARMUP_FACTOR = 3.0
#: ``_Top.kind`` of synthesized spans: the thread's wait in ``backward()``, in a collective.
_SYNTH_BACKWARD, _SYNTH_COLLECTIVE = -1, -2
#: ``_Top.kind`` of the stepping thread's top-level idle time while its own
#: point-to-point transfers are in flight.
_SYNTH_RECV, _SYNTH_SEND = -3, -4


@dataclass
class TraceConversion:
    """One trace turned into v1 records.

    Attributes:
        path: the trace file.
        rank: the rank of its records; ``rank_source`` says where it came from
            (``"distributedInfo"``, ``"file name"`` or ``"default"``).
        world_size: ``distributedInfo.world_size`` if present.
        windows: ``"ProfilerStep"``, ``"loop"`` (cut at the loop boundary) or
            ``"annotation"`` (what the iterations are).
        meta: the ``meta`` record (rank, pid, host, world_size, source, trace).
        records: the ``iter`` records, in time order.
        samples: the ``sys`` records made of the device's ``[memory]`` events
            (:func:`memory_samples`), in time order.
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
    samples: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> Iterator[str]:
        """The records as JSONL lines (no newline): the ``meta`` line first, then
        the ``iter`` records, then the ``sys`` ones."""
        yield json.dumps(self.meta, separators=(",", ":"))
        for rec in (*self.records, *self.samples):
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
    backward: list[bool] = field(default_factory=list)     # backward work (BACKWARD_OP_RE)
    collective: list[bool] = field(default_factory=list)   # a collective (COLLECTIVE_RE)
    async_copy: list[bool] = field(default_factory=list)   # an async copy call (ASYNC_COPY_RE)
    reducer: list[bool] = field(default_factory=list)      # DDP's reducer (DDP_REDUCER_RE)
    p2p: list[int] = field(default_factory=list)           # _P2P_* (P2P_SPAN_RE)
    p2p_op: list[int] = field(default_factory=list)        # _P2P_* (P2P_OP_RE)


def _name_info(names: list[str]) -> _NameInfo:
    step, fw, sync, copy = [], [], [], []
    bwd, coll, acopy, reducer, p2p, p2p_op = [], [], [], [], [], []
    for name in names:
        m = P2P_SPAN_RE.match(name)
        p2p.append(_P2P_NONE if m is None else _P2P_RECV if m.group(2) == "recv" else _P2P_SEND)
        m = P2P_OP_RE.match(name)
        p2p_op.append(_P2P_NONE if m is None else _P2P_RECV if m.group(1) == "recv" else _P2P_SEND)
        reducer.append(bool(DDP_REDUCER_RE.match(name)))
        bwd.append(bool(BACKWARD_OP_RE.search(name)) or "backward" in split_words(name))
        coll.append(bool(COLLECTIVE_RE.search(name)))
        acopy.append(bool(ASYNC_COPY_RE.match(_base_call(name))))
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
    return _NameInfo(step, fw, sync, copy, bwd, coll, acopy, reducer, p2p, p2p_op)


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
    #: Spans of backward work on other threads (the autograd thread), µs.
    autograd: list[tuple[float, float]] = field(default_factory=list)
    #: Collective spans on other threads (gloo/NCCL worker threads), µs.
    collective: list[tuple[float, float]] = field(default_factory=list)
    #: When (µs) each gradient bucket whose collective the stepping thread called
    #: from inside a backward operator became ready: the end of DDP's last reducer
    #: span (its copy of the gradient into the bucket) nested in that operator
    #: before the call, else the call's start. DDP's gradient-bucket all-reduces,
    #: launched by the reducer's hooks on the thread that runs backward (CPU tensors).
    launches: list[float] = field(default_factory=list)
    #: The stepping thread's own point-to-point transfers in flight: ``(start,
    #: end, _P2P_RECV or _P2P_SEND)``, µs (:data:`P2P_SPAN_RE`).
    p2p: list[tuple[float, float, int]] = field(default_factory=list)


@dataclass(eq=False, slots=True)
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
    blocking: bool = False  # itself a host-blocking runtime call
    phase: str = ""
    category: str = ""
    #: its idle time while its thread's point-to-point transfers were in flight,
    #: µs, by phase name (``recv_wait``, ``send_wait``): carved out as sync
    p2p_us: dict[str, float] = field(default_factory=dict)
    #: end of its direct children so far (µs), while the walk is inside it
    cursor: float = 0.0


def _thread_events(cols: TraceColumns) -> dict[int, array]:
    """Host span indices per thread (typed arrays: 8 bytes per span)."""
    by: dict[int, array] = {}
    for i, t in enumerate(cols.h_thread):
        arr = by.get(t)
        if arr is None:
            arr = by[t] = array("q")
        arr.append(i)
    return by


def _sorted(cols: TraceColumns, idx: Iterable[int]) -> array:
    """Indices by start, the longer (enclosing) span first at equal starts, then
    in file order: a typed array (8 bytes per span; numpy's stable sort, no
    Python object per span)."""
    return _sorted_arrays(cols, idx)[0]


def _sorted_arrays(cols: TraceColumns, idx: Iterable[int]) -> tuple[array, array]:
    """:func:`_sorted`'s order and the spans' starts in that order (µs), as typed arrays."""
    import numpy as np

    ix = np.frombuffer(idx, dtype=np.int64) if isinstance(idx, array) and idx.typecode == "q" \
        else np.fromiter(idx, dtype=np.int64)
    ts = np.frombuffer(cols.h_ts, dtype=np.float64)[ix]
    dur = np.frombuffer(cols.h_dur, dtype=np.float64)[ix]
    order = np.lexsort((-dur, ts))
    del dur
    out, starts = array("q"), array("d")
    out.frombytes(ix[order].tobytes())
    starts.frombytes(ts[order].tobytes())
    return out, starts


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


def _loop_windows(cols: TraceColumns, info: _NameInfo, by_thread: dict[int, array],
                  warnings: list[str]) -> tuple[int, list[_Window]] | None:
    """Iterations of a trace without ``ProfilerStep`` spans, cut at the loop's
    repeating boundary (docs/KINETO.md, rule 2): each top-level DataLoader
    fetch starts one; else each top-level ``Optimizer.zero_grad``; else each
    top-level ``Optimizer.step`` ends one. The last (first) window ends (starts)
    at the end (start) of the thread's last (first) top-level span. None when
    no thread has such a mark at top level."""
    ts, dur = cols.h_ts, cols.h_dur
    for fw, edge, label in ((_DATALOADER, "start", ("each DataLoader fetch "
                             "(enumerate(DataLoader)#...__next__) starts one")),
                            (_ZERO_GRAD, "start", "each Optimizer.zero_grad starts one"),
                            (_OPT_STEP, "end", "each Optimizer.step ends one")):
        best: tuple[int, list[int], list[int]] | None = None
        for thread, idx in by_thread.items():
            if not any(info.framework[cols.h_name[i]] == fw for i in idx):
                continue
            tops = _top_level(cols, _sorted(cols, idx))
            marks = [i for i in tops if info.framework[cols.h_name[i]] == fw]
            if marks and (best is None or len(marks) > len(best[1])):
                best = (thread, marks, tops)
        if best is None:
            continue
        thread, marks, tops = best
        if edge == "start":
            last_end = max(ts[i] + dur[i] for i in tops)
            bounds = [ts[i] for i in marks] + [last_end]
        else:
            bounds = [ts[tops[0]]] + [ts[i] + dur[i] for i in marks]
        windows = [_Window(k, a, b, b - a, -1, None)
                   for k, (a, b) in enumerate(pairwise(bounds)) if b > a]
        if not windows:
            continue
        rest = sorted(w.dur for w in windows[1:])
        if rest and windows[0].dur > WARMUP_FACTOR * rest[len(rest) // 2]:
            warnings.append(f"the first loop iteration ({windows[0].dur / 1e3:,.1f} ms, over "
                            f"{WARMUP_FACTOR:g}x the median of the others) is warm-up (one-time "
                            f"initialization, no profiler schedule to skip it): left out")
            windows = windows[1:]
        edge_note = ("the last ends with the thread's last span" if edge == "start"
                     else "the first starts with the thread's first span")
        warnings.append(f"no ProfilerStep spans: {len(windows)} iterations cut at the training "
                        f"loop's boundary ({label}; {edge_note}); for exact steps, "
                        f"{HOW_TO_STEP}")
        return thread, windows
    return None


def _annotation_windows(cols: TraceColumns, info: _NameInfo, by_thread: dict[int, array],
                        warnings: list[str]) -> tuple[int, list[_Window]] | None:
    best: tuple[int, list[int]] | None = None
    for thread, idx in by_thread.items():
        ann = _sorted(cols, [i for i in idx if cols.h_kind[i] == KIND_ANNOTATION
                             and info.framework[cols.h_name[i]] < 0
                             and not info.collective[cols.h_name[i]]])
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

    warnings.extend(cols.notes)
    found = _step_windows(cols, info, by_thread, warnings)
    windows_kind = "ProfilerStep"
    if found is None:
        found = _loop_windows(cols, info, by_thread, warnings)
        windows_kind = "loop"
    if found is None:
        found = _annotation_windows(cols, info, by_thread, warnings)
        windows_kind = "annotation"
    if found is None:
        msg = (f"trace {path} has no ProfilerStep#N spans, no DataLoader or optimizer spans "
               f"and no record_function annotations, so it has no iterations: {HOW_TO_STEP}")
        raise TraceError(msg)
    thread, windows = found
    starts = [w.t0 for w in windows]

    copy_end = _copy_ends(cols, info)
    htod = {corr for j, corr in enumerate(cols.d_corr) if cols.d_htod[j] and corr >= 0}
    launch_other: dict[int, tuple[int, float]] = {}    # corr -> (window, launch ts)
    autograd_threads = {t for t, idx in by_thread.items() if t != thread
                        and any(info.backward[cols.h_name[i]] for i in idx)}
    for t, idx in by_thread.items():
        if t == thread:
            continue
        _walk_other_thread(cols, info, idx, windows, starts, launch_other,
                           autograd=t in autograd_threads)
    other_by_window: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for corr, (k, t) in launch_other.items():
        other_by_window[k].append((corr, t))
    del launch_other

    # One window at a time: its top-level spans live only while it is mapped, so
    # memory grows with the windows and launches, not with the host spans.
    owners = _Owners()
    launch_oid: dict[int, int] = {}     # corr -> owner, launched on the stepping thread
    other_oid: dict[int, int] = {}      # corr -> owner, launched on another thread
    idx, ev_starts = _sorted_arrays(cols, by_thread[thread])
    step_events = {w.event for w in windows}
    parts: list[tuple[dict[str, float], list[tuple[str, str, bool]]]] = []
    split: set[str] = set()
    for k, w in enumerate(windows):
        launches: list[tuple[int, _Top]] = []
        _walk_window(cols, info, idx, ev_starts, k, w, step_events, launches, copy_end)
        for corr, top in launches:
            if corr in htod:
                top.htod = True
        _fill_gaps(w, k, info)
        _exposed_collective_wait(w, k, info)
        _classify(w, cols, info)
        for corr, top in launches:
            launch_oid[corr] = owners.id(k, top.phase)
        top_starts = [t.t0 for t in w.tops]
        for corr, t in other_by_window.pop(k, ()):
            pos = bisect_right(top_starts, t) - 1
            if pos >= 0 and t < w.tops[pos].t1 + NEST_EPS_US:
                other_oid[corr] = owners.id(k, w.tops[pos].phase)
            else:
                other_oid[corr] = owners.id(k, GPU_OTHER_THREADS)
        parts.append(_window_sums(w, split))
        w.tops, w.p2p = [], []
    del idx, ev_starts

    gpu_by_window = _device_time(cols, owners, launch_oid, other_oid)

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
    host_only = _host_only(cols)
    mem = _memory_at(cols, [w.t1 for w in windows])

    # An annotation whose blocking calls were split out keeps host work only
    # (op dispatch, kernel launches): compute, even when its name is a
    # collective's (torchrec's "## sparse_data_dist ##").
    records: list[dict[str, Any]] = []
    for k, w in enumerate(windows):
        phases, seq = parts[k]
        kinds: dict[str, str] = {}
        for phase, category, synced in seq:
            if category:
                kinds[phase] = category
            elif phase in split and categorize(phase) == Category.SYNC.value:
                kinds[phase] = Category.COMPUTE.value
            if synced:
                kinds[phase + SYNC_SUFFIX] = Category.SYNC.value
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
    if host_only:
        meta["device"] = "cpu"
    return TraceConversion(path=path, rank=rank, rank_source=rank_source, world_size=world_size,
                           windows=windows_kind, meta=meta, records=records, warnings=warnings,
                           events=cols.events_read, host_spans=cols.host_count,
                           device_ops=cols.device_count,
                           samples=memory_samples(cols, windows, base_s))


class _Owners:
    """Ids of the (window, phase) pairs device work is attributed to."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, str]] = []
        self._ids: dict[tuple[int, str], int] = {}

    def id(self, k: int, phase: str) -> int:
        """The id of window ``k``'s phase ``phase`` (a new one the first time)."""
        key = (k, phase)
        oid = self._ids.get(key)
        if oid is None:
            oid = self._ids[key] = len(self.keys)
            self.keys.append(key)
        return oid


def _device_time(cols: TraceColumns, owners: _Owners, launch_oid: dict[int, int],
                 other_oid: dict[int, int]) -> dict[int, dict[str, float]]:
    """Device µs per window and phase: each activity goes to the phase that
    launched it (by correlation id: ``launch_oid`` for the stepping thread's
    launches, else ``other_oid``, the stepping thread's phase at the moment
    another thread launched it, or :data:`GPU_OTHER_THREADS`). An owner none of
    whose launches has a device activity counted (none in the trace, or only
    NCCL send/recv kernels) gets no entry."""
    d_owner = array("l", [-1]) * len(cols.d_corr)
    used = bytearray(len(owners.keys))
    p2p = cols.d_p2p
    for j, corr in enumerate(cols.d_corr):
        if corr < 0 or p2p[j]:   # an NCCL send/recv kernel waits for a peer: no compute
            continue
        oid = launch_oid.get(corr)
        if oid is None:
            oid = other_oid.get(corr)
        if oid is not None:
            d_owner[j] = oid
            used[oid] = 1
    gpu_us = _device_union(cols, d_owner, len(owners.keys))

    gpu_by_window: dict[int, dict[str, float]] = defaultdict(dict)
    for oid, (k, phase) in enumerate(owners.keys):
        if used[oid]:
            gpu_by_window[k][phase] = gpu_by_window[k].get(phase, 0.0) + gpu_us[oid]
    return gpu_by_window


def _window_sums(w: _Window, split: set[str]) -> tuple[dict[str, float], list[tuple[str, str, bool]]]:
    """A mapped window's phases (host seconds each, its blocking calls' time in
    ``<phase>_sync``, an annotation's wait on its thread's send/recv carved out
    into ``recv_wait``/``send_wait``: :attr:`_Top.p2p_us`) and the sequence of
    (phase, category, has sync) of its tops and carve-outs, consecutive repeats
    dropped (what the record's ``kinds`` are made of); adds to ``split`` the
    uncategorized phases whose blocking calls were split out."""
    phases: dict[str, float] = {}
    seq: list[tuple[str, str, bool]] = []
    for top in w.tops:
        host = max(top.host, 0.0)
        sync = min(top.sync_us, host)
        phases[top.phase] = phases.get(top.phase, 0.0) + (host - sync) / 1e6
        if sync > 0.0:
            sname = top.phase + SYNC_SUFFIX
            phases[sname] = phases.get(sname, 0.0) + sync / 1e6
        entry = (top.phase, top.category, sync > 0.0)
        if not seq or seq[-1] != entry:
            seq.append(entry)
        for pname, us in top.p2p_us.items():   # its wait on send/recv: carved out
            us = min(us, phases[top.phase] * 1e6)
            phases[top.phase] -= us / 1e6
            phases[pname] = phases.get(pname, 0.0) + us / 1e6
            entry = (pname, Category.SYNC.value, False)
            if seq[-1] != entry:
                seq.append(entry)
        if not top.category and top.sync_us > 0.0 and top.host > 0.0:
            split.add(top.phase)
    return phases, seq


def _seconds(us: float) -> float:
    """Microseconds to seconds, rounded to Kineto's resolution (1 ns)."""
    return round(us / 1e6, 9)


def _copy_ends(cols: TraceColumns, info: _NameInfo) -> dict[int, float]:
    """End (µs) of the device copy of each correlation id that has one, when the
    trace holds asynchronous copy calls (else {}): what :func:`_blocking` needs."""
    if not any(info.async_copy):
        return {}
    ends: dict[int, float] = {}
    for j, corr in enumerate(cols.d_corr):
        if corr >= 0 and cols.d_kind[j] == DKIND_MEMCPY:
            end = cols.d_ts[j] + cols.d_dur[j]
            if end > ends.get(corr, float("-inf")):
                ends[corr] = end
    return ends


def _blocking(cols: TraceColumns, info: _NameInfo, i: int, copy_end: dict[int, float]) -> bool:
    """Whether host span ``i`` (a runtime call) blocked the host: a call of
    :data:`SYNC_CALLS`, or an asynchronous copy (:data:`ASYNC_COPY_RE`) of at
    least :data:`BLOCKING_COPY_MIN_US` that returned only after its copy ended."""
    name = cols.h_name[i]
    if info.sync[name]:
        return True
    if not info.async_copy[name] or cols.h_dur[i] < BLOCKING_COPY_MIN_US:
        return False
    end = copy_end.get(cols.h_corr[i])
    return end is not None and end <= cols.h_ts[i] + cols.h_dur[i] + BLOCKING_COPY_SKEW_US


def _walk_window(cols: TraceColumns, info: _NameInfo, idx: array, ev_starts: array, k: int,
                 w: _Window, step_events: set[int], launches: list[tuple[int, _Top]],
                 copy_end: dict[int, float]) -> None:
    """Find window ``k``'s top-level spans on the stepping thread (``idx``: its
    spans in :func:`_sorted` order, ``ev_starts`` their starts), their nested
    host-blocking time, and its launches (correlation id, launching top) in order;
    the thread's point-to-point transfers go to ``w.p2p``, and an annotation's idle
    time while they are in flight to its :attr:`_Top.p2p_us` (:func:`_idle_p2p`)."""
    ts, dur, names, kinds, corrs = cols.h_ts, cols.h_dur, cols.h_name, cols.h_kind, cols.h_corr
    lo = bisect_left(ev_starts, w.t0)
    hi = bisect_left(ev_starts, w.t1)
    end = float("-inf")
    cur: _Top | None = None
    filled = float("-inf")   # end of the last reducer span nested in ``cur``
    for pos in range(lo, hi):
        i = idx[pos]
        if i in step_events:
            continue
        t0 = ts[i]
        if t0 >= end - NEST_EPS_US:
            if info.step[names[i]] != _NO_STEP:
                continue  # a step nested in an annotation window: not a phase
            if cur is not None:
                _idle_p2p(cur, w, cur.cursor, cur.t1)
            end = t0 + dur[i]
            host = dur[i] if end <= w.t1 else w.t1 - t0
            cur = _Top(k, t0, min(end, w.t1), host, names[i], kinds[i])
            cur.cursor = t0
            cur.blocking = kinds[i] == KIND_RUNTIME and _blocking(cols, info, i, copy_end)
            w.tops.append(cur)
            filled = float("-inf")
        elif cur is not None and info.p2p[names[i]]:
            # in flight beyond the call that opened it: not the thread's own work
            w.p2p.append((t0, t0 + dur[i], info.p2p[names[i]]))
            continue
        else:
            if cur is not None and cur.kind == KIND_ANNOTATION:
                _child(cur, w, t0, t0 + dur[i], info.p2p_op[names[i]])
            if info.reducer[names[i]] and cur is not None:
                filled = t0 + dur[i]
            elif (kinds[i] == KIND_RUNTIME and cur is not None
                  and _blocking(cols, info, i, copy_end)):
                cur.sync_us += max(min(t0 + dur[i], cur.t1) - t0, 0.0)
            elif (info.collective[names[i]] and cur is not None and cur.kind == KIND_OP
                  and info.backward[cur.name] and t0 < w.t1):
                w.launches.append(filled if cur.t0 <= filled <= t0 else t0)
        if kinds[i] == KIND_RUNTIME and corrs[i] >= 0 and cur is not None:
            launches.append((corrs[i], cur))
    if cur is not None:
        _idle_p2p(cur, w, cur.cursor, cur.t1)


def _child(top: _Top, w: _Window, t0: float, t1: float, p2p_op: int) -> None:
    """Note a span nested in ``top`` from ``t0`` to ``t1`` (µs): the idle time
    before it, when it is a direct child, goes to :func:`_idle_p2p`; a direct
    child that is a point-to-point call (``p2p_op``, :data:`P2P_OP_RE`) is a wait
    itself; its end moves ``top.cursor``. Only for annotations (:func:`_idle_p2p`)."""
    if t0 >= top.cursor:
        if t0 > top.cursor:
            _idle_p2p(top, w, top.cursor, t0)
        if p2p_op:
            name = P2P_RECV_WAIT if p2p_op == _P2P_RECV else P2P_SEND_WAIT
            top.p2p_us[name] = top.p2p_us.get(name, 0.0) + max(min(t1, top.t1) - t0, 0.0)
    top.cursor = max(top.cursor, t1)


def _p2p_cover(w: _Window, a: float, b: float) -> list[tuple[float, float, int]]:
    """The wait in the stepping thread's idle stretch ``(a, b)`` (µs): from ``a`` to
    the last end, inside the stretch, of a point-to-point transfer of the thread
    (``w.p2p``), as ``[(a, end, _P2P_RECV or _P2P_SEND)]`` (a receive when one of
    the transfers ending there is a receive: the thread waits for its input), or
    ``[]`` when no transfer ends in it. A thread blocked in ``wait()`` resumes when
    its transfer completes; a stretch of Python work while transfers stay in flight
    ends at no completion (:data:`P2P_END_SLACK_US`)."""
    if b <= a or not w.p2p:
        return []
    ends = [(e, kind) for s, e, kind in w.p2p if s < b and a < e <= b + P2P_END_SLACK_US]
    if not ends:
        return []
    end = min(max(e for e, _ in ends), b)
    kind = _P2P_RECV if any(k == _P2P_RECV for _, k in ends) else _P2P_SEND
    return [(a, end, kind)]


def _idle_p2p(top: _Top, w: _Window, a: float, b: float) -> None:
    """Count the idle time ``(a, b)`` inside annotation ``top`` during which the
    thread's point-to-point transfers were in flight as ``recv_wait``/``send_wait``.
    Only an annotation: its own time is Python (the schedule's, the ``wait()`` no
    span records); an operator's own time is the operator's work."""
    if top.kind != KIND_ANNOTATION:
        return
    for s, e, kind in _p2p_cover(w, a, min(b, top.t1)):
        name = P2P_RECV_WAIT if kind == _P2P_RECV else P2P_SEND_WAIT
        top.p2p_us[name] = top.p2p_us.get(name, 0.0) + (e - s)


def _walk_other_thread(cols: TraceColumns, info: _NameInfo, idx: Iterable[int],
                       windows: list[_Window], starts: list[float],
                       launch_other: dict[int, tuple[int, float]], *, autograd: bool) -> None:
    """Launches of another thread inside a window, the autograd thread's
    activity (every span; a span inside the previous one kept is skipped, so a
    time-ordered thread keeps about one interval per top-level span) and the
    collective spans of the other threads."""
    ts, dur, names, kinds, corrs = cols.h_ts, cols.h_dur, cols.h_name, cols.h_kind, cols.h_corr
    last_start = last_end = float("-inf")
    for i in idx:
        is_launch = kinds[i] == KIND_RUNTIME and corrs[i] >= 0
        is_coll = not autograd and info.collective[names[i]]
        if not (is_launch or autograd or is_coll):
            continue
        k = _window_of(starts, windows, ts[i])
        if k < 0:
            continue
        if is_launch:
            launch_other[corrs[i]] = (k, ts[i])
        t0, t1 = ts[i], ts[i] + dur[i]
        if autograd:
            if t0 >= last_start and t1 <= last_end:
                continue     # nested in the span kept last
            last_start, last_end = t0, t1
            windows[k].autograd.append((t0, t1))
        elif is_coll:
            windows[k].collective.append((t0, t1))


def _merge(spans: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Union of intervals: the sorted starts and ends of the disjoint pieces."""
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(spans):
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


def _overlapping(union: tuple[list[float], list[float]], a: float, b: float) -> range:
    """Indices of the pieces of ``union`` (:func:`_merge`) that overlap ``(a, b)``."""
    starts, ends = union
    return range(bisect_right(ends, a), bisect_left(starts, b))


def _fill_gaps(w: _Window, k: int, info: _NameInfo) -> None:
    """Name the stepping thread's idle gaps inside the window by what other
    threads did meanwhile (docs/KINETO.md "Gaps of the stepping thread"):

    - a gap between two backward spans of the stepping thread is ``backward``
      (the thread is inside ``backward()``, between two autograd nodes);
    - a gap that overlaps autograd-thread work is ``backward`` as a whole (the
      thread waits in ``backward()`` while the autograd engine's device thread
      runs it, from the call to its return) - unless collectives run on other
      threads after that work ends: then ``backward`` ends with the autograd
      work and the collectives' time after it is ``collective_wait``;
    - a gap without autograd work: the moments a collective runs on another
      thread are ``collective_wait`` (sync), each moment counted once;
    - what remains stays idle (unaccounted).
    """
    if not (w.autograd or w.collective or w.p2p) and not w.tops:
        return
    bwd = _merge(w.autograd)
    coll = _merge(w.collective)
    new: list[_Top] = []

    def synth(a: float, b: float, kind: int) -> None:
        if b > a:
            new.append(_Top(k, a, b, b - a, -1, kind))

    def collective_part(a: float, b: float) -> None:
        for s, e, kind in _p2p_cover(w, a, b):   # the thread's own transfers first
            collective_only(a, s)
            synth(s, e, _SYNTH_RECV if kind == _P2P_RECV else _SYNTH_SEND)
            a = e
        collective_only(a, b)

    def collective_only(a: float, b: float) -> None:
        for j in _overlapping(coll, a, b):
            synth(max(a, coll[0][j]), min(b, coll[1][j]), _SYNTH_COLLECTIVE)

    prev_end = w.t0
    prev_bwd = False
    for top in [*w.tops, None]:
        gap_end = top.t0 if top is not None else w.t1
        top_bwd = top is not None and top.kind >= 0 and info.backward[top.name]
        if gap_end > prev_end:
            if prev_bwd and top_bwd:
                synth(prev_end, gap_end, _SYNTH_BACKWARD)
            else:
                inside = _overlapping(bwd, prev_end, gap_end)
                if inside:
                    b1 = min(bwd[1][inside[-1]], gap_end)
                    if _overlapping(coll, b1, gap_end):
                        synth(prev_end, b1, _SYNTH_BACKWARD)
                        collective_part(b1, gap_end)
                    else:
                        synth(prev_end, gap_end, _SYNTH_BACKWARD)
                else:
                    collective_part(prev_end, gap_end)
        if top is not None:
            new.append(top)
            if top.t1 >= prev_end:
                prev_end = top.t1
                prev_bwd = top_bwd
    w.tops = new


def _exposed_collective_wait(w: _Window, k: int, info: _NameInfo) -> None:
    """DDP's exposed all-reduce wait when the stepping thread runs backward itself
    (CPU tensors, gloo): from the moment its last gradient bucket became ready
    (the end of DDP's copy of the gradient into the bucket, a reducer span, nested
    in the backward operator that then made the collective call; DDP calls the
    comm hook there, which averages the bucket and makes the call; without such a
    span, the call's start) to the end
    of the last collective running on another thread, or to the end of DDP's last
    copy of a finished bucket back into the gradients when that comes later,
    every moment of the stepping thread is ``collective_wait`` (docs/KINETO.md
    "Gaps of the stepping thread", rule 5).

    What the thread does after its last bucket is ready is waiting for the
    all-reduce, whether it shows as a gap, as a long call into the collective, as
    the rest of the backward operator that launched it, or as DDP's copies back
    (``backward()`` returns after them): the exposed wait the shim's
    ``rec.watch_ddp`` measures from the same moment. It stops early at the first
    top-level span after the launch that is neither an operator nor synthesized
    (the optimizer's annotation, another ``record_function``): the thread's own
    next phase.
    """
    if not w.launches or not w.collective:
        return
    ready = max(w.launches)
    end = max((b for _, b in w.collective if b > ready), default=ready)
    for top in w.tops:
        if top.t0 < ready:
            continue
        if (top.kind not in (KIND_OP, _SYNTH_BACKWARD, _SYNTH_COLLECTIVE)
                or (top.name >= 0 and info.framework[top.name] >= 0)):
            end = min(end, top.t0)
            break
        if top.name >= 0 and info.reducer[top.name]:
            end = max(end, top.t1)
    end = min(end, w.t1)
    if end <= ready:
        return
    new: list[_Top] = []
    for top in w.tops:
        if top.t1 <= ready or top.t0 >= end:
            new.append(top)
            continue
        if top.t1 > end:   # the part after the wait keeps its name
            tail = _Top(k, end, top.t1, top.t1 - end, top.name, top.kind)
            tail.htod = top.htod
            new.append(tail)
        if top.t0 < ready:  # the part before the wait (the launching operator's own work)
            top.t1 = ready
            top.host = ready - top.t0
            top.sync_us = min(top.sync_us, top.host)
            new.append(top)
    new.append(_Top(k, ready, end, end - ready, -1, _SYNTH_COLLECTIVE))
    new.sort(key=lambda t: t.t0)
    w.tops = new


def _classify(w: _Window, cols: TraceColumns, info: _NameInfo) -> None:
    """Give every top of the window its phase name and category."""
    tops = w.tops
    # Where the backward starts: the first backward-like top.
    bwd_start = float("inf")
    for top in tops:
        if top.kind == _SYNTH_BACKWARD:
            top.phase, top.category = PHASE_BACKWARD, Category.COMPUTE.value
        elif top.kind == _SYNTH_COLLECTIVE:
            top.phase, top.category = PHASE_COLLECTIVE_WAIT, Category.SYNC.value
        elif top.kind in (_SYNTH_RECV, _SYNTH_SEND):
            top.phase = P2P_RECV_WAIT if top.kind == _SYNTH_RECV else P2P_SEND_WAIT
            top.category = Category.SYNC.value
        elif top.kind == KIND_OP and info.p2p_op[top.name]:
            top.phase = P2P_RECV_WAIT if info.p2p_op[top.name] == _P2P_RECV else P2P_SEND_WAIT
            top.category = Category.SYNC.value
        elif info.framework[top.name] >= 0:
            _, top.phase, top.category = FRAMEWORK_SPANS[info.framework[top.name]]
        elif top.kind == KIND_ANNOTATION:
            top.phase = annotation_phase(cols.names[top.name])
        elif top.blocking:
            top.phase, top.category = PHASE_SYNC, Category.SYNC.value
            top.sync_us = 0.0
        elif top.kind == KIND_OP and info.backward[top.name]:
            top.phase, top.category = PHASE_BACKWARD, Category.COMPUTE.value
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


def _host_only(cols: TraceColumns) -> bool:
    """Whether the trace shows a job without a GPU: no device activity, no
    runtime call (cudaLaunchKernel, cudaMemcpy ...), an empty or absent
    ``deviceProperties`` and a ``distributedInfo.backend`` (if any) that is not
    NCCL. (A GPU job profiled with CPU activities only has no runtime calls
    either, but Kineto lists its GPUs in ``deviceProperties``: an inference,
    documented in docs/KINETO.md.)"""
    if len(cols.d_ts) or KIND_RUNTIME in cols.h_kind:
        return False
    if cols.header.get("deviceProperties"):
        return False
    dist = cols.header.get("distributedInfo")
    backend = dist.get("backend") if isinstance(dist, dict) else None
    return not (isinstance(backend, str) and "nccl" in backend.lower())


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


#: Slot of trace time (seconds) of which one ``[memory]`` event per device becomes a
#: ``sys`` record (tlog's choice: with ``profile_memory=True`` Kineto writes an
#: event per allocation and free, up to millions a trace; 10 ms keeps the allocator's
#: course at the shim's finest sampling rate with at most 100 rows per second).
MEMORY_SLOT_S = 0.01


def _memory_device(cols: TraceColumns) -> int:
    """The device whose ``[memory]`` events are read: the one with the most (a
    process normally drives one GPU; ``mem`` and the ``sys`` records agree)."""
    return Counter(cols.m_device).most_common(1)[0][0]


def memory_samples(cols: TraceColumns, windows: list[_Window],
                   base_s: float) -> list[dict[str, Any]]:
    """``sys`` records (docs/FORMAT.md) of the device ``[memory]`` events.

    Of the device with the most events (:func:`_memory_device`), the last event
    of each :data:`MEMORY_SLOT_S` slot of trace time gives one record: ``ts`` on
    the iterations' time base (``base_s`` + µs / 1e6), ``iter`` the last step
    started at or before it (None before the first), ``cuda.allocated`` (``Total
    Allocated``) and ``cuda.reserved`` (``Total Reserved``, when present), bytes.
    Host events (``Device Type`` 0) are not read (:mod:`tlog.ingest.kineto_read`):
    their totals are the CPU allocator's, not the process's resident memory.
    """
    if not len(cols.m_ts):
        return []
    device = _memory_device(cols)
    order = sorted((j for j in range(len(cols.m_ts)) if cols.m_device[j] == device),
                   key=cols.m_ts.__getitem__)
    slot_us = MEMORY_SLOT_S * 1e6
    kept: list[int] = []
    last_slot = None
    for j in order:
        slot = int(cols.m_ts[j] // slot_us)
        if slot == last_slot:
            kept[-1] = j
        else:
            kept.append(j)
            last_slot = slot
    starts = [w.t0 for w in windows]
    out: list[dict[str, Any]] = []
    for j in kept:
        t = cols.m_ts[j]
        k = bisect_right(starts, t) - 1
        cuda = {"allocated": int(cols.m_alloc[j])}
        if cols.m_reserved[j] >= 0:
            cuda["reserved"] = int(cols.m_reserved[j])
        out.append({"type": "sys", "ts": base_s + t / 1e6,
                    "iter": windows[k].iter if k >= 0 else None, "cuda": cuda})
    return out


def _memory_at(cols: TraceColumns, ends: list[float]) -> list[dict[str, int] | None]:
    """Allocator totals at each window end: the last ``[memory]`` sample at or
    before it, of the device with the most samples."""
    if not len(cols.m_ts):
        return [None] * len(ends)
    device = _memory_device(cols)
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
