"""Names of the v1 timing-log format as the shim writes it (docs/FORMAT.md).

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

from enum import StrEnum

#: Format version written in every record (docs/FORMAT.md: "Every record may carry "v": 1").
FORMAT_VERSION = 1


class RecordType(StrEnum):
    """The ``type`` field of a record (docs/FORMAT.md "Records")."""

    META = "meta"
    ITER = "iter"
    QUEUE = "queue"
    EVENT = "event"


class Kind(StrEnum):
    """Categories a phase may be given in an iteration's ``kinds`` (docs/FORMAT.md "Categories").

    ``unaccounted`` is not a phase category: it is the part of ``dur`` no phase covers.
    """

    STARVATION = "starvation"
    BACKPRESSURE = "backpressure"
    COMPUTE = "compute"
    SYNC = "sync"


#: The values accepted for ``kind=`` arguments and ``phase_kinds``.
PHASE_KINDS: frozenset[str] = frozenset(k.value for k in Kind)

#: Separator of a child phase from its parent (docs/FORMAT.md: ``forward/mask_build``).
CHILD_SEP = "/"


def check_kind(kind: str) -> str:
    """Return ``kind`` if it is one of :data:`PHASE_KINDS`, else raise ``ValueError``."""
    if kind not in PHASE_KINDS:
        msg = f"unknown phase kind {kind!r}: use one of {', '.join(sorted(PHASE_KINDS))}"
        raise ValueError(msg)
    return kind
