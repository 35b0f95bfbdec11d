"""The v1 timing-log format, defined once (docs/FORMAT.md is its prose; a test
reads that document's tables and checks them against this module both ways).

Standard library only: the runtime shim writes with it, ``tlog ingest`` builds
its SQL and its line templates from it (``tlog.ingest.parse_sql``,
``tlog.ingest.templates``), and analysis reads its categories and name rules.

What it holds:

- record kinds (:class:`RecordType`), the format version, the child-phase separator;
- the known fields of each kind (:data:`FIELDS`: which kinds carry a field,
  which require it, the value rule :class:`Check` and the integer limit), and
  the keys of the ``mem`` and ``clock`` objects;
- value limits (durations, epoch timestamps, integers, phases per record);
- categories (:class:`Category`) and the phase-name rules that give a phase its
  category (:func:`categorize`, :func:`is_collective`, :func:`resolve_category`).

A sample ``iter`` line, as :mod:`dflash_runtime.writer` serialises it::

    {"type": "iter", "v": 1, "iter": 41, "ts": 1764403200.1234, "dur": 0.0612,
     "phases": {"hs_get": 0.0012, "forward": 0.0201, "forward/mask_build": 0.004,
                "backward": 0.029},
     "gpu": {"forward": 0.0312}, "cpu": 0.0203, "tokens": 16384, "samples": 8,
     "kinds": {"hs_get": "starvation"}}

Rank, stage and worker are not repeated on each line: the file's first line is a
``meta`` record that sets them (docs/FORMAT.md "meta: per-file defaults").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from itertools import pairwise

# -- records -----------------------------------------------------------------------------------

#: Format version written in every record (docs/FORMAT.md: "Every record may carry "v": 1").
FORMAT_VERSION = 1


class RecordType(StrEnum):
    """The ``type`` field of a record (docs/FORMAT.md "Records"); a line
    without ``type`` is an ``iter`` record (:data:`DEFAULT_RECORD_TYPE`)."""

    ITER = "iter"
    QUEUE = "queue"
    EVENT = "event"
    META = "meta"
    SYS = "sys"


#: Record kinds, in the order of docs/FORMAT.md's sections after ``meta``.
RECORD_KINDS: tuple[str, ...] = tuple(t.value for t in RecordType)
#: The kind of a record that has no ``type``.
DEFAULT_RECORD_TYPE = RecordType.ITER.value
#: Fields every record may carry besides :data:`FIELDS`: the kind and the version.
ENVELOPE_FIELDS: tuple[str, ...] = ("type", "v")

#: Separator of a child phase from its parent (docs/FORMAT.md: ``forward/mask_build``).
CHILD_SEP = "/"

# -- limits ------------------------------------------------------------------------------------

#: Largest 32-bit signed integer (``world_size`` and ``rank`` are INTEGER columns).
INT32_MAX = 2**31 - 1
#: Largest ``rank``: ranks are stored as INTEGER and a run's ``world_size``
#: defaults to the highest rank + 1, also an INTEGER (docs/FORMAT.md "Reading rules").
MAX_RANK = INT32_MAX - 1
#: Largest value of every other integer field (a BIGINT column).
MAX_BIGINT = 2**63 - 1
#: Wall-clock timestamps (``ts``, run.json ``started``) are epoch seconds in
#: ``[0, MAX_EPOCH_S)``: 1e11 s is the year 5138, while milliseconds since 1970
#: are above 1e12 since 2001. Source: tlog's choice, so that a log written in
#: ms/us/ns is refused with that reason (before, ``ts`` in ms made ``tlog runs``
#: fail for every run: "year 58887 is out of range").
MAX_EPOCH_S = 1e11
#: Longest duration accepted (seconds) for ``dur``, ``cpu`` and every phase
#: value: one day. Source: tlog's choice, a cap on absurd values, not on real
#: ones (an iteration of a training loop takes milliseconds to minutes); it
#: keeps sums of any number of them far from overflow (1e308 + 1e308 = inf
#: broke diagnose and report).
MAX_DURATION_S = 86400.0
#: Most names in one record's ``phases`` (and in its ``gpu``); a record with more
#: is rejected (``too_large``). A cap on absurd input, not a v1 rule: real loops
#: have a handful to a few dozen phases (the reference pipeline 6-9), and the
#: cost of a record grows with its distinct names (20 records x 5,000 names
#: exhausted 24 GB before the cap). docs/FORMAT.md "Reading rules".
MAX_PHASES = 256


class Check(StrEnum):
    """The value rule of a field (docs/FORMAT.md, the ``type`` column of the field tables)."""

    INT0 = "int0"      #: non-negative integer up to the field's ``limit``
    EPOCH = "epoch"    #: wall-clock timestamp, epoch seconds in ``[0, MAX_EPOCH_S)``
    DUR = "dur"        #: duration, finite seconds in ``[0, MAX_DURATION_S]``
    STR = "str"        #: string
    DURS = "durs"      #: object of durations (``phases``, ``gpu``)
    CATS = "cats"      #: object of category names (``kinds``)
    NUM0 = "num0"      #: finite number >= 0 (no upper limit: CPU seconds, load)
    MEM = "mem"        #: object of non-negative integers (keys :attr:`Field.keys`)
    CLOCK = "clock"    #: object of finite numbers (keys :attr:`Field.keys`)
    GAUGES = "gauges"  #: object of finite numbers >= 0, some integers (:data:`GPU_INT_FIELDS`)
    FACTS = "facts"    #: object of strings and integers >= 0 (:data:`MACHINE_INT_FIELDS`)


#: How docs/FORMAT.md's field tables name each :class:`Check` (the ``type`` column).
CHECK_DOC: dict[Check, str] = {
    Check.INT0: "integer ≥ 0",
    Check.EPOCH: "epoch seconds",
    Check.DUR: "seconds",
    Check.STR: "string",
    Check.DURS: "object of seconds",
    Check.CATS: "object of categories",
    Check.MEM: "object of integers",
    Check.CLOCK: "object of numbers",
    Check.NUM0: "number ≥ 0",
    Check.GAUGES: "object of numbers ≥ 0",
    Check.FACTS: "object of facts",
}


@dataclass(frozen=True)
class Field:
    """A known field of the v1 format and its rule.

    Attributes:
        name: the JSON key.
        kinds: record kinds that carry it (:data:`RECORD_KINDS` values).
        required: the kinds among ``kinds`` that must carry it (non-null).
        check: its value rule (:class:`Check`).
        limit: largest value of an ``int0`` field (the range of its column).
        keys: the known keys of an object field (``mem``, ``clock``, ``cuda``,
            the ``sys`` record's ``gpu``, ``machine``); empty for the others.

    One name may have two :class:`Field` entries for disjoint kinds with
    different rules: ``cpu`` is an iteration's thread CPU time (``dur``) in
    ``iter`` and the process's cumulative CPU time (``num0``) in ``sys``;
    ``gpu`` is device time per phase in ``iter`` and the device's gauges in ``sys``.
    """

    name: str
    kinds: tuple[str, ...]
    required: tuple[str, ...]
    check: Check
    limit: int = MAX_BIGINT
    keys: tuple[str, ...] = ()


_ALL = RECORD_KINDS
#: Keys of ``mem`` (docs/FORMAT.md ``iter`` table): bytes or cumulative counts.
MEM_FIELDS: tuple[str, ...] = ("allocated", "reserved", "alloc_retries", "device_allocs")
#: Keys of a ``meta`` record's ``clock``: ``time.time()`` and ``time.perf_counter()``.
CLOCK_FIELDS: tuple[str, ...] = ("wall", "mono")
#: Keys of a ``sys`` record's ``cuda`` (torch's caching allocator, current device):
#: ``allocated``, ``reserved`` (bytes), ``retries`` (cumulative count of allocations
#: retried after freeing the cache), ``limit`` (bytes the allocator may hold).
CUDA_FIELDS: tuple[str, ...] = ("allocated", "reserved", "retries", "limit")
#: Keys of a ``sys`` record's ``gpu`` (NVML, the process's device): utilisation
#: (percent), memory used and total (bytes), temperature (Celsius), SM clock and its
#: maximum (MHz), power (watts), the clocks-event (throttle) reasons (bitmask).
GPU_FIELDS: tuple[str, ...] = ("util", "mem_used", "mem_total", "temp", "sm_clock",
                               "sm_clock_max", "power", "throttle")
#: The keys of ``gpu`` (``sys``) whose values must be integers.
GPU_INT_FIELDS: tuple[str, ...] = ("mem_used", "mem_total", "throttle")
#: Keys of a ``meta`` record's ``machine``: host, CPU model, cores, memory (bytes),
#: GPU model and count, driver version, CUDA version.
MACHINE_FIELDS: tuple[str, ...] = ("host", "cpu_model", "ncpu", "mem_total", "gpu_name",
                                   "gpu_count", "driver", "cuda")
#: The keys of ``machine`` whose values are integers (the others are strings).
MACHINE_INT_FIELDS: tuple[str, ...] = ("ncpu", "mem_total", "gpu_count")
#: Known fields in the order their rules are checked (docs/FORMAT.md field tables).
FIELDS: tuple[Field, ...] = (
    Field("rank", _ALL, (), Check.INT0, MAX_RANK),
    Field("stage", _ALL, (), Check.STR),
    Field("worker", _ALL, (), Check.STR),
    Field("iter", ("iter", "sys"), ("iter",), Check.INT0),
    Field("ts", ("iter", "queue", "event", "sys"), ("iter", "queue", "event", "sys"),
          Check.EPOCH),
    Field("dur", ("iter", "event"), ("iter",), Check.DUR),
    Field("phases", ("iter",), ("iter",), Check.DURS),
    Field("gpu", ("iter",), (), Check.DURS),
    Field("cpu", ("iter",), (), Check.DUR),
    Field("tokens", ("iter",), (), Check.INT0),
    Field("samples", ("iter",), (), Check.INT0),
    Field("kinds", ("iter",), (), Check.CATS),
    Field("mem", ("iter",), (), Check.MEM, keys=MEM_FIELDS),
    Field("name", ("queue", "event"), ("queue", "event"), Check.STR),
    Field("depth", ("queue",), ("queue",), Check.INT0),
    Field("capacity", ("queue",), (), Check.INT0),
    Field("host", ("meta",), (), Check.STR),
    Field("pid", ("meta",), (), Check.INT0),
    Field("world_size", ("meta",), (), Check.INT0, INT32_MAX),
    Field("clock", ("meta",), (), Check.CLOCK, keys=CLOCK_FIELDS),
    Field("machine", ("meta",), (), Check.FACTS, keys=MACHINE_FIELDS),
    Field("cpu", ("sys",), (), Check.NUM0),
    Field("rss", ("sys",), (), Check.INT0),
    Field("ncpu", ("sys",), (), Check.INT0, INT32_MAX),
    Field("load1", ("sys",), (), Check.NUM0),
    Field("threads", ("sys",), (), Check.INT0, INT32_MAX),
    Field("running", ("sys",), (), Check.INT0, INT32_MAX),
    Field("cpu_wait", ("sys",), (), Check.NUM0),
    Field("cuda", ("sys",), (), Check.MEM, keys=CUDA_FIELDS),
    Field("gpu", ("sys",), (), Check.GAUGES, keys=GPU_FIELDS),
)

def fields_of(kind: str) -> dict[str, Field]:
    """``{name: Field}`` of the known fields of record kind ``kind`` (in
    :data:`FIELDS` order; ``type`` and ``v`` not included)."""
    return {f.name: f for f in FIELDS if kind in f.kinds}


def required_of(kind: str) -> tuple[str, ...]:
    """Names of the fields record kind ``kind`` must carry."""
    return tuple(f.name for f in FIELDS if kind in f.required)


# -- implicit syncs: the call site in a phase name ------------------------------------------

#: Prefix of a caught implicit sync's phase name (``sync.item@train.py:212``):
#: the shim's ``catch_syncs`` (docs/FORMAT.md "Implicit syncs").
SYNC_SITE_PREFIX = "sync."
#: Separates the operation from its call site in such a name.
SYNC_SITE_SEP = "@"
#: The operations the shim catches (``dflash_runtime.syncs``), as named in a sync
#: site's phase name (how prose writes each call: ``tlog.analyze.text.SYNC_CALL_TEXT``).
SYNC_OPS: tuple[str, ...] = (
    "item", "tolist", "cpu", "to_cpu", "nonzero", "bool", "float", "int", "synchronize",
    "stream_synchronize", "event_synchronize",
)
_SYNC_SITE = re.compile(r"^sync\.([A-Za-z_][A-Za-z0-9_]*)@(.+):(\d+)$")


def sync_site_name(op: str, file: str, line: int) -> str:
    """The phase name of an implicit sync ``op`` (``item``, ``cpu``, ``synchronize``)
    called at ``file:line`` (a file's base name: a ``/`` would make it a child).

    >>> sync_site_name("item", "train.py", 212)
    'sync.item@train.py:212'
    """
    return f"{SYNC_SITE_PREFIX}{op}{SYNC_SITE_SEP}{file.replace(CHILD_SEP, '_')}:{line}"


def parse_sync_site(name: str) -> tuple[str, str, int] | None:
    """``(op, file, line)`` of an implicit-sync phase name (the last ``/``
    component of ``name``), or None for any other phase.

    >>> parse_sync_site("optimizer_step/sync.item@train.py:212")
    ('item', 'train.py', 212)
    """
    m = _SYNC_SITE.match(name.rsplit(CHILD_SEP, 1)[-1])
    return None if m is None else (m.group(1), m.group(2), int(m.group(3)))


#: Phases of point-to-point waits (``dflash_runtime.p2p``; docs/FORMAT.md
#: "Point-to-point waits"): the host blocked in a ``recv``, a ``send``, or a batch of
#: both (``batch_isend_irecv`` on a coalescing backend). Kind ``sync``; a trace's
#: gloo/NCCL send and recv spans get the same names (``tlog.ingest.kineto_map``).
P2P_RECV_WAIT = "recv_wait"
P2P_SEND_WAIT = "send_wait"
P2P_SEND_RECV_WAIT = "send_recv_wait"
P2P_WAIT_PHASES: frozenset[str] = frozenset({P2P_RECV_WAIT, P2P_SEND_WAIT, P2P_SEND_RECV_WAIT})


def is_p2p_wait(name: str) -> bool:
    """Whether phase ``name`` (its last ``/`` component) is a point-to-point wait.

    >>> is_p2p_wait("forward/recv_wait"), is_p2p_wait("recv_batch")
    (True, False)
    """
    return name.rsplit(CHILD_SEP, 1)[-1] in P2P_WAIT_PHASES


# -- categories --------------------------------------------------------------------------------


class Category(StrEnum):
    """Where a second of worker wall time goes (docs/FORMAT.md "Categories").

    ``unaccounted`` is not a phase category: it is the part of ``dur`` no phase covers.
    """

    STARVATION = "starvation"
    BACKPRESSURE = "backpressure"
    COMPUTE = "compute"
    SYNC = "sync"
    UNACCOUNTED = "unaccounted"


#: The shim's name for the categories a phase may be given (``kind=`` arguments).
Kind = Category
#: Categories in report order.
CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)
#: Categories a phase may be given in ``kinds``/``phase_kinds``/``kind=`` (all but unaccounted).
PHASE_CATEGORIES: frozenset[str] = frozenset(CATEGORIES) - {Category.UNACCOUNTED.value}
#: The shim's name for :data:`PHASE_CATEGORIES`.
PHASE_KINDS = PHASE_CATEGORIES


def check_kind(kind: str) -> str:
    """Return ``kind`` if it is one of :data:`PHASE_CATEGORIES`, else raise ``ValueError``."""
    if kind not in PHASE_CATEGORIES:
        msg = f"unknown phase kind {kind!r}: use one of {', '.join(sorted(PHASE_CATEGORIES))}"
        raise ValueError(msg)
    return kind


# -- name rules --------------------------------------------------------------------------------
# docs/FORMAT.md "Name rules" lists every word and pair below (a test compares).
#
# The rules match whole words. A name is split into lower-case words at ``_``,
# ``-``, ``.``, ``/``, ``:``, ``#``, spaces, brackets and camelCase humps, so
# ``target_forward`` is ``["target", "forward"]`` (compute, although ``target``
# holds the letters ``get``) and ``hsGet`` is ``["hs", "get"]`` (starvation).
# For a child phase (``forward/mask_build``) only the last path component is
# used: the child's own name says what it does. First match wins:
#
# 1. a pair in SYNC_PAIRS or a word in SYNC_WORDS -> sync (collectives and
#    distribution included, so communication wins over input:
#    ``sparse_data_dist``, torchrec's input distribution, an all-to-all, is
#    sync although ``data`` is an input word; ``send``/``recv`` are
#    torch.distributed's point-to-point calls, a peer rank's collective);
# 2. a word in BACKPRESSURE_WORDS -> backpressure;
# 3. a pair in STARVATION_PAIRS or a word in STARVATION_WORDS -> starvation;
# 4. anything else -> compute.
#
# Sources: docs/FORMAT.md ("Categories") lists the core words; the framework
# names that must read as starvation (``next_batch``, ``get_train_batch``,
# ``batch_generator``, ``data_loading``,
# ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``) come from
# Megatron-LM, torchtitan and torch.profiler traces.

#: Word pairs and words of collectives and distribution (torch.distributed,
#: torchrec, NCCL/gloo spans): a phase so named waits for other ranks (or for
#: another stream's communication), not for its own queued device work, so the
#: device-backlog walk of analysis never splits it (:func:`is_collective`).
COLLECTIVE_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {("all", "reduce"), ("all", "gather"), ("reduce", "scatter"), ("all", "to")}
)
COLLECTIVE_WORDS: frozenset[str] = frozenset(
    {
        "barrier", "allreduce", "allgather", "reducescatter", "alltoall", "broadcast",
        "collective", "collectives", "nccl", "dist", "a2a", "send", "recv", "isend",
        "irecv", "gloo", "c10d",
    }
)
#: Sync: the collectives, and the host blocking on the device.
SYNC_PAIRS: frozenset[tuple[str, str]] = COLLECTIVE_PAIRS | frozenset(
    {
        ("wait", "stream"),
        ("wait", "event"),
        ("event", "wait"),
        ("event", "synchronize"),
        ("stream", "synchronize"),
        ("to", "cpu"),
    }
)
SYNC_WORDS: frozenset[str] = COLLECTIVE_WORDS | frozenset(
    {
        "item", "items", "sync", "synchronize", "synchronise", "cudasynchronize",
        "cpu", "tolist",
        "cudadevicesynchronize", "cudastreamsynchronize", "cudaeventsynchronize",
    }
)
BACKPRESSURE_WORDS: frozenset[str] = frozenset({"put", "enqueue", "push", "backpressure"})
STARVATION_PAIRS: frozenset[tuple[str, str]] = frozenset({("read", "shard")})
STARVATION_WORDS: frozenset[str] = frozenset(
    {
        "get", "wait", "fetch", "data", "load", "loader", "loading", "dataloader",
        "next", "receive", "dequeue", "pop", "generator", "prefetch",
        "starvation", "starve", "collate", "io",
    }
)

_SPLIT = re.compile(r"[_\-./:#\s()\[\]<>,]+")
_HUMPS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


def split_words(name: str) -> list[str]:
    """Split a phase name into lower-case words (see "name rules" above).

    >>> split_words("target_forward")
    ['target', 'forward']
    >>> split_words("gradNormItem")
    ['grad', 'norm', 'item']
    """
    words: list[str] = []
    for chunk in _SPLIT.split(name):
        if chunk:
            words.extend(w.lower() for w in _HUMPS.findall(chunk))
    return words


def _words(name: str) -> tuple[list[str], set[tuple[str, str]], set[str]]:
    """The words of a phase name's last ``/`` component, their neighbouring
    pairs, and the set of words plus whole lower-cased chunks (camelCase
    splitting cuts ``a2a`` into ``a``, ``2``, ``a``)."""
    leaf = name.rsplit(CHILD_SEP, 1)[-1]
    words = split_words(leaf)
    return words, set(pairwise(words)), set(words) | {c.lower() for c in _SPLIT.split(leaf) if c}


@lru_cache(maxsize=65536)
def is_collective(name: str) -> bool:
    """Whether a phase name says it is a collective or a distribution step
    (:data:`COLLECTIVE_PAIRS`, :data:`COLLECTIVE_WORDS`: ``grad_allreduce``,
    ``sparse_data_dist_sync``, ``collective_wait``, ``gloo:all_reduce``).

    Such a phase waits for other ranks, or for a communication stream, not
    for the host's own queued device work: analysis never splits it with the
    device-backlog walk. Evidence (docs/DIAGNOSIS.md): in the torchrec trace
    ``hta/trace_diff/test``, the copies blocking the host inside
    ``## sparse_data_dist ##`` sat on a stream that ran kernels for 7 of their
    314 ms (the stream waited on the all-to-all), while other streams ran
    backward kernels the walk would have credited.

    >>> is_collective("grad_allreduce"), is_collective("loss_item")
    (True, False)
    """
    _, pairs, wordset = _words(name)
    return bool(pairs & COLLECTIVE_PAIRS or wordset & COLLECTIVE_WORDS)


@lru_cache(maxsize=65536)
def categorize(name: str) -> str:
    """Return the built-in category of a phase name (a :class:`Category` value).

    Only the last ``/`` component of a child phase counts. Unknown names are
    ``compute``. Cached: the distinct phase names of a run are few.

    >>> categorize("hs_get"), categorize("hs_put"), categorize("grad_norm_item")
    ('starvation', 'backpressure', 'sync')
    >>> categorize("target_forward"), categorize("wait_stream")
    ('compute', 'sync')
    """
    _, pairs, wordset = _words(name)
    if pairs & SYNC_PAIRS or wordset & SYNC_WORDS:
        return Category.SYNC.value
    if wordset & BACKPRESSURE_WORDS:
        return Category.BACKPRESSURE.value
    if pairs & STARVATION_PAIRS or wordset & STARVATION_WORDS:
        return Category.STARVATION.value
    return Category.COMPUTE.value


def resolve_category(name: str, kinds: dict[str, str] | None = None,
                     phase_kinds: dict[str, str] | None = None) -> str:
    """Category of ``name``: the record's ``kinds``, then the manifest's
    ``phase_kinds``, then :func:`categorize` (docs/FORMAT.md "Categories").
    Overrides naming an unknown category are ignored (ingest reports them)."""
    for table in (kinds, phase_kinds):
        if table:
            value = table.get(name)
            if value in PHASE_CATEGORIES:
                return value
    return categorize(name)
