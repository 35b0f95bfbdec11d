"""tlog: find where multi-GPU training pipelines lose their time.

From Python (``tlog.api``)::

    import tlog
    db = tlog.open("runs.duckdb")
    db.ingest("logs/run-42")
    d = db.diagnose("run-42")

``import tlog`` is light: :func:`open` and :class:`Database` load their
libraries (DuckDB, polars) on first use.
"""

from __future__ import annotations

import os
from typing import Any

# $TLOG_THREADS (tlog.ingest.db.THREADS_ENV) bounds polars' pool too; polars reads
# POLARS_MAX_THREADS once, at its import, which comes after this package's.
_threads = os.environ.get("TLOG_THREADS", "").strip()
if _threads.isdigit() and int(_threads) >= 1:
    os.environ.setdefault("POLARS_MAX_THREADS", _threads)

__all__ = ["Database", "open"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tlog import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
