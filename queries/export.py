"""Export the tlog tables as Parquet, partitioned by run (hive style).

Layout (``docs/QUERIES.md`` shows how Spark, Trino and DuckDB read it)::

    DIR/
      tlog_export.json                 the runs present, each table's columns and types,
                                       the schema version, what the last export wrote
      runs/run_id=<id>/data_0.parquet
      iterations/run_id=<id>/data_0.parquet
      phases/run_id=<id>/data_0.parquet
      ...                              one folder per table in EXPORT_TABLES

Each table's rows go under ``run_id=<id>`` folders (DuckDB ``COPY ... TO ...
(FORMAT parquet, PARTITION_BY (run_id))``); the ``run_id`` column lives in the
folder name, not in the files, as hive partitioning does, and readers restore
it (``hive_partitioning``). Run ids are percent-encoded in folder names
(``a/b`` -> ``run_id=a%2Fb``), which DuckDB, Spark and Trino decode. Columns
keep the database's types and units (seconds, epoch seconds, bytes); JSON
columns (``tags``, ``config`` ...) are strings holding JSON. ``phases`` is
written flat (one row per phase per iteration, as the ``phases`` view shows
it), and ``iteration_categories`` (a view) is written too, so other engines
need no tlog logic to get per-category seconds; so is the stored diagnosis
(``attribution``, ``attribution_phases``, ``attribution_stages``,
``attribution_runs``, made fresh first), which the stored queries read. A table with no rows (often
``rejects``) has no files; its columns are in ``tlog_export.json``.

The export streams inside DuckDB (no table is loaded into Python), reading the
database read-only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import duckdb
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.db import schema_version
from tlog.ingest.errors import TlogError, UsageError
from tlog.queries.runner import check_run

#: Tables (and the one view) exported, each with the row order inside a partition
#: (sorted rows compress better and read in the order analysis wants).
EXPORT_TABLES: dict[str, str] = {
    "runs": "run_id",
    "files": "path",
    "workers": "stage, rank, worker",
    "iterations": "stage, rank, worker, iter",
    "phases": "stage, rank, worker, iter, seq",
    "queue_samples": "name, ts",
    "events": "ts",
    "rejects": "file, line",
    "sys_samples": "worker, ts",
    "machines": "worker",
    "iteration_categories": "stage, rank, worker, iter",
    # the stored diagnosis (tlog.analyze.persist): what the stored queries read
    "attribution": "stage, rank, worker, iter",
    "attribution_phases": "stage, rank, worker, phase, category",
    "attribution_stages": "pos",
    "attribution_runs": "data_key",
}
#: Storage columns left out of the export: the per-iteration phase time lists
#: and their layout id are how the database stores the ``phases`` view, which is
#: exported flat (one row per phase per iteration) instead.
INTERNAL_COLUMNS: frozenset[str] = frozenset({"layout", "phase_host_s", "phase_gpu_s"})
#: Name of the manifest written beside the table folders.
MANIFEST = "tlog_export.json"
#: Parquet compression codec (zstd: readable by Spark 3+, Trino, DuckDB, pyarrow).
COMPRESSION = "zstd"


class ExportError(TlogError):
    """The export cannot be written (target folder not empty, disk error)."""


@dataclass
class ExportReport:
    """What :func:`export_parquet` wrote.

    Attributes:
        directory: the export folder (absolute).
        tables: rows written per table by this export.
        runs: the run ids this export wrote, sorted.
        files: Parquet files this export wrote.
        schema_version: the database schema version the files follow.
    """

    directory: str
    tables: dict[str, int]
    runs: list[str]
    files: int
    schema_version: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the manifest's fields)."""
        return asdict(self)


def _is_export_dir(path: Path) -> bool:
    """True when ``path`` holds only ``run_id=...`` partition folders (a previous export)."""
    return all(p.is_dir() and p.name.startswith("run_id=") for p in path.iterdir())


def _runs_in(out: Path) -> list[str]:
    """Run ids present in an export folder (decoded from its ``run_id=`` folder names)."""
    found = {unquote(p.name.split("=", 1)[1])
             for table in EXPORT_TABLES for p in (out / table).glob("run_id=*") if p.is_dir()}
    return sorted(found)


def export_parquet(con: duckdb.DuckDBPyConnection, directory: str | Path, *,
                   run_ids: Sequence[str] | None = None, overwrite: bool = False) -> ExportReport:
    """Write the tlog tables under ``directory`` as hive-partitioned Parquet.

    Without ``run_ids`` every run is written and each table folder is replaced
    as a whole (runs no longer in the database disappear from the export). With
    ``run_ids`` only those runs' partitions are written and the other runs'
    partitions already in ``directory`` are kept: a nightly job can add the
    day's runs to a shared export.

    Each table is first written to a staging folder inside ``directory`` and
    then moved into place, so a failed export leaves the earlier one whole.

    Args:
        con: an open tlog database connection (read-only is enough; it must be
            allowed to write files, so not a :func:`queries.read_only_connection`).
        directory: the export folder; created if missing.
        run_ids: export only these runs (default: every run).
        overwrite: replace what an earlier export wrote for the same tables
            (without ``run_ids``) or the same runs (with them).

    Returns:
        An :class:`ExportReport` of the rows written (also in ``tlog_export.json``,
        whose ``runs`` lists every run present in the folder).

    Raises:
        RunNotFoundError: a run in ``run_ids`` is not in the database.
        UsageError: ``directory`` is a file.
        ExportError: the export would replace earlier files and ``overwrite``
            is false, a table folder holds files that are not an export, or a
            write fails.
    """
    out = Path(directory).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file; give a folder for the Parquet export")
    runs = sorted(set(run_ids or []))
    for run_id in runs:
        check_run(con, run_id)
    ensure_attribution(con, runs or None)
    for table in EXPORT_TABLES:
        target = out / table
        if target.exists() and any(target.iterdir()):
            if not _is_export_dir(target):
                raise ExportError(f"{target} holds files that are not a tlog export; "
                                  "refusing to write there")
            if not runs and not overwrite:
                raise ExportError(f"{target} already holds an export; pass --overwrite to "
                                  "replace it, or choose another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tlog-export-", dir=out))
    except OSError as exc:
        raise ExportError(f"cannot create {out}: {exc.strerror}") from exc
    try:
        counts = _write_staged(con, staging, runs)
        files = sum(1 for _ in staging.glob("*/run_id=*/*.parquet"))
        _move_into_place(staging, out, whole=not runs, overwrite=overwrite)
    except (duckdb.IOException, OSError) as exc:
        raise ExportError(f"cannot write the export under {out}: "
                          f"{str(exc).strip().splitlines()[0]}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    exported = runs or [r[0] for r in con.execute(
        "SELECT DISTINCT run_id FROM (SELECT run_id FROM runs UNION SELECT run_id FROM iterations)"
        " ORDER BY run_id").fetchall()]
    report = ExportReport(directory=str(out), tables=counts, runs=exported, files=files,
                          schema_version=schema_version(con))
    manifest = {"format": "parquet", "layout": "hive", "partition_by": ["run_id"],
                "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "schema_version": report.schema_version, "runs": _runs_in(out),
                "tables": {t: _schema(con, t) for t in EXPORT_TABLES},
                "last_export": {"runs": exported, "rows": counts}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return report


def _write_staged(con: duckdb.DuckDBPyConnection, staging: Path, runs: list[str]) -> dict[str, int]:
    where = "WHERE run_id IN (SELECT unnest($runs::VARCHAR[]))" if runs else ""
    params: dict[str, Any] = {"runs": runs} if runs else {}
    counts: dict[str, int] = {}
    for table, order in EXPORT_TABLES.items():
        rows = con.execute(f"SELECT count(*) FROM {table} {where}", params).fetchall()[0][0]
        counts[table] = int(rows)
        target = staging / table
        target.mkdir()
        if rows:
            con.execute(
                f"COPY (SELECT {_columns(con, table)} FROM {table} {where} "
                f"ORDER BY run_id, {order}) TO $path "
                f"(FORMAT parquet, PARTITION_BY (run_id), COMPRESSION {COMPRESSION})",
                {**params, "path": str(target)}).fetchall()
    return counts


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """The select list of ``table``: its columns but :data:`INTERNAL_COLUMNS`, quoted."""
    # a temporary view of the same name (analyze.persist, read-only) lists them again
    names = list(dict.fromkeys(r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = $t "
        "ORDER BY ordinal_position", {"t": table}).fetchall()))
    return ", ".join('"' + n.replace('"', '""') + '"' for n in names if n not in INTERNAL_COLUMNS)


def _schema(con: duckdb.DuckDBPyConnection, table: str) -> list[list[str]]:
    """``[[column, DuckDB type], ...]`` of an exported table (``run_id`` last, as
    hive readers put the partition column), for tables that have no files."""
    rows = con.execute(f"DESCRIBE SELECT {_columns(con, table)} FROM {table}").fetchall()
    cols = [[r[0], str(r[1])] for r in rows if r[0] != "run_id"]
    return [*cols, ["run_id", "VARCHAR"]]


def _move_into_place(staging: Path, out: Path, *, whole: bool, overwrite: bool) -> None:
    if not whole and not overwrite:
        clashes = [out / t / p.name for t in EXPORT_TABLES for p in (staging / t).iterdir()
                   if (out / t / p.name).exists()]
        if clashes:
            raise ExportError(f"{clashes[0]} already exists; pass --overwrite to replace "
                              "those runs' partitions")
    for table in EXPORT_TABLES:
        target = out / table
        if whole:
            if target.exists():
                shutil.rmtree(target)
            (staging / table).rename(target)
            continue
        target.mkdir(exist_ok=True)
        for part in sorted((staging / table).iterdir()):
            if (target / part.name).exists():
                shutil.rmtree(target / part.name)
            part.rename(target / part.name)
