"""``ingest_run``: load a run directory into the database, incrementally and safely.

Per file the ``files`` table remembers how far it was read: the byte offset
after the last complete line, the number of lines, the size and mtime seen,
and a fingerprint (blake2b) of its first bytes. An ingest then reads only:

- new files, from the start;
- grown files, from the stored offset (a ``.gz`` or decoded file is decoded
  again and the consumed part skipped);
- plain logs found renamed (rotation) by their fingerprint, from their offset
  (:func:`_identify`); a path holding another file is a new file;
- rewritten decoded files (the head fingerprint changed, or the file shrank):
  their old rows are deleted and they are read again from the start.

A file whose size, mtime and head are unchanged is not opened past its head,
so re-ingesting an unchanged run costs a ``stat`` and a 4 KB read per file.
A final line without a newline is left for the next ingest.

**Crash safety.** Each batch (about :data:`ingest.sources.CHUNK_BYTES` of
text; one or more files, or part of a large file) is one transaction: its
records, its rejects and the new offsets of its files commit together. A
process killed mid-ingest (``kill -9``) leaves the database as of the last
committed batch, with every file's offset matching exactly the records loaded
from it, and the next ingest resumes from there.

**Overlap.** The next batch is read, split into lines and sampled for
templates on a helper thread while DuckDB (which releases the GIL) works on
the current one.

**Concurrency.** DuckDB lets one process write a database file at a time;
:func:`ingest.db.connect` waits ``wait_s`` for the lock, then raises
:class:`~ingest.errors.DatabaseLockedError`.

**Seams for other sources.** A ``tlog.sources`` entry point (or, for one
process, :func:`ingest.sources.register_source`) adds a file kind found in
run directories (decoded into v1 JSONL text; ``ingest.sources``);
:func:`ingest_lines` loads v1 JSONL lines (``str``/``bytes``, with or without
newlines) as one virtual file of a run, e.g. a converter's output.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from tlog.ingest.batch import MAX_ERRORS, SCAN_CHUNK_ROWS, BatchFile, BatchLoader, BatchResult
from tlog.ingest.db import stored_phase_kinds
from tlog.ingest.errors import RunDirError, RunNotFoundError, UsageError
from tlog.ingest.manifest import Manifest, read_manifest
from tlog.ingest.parse_sql import REASON_CODES
from tlog.ingest.recategorize import phase_kinds_warnings, recategorize
from tlog.ingest.sources import (
    CHUNK_BYTES,
    HEAD_BYTES,
    MANIFEST,
    LinesStream,
    LogFile,
    Piece,
    Source,
    active_sources,
    claim_order,
    discover,
    pieces,
    sample_lines,
    stat,
)
from tlog.ingest.templates import SAMPLE_FRACTIONS, SAMPLE_HEAD, learn


@dataclass
class IngestProgress:
    """Progress of one ingest: files and (decoded) bytes done of the total to read."""

    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


ProgressFn = Callable[[IngestProgress], None]


@dataclass
class IngestReport:
    """What one ingest of a run did.

    Attributes:
        run_id: the run's id (``--run-id``, else ``run.json`` ``run_id``, else the
            directory name).
        root: absolute path of the run directory.
        files: log files found; ``files_read`` of them had new bytes,
            ``files_unchanged`` had none; ``files_rewritten`` (relative paths,
            decoded sources: ``.gz``, traces) were replaced on disk and loaded
            again from the start; ``files_moved`` (``{"from", "to"}``) are
            plain logs found renamed (rotation): their rows moved with them;
            ``files_replaced`` (``{"path", "old_rows_as"}``) are plain logs
            whose path holds another file now: the old rows stay, relabelled.
        bytes_read: decoded bytes of complete lines read (bytes); for a converted
            source (a torch.profiler trace), the size on disk of each trace read.
        records_loaded: records loaded by kind: ``iter``, ``queue``, ``event``, ``meta``;
            and ``sys`` when any was (for a trace: its device ``[memory]`` events,
            docs/KINETO.md).
        records_rejected: lines rejected; ``rejected_by_reason`` counts them by
            reason code (``tlog.ingest.parse_sql.REASON_CODES``).
        duplicates: ``iter`` records whose (run, rank, stage, worker, iter) was
            already loaded (earlier in this ingest or before): kept once.
        errors: the first :data:`tlog.ingest.batch.MAX_ERRORS` rejected lines as
            ``{file, line, reason}`` (all of them are in the ``rejects`` table);
            first, a file its decoder could not read to the end (a ``.jsonl.gz``
            that is ``not gzip`` or has a ``damaged gzip stream after N bytes``):
            ``line`` is the line after its last complete one, its good prefix is
            loaded, it is not counted in ``files_read`` and is read again from
            there next time.
        partial_lines: files whose last line has no newline yet (left for later).
        lines_skipped: lines of other text a converting source passed over in
            the files read (``files.meta`` ``extra.lines_skipped``: a timer log's
            lines that are not timer lines, :mod:`tlog.ingest.timer_logs`).
        warnings: things loaded but worth a look (e.g. an unknown category in
            ``kinds``), and what was left out, one line each: symbolic links out of
            the run directory (not followed), files and directories that cannot be
            read (:meth:`ingest.sources.Survey.warnings`), a file replaced or made
            unreadable while the ingest ran.
        recategorized: phases of the run whose category this ingest changed,
            ``{"phase", "from", "to"}``: ``run.json`` ``phase_kinds`` (or the
            name rules) say otherwise than when they were loaded
            (:func:`tlog.ingest.recategorize.recategorize`).
        seconds: wall time of the ingest (s).
    """

    run_id: str
    root: str
    source: str = "jsonl"
    files: int = 0
    files_read: int = 0
    files_unchanged: int = 0
    files_rewritten: list[str] = field(default_factory=list)
    files_moved: list[dict[str, str]] = field(default_factory=list)
    files_replaced: list[dict[str, str]] = field(default_factory=list)
    bytes_read: int = 0
    records_loaded: dict[str, int] = field(
        default_factory=lambda: {"iter": 0, "queue": 0, "event": 0, "meta": 0})
    records_rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    partial_lines: list[str] = field(default_factory=list)
    lines_skipped: int = 0
    warnings: list[str] = field(default_factory=list)
    recategorized: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``tlog ingest --json``."""
        out = asdict(self)
        out["seconds"] = round(self.seconds, 6)
        return out

    @property
    def records_total(self) -> int:
        """Records loaded, all kinds together."""
        return sum(self.records_loaded.values())

    def add(self, res: BatchResult) -> None:
        for kind, n in res.loaded.items():
            self.records_loaded[kind] = self.records_loaded.get(kind, 0) + int(n)
        for code, n in res.rejected.items():
            self.rejected_by_reason[code] = self.rejected_by_reason.get(code, 0) + int(n)
        self.records_rejected = sum(self.rejected_by_reason.values())
        self.duplicates += res.duplicates
        self.errors.extend(res.errors)
        for w in res.warnings:
            if w not in self.warnings:
                self.warnings.append(w)


def ingest_run(con: duckdb.DuckDBPyConnection, path: str | Path, *, run_id: str | None = None,
               progress: bool | ProgressFn = False, chunk_bytes: int = CHUNK_BYTES,
               check_all: bool = False, reload: bool = False,
               absent: Collection[str] = ()) -> IngestReport:
    """Load the run directory ``path`` (new and grown files only) into ``con``.

    Args:
        con: a writable connection from :func:`ingest.db.connect`.
        path: the run directory (docs/FORMAT.md "A run directory"): every ``*.jsonl``
            and ``*.jsonl.gz`` below it, recursively, plus any registered source;
            symbolic links out of it are not followed (:func:`ingest.sources.discover`).
        run_id: the run's id; default ``run.json`` ``run_id``, else the directory name.
        progress: ``True`` for a rich progress bar on stderr, or a function
            called with :class:`IngestProgress` after every batch.
        chunk_bytes: text per batch and transaction (bytes; bounds memory).
        check_all: run every line through the exact checks (tests; slower).
        reload: forget the run (its rows in every table, ``runs`` included)
            and load it again from its logs and run.json, as a first ingest
            would (e.g. after a tlog upgrade or a schema migration). The rows
            go in one transaction; killed after it, the next ingest loads all.
        absent: run ids the caller has just found ``con`` holds no row of
            in ``runs``, ``files``, ``phase_layouts`` or ``iterations``
            (:func:`absent_runs`: one statement for many runs). For a run id
            among them the look-ups of its stored root, files and phase kinds
            are skipped (five statements); ignored with ``reload``. Rows and
            report are those of a call without it.

    Returns:
        :class:`IngestReport`.

    Raises:
        RunDirError: ``path`` does not exist, is not a directory (nor a file a
            registered source reads), holds no logs, has a bad ``run.json``, or
            its run id is in the database for another directory.
    """
    started = time.perf_counter()
    root = Path(path).expanduser()
    found, manifest, rid = _open_run(root, run_id)
    report = IngestReport(run_id=rid, root=str(root.resolve()))
    report.warnings.extend(manifest.warnings)
    new = rid in absent and not reload
    if reload:
        _check_root(con, rid, report.root, _plan(con, rid, root, found,
                                                 IngestReport(rid, report.root))[1])
        _forget_run(con, rid)
    if not new:
        _rebase(con, rid, report)
    logs, every = _plan(con, rid, root, found, report, absent=new)
    report.source = _run_source(found)
    if not new:      # nothing stored: no root to clash with, no file to move
        _check_root(con, rid, report.root, every)
        _apply_identity(con, rid, every)
    fn = _progress_fn(progress)
    limit = _cap_memory(con) if _needs_cap(logs) else None
    try:
        _load(con, rid, manifest, report, logs, chunk_bytes=chunk_bytes, check_all=check_all,
              progress=fn, absent=new)
    finally:
        if limit is not None:
            con.execute(f"SET memory_limit = '{limit}'")
        if hasattr(fn, "close"):
            fn.close()  # type: ignore[attr-defined]
    report.seconds = time.perf_counter() - started
    return report


def check_run_dir(path: str | Path) -> str:
    """The run id ``path`` would be ingested under (run.json's ``run_id``, else
    the directory name), after the checks :func:`ingest_run` makes before it
    loads anything: the directory (or trace file) exists, holds logs or a
    ``run.json``, and its ``run.json`` is readable. Reads no log.

    Raises:
        RunDirError: as :func:`ingest_run` for a missing, empty or unreadable
            run directory. UsageError: an invalid run id.
    """
    return _open_run(Path(path).expanduser(), None)[2]


def survey_run_dir(path: str | Path) -> tuple[str, int]:
    """:func:`check_run_dir`'s run id, and the bytes on disk of the logs
    :func:`ingest_run` would find there (read or not; a file gone since it
    was listed counts 0). Raises as :func:`check_run_dir`."""
    found, _, rid = _open_run(Path(path).expanduser(), None)
    size = 0
    for log, _ in found:
        try:
            size += log.stat().st_size
        except OSError:
            pass    # ingest_run says what is wrong with it when it gets there
    return rid, size


def absent_runs(con: duckdb.DuckDBPyConnection, run_ids: Iterable[str]) -> set[str]:
    """The ids among ``run_ids`` of which ``con`` holds no row in ``runs``,
    ``files``, ``phase_layouts`` or ``iterations`` (one statement): what
    :func:`ingest_run` looks up of a run before loading it, so its
    ``absent`` skips those look-ups for them."""
    ids = sorted(set(run_ids))
    if not ids:
        return set()
    held = con.execute(" UNION ".join(
        f"SELECT DISTINCT run_id FROM {table} WHERE run_id IN (SELECT unnest($ids::VARCHAR[]))"
        for table in ("runs", "files", "phase_layouts", "iterations")), {"ids": ids}).fetchall()
    return set(ids) - {r[0] for r in held}


def run_dirs_under(parent: str | Path) -> list[Path]:
    """The subdirectories of ``parent`` (one level; hidden ones left out), by
    name: the candidates for run directories of a sweep's folder (each is
    checked by :func:`check_run_dir`).

    Raises:
        RunDirError: ``parent`` does not exist, is not a directory or cannot be
            listed; or it holds a run's own files (a log a source claims, or a
            ``run.json``) beside its subdirectories: it is one run whose logs
            may sit in per-node folders, which splitting would make several.
    """
    root = Path(parent).expanduser()
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        msg = f"{root} {what}: give the folder that holds the run directories"
        raise RunDirError(msg)
    try:
        subdirs = sorted((p for p in root.iterdir() if not p.name.startswith(".")
                          and p.is_dir()), key=lambda p: p.name)
        own = [p for p, _ in discover(root) if p.parent == root]   # one walk of the folder
        if (root / MANIFEST).is_file():
            own.append(root / MANIFEST)
    except OSError as exc:
        msg = f"cannot list {root}: {exc.strerror}"
        raise RunDirError(msg) from exc
    if own:
        msg = (f"{root} holds a run's own files ({own[0].name}): it is one run, its logs "
               f"perhaps in per-node folders; ingest it without --each")
        raise RunDirError(msg)
    return subdirs


def ingest_lines(con: duckdb.DuckDBPyConnection, run_id: str, name: str,
                 lines: Iterable[str | bytes], *, source: str = "jsonl",
                 root: str | None = None, manifest: Manifest | None = None,
                 check_all: bool = False) -> IngestReport:
    """Load v1 JSONL ``lines`` as the virtual file ``name`` of run ``run_id``.

    The seam for converters (e.g. :mod:`ingest.kineto` output) and for
    hand-built test databases: the lines go through the same bulk validation,
    meta defaults, categories and duplicate rules as a log file. Each item is
    one line or several (a newline is added where one is missing). The
    virtual file's state is kept in ``files`` like a real one: loading the same
    lines again adds nothing; more lines after them are appended.

    Args:
        source: value for ``runs.source`` (``'jsonl'`` or ``'kineto'``).
        root: stored as ``runs.root`` (default: ``name``).
        manifest: run metadata (name, tags, phase_kinds ...); default none.
    """
    started = time.perf_counter()
    parts = [x.encode("utf-8") if isinstance(x, str) else x for x in lines]
    data = b"".join(p if p.endswith(b"\n") else p + b"\n" for p in parts if p)
    src = Source(kind=source, find=lambda _root: [], run_source=source)
    report = IngestReport(run_id=run_id, root=root or name, source=source)
    log = LogFile(path=Path(name), rel=name, source=src, size=len(data), mtime=0.0, data=data)
    logs, _ = _with_state(con, run_id, [log], report)
    _load(con, run_id, manifest or Manifest(), report, logs, chunk_bytes=CHUNK_BYTES,
          check_all=check_all, progress=None)
    report.seconds = time.perf_counter() - started
    return report


#: DuckDB memory limit while ingesting (bytes). DuckDB's default is 80% of RAM,
#: and it keeps written blocks cached up to it; a lower cap makes it evict, so an
#: ingest of any size stays bounded (under 1 GB for a 2 GB run).
INGEST_MEMORY_LIMIT = 768 << 20


#: Fewest new bytes of plain logs for which an ingest lowers DuckDB's memory
#: limit: below it what the ingest writes stays far under
#: :data:`INGEST_MEMORY_LIMIT` anyway, and setting and restoring the limit cost a
#: small ingest two statements (a few ms). tlog's choice.
CAP_MEMORY_FROM_BYTES = 16 << 20


def _needs_cap(logs: list[LogFile]) -> bool:
    """Whether ingesting ``logs`` lowers DuckDB's memory limit: any log converted
    or decoded (a trace, a ``.gz``: its size says little of its records), or
    :data:`CAP_MEMORY_FROM_BYTES` new bytes or more."""
    if any(log.source.converts or not log.source.seekable for log in logs):
        return True
    return sum(_new_bytes(log) for log in logs) >= CAP_MEMORY_FROM_BYTES


def _cap_memory(con: duckdb.DuckDBPyConnection) -> str | None:
    """Lower DuckDB's memory limit for the ingest; return the old setting to restore
    (None: left alone, in a database shared by threads, :func:`tlog.ingest.db.sharing_database`)."""
    from tlog.ingest.db import memory_limit_is_shared

    if memory_limit_is_shared():
        return None
    old = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    con.execute(f"SET memory_limit = '{INGEST_MEMORY_LIMIT >> 20}MiB'")
    return str(old)


# -- opening a run ------------------------------------------------------------------------------
def _open_run(root: Path, run_id: str | None) -> tuple[list[tuple[Path, Source]], Manifest, str]:
    if not root.exists():
        msg = f"run directory {root} does not exist"
        raise RunDirError(msg)
    if root.is_file():
        claimed = [(root, s) for s in claim_order() if root in s.find(root)]
        if not claimed:
            msg = (f"{root} is a file, not a run directory: pass the directory that holds "
                   f"the rank*.jsonl logs ({root.parent})")
            raise RunDirError(msg)
        rid = run_id or root.name.split(".")[0]
        return claimed[:1], Manifest(), _valid_id(rid)
    if not root.is_dir():
        msg = f"{root} is not a directory"
        raise RunDirError(msg)
    warnings: list[str] = []
    try:
        found = discover(root, warnings)
    except OSError as exc:
        msg = f"cannot read run directory {root}: {exc.strerror}"
        raise RunDirError(msg) from exc
    manifest = _manifest(root)
    if not found and not manifest.present:
        kinds = ", ".join(s.describe() for s in active_sources())
        msg = f"no logs under {root} ({kinds}) and no {MANIFEST}: is this a run directory?"
        if warnings:
            msg += f" (left out: {warnings[0]}" + (
                f"; and {len(warnings) - 1} more)" if len(warnings) > 1 else ")")
        raise RunDirError(msg)
    rid = run_id or manifest.run_id or root.resolve().name
    manifest.warnings[:0] = warnings
    return found, manifest, _valid_id(rid)


def _manifest(root: Path) -> Manifest:
    """``run.json`` (:func:`ingest.manifest.read_manifest`), unless it is a
    symbolic link out of the run directory: that one is not read (the walk of
    :func:`ingest.sources.discover` names it in a warning)."""
    path = root / MANIFEST
    if path.is_symlink():
        target = path.resolve()
        base = root.resolve()
        if target != base and base not in target.parents:
            return Manifest()
    return read_manifest(root)


def _valid_id(rid: str) -> str:
    if not rid or not rid.strip() or len(rid) > 512:
        msg = f"invalid run id {rid!r}: give a non-empty name with --run-id"
        raise UsageError(msg)
    return rid


def _run_source(found: list[tuple[Path, Source]]) -> str:
    kinds = {s.run_source for _, s in found}
    return kinds.pop() if len(kinds) == 1 else "jsonl"


def _plan(con: duckdb.DuckDBPyConnection, run_id: str, root: Path,
          found: list[tuple[Path, Source]], report: IngestReport, *, absent: bool = False,
          ) -> tuple[list[LogFile], list[LogFile]]:
    logs = []
    base = root if root.is_dir() else root.parent
    for path, source in found:
        try:
            size, mtime, inode = stat(path)
        except FileNotFoundError:      # removed since it was listed (rotated away)
            continue
        except OSError as exc:         # made unreadable since it was listed
            report.warnings.append(f"cannot read {path.relative_to(base).as_posix()} "
                                   f"({(exc.strerror or str(exc)).lower()}): not loaded")
            continue
        logs.append(LogFile(path=path, rel=path.relative_to(base).as_posix(), source=source,
                            size=size, mtime=mtime, inode=inode, link=path.is_symlink()))
    return _with_state(con, run_id, logs, report, absent=absent)


def _with_state(con: duckdb.DuckDBPyConnection, run_id: str, logs: list[LogFile],
                report: IngestReport, *, absent: bool = False,
                ) -> tuple[list[LogFile], list[LogFile]]:
    """Fill each log's stored state; return the logs that need reading, and all.

    A plain ``*.jsonl`` file is recognised by what it is, its fingerprint (the
    blake2b of its first ``min(offset, 4 KiB)`` bytes, as Vector's checksum
    fingerprints do), not by its name (:func:`_identify`): renamed, it keeps its
    state and rows under the new name; a path holding another file is a new
    file. Other sources (decoded: ``.gz``, traces) are known by path: a changed
    head or a shrink there is a rewrite, loaded again after deleting its rows."""
    rows = [] if absent else con.execute(
        'SELECT path, size, "offset", lines, head_hash, mtime, meta::VARCHAR '
        'FROM files WHERE run_id = ?', [run_id]).fetchall()
    state = {r[0]: r[1:] for r in rows}
    if any(log.source.seekable and log.data is None for log in logs):
        state = _identify(con, run_id, logs, state, report)
    report.files = len(logs)
    todo = []
    for log in logs:
        known = state.get(log.rel)
        if known is not None:
            size, offset, lines, head, mtime, meta = known
            log.known = True
            log.offset, log.lines = int(offset or 0), int(lines or 0)
            log.meta = json.loads(meta) if meta else {}
            seen_size = int(size) if size is not None else -1
            length = min(log.offset if log.source.seekable else max(seen_size, 0), 4096)
            shrank = (log.size < log.offset) if log.source.seekable else (log.size < seen_size)
            if shrank or (head is not None and log.head_digest(length) != head):
                log.rewritten = True
                log.offset, log.lines, log.meta = 0, 0, {}
                report.files_rewritten.append(log.rel)
            elif seen_size == log.size and mtime == log.mtime:
                report.files_unchanged += 1
                continue
            elif log.source.whole:      # changed: its records are decoded anew
                log.rewritten = True
                log.offset, log.lines, log.meta = 0, 0, {}
        todo.append(log)
    return todo, logs


def _identify(con: duckdb.DuckDBPyConnection, run_id: str, logs: list[LogFile],
              state: dict[str, tuple], report: IngestReport) -> dict[str, tuple]:
    """Match the plain log files on disk to the stored ones by fingerprint and
    apply what happened to them (one transaction); returns the stored state by
    path, as it is now.

    1. A path holding the file stored under it (same fingerprint, not shorter
       than its offset) keeps its state.
    2. A file under a path not stored (or whose path now holds another file)
       that has the fingerprint of a stored file whose path no longer holds it
       *is* that file, renamed (rename rotation ``rank0.jsonl`` ->
       ``rank0.1.jsonl``, a copytruncate copy): the stored entry and every row
       read from it move to the new path, and reading goes on at its offset.
    3. A stored file whose path now holds another file and that was found
       nowhere else (replaced, or truncated in place) keeps its rows under the
       label ``PATH#N``; the new file at PATH is read from its start.
    A stored file whose path is gone keeps its rows (it may reappear renamed).
    """
    seekable = {log.rel: log for log in logs if log.source.seekable and log.data is None}

    def length(entry: tuple) -> int:
        return min(int(entry[1] or 0), HEAD_BYTES)

    def holds(log: LogFile, entry: tuple) -> bool:
        return log.size >= int(entry[1] or 0) and (
            entry[3] is None or log.head_digest(length(entry)) == entry[3])

    decoded = {log.rel for log in logs if not log.source.seekable}
    stay = {rel for rel, log in seekable.items() if rel in state and holds(log, state[rel])}
    lost = {rel: e for rel, e in state.items() if rel not in stay and length(e) > 0
            and rel not in decoded}
    moves: dict[str, str] = {}
    for rel, log in sorted(seekable.items()):
        if rel in stay or not lost:
            continue
        heads: dict[int, str] = {}
        for old, entry in sorted(lost.items()):
            if old in moves or log.size < int(entry[1] or 0):
                continue
            n = length(entry)
            if n not in heads:
                heads[n] = log.head_digest(n)
            if heads[n] == entry[3]:
                moves[old] = rel
                break
    retire = {old: _free_label(old, state) for old in lost
              if old not in moves and old in seekable}
    for old, new in sorted(moves.items()):
        seekable[new].moved_from = old
        report.files_moved.append({"from": old, "to": new})
    for old, label in sorted(retire.items()):
        seekable[old].replaced_as = label
        report.files_replaced.append({"path": old, "old_rows_as": label})
    new_state = {p: e for p, e in state.items() if p not in moves and p not in retire
                 and p not in moves.values()}
    for old, new in moves.items():
        new_state[new] = state[old]
    for old, label in retire.items():
        new_state[label] = state[old]
    return new_state


def _apply_identity(con: duckdb.DuckDBPyConnection, run_id: str, logs: list[LogFile]) -> None:
    """Apply what :func:`_identify` found, in one transaction: stored files
    renamed (``log.moved_from``) move with their rows to their new path; the
    rows of files replaced at a path (``log.replaced_as``) are relabelled."""
    final = {log.moved_from: log.rel for log in logs if log.moved_from is not None}
    final.update({log.rel: log.replaced_as for log in logs if log.replaced_as is not None})
    if not final:
        return

    _transaction(con, lambda: _relabel_all(con, run_id, final))


def _relabel_all(con: duckdb.DuckDBPyConnection, run_id: str, moves: dict[str, str]) -> None:
    """:func:`_relabel` every ``old -> new`` of ``moves`` (inside the caller's
    transaction), in two steps (to a temporary label, then to the new path): a
    chain of renames (rank0.1 -> rank0.2, rank0 -> rank0.1) or a swap never
    collides; a stored entry already at a new path gives way."""
    for k, old in enumerate(sorted(moves)):
        _relabel(con, run_id, old, f"\x00tlog-move-{k}")
    for k, old in enumerate(sorted(moves)):
        new = moves[old]
        con.execute("DELETE FROM files WHERE run_id = ? AND path = ?", [run_id, new])
        _relabel(con, run_id, f"\x00tlog-move-{k}", new)


def _free_label(rel: str, state: dict[str, tuple]) -> str:
    """``rel#N`` for the smallest N not stored yet: the label of a replaced file's rows."""
    n = 1
    while f"{rel}#{n}" in state:
        n += 1
    return f"{rel}#{n}"


def _relabel(con: duckdb.DuckDBPyConnection, run_id: str, old: str, new: str) -> None:
    """Move a stored file and every row read from it to the path ``new``."""
    for table in (*_FILE_TABLES, "files"):
        col = "path" if table == "files" else "file"
        con.execute(f"UPDATE {table} SET {col} = ? WHERE run_id = ? AND {col} = ?",
                    [new, run_id, old])


def _rebase(con: duckdb.DuckDBPyConnection, run_id: str, report: IngestReport) -> None:
    """The same files reached through another root (``tlog ingest runs/a`` once,
    ``tlog ingest runs/a/tlog`` later, or the other way round): the stored paths,
    relative to the stored root, are re-expressed relative to ``report.root``
    with their rows, so that nothing reads as renamed. Only when one root holds
    the other; the stored root becomes the new one when the run is stored."""
    rows = con.execute("SELECT root FROM runs WHERE run_id = ?", [run_id]).fetchall()
    old_root = rows[0][0] if rows else None
    new_root = report.root
    if not old_root or old_root == new_root or not os.path.isabs(old_root):
        return
    inner = (new_root.startswith(old_root.rstrip(os.sep) + os.sep)
             or old_root.startswith(new_root.rstrip(os.sep) + os.sep))
    if not inner:
        return
    moves = {}
    for (path,) in con.execute("SELECT path FROM files WHERE run_id = ?", [run_id]).fetchall():
        label = ""
        if "#" in path:      # a replaced file's rows: rank0.jsonl#2
            path, _, n = path.rpartition("#")
            label = f"#{n}"
        where = os.path.normpath(os.path.join(old_root, path))
        if where.startswith(new_root.rstrip(os.sep) + os.sep):
            rel = Path(os.path.relpath(where, new_root)).as_posix() + label
            if rel != path + label:
                moves[path + label] = rel
    if not moves:
        return

    def apply() -> None:
        _relabel_all(con, run_id, moves)
        con.execute("UPDATE runs SET root = ? WHERE run_id = ?", [new_root, run_id])

    _transaction(con, apply)
    report.warnings.append(f"run {run_id} was ingested from {old_root} before: the same "
                           f"files, now read from {new_root} ({len(moves)} paths re-based)")


def _check_root(con: duckdb.DuckDBPyConnection, run_id: str, root: str,
                logs: list[LogFile]) -> None:
    """Refuse to mix two different runs that share a run id (e.g. two ``out/``
    dirs, or a new run whose ``run.json`` reuses an old id before it has logs):
    ``logs`` are all the files found (read or not). A directory that holds some
    of the run's files unchanged is the same run, moved or copied."""
    rows = con.execute("SELECT root FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if not rows or rows[0][0] in (None, root):
        return
    moved = any(log.known and not log.rewritten for log in logs)
    if not moved:
        msg = (f"run id {run_id!r} is already in the database for {rows[0][0]}; give this run "
               f"another id: a run_id in its {MANIFEST}, or --run-id when it is ingested alone")
        raise RunDirError(msg)


# -- loading ------------------------------------------------------------------------------------
#: Most files in one batch (and transaction). Each file of a batch costs a few
#: KB beside its text (its pieces, offsets, arrays, a meta segment, a ``files``
#: row), so without a cap a batch of 64 MB of 700-byte files held 90,000 of
#: them; with it, ingest memory does not grow with the number of files (without
#: it, 10,000 small files ran out of memory). A batch costs about 50 ms of fixed
#: work, so 10,000 files cost about 0.3 s more than one file of the same bytes.
#: tlog's choice.
MAX_BATCH_FILES = 2048


#: A batch that would be followed only by less than this share of
#: ``chunk_bytes`` takes that tail too (at most 1.5x ``chunk_bytes``). A tail
#: batch of fewer rows than DuckDB's row group (122,880) goes through the
#: write-ahead log: written and synced at its commit, then copied into the
#: file again at close. The bench run (77 MB) was 58 MB + a 19 MB tail of
#: 75,001 rows: a 16.5 MB WAL, 35 CPU-ms at commit and about 50 at close, plus
#: a second batch's fixed statements (docs/DATABASE.md, fourth pass). tlog's
#: choice of half: the largest batch stays within 1.5x the memory bound.
TAIL_FOLD = 0.5


def _new_bytes(log: LogFile) -> int:
    """Bytes of ``log`` not read yet, as listed (the whole file for a source
    read from its start)."""
    return max(log.size - log.offset, 0) if log.source.seekable else max(log.size, 0)


def _batches(logs: list[LogFile], chunk_bytes: int,
             max_files: int | None = None) -> Iterator[list[Piece]]:
    """Group the new pieces of all logs into batches of about ``chunk_bytes``
    and at most ``max_files`` files (default :data:`MAX_BATCH_FILES`; a large
    file may span batches); a tail under :data:`TAIL_FOLD` x ``chunk_bytes``
    joins the batch before it."""
    max_files = max_files or MAX_BATCH_FILES
    batch: list[Piece] = []
    held = 0
    files = 0
    # bytes listed but not in a batch yet: a file that grew since its listing
    # gives more, so the fold also checks what the batch would hold
    left = sum(_new_bytes(log) for log in logs)
    for log in logs:
        if batch and files >= max_files:
            yield batch
            batch, held, files = [], 0, 0
        files += 1
        for piece in pieces(log, log.offset, log.lines + 1, chunk_bytes):
            size = len(piece.data)
            if (batch and held + size > chunk_bytes
                    and held + max(left, size) > chunk_bytes * (1 + TAIL_FOLD)):
                yield batch
                batch, held, files = [], 0, 1
            batch.append(piece)
            held += size
            left -= size
    if batch:
        yield batch


def _load(con: duckdb.DuckDBPyConnection, run_id: str, manifest: Manifest, report: IngestReport,
          logs: list[LogFile], *, chunk_bytes: int, check_all: bool,
          progress: ProgressFn | None, absent: bool = False) -> None:
    kinds, known = _phase_kinds(con, run_id, manifest, absent=absent)

    def recategorized() -> None:   # the categories and the kinds they follow change together
        report.recategorized = recategorize(con, run_id, kinds)
        if manifest.gives_phase_kinds:
            con.execute("UPDATE runs SET phase_kinds = ? WHERE run_id = ?",
                        [json.dumps(kinds) if kinds else None, run_id])

    if known:       # a run not stored yet has no categories to bring up to date
        _transaction(con, recategorized)
    # Made at the first batch: a run with nothing new (a re-ingest, a --follow
    # poll that finds nothing) does not pay its set-up (temp macros, ~3 ms).
    loader: BatchLoader | None = None
    total = sum(_new_bytes(log) for log in logs)
    done_files: set[int] = set()
    done_bytes = 0
    batches = 0
    stored = known      # whether the database holds the run's row (else a plain insert)
    for batch, fids, lines, templates in _prepared(logs, chunk_bytes):
        batches += 1
        if loader is None:
            loader = BatchLoader(con, run_id, kinds, check_all=check_all, new_run=not known)
        fids, files, parsed = _parse_batch(loader, batch, fids, lines, templates)
        _transaction(con, lambda b=batch, f=fids, fs=files, pa=parsed, ld=loader, n=not stored:
                     _load_batch(con, run_id, manifest, report, ld, b, f, fs, pa, new=n), loader)
        stored = True
        for piece in batch:
            done_bytes += piece.end - piece.start
            if piece.last:
                done_files.add(id(piece.log))
        if progress is not None:
            progress(IngestProgress(len(done_files), len(logs), done_bytes, total))
    if not batches:   # else the last batch's transaction stored the same run row
        _transaction(con, lambda: _upsert_run(con, run_id, manifest, report, None,
                                              new=not known))
    report.errors = report.errors[:MAX_ERRORS]
    for w in phase_kinds_warnings(con, run_id, kinds):
        if w not in report.warnings:
            report.warnings.append(w)


def _phase_kinds(con: duckdb.DuckDBPyConnection, run_id: str,
                 manifest: Manifest, *, absent: bool = False) -> tuple[dict[str, str], bool]:
    """The run's ``phase_kinds``: the manifest's when there is one (an empty one
    clears earlier kinds), else what the database kept from an earlier ingest;
    and whether the database has anything of the run (a ``runs`` row, phase
    layouts or iterations: ingest writes the row with them, a hand-built
    database may not). ``absent``: the caller found none of those (no look-up)."""
    if absent:
        return (dict(manifest.phase_kinds) if manifest.gives_phase_kinds else {}), False
    rows = con.execute("SELECT phase_kinds::VARCHAR FROM runs WHERE run_id = ?",
                       [run_id]).fetchall()
    known = bool(rows) or bool(con.execute(
        "SELECT count(*) FROM (SELECT 1 FROM phase_layouts WHERE run_id = $run UNION ALL "
        "SELECT 1 FROM iterations WHERE run_id = $run LIMIT 1)", {"run": run_id}
    ).fetchall()[0][0])
    if manifest.gives_phase_kinds:
        return dict(manifest.phase_kinds), known
    return (stored_phase_kinds(rows[0][0]) if rows else {}), known


def _transaction(con: duckdb.DuckDBPyConnection, body: Callable[[], None],
                 loader: BatchLoader | None = None) -> None:
    """Run ``body`` in one transaction; on failure roll back (and reload
    ``loader``'s layout cache, which may hold layouts the rollback removed)."""
    con.execute("BEGIN TRANSACTION")
    try:
        body()
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass   # a failed COMMIT (disk full) ends the transaction: keep its own error
        if loader is not None:
            loader.layouts.__init__(con, loader.run_id)  # type: ignore[misc]
        raise


Prepared = tuple[list[Piece], dict[int, int], LinesStream, list]


def _prepared(logs: list[LogFile], chunk_bytes: int) -> Iterator[Prepared]:
    """Batches with their lines and templates, each prepared on a helper thread
    while the previous batch is in DuckDB, which releases the GIL: files read,
    samples parsed into templates, and the lines split and their quotes counted
    by a :class:`LinesStream`, which DuckDB reads as it goes. One batch ahead."""
    batches = _batches(logs, chunk_bytes)

    def prepare() -> Prepared | None:
        batch = next(batches, None)
        if batch is None:
            return None
        fids: dict[int, int] = {}
        for piece in batch:
            fids.setdefault(id(piece.log), len(fids))
        templates = learn(sample_lines(batch, SAMPLE_FRACTIONS, SAMPLE_HEAD))
        return batch, fids, LinesStream(batch, fids, SCAN_CHUNK_ROWS), templates

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tlog-ingest") as pool:
        ahead = pool.submit(prepare)
        while (item := ahead.result()) is not None:
            ahead = pool.submit(prepare)
            yield item


def _parse_batch(loader: BatchLoader, batch: list[Piece], fids: dict[int, int],
                 lines: LinesStream, templates: list
                 ) -> tuple[dict[int, int], list[BatchFile], tuple[list, list]]:
    """Stages A and B of a batch (temp tables only, before its transaction)."""
    files = [BatchFile(fid=0, rel="", meta={}) for _ in fids]
    for piece in batch:
        f = files[fids[id(piece.log)]]
        f.fid, f.rel, f.meta = fids[id(piece.log)], piece.log.rel, dict(piece.log.meta)
    templates = loader.parse(lines, templates)
    return fids, files, (lines.result()[1], templates)


def _load_batch(con: duckdb.DuckDBPyConnection, run_id: str, manifest: Manifest,
                report: IngestReport, loader: BatchLoader, batch: list[Piece],
                fids: dict[int, int], files: list[BatchFile], parsed: tuple[list, list], *,
                new: bool = False) -> None:
    for piece in batch:
        if piece.log.rewritten and piece.start == 0:
            _forget_file(con, run_id, piece.log.rel)
    res = loader.load(files, parsed[0], parsed[1])
    report.add(res)
    last: dict[int, Piece] = {}
    for piece in batch:
        last[id(piece.log)] = piece
        if not piece.log.source.converts:
            report.bytes_read += piece.end - piece.start
        elif piece.last:            # a converted trace: what was read is the file
            report.bytes_read += max(piece.log.size, 0)
    rows = []
    for key, piece in last.items():
        log = piece.log
        if log.swapped or log.unreadable:   # nothing read; the next ingest looks again
            warning = (f"{log.rel} was replaced while this ingest read the run; read next time"
                       if log.swapped else
                       f"cannot read {log.rel} ({log.unreadable}): not loaded; read next time")
            if warning not in report.warnings:
                report.warnings.append(warning)
            continue
        bf = files[fids[key]]
        log.offset, log.lines, log.meta = piece.end, piece.first_line + piece.n_lines - 1, bf.meta_out
        done = piece.last and piece.error is None
        if piece.error is not None:   # damaged: not fully read, read again next time
            report.errors.insert(0, {"file": log.rel, "line": piece.first_line,
                                     "reason": piece.error})
        elif piece.last:
            report.files_read += 1
            for w in (log.meta.get("extra") or {}).get("warnings") or []:
                if f"{log.rel}: {w}" not in report.warnings:   # a converter's fallbacks
                    report.warnings.append(f"{log.rel}: {w}")
            skipped = (log.meta.get("extra") or {}).get("lines_skipped")
            if isinstance(skipped, int) and not isinstance(skipped, bool) and skipped > 0:
                report.lines_skipped += skipped
            drop = shim_drops(log.meta)
            if drop is not None:
                report.warnings.append(f"{log.rel}: {drop}")
            if piece.partial:
                report.partial_lines.append(log.rel)
        rows.append((run_id, log.rel, log.size if done else -1, log.offset, log.lines,
                     log.head_digest(log.head_length()), log.mtime,
                     json.dumps(log.meta) if log.meta else None, log.source.kind))
        if piece.last:      # read to its end: nothing of it is held past its row
            log.release()
    _store_files(con, rows)
    _upsert_run(con, run_id, manifest, report, res, new=new)
    if all(_device_of(row[7]) == "cpu" for row in rows):
        _tag_host_only(con, run_id)   # (a file of this batch on another device: no tag)


def _store_files(con: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    """Upsert ``files`` rows ``(run_id, path, size, offset, lines, head_hash,
    mtime, meta JSON text, source)`` in one statement from an Arrow table
    (``executemany`` costs about 3 ms a row here: 10,000 small files took 32 s)."""
    if not rows:
        return
    cols = list(zip(*rows, strict=True))
    types = (pa.string(), pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.string(),
             pa.float64(), pa.string(), pa.string())
    names = ("run_id", "path", "size", "offset", "lines", "head_hash", "mtime", "meta", "source")
    table = pa.table([pa.array(c, t) for c, t in zip(cols, types, strict=True)], names=names)
    con.register("_tlog_files_new", table)
    try:
        con.execute(
            'INSERT OR REPLACE INTO files (run_id, path, size, "offset", lines, head_hash, mtime, '
            'meta, source, ingested_at) SELECT run_id, path, size, "offset", lines, head_hash, '
            "mtime, meta::JSON, source, current_timestamp FROM _tlog_files_new")
    finally:
        con.unregister("_tlog_files_new")


def shim_drops(meta: dict[str, Any] | None) -> str | None:
    """What a log's meta says the shim dropped, as one line, or None when nothing.

    The shim writes ``{"type": "meta", "records_dropped": N, "iters_dropped": M}``
    (cumulative for its file; docs/FORMAT.md "Drop counts") when its queue was
    full or its disk failed; ingest keeps the last one in ``files.meta`` ->
    ``extra``. ``meta``: a file's stored meta (``files.meta``)."""
    extra = (meta or {}).get("extra") or {}
    records, iters = extra.get("records_dropped"), extra.get("iters_dropped")
    if not isinstance(records, int) or isinstance(records, bool) or records <= 0:
        return None
    iters = iters if isinstance(iters, int) and not isinstance(iters, bool) else 0
    return (f"the shim dropped {records:,} records ({iters:,} iterations) of this log "
            f"(its queue was full or its file could not be written): figures rest on the "
            f"records it kept")


def stored_shim_drops(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """:func:`shim_drops` of each log of a run, ``"<file>: <line>"``, in file
    order; [] when the shim dropped nothing."""
    # only the logs that carry drop counts (diagnose and `tlog runs` ask every time)
    rows = con.execute("SELECT path, meta::VARCHAR FROM files WHERE run_id = ? AND "
                       "json_extract(meta, '$.extra.records_dropped') IS NOT NULL "
                       "ORDER BY path", [run_id]).fetchall()
    out = []
    for path, raw in rows:
        line = shim_drops(json.loads(raw))
        if line is not None:
            out.append(f"{path}: {line}")
    return out


def _device_of(meta_json: str | None) -> str | None:
    """``extra.device`` of a ``files.meta`` JSON text (a converted trace's), else None."""
    if not meta_json or '"device"' not in meta_json:
        return None
    device = (json.loads(meta_json).get("extra") or {}).get("device")
    return device if isinstance(device, str) else None


def _tag_host_only(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Tag ``device: cpu`` on a run whose every file's meta says ``device: cpu``
    (a torch.profiler trace of a job without GPU, ``docs/KINETO.md``), unless
    its tags already name a device: the analysis then treats its sync as exact."""
    con.execute("""
        UPDATE runs SET tags = json_merge_patch(coalesce(tags, '{}'), '{"device": "cpu"}')
        WHERE run_id = $run AND json_extract(coalesce(tags, '{}'), '$.device') IS NULL
          AND EXISTS (SELECT 1 FROM files WHERE run_id = $run)
          AND NOT EXISTS (SELECT 1 FROM files WHERE run_id = $run AND
                          coalesce(json_extract_string(meta, '$.extra.device'), '') <> 'cpu')
        """, {"run": run_id})


#: Tables whose rows say which file they were read from (``file`` column).
_FILE_TABLES = ("iterations", "queue_samples", "events", "rejects", "workers", "sys_samples",
                "machines")
#: Tables holding everything of a run.
_RUN_TABLES = (*_FILE_TABLES, "files", "phase_layouts", "runs")


def _forget_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Delete everything of ``run_id``, its ``runs`` row too (one transaction),
    for a reload: the ingest that follows is a first one."""
    def forget() -> None:
        for table in _RUN_TABLES:
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])

    _transaction(con, forget)


def forget_run(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, int]:
    """Remove run ``run_id`` from the database: every row of it in every table
    (one transaction; its logs on disk are untouched, ``tlog ingest`` loads it
    again).

    Returns:
        rows deleted per table (``{"iterations": 123, ...}``).

    Raises:
        RunNotFoundError: no run ``run_id`` (the message lists a few that exist).
    """
    found = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    if not found:
        known = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY run_id LIMIT 5"
                                           ).fetchall()]
        msg = (f"no run {run_id!r} in the database"
               + (f" (runs: {', '.join(repr(k) for k in known)}...; see 'tlog runs')"
                  if known else " (it is empty)"))
        raise RunNotFoundError(msg)
    counts = {t: int(con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?",
                                 [run_id]).fetchall()[0][0]) for t in _RUN_TABLES}
    _forget_run(con, run_id)
    return counts


def _forget_file(con: duckdb.DuckDBPyConnection, run_id: str, rel: str) -> None:
    """Delete everything loaded from a file that was rewritten."""
    for table in _FILE_TABLES:
        con.execute(f"DELETE FROM {table} WHERE run_id = ? AND file = ?", [run_id, rel])


def _upsert_run(con: duckdb.DuckDBPyConnection, run_id: str, manifest: Manifest,
                report: IngestReport, res: BatchResult | None, *, new: bool = False) -> None:
    """Insert or update the run's ``runs`` row. ``new``: the database holds no
    row of the run: a plain insert of the same row (planning the update half
    is a fixed cost of every small run's ingest)."""

    def dumps(x: Any) -> str | None:
        return json.dumps(x) if x else None

    started = manifest.started
    if started is None and res is not None:
        started = res.min_ts

    def owned(col: str) -> str:
        """A column run.json owns: its value when run.json is present (a field
        removed there is removed here), else kept unless given otherwise."""
        return (f"{col} = CASE WHEN $present THEN excluded.{col} "
                f"ELSE coalesce(excluded.{col}, runs.{col}) END")

    # world_size: run.json's, else what the workers say (their own world_size,
    # else the highest rank + 1), in the same statement (a second one cost a
    # re-ingest of an unchanged run 2-3 ms of its ~35)
    insert = """
        INSERT INTO runs (run_id, name, source, root, started, world_size, tags, config,
                          phase_kinds, manifest, first_ingested, last_ingested)
        SELECT $run, $name, $source, $root, $started,
               coalesce($world, (SELECT coalesce(max(world_size), max(rank) + 1)
                                 FROM workers WHERE run_id = $run)),
               $tags, $config, $kinds, $manifest, current_timestamp, current_timestamp"""
    params = {"run": run_id, "name": manifest.name, "source": report.source,
              "root": report.root, "started": started, "world": manifest.world_size,
              "tags": dumps(manifest.tags), "config": dumps(manifest.config),
              "kinds": dumps(manifest.phase_kinds), "manifest": dumps(manifest.raw)}
    if new:
        con.execute(insert, params)
        return
    con.execute(f"""{insert}
        ON CONFLICT (run_id) DO UPDATE SET
            {owned('name')},
            source = excluded.source,
            root = excluded.root,
            started = CASE WHEN $manifest_started THEN excluded.started
                           ELSE least(runs.started, excluded.started) END,
            world_size = excluded.world_size,
            {owned('tags')},
            {owned('config')},
            phase_kinds = CASE WHEN $kinds_given THEN excluded.phase_kinds
                               ELSE runs.phase_kinds END,
            {owned('manifest')},
            last_ingested = excluded.last_ingested
        """, {**params, "manifest_started": manifest.started is not None,
              "kinds_given": manifest.gives_phase_kinds, "present": manifest.present})


# -- progress -----------------------------------------------------------------------------------
class _RichProgress:
    """A rich progress bar on stderr: files and bytes."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("ingest"), BarColumn(), DownloadColumn(),
                            TextColumn("{task.fields[files]}"), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=True)
        self.task = self.bar.add_task("ingest", total=None, files="")
        self.bar.start()

    def __call__(self, p: IngestProgress) -> None:
        self.bar.update(self.task, total=max(p.bytes_total, p.bytes_done), completed=p.bytes_done,
                        files=f"{p.files_done}/{p.files_total} files")

    def close(self) -> None:
        self.bar.stop()


def _progress_fn(progress: bool | ProgressFn) -> ProgressFn | None:
    if progress is True:
        return _RichProgress()
    if callable(progress):
        return progress
    return None


def summarize_reasons(report: IngestReport) -> list[tuple[str, int, str]]:
    """``(code, count, meaning)`` of the rejected lines, most frequent first."""
    counts = Counter(report.rejected_by_reason)
    return [(code, n, REASON_CODES.get(code, code)) for code, n in counts.most_common()]
