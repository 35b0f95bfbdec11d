"""``$TLOG_THREADS``: the most threads one tlog process's queries use (stdlib only).

DuckDB's ``threads`` setting on every connection (:func:`tlog.ingest.db.connect`)
and polars' pool, through ``POLARS_MAX_THREADS``, which ``tlog/__init__.py`` sets
from it before polars loads (polars reads it once, at its import). Unset: DuckDB's
and polars' default, one per core. For a shared login node, tlog beside a running
job, or several tlog processes at once (``make test`` runs its pytest workers with
1: they already take the cores).
"""

from __future__ import annotations

import os

#: The environment variable.
THREADS_ENV = "TLOG_THREADS"


def threads_from_env() -> int | None:
    """``$TLOG_THREADS`` as a thread count; None when unset or empty.

    Raises:
        ValueError: it is set to anything but a whole number >= 1 (the message says
            so in one line).
    """
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        msg = f"${THREADS_ENV} is {raw!r}: give a whole number of threads >= 1, or unset it"
        raise ValueError(msg)
    return int(raw)
