"""Stream a torch.profiler (Kineto) Chrome-trace file into compact columns.

A Kineto trace is one JSON object (``*.pt.trace.json``, often gzipped)::

    {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 8},
     "deviceProperties": [...],
     "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4",
         "pid": 81, "tid": 81, "ts": 4458676416788.066, "dur": 222442.191, "args": {...}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", ...,
         "args": {"correlation": 57541}},
        {"ph": "X", "cat": "kernel", "name": "void bn_bw...", "pid": 0, "tid": 7, ...,
         "args": {"device": 0, "stream": 7, "correlation": 57541}},
        ...],
     "traceName": "...", "displayTimeUnit": "ms",
     "baseTimeNanoseconds": 1711964646000000000}

This module reads such a file once, as a stream (ijson's C backend; gzip
detected by its magic bytes, not by the file name), and keeps only what the
mapping in :mod:`ingest.kineto` needs, in typed ``array`` columns of a few
dozen bytes per event: never the parsed events themselves. A 1 GB trace of
~4M events needs ~200 MB of columns (``benchmarks/bench_kineto.py`` measures
the peak).

Time units (Kineto's ``ChromeTraceLogger``): ``ts`` and ``dur`` are
microseconds, written with up to three decimals (nanosecond resolution) by
recent versions. When the trace carries ``baseTimeNanoseconds`` (written by
Kineto since 2024), ``ts`` is relative to it: wall-clock epoch nanoseconds =
``baseTimeNanoseconds + ts * 1000`` (Kineto subtracts a base floored to a
three-month interval so that ``ts`` fits a double). It is read from the
header (before ``traceEvents``, where torch 2.13 writes it) or, failing that,
from the last :data:`TAIL_BYTES` of the stream (where 2024 versions put it).
Older traces have ``ts`` in epoch microseconds. ``displayTimeUnit`` only sets
how viewers display time; it does not change the unit of ``ts``.

Only complete events (``"ph": "X"``) and memory instant events
(``"name": "[memory]"``) are read; flow events (``ac2g``) are not needed
because Kineto writes the same link as ``args.correlation`` on both the
runtime call and the device activity.
"""

from __future__ import annotations

import gzip
import json
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
from tlog.ingest.errors import TraceError

#: Bytes of (decompressed) content :func:`looks_like_trace` inspects.
SNIFF_BYTES = 65536
#: Most bytes before ``"traceEvents"`` kept to parse the header fields
#: (``distributedInfo``, ``deviceProperties`` ...); Kineto writes ~1 KB per GPU.
HEAD_LIMIT = 8 * 1024 * 1024
#: Bytes kept from the end of the stream to find ``baseTimeNanoseconds`` when it
#: is not in the header (Kineto of 2024 writes it last, after ``traceEvents``
#: and the ``INFO`` log lines; torch 2.13 writes it in the header).
TAIL_BYTES = 1024 * 1024
#: Read size of the stream, bytes.
CHUNK = 1 << 20

#: ``cat`` values of host-side spans (lower-cased). ``Operator``/``Runtime`` are
#: the names PyTorch 1.8-1.9 traces used. ``python_function`` spans (``with_stack``)
#: are skipped so that they do not hide the operator nesting.
HOST_OP_CATS = frozenset({"cpu_op", "operator"})
HOST_ANNOTATION_CATS = frozenset({"user_annotation"})
HOST_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver",
                               "privateuse1_runtime", "privateuse1_driver", "xpu_runtime",
                               "mtia_runtime"})
#: ``cat`` values of device activities whose time counts as device time.
DEVICE_CATS = {"kernel": 0, "gpu_memcpy": 1, "memcpy": 1, "gpu_memset": 2, "memset": 2,
               "mtia_ccp_events": 0}

#: Host span kinds stored in :attr:`TraceColumns.h_kind`.
KIND_OP, KIND_ANNOTATION, KIND_RUNTIME = 0, 1, 2
#: Device activity kinds stored in :attr:`TraceColumns.d_kind`.
DKIND_KERNEL, DKIND_MEMCPY, DKIND_MEMSET = 0, 1, 2

_GZIP_MAGIC = b"\x1f\x8b"
_BASE_RE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_KEY_RE = re.compile(rb'"traceEvents"\s*:')
_HTOD_RE = re.compile(r"HtoD|Host\s*->\s*Device", re.IGNORECASE)
#: NCCL's point-to-point kernels (``ncclDevKernel_SendRecv``, ``ncclKernel_SendRecv_RING_...``,
#: ``ncclDevKernel_Send``...): a device waiting for a peer, not compute. Source: the
#: kernel names NCCL 2.x registers (src/device/generate.py), as Kineto records them.
P2P_KERNEL_RE = re.compile(r"^nccl(Dev)?Kernel_(SendRecv|Send|Recv)")
#: The head of a bare-array trace: ``[``, an object, and a complete span in the sniffed bytes.
_ARRAY_START_RE = re.compile(rb"^\[\s*\{")
_ARRAY_SPAN_RE = re.compile(rb'"ph"\s*:\s*"X"')


def open_stream(path: str | Path) -> IO[bytes]:
    """Open ``path`` for binary reading, decompressing gzip (by magic bytes).

    Raises:
        TraceError: the file cannot be read.
    """
    p = Path(path)
    try:
        raw = p.open("rb")
    except OSError as exc:
        msg = f"cannot read trace {p}: {exc.strerror}"
        raise TraceError(msg) from exc
    magic = raw.read(2)
    raw.seek(0)
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def sniff(path: str | Path, size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` bytes of the decompressed content ('' if unreadable)."""
    try:
        with open_stream(path) as f:
            return f.read(size)
    except (TraceError, OSError, EOFError, gzip.BadGzipFile):
        return b""


def looks_like_trace(path: str | Path) -> bool:
    """True when the file's content is a Chrome-trace JSON object from torch.profiler.

    Decided by content, not by name: the (decompressed) text starts with ``{``
    and its first :data:`SNIFF_BYTES` hold the ``"traceEvents"`` key, or Kineto's
    ``"schemaVersion"`` together with ``"deviceProperties"``/``"distributedInfo"``
    (the header Kineto writes before ``traceEvents``). A tlog JSONL log never
    holds these keys. Early Kineto (PyTorch 1.8, late 2020) wrote a bare JSON
    array of events: a text starting with ``[`` whose first event object is a
    complete span (``"ph": "X"`` with ``"ts"``) is a trace too; a JSONL log
    never starts with ``[``.
    """
    head = sniff(path).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        return bool(_ARRAY_START_RE.match(head) and _ARRAY_SPAN_RE.search(head)
                    and b'"ts"' in head)
    if not head.startswith(b"{"):
        return False
    if _KEY_RE.search(head):
        return True
    return b'"schemaVersion"' in head and (b'"deviceProperties"' in head
                                           or b'"distributedInfo"' in head)


@dataclass
class TraceColumns:
    """What :func:`read_columns` keeps of one trace: typed columns, one row per event.

    Host spans (``h_*``; ``ph == "X"`` with a host ``cat``): thread index
    (into :attr:`threads`), start and duration in trace microseconds, name
    index (into :attr:`names`), kind (:data:`KIND_OP`, :data:`KIND_ANNOTATION`,
    :data:`KIND_RUNTIME`) and the runtime call's correlation id (-1 if none).

    Device activities (``d_*``; kernels, memcpys, memsets): start and duration
    (µs), stream index (into :attr:`streams`, a ``(device, stream)`` pair),
    correlation id, kind, whether a memcpy is host-to-device, and whether a kernel
    is an NCCL point-to-point one (:data:`P2P_KERNEL_RE`).

    Memory samples (``m_*``; ``[memory]`` instant events on a device, written
    with ``profile_memory=True``): time (µs), total allocated and reserved
    bytes, device id.
    """

    header: dict[str, Any] = field(default_factory=dict)
    base_ns: int | None = None
    threads: list[tuple[Any, Any]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    streams: list[tuple[Any, Any]] = field(default_factory=list)
    h_thread: array = field(default_factory=lambda: array("l"))
    h_ts: array = field(default_factory=lambda: array("d"))
    h_dur: array = field(default_factory=lambda: array("d"))
    h_name: array = field(default_factory=lambda: array("l"))
    h_kind: array = field(default_factory=lambda: array("b"))
    h_corr: array = field(default_factory=lambda: array("q"))
    d_ts: array = field(default_factory=lambda: array("d"))
    d_dur: array = field(default_factory=lambda: array("d"))
    d_stream: array = field(default_factory=lambda: array("l"))
    d_corr: array = field(default_factory=lambda: array("q"))
    d_kind: array = field(default_factory=lambda: array("b"))
    d_htod: array = field(default_factory=lambda: array("b"))
    d_p2p: array = field(default_factory=lambda: array("b"))
    m_ts: array = field(default_factory=lambda: array("d"))
    m_alloc: array = field(default_factory=lambda: array("q"))
    m_reserved: array = field(default_factory=lambda: array("q"))
    m_device: array = field(default_factory=lambda: array("l"))
    events_read: int = 0
    bytes_read: int = 0
    #: How the file had to be read, one line each (e.g. the slower parser), for warnings.
    notes: list[str] = field(default_factory=list)

    @property
    def host_count(self) -> int:
        """Number of host spans kept."""
        return len(self.h_ts)

    @property
    def device_count(self) -> int:
        """Number of device activities kept."""
        return len(self.d_ts)


class _Recorder:
    """A read-through wrapper that keeps the stream's head and tail bytes."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self._pending = b""
        self.head = bytearray()
        self.head_done = False
        self._tail: list[bytes] = []
        self._tail_len = 0
        self.total = 0

    def push_back(self, data: bytes) -> None:
        """Return ``data`` (already recorded) first on the next :meth:`read`."""
        self._pending = data

    def read(self, size: int = -1) -> bytes:
        """Read up to ``size`` bytes (``CHUNK`` when negative)."""
        if size == 0:
            return b""
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        data = self._inner.read(CHUNK if size is None or size < 0 else size)
        if not data:
            return b""
        self.total += len(data)
        if not self.head_done:
            self.head += data
            if _KEY_RE.search(self.head) or len(self.head) >= HEAD_LIMIT:
                self.head_done = True
        self._tail.append(data)
        self._tail_len += len(data)
        while self._tail and self._tail_len - len(self._tail[0]) >= TAIL_BYTES:
            self._tail_len -= len(self._tail.pop(0))
        return data

    @property
    def tail(self) -> bytes:
        """The last :data:`TAIL_BYTES` (or a little more) of the stream."""
        return b"".join(self._tail)


def _parse_header(head: bytes) -> dict[str, Any]:
    """The top-level fields written before ``traceEvents`` ({} if not parseable)."""
    m = _KEY_RE.search(head)
    if m is None:
        return {}
    text = head[: m.start()].rstrip().decode("utf-8", errors="replace")
    text = text.removesuffix(",")
    try:
        obj = json.loads(text + "}") if text.lstrip().startswith("{") else {}
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def read_header(path: str | Path) -> dict[str, Any]:
    """The top-level fields written before ``traceEvents`` (``distributedInfo``,
    ``deviceProperties`` ...), reading no further than that ({} if none)."""
    head = bytearray()
    try:
        with open_stream(path) as f:
            while len(head) < HEAD_LIMIT:
                data = f.read(CHUNK)
                if not data:
                    break
                head += data
                if _KEY_RE.search(head):
                    break
    except (TraceError, OSError, EOFError, gzip.BadGzipFile):
        return {}
    return _parse_header(bytes(head))


#: Offset of device kinds in the per-``cat`` codes of :func:`_cat_code`.
_DEVICE = 10
_NUMBER = frozenset({int, float})


def _cat_code(cat: Any) -> int:
    """What a ``cat`` is: a host kind (``KIND_*``), ``_DEVICE`` + a device kind,
    or -1 (not read). Matched without regard to case."""
    if not isinstance(cat, str):
        return -1
    c = cat.lower()
    if c in DEVICE_CATS:
        return _DEVICE + DEVICE_CATS[c]
    if c in HOST_OP_CATS:
        return KIND_OP
    if c in HOST_ANNOTATION_CATS:
        return KIND_ANNOTATION
    if c in HOST_RUNTIME_CATS:
        return KIND_RUNTIME
    return -1


class _IntegerOverflow(Exception):
    """The C parser met an integer beyond 64 bits (valid JSON it cannot hold)."""


def read_columns(path: str | Path) -> TraceColumns:
    """Read one trace file into :class:`TraceColumns`, streaming.

    Args:
        path: a Kineto trace (``.json`` or gzip-compressed, any name; a
            ``{"traceEvents": [...]}`` object or, as early Kineto wrote, a bare
            array of events).

    Returns:
        The columns, the header (``distributedInfo`` etc., when written before
        ``traceEvents`` as Kineto does) and ``baseTimeNanoseconds`` if present.
        A trace holding an integer beyond 64 bits (valid JSON: Kineto writes
        e.g. ``"Comms Id": 10159970886766084423``, an unsigned 64-bit id) makes
        ijson's C parser (yajl) stop with "integer overflow"; it is then read
        again with ijson's pure-Python parser (exact integers, several times
        slower), and :attr:`TraceColumns.notes` says so.

    Raises:
        TraceError: the file is not valid JSON, or holds no ``traceEvents``.
    """
    try:
        return _read_columns(Path(path), ijson)
    except _IntegerOverflow:
        import ijson.backends.python as slow

        cols = _read_columns(Path(path), slow)
        cols.notes.append("the trace holds integers beyond 64 bits (valid JSON the fast "
                          "parser cannot hold): it was read with the slower pure-Python parser")
        return cols


def _read_columns(p: Path, parser: Any) -> TraceColumns:
    """:func:`read_columns` with one ijson backend (``parser``: a module with ``items``)."""
    cols = TraceColumns()
    thread_ix: dict[Any, int] = {}
    name_ix: dict[str, int] = {}
    stream_ix: dict[Any, int] = {}
    threads, names, streams = cols.threads, cols.names, cols.streams
    h_thread, h_ts, h_dur, h_name = cols.h_thread, cols.h_ts, cols.h_dur, cols.h_name
    h_kind, h_corr = cols.h_kind, cols.h_corr
    d_ts, d_dur, d_stream, d_corr = cols.d_ts, cols.d_dur, cols.d_stream, cols.d_corr
    d_kind, d_htod, d_p2p = cols.d_kind, cols.d_htod, cols.d_p2p
    codes: dict[Any, int] = {}
    n = 0
    with open_stream(p) as raw:
        rec = _Recorder(raw)
        first = b""
        while not first.strip():
            first = rec.read(4096)
            if not first:
                break
        body = first.lstrip(b"\xef\xbb\xbf \t\r\n")
        prefix = "item" if body.startswith(b"[") else "traceEvents.item"
        rec.push_back(first)
        try:
            for ev in parser.items(rec, prefix, use_float=True, buf_size=CHUNK):
                n += 1
                if ev.__class__ is not dict:
                    continue
                ph = ev.get("ph")
                if ph == "X":
                    cat = ev.get("cat")
                    code = codes.get(cat)
                    if code is None:
                        code = _cat_code(cat)
                        if isinstance(cat, str):
                            codes[cat] = code
                    if code < 0:
                        continue
                    ts = ev.get("ts")
                    dur = ev.get("dur")
                    if ts.__class__ not in _NUMBER or dur.__class__ not in _NUMBER:
                        continue
                    if code >= _DEVICE:
                        args = ev.get("args") or {}
                        corr = args.get("correlation")
                        key = (args.get("device", ev.get("pid")), args.get("stream", ev.get("tid")))
                        sx = stream_ix.get(key)
                        if sx is None:
                            sx = stream_ix[key] = len(streams)
                            streams.append(key)
                        kind = code - _DEVICE
                        d_ts.append(ts)
                        d_dur.append(dur)
                        d_stream.append(sx)
                        d_corr.append(corr if corr.__class__ is int else -1)
                        d_kind.append(kind)
                        d_htod.append(kind == DKIND_MEMCPY
                                      and bool(_HTOD_RE.search(str(ev.get("name", "")))
                                               or args.get("kind") == "HtoD"))
                        d_p2p.append(bool(P2P_KERNEL_RE.match(str(ev.get("name", "")))))
                        continue
                    name = ev.get("name")
                    nx = name_ix.get(name)
                    if nx is None:
                        if name.__class__ is not str:
                            name = str(name)
                        nx = name_ix.get(name)
                        if nx is None:
                            nx = name_ix[name] = len(names)
                            names.append(name)
                    corr = -1
                    if code == KIND_RUNTIME:
                        args = ev.get("args")
                        if args:
                            c = args.get("correlation")
                            corr = c if c.__class__ is int else -1
                    key = (ev.get("pid"), ev.get("tid"))
                    tx = thread_ix.get(key)
                    if tx is None:
                        tx = thread_ix[key] = len(threads)
                        threads.append(key)
                    h_thread.append(tx)
                    h_ts.append(ts)
                    h_dur.append(dur)
                    h_name.append(nx)
                    h_kind.append(code)
                    h_corr.append(corr)
                elif ph == "i" and ev.get("name") == "[memory]":
                    args = ev.get("args") or {}
                    dev = args.get("Device Id")
                    if args.get("Device Type") in (0, None) or not isinstance(dev, int) or dev < 0:
                        continue
                    ts = ev.get("ts")
                    alloc, reserved = args.get("Total Allocated"), args.get("Total Reserved")
                    if isinstance(ts, (int, float)) and isinstance(alloc, int):
                        cols.m_ts.append(ts)
                        cols.m_alloc.append(alloc)
                        cols.m_reserved.append(reserved if isinstance(reserved, int) else -1)
                        cols.m_device.append(dev)
        except ijson.JSONError as exc:
            if parser is ijson and "integer overflow" in str(exc):
                raise _IntegerOverflow from exc
            msg = (f"trace {p} is not valid JSON after {n} events ({exc}); "
                   "a trace cut short by a crash cannot be read: write it again")
            raise TraceError(msg) from exc
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            msg = f"cannot read trace {p}: {exc}"
            raise TraceError(msg) from exc
        cols.header = _parse_header(bytes(rec.head))
        if isinstance(cols.header.get("baseTimeNanoseconds"), int):
            cols.base_ns = cols.header["baseTimeNanoseconds"]
        elif (m := _BASE_RE.search(rec.tail)) is not None:
            cols.base_ns = int(m.group(1))
        cols.bytes_read = rec.total
    if n == 0:
        msg = f"trace {p} holds no traceEvents: is it a torch.profiler trace?"
        raise TraceError(msg)
    cols.events_read = n
    return cols
