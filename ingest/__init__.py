"""tlog ingest: run directories of v1 JSONL timing logs -> the DuckDB database.

Public API:

- :func:`connect` ``(path=None, *, read_only=False, wait_s=0.0)``: open (create,
  migrate) the database (:mod:`ingest.db`).
- :func:`ingest_run` ``(con, path, *, run_id=None, progress=False) -> IngestReport``:
  load a run directory, incrementally (:mod:`ingest.run`).
- :func:`ingest_lines` ``(con, run_id, name, lines)``: load v1 JSONL lines as one
  virtual file of a run (the seam for converters such as :mod:`ingest.kineto`).
- :func:`register_source` / :class:`Source`: a new kind of log file in run
  directories (:mod:`ingest.sources`).

Parsing and validation run in bulk inside DuckDB (:mod:`ingest.load`); the
tables and views are documented in ``docs/DATABASE.md``.
"""

from __future__ import annotations

from tlog.ingest.db import SCHEMA_VERSION, connect, default_db_path
from tlog.ingest.kineto import register as _register_kineto
from tlog.ingest.load import REASON_CODES
from tlog.ingest.manifest import Manifest, read_manifest
from tlog.ingest.run import IngestProgress, IngestReport, ingest_lines, ingest_run
from tlog.ingest.sources import Source, register_source

# torch.profiler (Kineto) traces are a registered source too (docs/KINETO.md).
_register_kineto()

__all__ = [
    "REASON_CODES",
    "SCHEMA_VERSION",
    "IngestProgress",
    "IngestReport",
    "Manifest",
    "Source",
    "connect",
    "default_db_path",
    "ingest_lines",
    "ingest_run",
    "read_manifest",
    "register_source",
]
