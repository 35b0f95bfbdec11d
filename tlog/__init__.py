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

from tlog.ingest.threads import threads_from_env

# $TLOG_THREADS bounds polars' pool too (tlog/ingest/threads.py); polars reads
# POLARS_MAX_THREADS once, at its import, which comes after this package's. A bad
# value is left for connect() to report in one line.
try:
    _threads = threads_from_env()
except ValueError:
    _threads = None
if _threads:
    os.environ.setdefault("POLARS_MAX_THREADS", str(_threads))

__all__ = ["Database", "open"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tlog import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
