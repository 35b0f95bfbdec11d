"""tlog ingest: run directories of v1 JSONL timing logs -> the DuckDB database.

Public API:

- :func:`connect` ``(path=None, *, read_only=False, wait_s=0.0)``: open (create,
  migrate) the database (:mod:`ingest.db`).
- :func:`ingest_run` ``(con, path, *, run_id=None, progress=False) -> IngestReport``:
  load a run directory, incrementally (:mod:`ingest.run`).
- :func:`ingest_lines` ``(con, run_id, name, lines)``: load v1 JSONL lines as one
  virtual file of a run (the seam for converters such as :mod:`ingest.kineto`).
- :class:`Source`: a kind of log file in run directories, discovered from
  the ``tlog.sources`` entry points of installed distributions (tlog's own
  ``jsonl``, ``jsonl.gz`` and ``kineto`` among them) by
  :func:`active_sources`; :func:`register_source` adds one for this process
  (:mod:`ingest.sources`).

Parsing and validation run in bulk inside DuckDB (:mod:`tlog.ingest.parse_sql` and :mod:`tlog.ingest.batch`); the
tables and views are documented in ``docs/DATABASE.md``.
"""

from __future__ import annotations

from dflash_runtime.lazy import lazy_exports

#: Public name -> the module that defines it. Imported on first use (module
#: ``__getattr__``), so ``import tlog.ingest.errors`` (the CLI's start-up) loads
#: neither DuckDB nor pyarrow (fast where users wait).
_EXPORTS = {
    "SCHEMA_VERSION": "db", "connect": "db", "default_db_path": "db",
    "REASON_CODES": "parse_sql", "Manifest": "manifest",
    "read_manifest": "manifest", "IngestProgress": "run", "IngestReport": "run",
    "ingest_lines": "run", "ingest_run": "run", "Source": "sources",
    "register_source": "sources", "active_sources": "sources",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "REASON_CODES",
    "SCHEMA_VERSION",
    "IngestProgress",
    "IngestReport",
    "Manifest",
    "Source",
    "active_sources",
    "connect",
    "default_db_path",
    "ingest_lines",
    "ingest_run",
    "read_manifest",
    "register_source",
]
