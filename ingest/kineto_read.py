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

This module reads such a file once, as a stream (gzip detected by its magic
bytes, not by the file name), decoding one event at a time with the standard
library's JSON decoder, and keeps only what the mapping in :mod:`ingest.kineto`
needs, in typed ``array`` columns of a few dozen bytes per event: never the
parsed events themselves. Whatever the file holds, the reader holds at most a
chunk and one event of text: an event over the limits (:data:`MAX_EVENT_CHARS`,
:data:`MAX_DEPTH`, :data:`MAX_NAME_CHARS`, :data:`MAX_ID_CHARS`) is skipped
unparsed and counted, so memory grows with the events kept, not with the bytes
read (``benchmarks/bench_kineto.py`` measures the peak; docs/KINETO.md, "Limits").

Time units (Kineto's ``ChromeTraceLogger``): ``ts`` and ``dur`` are
microseconds, written with up to three decimals (nanosecond resolution) by
recent versions. When the trace carries ``baseTimeNanoseconds`` (written by
Kineto since 2024), ``ts`` is relative to it: wall-clock epoch nanoseconds =
``baseTimeNanoseconds + ts * 1000`` (Kineto subtracts a base floored to a
three-month interval so that ``ts`` fits a double). It is a top-level
field, read wherever it is (before ``traceEvents``, where torch 2.13 writes
it, or after, where 2024 versions put it). Older traces have ``ts`` in epoch microseconds. ``displayTimeUnit`` only sets
how viewers display time; it does not change the unit of ``ts``.

Only complete events (``"ph": "X"``) and memory instant events
(``"name": "[memory]"``) are read; flow events (``ac2g``) are not needed
because Kineto writes the same link as ``args.correlation`` on both the
runtime call and the device activity.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tlog.ingest.errors import TraceError

#: Bytes of (decompressed) content :func:`looks_like_trace` inspects.
SNIFF_BYTES = 65536
#: Most bytes before ``"traceEvents"`` kept to parse the header fields
#: (``distributedInfo``, ``deviceProperties`` ...); Kineto writes ~1 KB per GPU.
HEAD_LIMIT = 8 * 1024 * 1024
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
    #: Events left out for a limit, by reason (``size``, ``depth``, ``name``,
    #: ``field``; :data:`MAX_EVENT_CHARS` and kin).
    rejected: dict[str, int] = field(default_factory=dict)
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


#: Limits on one event of ``traceEvents`` (tlog's choice, far above what Kineto
#: writes: its largest events, an operator with ``Input Dims`` and ``Concrete
#: Inputs`` or a templated kernel, are a few KB and at most 5 levels deep). An
#: event beyond one is left out and counted, and :attr:`TraceColumns.notes`
#: says how many, in one line, so that no file can make the reader hold more than
#: a chunk and one event of text (docs/KINETO.md, "Limits"): characters of the
#: event's JSON text; nesting of objects and arrays (the event itself is level
#: 1); characters of its ``name``; characters of a ``pid``, ``tid``, ``device``
#: or ``stream`` written as a string.
MAX_EVENT_CHARS = 1 << 20
MAX_DEPTH = 32
MAX_NAME_CHARS = 16384
MAX_ID_CHARS = 256
#: Most characters of top-level fields other than ``traceEvents`` kept (the
#: header: ``distributedInfo``, ``deviceProperties`` ...; Kineto writes ~1 KB per
#: GPU); fields beyond it are skipped.
HEADER_CHARS = HEAD_LIMIT

_WS_RE = re.compile(r"[ \t\r\n]*")
_STRUCT_RE = re.compile(r'[\[\]{}"]')
_STRING_BODY_RE = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
_SCALAR_RE = re.compile(r"[^,\]}\s]*")
_DECODER = json.JSONDecoder()
#: A decoding error this close to the end of the text read so far may be a
#: number, literal or escape cut by the chunk's end: read more and decode again.
_CUT_SLACK = 16
#: Why an event was left out (the keys of the count in the warning).
_WHY = {"size": f"over {MAX_EVENT_CHARS // 1024:,} KiB of JSON",
        "depth": f"nested deeper than {MAX_DEPTH} levels",
        "name": f"with a name over {MAX_NAME_CHARS:,} characters",
        "field": "with a field of the wrong type or out of range"}
_ID_TYPES = frozenset({int, str, float, bool, type(None)})
_Q_MAX = (1 << 63) - 1
_CONTAINERS = frozenset({dict, list})


class _BadJSON(Exception):
    """The text is not valid JSON (the message says where)."""


def _depth(obj: Any) -> int:
    """Nesting depth of ``obj`` (a scalar 0, ``[]`` 1), counted without recursion,
    stopping once past :data:`MAX_DEPTH`."""
    best = 0
    stack = [(obj, 1)] if obj.__class__ in _CONTAINERS else []
    while stack:
        o, d = stack.pop()
        best = max(best, d)
        if best > MAX_DEPTH:
            break
        for c in (o.values() if o.__class__ is dict else o):
            if c.__class__ in _CONTAINERS:
                stack.append((c, d + 1))
    return best


class _Text:
    """The decompressed trace as text, read a chunk at a time: only what is not
    parsed yet is held (a chunk, or one event up to :data:`MAX_EVENT_CHARS`)."""

    def __init__(self, raw: IO[bytes], path: Path) -> None:
        self._raw = raw
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
        self.path = path
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.total = 0

    def more(self) -> bool:
        """Read the next chunk (dropping what was parsed); False at the end."""
        if self.eof:
            return False
        try:
            data = self._raw.read(CHUNK)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            msg = f"cannot read trace {self.path}: {exc}"
            raise TraceError(msg) from exc
        self.total += len(data)
        self.eof = not data
        text = self._decode(data, final=self.eof)
        self.buf = self.buf[self.pos:] + text
        self.pos = 0
        return bool(data or text)

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end); ``pos`` moves to it."""
        while True:
            self.pos = _WS_RE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def expect(self, chars: str) -> str:
        """Move past the next character, one of ``chars``, and return it.

        Raises:
            _BadJSON: another character, or the end.
        """
        c = self.peek()
        if not c or c not in chars:
            what = repr(c) if c else "the end of the file"
            msg = f"expected one of {chars!r} at {what}"
            raise _BadJSON(msg)
        self.pos += 1
        return c

    def value(self) -> tuple[Any, str | None]:
        """Decode the JSON value at ``pos`` and move past it: ``(value, None)``, or
        ``(None, why)`` (a key of :data:`_WHY`) when it is over a limit, skipped.

        Raises:
            _BadJSON: the text is not valid JSON, or ends inside the value.
        """
        if not self.peek():
            msg = "the file ends where a value was expected"
            raise _BadJSON(msg)
        while True:
            buf, pos = self.buf, self.pos
            try:
                obj, end = _DECODER.raw_decode(buf, pos)
            except RecursionError:
                self.skip()
                return None, "depth"
            except json.JSONDecodeError as exc:
                cut = exc.pos >= len(buf) - _CUT_SLACK or exc.msg.startswith("Unterminated")
                if not cut or self.eof:
                    raise _BadJSON(str(exc)) from None
                if len(buf) - pos > MAX_EVENT_CHARS:
                    self.skip()
                    return None, "size"
                self.more()
                continue
            except ValueError:   # an integer beyond Python's digit limit
                self.skip()
                return None, "size"
            if end == len(buf) and not self.eof and obj.__class__ not in _CONTAINERS:
                self.more()      # a number may go on in the next chunk
                continue
            self.pos = end
            if end - pos > MAX_EVENT_CHARS:
                return None, "size"
            if (buf.count("[", pos, end) + buf.count("{", pos, end) > MAX_DEPTH
                    and _depth(obj) > MAX_DEPTH):
                return None, "depth"
            return obj, None

    def skip(self) -> None:
        """Move past the JSON value at ``pos`` without decoding it, holding no
        more than a chunk whatever its size or depth.

        Raises:
            _BadJSON: the file ends inside the value.
        """
        if self.peek() not in '[{"':
            while True:          # a scalar runs to the next delimiter
                self.pos = _SCALAR_RE.match(self.buf, self.pos).end()
                if self.pos < len(self.buf) or not self.more():
                    return
        depth = 0
        in_string = False
        while True:
            buf = self.buf
            if in_string:
                end = _STRING_BODY_RE.match(buf, self.pos).end()
                if end < len(buf) and buf[end] == '"':
                    in_string = False
                    self.pos = end + 1
                    if depth == 0:
                        return
                    continue
                self.pos = end   # the string goes on (a final backslash waits for its escape)
            else:
                m = _STRUCT_RE.search(buf, self.pos)
                if m is not None:
                    self.pos = m.end()
                    c = m.group()
                    if c == '"':
                        in_string = True
                    elif c in "[{":
                        depth += 1
                    else:
                        depth -= 1
                        if depth <= 0:
                            return
                    continue
                self.pos = len(buf)
            if not self.more():
                msg = "the file ends inside a value"
                raise _BadJSON(msg)


def _parse_header(head: bytes) -> dict[str, Any]:
    """The top-level fields written before ``traceEvents`` ({} if not parseable)."""
    m = _KEY_RE.search(head)
    if m is None:
        return {}
    text = head[: m.start()].rstrip().decode("utf-8", errors="replace")
    text = text.removesuffix(",")
    try:
        obj = json.loads(text + "}") if text.lstrip().startswith("{") else {}
    except (ValueError, RecursionError):
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
#: Most distinct ``cat`` values whose code is cached.
_MAX_CATS = 1024


def _cat_code(cat: str) -> int:
    """What a ``cat`` is: a host kind (``KIND_*``), ``_DEVICE`` + a device kind,
    or -1 (not read). Matched without regard to case."""
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


def _id_ok(v: Any) -> bool:
    """A ``pid``/``tid``/``device``/``stream`` tlog can key on: a number, a short
    string, a boolean or absent."""
    return v.__class__ in _ID_TYPES and (v.__class__ is not str or len(v) <= MAX_ID_CHARS)


def _time(v: Any) -> float | None:
    """A finite ``ts``/``dur`` as a float; None when it is no number (or too big)."""
    if v.__class__ is not float:
        if v.__class__ is not int:
            return None
        try:
            v = float(v)
        except OverflowError:
            return None
    return v if v - v == 0.0 else None


def _int(v: Any, lo: int = 0, hi: int = _Q_MAX) -> int | None:
    """``v`` when it is an int in ``[lo, hi]``, else None."""
    return v if v.__class__ is int and lo <= v <= hi else None


def read_columns(path: str | Path) -> TraceColumns:
    """Read one trace file into :class:`TraceColumns`, streaming, in bounded memory.

    Args:
        path: a Kineto trace (``.json`` or gzip-compressed, any name; a
            ``{"traceEvents": [...]}`` object or, as early Kineto wrote, a bare
            array of events).

    Returns:
        The columns, the header (the top-level fields other than
        ``traceEvents``: ``distributedInfo`` etc.) and ``baseTimeNanoseconds`` if
        present. The text is decoded with the standard library's JSON decoder
        one event at a time, so integers beyond 64 bits (Kineto's ``"Comms
        Id"``) read exactly. An event over one of the limits
        (:data:`MAX_EVENT_CHARS`, :data:`MAX_DEPTH`, :data:`MAX_NAME_CHARS`,
        :data:`MAX_ID_CHARS`; a ``ts``/``dur`` that is not a finite number) is
        skipped without being held and counted; :attr:`TraceColumns.notes` then
        says how many, in one line. Memory: a chunk and one event of text, plus
        the columns of the events kept (~40 bytes each).

    Raises:
        TraceError: the file is not valid JSON, or holds no ``traceEvents``.
    """
    p = Path(path)
    cols = TraceColumns()
    rejected = cols.rejected
    with open_stream(p) as raw:
        text = _Text(raw, p)
        try:
            _read_document(text, cols, rejected)
        except _BadJSON as exc:
            msg = (f"trace {p} is not valid JSON after {cols.events_read} events ({exc}); "
                   "a trace cut short by a crash cannot be read: write it again")
            raise TraceError(msg) from None
        cols.bytes_read = text.total
    if cols.events_read == 0:
        msg = f"trace {p} holds no traceEvents: is it a torch.profiler trace?"
        raise TraceError(msg)
    base = cols.header.get("baseTimeNanoseconds")
    if base.__class__ is int:
        cols.base_ns = base
    if rejected:
        n = sum(rejected.values())
        parts = ", ".join(f"{c} {_WHY[k]}" for k, c in rejected.items())
        cols.notes.append(f"{n} event{'s' if n > 1 else ''} over the reader's limits "
                          f"{'were' if n > 1 else 'was'} left out: {parts} "
                          f"(docs/KINETO.md, Limits)")
    return cols


def _read_document(text: _Text, cols: TraceColumns, rejected: dict[str, int]) -> None:
    """The top level: a bare array of events, or an object whose ``traceEvents``
    are streamed and whose other fields (up to :data:`HEADER_CHARS`) are the header."""
    c = text.peek()
    if c == "\ufeff":
        text.pos += 1
        c = text.peek()
    if c == "[":
        text.pos += 1
        _read_events(text, cols, rejected)
        return
    text.expect("{")
    kept = 0
    if text.peek() == "}":
        text.pos += 1
        return
    while True:
        if text.peek() != '"':
            text.expect('"')
        key, why = text.value()
        text.expect(":")
        if key == "traceEvents" and text.peek() == "[":
            text.pos += 1
            _read_events(text, cols, rejected)
        else:
            start = text.total - len(text.buf) + text.pos
            val, why = text.value() if kept < HEADER_CHARS else (text.skip(), "size")
            kept += text.total - len(text.buf) + text.pos - start
            if why is None and key.__class__ is str:
                cols.header[key] = val
        if text.expect(",}") == "}":
            return


def _read_events(text: _Text, cols: TraceColumns, rejected: dict[str, int]) -> None:
    """The events of ``traceEvents`` (``pos`` just after its ``[``), into ``cols``;
    ``rejected`` counts those left out, by reason (:data:`_WHY`)."""
    thread_ix: dict[Any, int] = {}
    name_ix: dict[str, int] = {}
    stream_ix: dict[Any, int] = {}
    codes: dict[str, int] = {}
    threads, names, streams = cols.threads, cols.names, cols.streams

    def span(ev: dict[str, Any]) -> str | None:
        """Keep a complete event (``"ph": "X"``) of a host or device ``cat``; why not, if over a limit."""
        cat = ev.get("cat")
        if cat.__class__ is not str:
            return None
        code = codes.get(cat)
        if code is None:
            code = _cat_code(cat)
            if len(codes) < _MAX_CATS:
                codes[cat] = code
        if code < 0:
            return None
        ts, dur = ev.get("ts"), ev.get("dur")
        if ts is None or dur is None:
            return None
        ts, dur = _time(ts), _time(dur)
        if ts is None or dur is None:
            return "field"
        args = ev.get("args")
        if args.__class__ is not dict:
            args = {}
        if code >= _DEVICE:
            key = (args.get("device", ev.get("pid")), args.get("stream", ev.get("tid")))
            if not (_id_ok(key[0]) and _id_ok(key[1])):
                return "field"
            sx = stream_ix.get(key)
            if sx is None:
                sx = stream_ix[key] = len(streams)
                streams.append(key)
            kind = code - _DEVICE
            corr = _int(args.get("correlation"))
            cols.d_ts.append(ts)
            cols.d_dur.append(dur)
            cols.d_stream.append(sx)
            cols.d_corr.append(-1 if corr is None else corr)
            cols.d_kind.append(kind)
            name = ev.get("name")
            cols.d_htod.append(kind == DKIND_MEMCPY
                               and bool((name.__class__ is str and _HTOD_RE.search(name))
                                        or args.get("kind") == "HtoD"))
            cols.d_p2p.append(name.__class__ is str and P2P_KERNEL_RE.match(name) is not None)
            return None
        name = ev.get("name")
        if name.__class__ is not str:
            name = str(name)
        nx = name_ix.get(name)
        if nx is None:
            if len(name) > MAX_NAME_CHARS:
                return "name"
            nx = name_ix[name] = len(names)
            names.append(name)
        key = (ev.get("pid"), ev.get("tid"))
        tx = thread_ix.get(key) if _id_ok(key[0]) and _id_ok(key[1]) else -1
        if tx is None:
            tx = thread_ix[key] = len(threads)
            threads.append(key)
        elif tx < 0:
            return "field"
        corr = _int(args.get("correlation")) if code == KIND_RUNTIME else None
        cols.h_thread.append(tx)
        cols.h_ts.append(ts)
        cols.h_dur.append(dur)
        cols.h_name.append(nx)
        cols.h_kind.append(code)
        cols.h_corr.append(-1 if corr is None else corr)
        return None

    def memory(ev: dict[str, Any]) -> str | None:
        """Keep a device's ``[memory]`` sample; why not, if a field is out of range."""
        args = ev.get("args")
        if args.__class__ is not dict or args.get("Device Type") in (0, None):
            return None
        dev = _int(args.get("Device Id"), 0, 1 << 31)
        ts = _time(ev.get("ts"))
        alloc = _int(args.get("Total Allocated"))
        if dev is None or ts is None or alloc is None:
            return "field" if args.get("Device Id") is not None else None
        reserved = _int(args.get("Total Reserved"))
        cols.m_ts.append(ts)
        cols.m_alloc.append(alloc)
        cols.m_reserved.append(-1 if reserved is None else reserved)
        cols.m_device.append(dev)
        return None

    if text.peek() == "]":
        text.pos += 1
        return
    while True:
        ev, why = text.value()
        cols.events_read += 1
        if why is None and ev.__class__ is dict:
            ph = ev.get("ph")
            if ph == "X":
                why = span(ev)
            elif ph == "i" and ev.get("name") == "[memory]":
                why = memory(ev)
        if why is not None:
            rejected[why] = rejected.get(why, 0) + 1
        if text.expect(",]") == "]":
            return
