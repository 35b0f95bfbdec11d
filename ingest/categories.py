"""Phase categories: the built-in naming rules of docs/FORMAT.md ("Categories").

A phase's category is, in order: the record's ``kinds``; the manifest's
``phase_kinds``; these rules on the phase's name (:func:`categorize`).

The rules match whole words. A name is split into lower-case words at ``_``,
``-``, ``.``, ``/``, ``:``, ``#``, spaces and camelCase humps, so
``target_forward`` is ``["target", "forward"]`` (compute, although ``target``
holds the letters ``get``) and ``hsGet`` is ``["hs", "get"]`` (starvation).
For a child phase (``forward/mask_build``) only the last path component is
used: the child's own name says what it does.

Order of the checks (first match wins):

1. a word pair in :data:`SYNC_PAIRS` (``wait_stream``, ``all_reduce``,
   ``all_to_all``, ``reduce_scatter``) -> sync;
2. a word in :data:`SYNC_WORDS` (``item``, ``synchronize``, ``barrier``, and the
   words of collectives and distribution: ``dist``, ``alltoall``, ``a2a``,
   ``broadcast``, ``send``, ``recv``, ``nccl``, ``gloo`` ...) -> sync;
3. a word in :data:`BACKPRESSURE_WORDS` (``put``) -> backpressure;
4. a word pair in :data:`STARVATION_PAIRS` (``read_shard``) or a word in
   :data:`STARVATION_WORDS` (``get``, ``wait``, ``data``, ``collate``, ``io`` ...)
   -> starvation;
5. anything else -> compute.

Communication wins over input: ``sparse_data_dist`` (torchrec's input
distribution, an all-to-all between ranks) and ``wait_sparse_data_dist`` are
collectives the host waits for, not a data source, although ``data`` and
``wait`` are starvation words. ``send``/``recv`` are the point-to-point calls
of ``torch.distributed`` (pipeline-parallel hand-offs wait on a peer rank's
collective, sync); a queue hand-off named in plain words (``receive``,
``get``, ``put``) keeps its queue category.

Sources: docs/FORMAT.md ("Categories") lists the core words; the framework names that must read as
starvation (``next_batch``, ``get_train_batch``, ``batch_generator``,
``data_loading``, ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``)
come from Megatron-LM, torchtitan and torch.profiler traces.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import lru_cache
from itertools import pairwise


class Category(StrEnum):
    """Where a second of worker wall time goes (docs/FORMAT.md "Categories")."""

    STARVATION = "starvation"
    BACKPRESSURE = "backpressure"
    COMPUTE = "compute"
    SYNC = "sync"
    UNACCOUNTED = "unaccounted"


#: Categories in report order.
CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)
#: Categories a phase may be given in ``kinds``/``phase_kinds`` (all but unaccounted).
PHASE_CATEGORIES: frozenset[str] = frozenset(CATEGORIES) - {Category.UNACCOUNTED.value}

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
    """Split a phase name into lower-case words (see the module docstring).

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
    leaf = name.rsplit("/", 1)[-1]
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
    ``phase_kinds``, then :func:`categorize`. Overrides naming an unknown
    category are ignored (ingest reports them)."""
    for table in (kinds, phase_kinds):
        if table:
            value = table.get(name)
            if value in PHASE_CATEGORIES:
                return value
    return categorize(name)
