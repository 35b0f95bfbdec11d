"""A run lake: the tlog tables as Parquet on shared storage, published run by run.

Many hosts publish into one folder (a shared file system: NFS, Lustre, a
mounted bucket with atomic renames) without a coordinator; DuckDB and Spark
read it (:mod:`tlog.queries.lake_sql`). docs/LAKE.md is the user's guide.

Layout::

    DIR/
      _tlog/lake.json                      lake format, schema version, each table's columns
      _tlog/runs/<run>/<publish>.json      one manifest per publish of a run
      iterations/run_id=<run>/part-<publish>.parquet
      phases/run_id=<run>/part-<publish>.parquet
      ...                                  one folder per table of LAKE_TABLES

``<run>`` is the run id percent-encoded (:func:`encode_run_id`: ``a/b`` ->
``a%2Fb``), as hive partitioning writes it and DuckDB and Spark decode it;
``<publish>`` is ``<epoch ns, 20 digits>-<8 hex>``, so publish ids sort in
time order. Every publish writes one file per table (a table with no rows of
the run gets a file with no rows), the ``run_id`` column in the folder name
only (hive style). Folders and files starting with ``_`` or ``.`` are not
data: Spark, Hive and Trino skip them, and the ``*.parquet`` globs of DuckDB
never match the ``.part-*.tmp`` files being written.

The guarantees (checked by tests/lake/):

- **A reader never sees half a run.** A publish writes its files under new
  names, each first as ``.part-<publish>.parquet.tmp`` beside its place and
  renamed into place when whole, then commits by renaming its manifest into
  ``_tlog/runs/<run>/``. A run's current version is its manifest with the
  greatest publish id; tlog's readers (:func:`read_lake`) read the manifests
  first and then exactly the files they name, so they see a run's old
  version or its new one, never a mix.
- **No coordinator.** Publishes of different runs touch different files; two
  publishes of the same run at once both complete and the later publish id
  wins (clocks of the hosts should agree to well under the time between two
  publishes of one run). Only renames, which POSIX makes atomic, and
  create-if-absent of ``lake.json`` (a hard link) are relied on.
- **Re-publishing replaces.** After its commit a publish deletes the earlier
  manifests of the run and their files. A reader that read an earlier
  manifest just before may then find a file gone: tlog's readers read the
  manifests again and retry (:data:`READ_RETRIES`).
- **One schema per lake.** ``_tlog/lake.json`` records the database schema
  version the files follow (``tlog.ingest.db.SCHEMA_VERSION``); a tlog of
  another schema version refuses to publish there (:class:`LakeError`).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.db import SCHEMA_VERSION
from tlog.ingest.errors import TlogError, UsageError
from tlog.queries.export import COMPRESSION, EXPORT_TABLES
from tlog.queries.runner import check_run

#: Version of this layout (``_tlog/lake.json`` ``lake_format``); a reader refuses others.
LAKE_FORMAT = 1
#: The lake's own files (not data: the leading ``_`` makes Spark and Hive skip it).
META_DIR = "_tlog"
#: Tables published per run, each with its row order: the export's (tlog.queries.export)
#: and ``phase_layouts``; ``iterations`` keeps its phase-time lists and layout id
#: (the export leaves them out), so a worker's rows are all its attribution reads
#: (tlog.queries.lake_diagnose).
LAKE_TABLES: dict[str, str] = {**EXPORT_TABLES, "phase_layouts": "layout, seq"}
#: How often a reader reads the manifests again when a file it was told of is gone
#: (a publish replaced the run meanwhile): tlog's choice.
READ_RETRIES = 3
#: Rows per Arrow batch a publish holds in memory (and per Parquet row group at most):
#: tlog's choice, a few MB of an ``iterations`` table.
PUBLISH_BATCH_ROWS = 122_880


class LakeError(TlogError):
    """The lake cannot be written or read (another schema version, a damaged manifest,
    no runs, a file system error)."""


@dataclass(frozen=True)
class PublishReport:
    """What :func:`publish_run` wrote.

    Attributes:
        run_id: the run.
        publish_id: this publish (``<epoch ns>-<hex>``; greater is later).
        lake: the lake folder (absolute).
        rows: rows written per table.
        bytes: bytes of Parquet written.
        replaced: publish ids of the run's earlier versions this publish removed.
        superseded: True when a later publish of the same run (from another host)
            committed first: that one is the run's version, this one was removed.
        seconds: wall time of the publish.
    """

    run_id: str
    publish_id: str
    lake: str
    rows: dict[str, int]
    bytes: int
    replaced: list[str] = field(default_factory=list)
    superseded: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class LakeSnapshot:
    """The runs of a lake at one moment and the files that hold them.

    Attributes:
        directory: the lake folder (absolute).
        schema_version: the tlog database schema version of its files.
        tables: table -> ``[[column, DuckDB type], ...]`` (``run_id`` last).
        manifests: run id -> its current manifest (the publish with the greatest id).
    """

    directory: Path
    schema_version: int
    tables: dict[str, list[list[str]]]
    manifests: dict[str, dict[str, Any]]

    @property
    def runs(self) -> list[str]:
        """The run ids present, sorted."""
        return sorted(self.manifests)

    def files(self, table: str) -> list[str]:
        """Absolute paths of ``table``'s Parquet files, one per run, by run id."""
        return [str(self.directory / self.manifests[r]["tables"][table]["file"])
                for r in self.runs]


def encode_run_id(run_id: str) -> str:
    """A run id as a folder name: percent-encoded, every byte but ``A-Za-z0-9_.-~``
    (``a/b`` -> ``a%2Fb``); DuckDB's and Spark's hive partitioning decode it."""
    return quote(run_id, safe="")


def _publish_id() -> str:
    return f"{time.time_ns():020d}-{secrets.token_hex(4)}"


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden file beside it and a rename."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _lake_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[list[str]]:
    """``[[column, DuckDB type], ...]`` of a lake table's files (every column but
    ``run_id``, which is in the folder name), then ``["run_id", "VARCHAR"]``."""
    rows = con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall()
    names = list(dict.fromkeys(r[0] for r in rows))
    types = {r[0]: str(r[1]) for r in rows}
    return [*([n, types[n]] for n in names if n != "run_id"), ["run_id", "VARCHAR"]]


def _lake_meta(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    return {"lake_format": LAKE_FORMAT, "schema_version": SCHEMA_VERSION,
            "partition_by": ["run_id"], "compression": COMPRESSION,
            "tables": {t: _lake_columns(con, t) for t in LAKE_TABLES}}


def _ensure_lake_file(con: duckdb.DuckDBPyConnection, lake: Path) -> None:
    """Create ``_tlog/lake.json`` if absent (create-if-absent by a hard link, so two
    first publishers agree), else check it is a lake this tlog writes."""
    meta_dir = lake / META_DIR
    meta_dir.mkdir(parents=True, exist_ok=True)
    target = meta_dir / "lake.json"
    if not target.exists():
        tmp = meta_dir / f".lake.json.{secrets.token_hex(4)}.tmp"
        tmp.write_text(json.dumps(_lake_meta(con), indent=2) + "\n", encoding="utf-8")
        try:
            os.link(tmp, target)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    meta = _read_lake_file(lake)
    if meta["schema_version"] != SCHEMA_VERSION:
        raise LakeError(f"{target} holds tlog schema version {meta['schema_version']}; this "
                        f"tlog writes version {SCHEMA_VERSION}: publish with a tlog of that "
                        f"version, or into another folder")


def _read_lake_file(lake: Path) -> dict[str, Any]:
    path = lake / META_DIR / "lake.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise LakeError(f"{lake} is not a tlog lake (no {META_DIR}/lake.json); publish "
                        f"runs into it with 'tlog publish {lake}'") from exc
    except (OSError, ValueError) as exc:
        raise LakeError(f"cannot read {path}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("lake_format") != LAKE_FORMAT:
        raise LakeError(f"{path}: lake format {meta.get('lake_format') if isinstance(meta, dict) else '?'}"
                        f", this tlog reads format {LAKE_FORMAT}")
    return meta


def _write_parquet(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any],
                   path: Path) -> int:
    """Write the rows of ``sql`` to the Parquet file ``path`` (zstd), batch by batch;
    return the row count. Written by pyarrow from Arrow batches rather than by DuckDB's
    ``COPY``: a connection without external access (``tlog serve``'s) may run it, and
    memory holds one batch (:data:`PUBLISH_BATCH_ROWS`) whatever the run's size."""
    import pyarrow.parquet as pq

    reader = con.sql(sql, params=params).to_arrow_reader(PUBLISH_BATCH_ROWS)
    n = 0
    with pq.ParquetWriter(path, reader.schema, compression=COMPRESSION) as out:
        for batch in reader:
            out.write_batch(batch)
            n += batch.num_rows
    return n


def publish_run(con: duckdb.DuckDBPyConnection, run_id: str, lake_dir: str | Path
                ) -> PublishReport:
    """Publish one run of the database into the run lake at ``lake_dir`` (add or replace).

    Its stored diagnosis is made fresh first (``tlog.analyze.persist``), so the
    lake's ``attribution*`` tables hold ``tlog diagnose``'s figures. The run's
    files are written beside their place and renamed in, then its manifest is
    renamed in (the commit), then its earlier versions are deleted: readers see
    the old version or the new one, never half (module docstring). Safe to call
    from many hosts at once on one shared folder. ``tlog serve`` calls it for
    each run it finishes, ``tlog publish`` for the runs it is given.

    Args:
        con: an open tlog database connection (a reader is enough: a stale stored
            diagnosis is then computed in memory for the files; files are written
            by pyarrow, so a connection without external access may publish).
        run_id: the run to publish.
        lake_dir: the lake folder; created if missing.

    Returns:
        A :class:`PublishReport` (rows per table, bytes, the versions replaced).

    Raises:
        RunNotFoundError: no such run in the database.
        UsageError: ``lake_dir`` is a file.
        LakeError: the lake holds another schema version, or a write fails.
    """
    started = time.perf_counter()
    lake = Path(lake_dir).expanduser().resolve()
    if lake.exists() and not lake.is_dir():
        raise UsageError(f"{lake} is a file; give a folder for the run lake")
    check_run(con, run_id)
    ensure_attribution(con, [run_id])
    pid = _publish_id()
    enc = encode_run_id(run_id)
    written: list[Path] = []
    rows: dict[str, int] = {}
    tables: dict[str, dict[str, Any]] = {}
    try:
        _ensure_lake_file(con, lake)
        for table, order in LAKE_TABLES.items():
            part = lake / table / f"run_id={enc}"
            part.mkdir(parents=True, exist_ok=True)
            final = part / f"part-{pid}.parquet"
            tmp = part / f".part-{pid}.parquet.tmp"
            cols = ['"' + c.replace('"', '""') + '"' for c, _ in _lake_columns(con, table)[:-1]]
            n = _write_parquet(con, f"SELECT {', '.join(cols)} FROM {table} WHERE run_id = $r "
                                    f"ORDER BY {order}", {"r": run_id}, tmp)
            os.replace(tmp, final)
            written.append(final)
            rows[table] = int(n)
            tables[table] = {"file": str(final.relative_to(lake)), "rows": int(n),
                             "bytes": final.stat().st_size}
        runs_dir = lake / META_DIR / "runs" / enc
        runs_dir.mkdir(parents=True, exist_ok=True)
        manifest = {"run_id": run_id, "publish_id": pid,
                    "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "host": socket.gethostname(), "schema_version": SCHEMA_VERSION,
                    "tables": tables}
        _write_atomic(runs_dir / f"{pid}.json", json.dumps(manifest, indent=2) + "\n")
    except (duckdb.Error, OSError) as exc:   # a full disk, a connection that may not write files
        for path in written:
            path.unlink(missing_ok=True)
        raise LakeError(f"cannot publish run {run_id!r} into {lake}: "
                        f"{str(exc).strip().splitlines()[0]}") from exc
    replaced, superseded = _settle(lake, enc, pid)
    return PublishReport(run_id=run_id, publish_id=pid, lake=str(lake), rows=rows,
                         bytes=sum(t["bytes"] for t in tables.values()), replaced=replaced,
                         superseded=superseded, seconds=time.perf_counter() - started)


def _settle(lake: Path, enc: str, pid: str) -> tuple[list[str], bool]:
    """After the commit of ``pid``: remove the run's versions older than the newest
    (manifests first, so no reader starts on them, then their files). Returns the
    versions removed and whether ``pid`` itself lost to a newer publish."""
    runs_dir = lake / META_DIR / "runs" / enc
    ids = sorted(p.stem for p in runs_dir.glob("*.json") if not p.name.startswith("."))
    newest = ids[-1] if ids else pid
    old = [i for i in ids if i < newest]
    for i in old:
        (runs_dir / f"{i}.json").unlink(missing_ok=True)
    for table in LAKE_TABLES:
        part = lake / table / f"run_id={enc}"
        for f in part.glob("part-*.parquet"):
            if f.stem.removeprefix("part-") < newest:
                f.unlink(missing_ok=True)
    return [i for i in old if i != pid], newest != pid


def publish_runs(con: duckdb.DuckDBPyConnection, lake_dir: str | Path, *,
                 run_ids: Sequence[str] | None = None) -> list[PublishReport]:
    """:func:`publish_run` for each of ``run_ids`` (default: every run of the database),
    in run id order.

    Raises:
        as :func:`publish_run`; runs published before a failure stay published.
    """
    runs = sorted(set(run_ids)) if run_ids else [r[0] for r in con.execute(
        "SELECT run_id FROM runs UNION SELECT DISTINCT run_id FROM iterations ORDER BY 1"
    ).fetchall()]
    for run_id in runs:
        check_run(con, run_id)
    return [publish_run(con, run_id, lake_dir) for run_id in runs]


def read_lake(lake_dir: str | Path) -> LakeSnapshot:
    """The lake's runs now: for each run its current manifest (the greatest publish id).

    Raises:
        LakeError: not a lake (no ``_tlog/lake.json``), another lake format, a
            manifest that cannot be read, or no run published yet.
    """
    lake = Path(lake_dir).expanduser().resolve()
    if not lake.is_dir():
        raise LakeError(f"no run lake at {lake}: publish runs into it with 'tlog publish {lake}'")
    meta = _read_lake_file(lake)
    manifests: dict[str, dict[str, Any]] = {}
    runs_root = lake / META_DIR / "runs"
    for folder in sorted(runs_root.iterdir()) if runs_root.is_dir() else []:
        ids = sorted(p for p in folder.glob("*.json") if not p.name.startswith("."))
        for path in reversed(ids):           # the newest that is still there
            try:
                m = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue                      # removed by a newer publish meanwhile
            except (OSError, ValueError) as exc:
                raise LakeError(f"cannot read manifest {path}: {exc}; publish the run "
                                f"again") from exc
            manifests[m["run_id"]] = m
            break
    if not manifests:
        raise LakeError(f"no run published in {lake} yet: 'tlog publish {lake}' publishes "
                        "the runs of a database")
    return LakeSnapshot(directory=lake, schema_version=int(meta["schema_version"]),
                        tables=meta["tables"], manifests=manifests)
