"""Where the bytes of a run come from: log files, their decoders, and chunking.

A run directory holds log files. Each file kind is a :class:`Source`: how to
find its files below a run root and how to *decode* one file into v1 JSONL
text. Two sources are built in:

- ``jsonl``: ``*.jsonl``, read as is, seekable (an incremental ingest seeks to
  the stored byte offset);
- ``jsonl.gz``: ``*.jsonl.gz``, decompressed while read; the stored offset
  counts decompressed bytes, and a changed file is decompressed from the start
  with the first ``offset`` bytes skipped (a gzip stream cannot seek).

**The seam for other formats** (e.g. ``ingest.kineto``, torch.profiler traces):
a :class:`Source` with a finder (``root -> [paths]``) and a decoder
(``path -> iterator of str/bytes chunks of v1 JSONL``), declared by its
distribution under the ``tlog.sources`` entry-point group
(:func:`installed_sources`; tlog's own are declared so too), or added
for one process with :func:`register_source`. The decoder's output is
treated exactly like a non-seekable log: its decoded bytes are consumed up to
the last complete line, the file's size and head fingerprint say when it
changed, and a changed file is decoded again from the start with the consumed
part skipped. ``runs.source`` takes the source's ``kind`` (e.g. ``'kineto'``)
when every file of a run comes from that source. A source whose files also
match an earlier source's (``*.jsonl`` of another format) names that kind in
``Source.before`` to be tried first (``ingest.torchtitan``). Example::

    # pyproject.toml of a plugin distribution
    [project.entry-points."tlog.sources"]
    csvlog = "my_plugin:SOURCE"     # a Source, or a function returning one

Units: byte offsets and sizes in bytes; line numbers 1-based.
"""

from __future__ import annotations

import errno
import hashlib
import os
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache, partial
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tlog.ingest.plugins import load_plugin

#: Bytes hashed at the head of a file to notice a rewrite (a new run written
#: over an old file name). The head of an append-only log never changes.
HEAD_BYTES = 4096

#: Decoded bytes handed to DuckDB per batch. Bounds memory: a batch's Arrow
#: buffers plus DuckDB's parse of it stay within a few times this size.
CHUNK_BYTES = 64 << 20

#: Longest line read (bytes, newline included); a longer one is rejected
#: (``too_large``) without being parsed. A cap on absurd input: a v1 record is a
#: few hundred bytes (a few KB with hundreds of phases), and one 50 MB line
#: exhausted DuckDB's ingest memory limit. Documented in docs/FORMAT.md.
MAX_LINE_BYTES = 1 << 20

#: Bytes of a too-long line kept for ``rejects.raw`` (which keeps 2,000 characters).
_LONG_KEEP = 8000
#: Read size while reading past a line longer than a block (bytes).
_SCAN_BYTES = 8 << 20

#: Rows per Arrow record batch (DuckDB scans record batches in parallel).
ROWS_PER_RECORD_BATCH = 65536

#: File name of the optional manifest (docs/FORMAT.md "run.json").
MANIFEST = "run.json"

class DecodeError(Exception):
    """Raised by a decoder at damage it cannot read past (``reason``: one line).
    What it yielded before loads; the file is reported in the ingest's
    ``errors`` at the line after the last complete one and is read again from
    there by the next ingest."""


Decoder = Callable[[Path], Iterable[bytes | str]]
Finder = Callable[[Path], list[Path]]


@dataclass(frozen=True)
class Source:
    """One kind of log file.

    Attributes:
        kind: name stored in ``files.source`` (``'jsonl'``, ``'jsonl.gz'``, ``'kineto'``).
        find: ``root -> sorted list of files`` of this kind below ``root``.
        decode: ``path -> chunks`` of v1 JSONL text (``None``: read the file's bytes).
        seekable: the decoded text is the file's bytes (an append resumes by seeking).
        run_source: value for ``runs.source`` when a run has only files of this kind.
        label: how error messages name these files (default ``'<kind> files'``).
        match: optional ``file name -> bool``; see the attribute.
        converts, whole, before: see the attributes.
    """

    kind: str
    find: Finder
    decode: Decoder | None = None
    seekable: bool = False
    run_source: str = "jsonl"
    label: str = ""
    #: ``file name -> claimed`` for a source known by name: :func:`discover`
    #: then picks its files from its own walk (:func:`survey`) without calling ``find``
    match: Callable[[str], bool] | None = None
    #: the decoded text is a conversion (a trace turned into records), not the
    #: file's own text: ingest reports the file's size on disk as what it read
    converts: bool = False
    #: the decoded text of a grown file is not the old text plus more (a
    #: timer log's first interval depends on the next one): a file that changed
    #: is loaded again from its start, its old rows deleted first
    whole: bool = False
    #: kinds of other sources this one is tried before (e.g. ``("jsonl",)``: a
    #: format whose files also end in ``.jsonl`` claims them before the ``jsonl``
    #: source reads them as v1 records); :func:`claim_order` orders by it
    before: tuple[str, ...] = ()

    def describe(self) -> str:
        """Name of these files in messages."""
        return self.label or f"{self.kind} files"


def _find_suffix(suffix: str) -> Finder:
    def find(root: Path) -> list[Path]:
        return sorted(p for p in root.rglob(f"*{suffix}")
                      if p.is_file() and not _hidden(p.relative_to(root)))
    return find


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def _find_jsonl(root: Path) -> list[Path]:
    return _find_suffix(".jsonl")(root)


#: Most decompressed bytes per step of the gzip decoder: 1 MiB of compressed
#: text can inflate a thousandfold (a run of one repeated byte), and is never
#: inflated whole.
DECODED_MAX = 4 << 20


def _decode_gzip(path: Path) -> Iterator[bytes]:
    """Decompress ``path`` (one or more gzip members) in blocks. A stream that
    ends early (still being written, or the writer was killed) yields what
    could be decompressed. Raises :class:`DecodeError` after yielding the good
    prefix: ``not gzip`` when the file does not start like gzip (nothing
    decompressed), ``damaged gzip stream after N bytes`` (N decompressed bytes)
    at damage."""
    done = 0
    with open(path, "rb") as fh:
        d = zlib.decompressobj(wbits=31)
        while True:
            block = fh.read(1 << 20)
            if not block:
                if done == 0 and fh.tell() >= 2:
                    fh.seek(0)
                    if fh.read(2) != b"\x1f\x8b":
                        raise DecodeError("not gzip")
                return
            while True:
                try:
                    out = d.decompress(block, DECODED_MAX)
                except zlib.error as exc:
                    if done == 0 and not block.startswith(b"\x1f\x8b"):
                        raise DecodeError("not gzip") from None
                    raise DecodeError(f"damaged gzip stream after {done:,} bytes "
                                      f"({exc})") from None
                if out:
                    done += len(out)
                    yield out
                if d.eof:               # next member (concatenated gzip files)
                    block = d.unused_data
                    d = zlib.decompressobj(wbits=31)
                    if not block:
                        break
                    continue
                block = d.unconsumed_tail
                if not block and not out:   # input used up and nothing pending
                    break


#: ``*.jsonl``: the shim's logs, read as they are (entry point ``jsonl``).
JSONL = Source(kind="jsonl", find=_find_jsonl, seekable=True, label="*.jsonl",
               match=lambda name: name.endswith(".jsonl"))
#: ``*.jsonl.gz``: compressed logs, decompressed while read (entry point ``jsonl.gz``).
JSONL_GZ = Source(kind="jsonl.gz", find=_find_suffix(".jsonl.gz"), decode=_decode_gzip,
                  label="*.jsonl.gz", match=lambda name: name.endswith(".jsonl.gz"))

#: The entry-point group of log sources. tlog declares its own in pyproject.toml
#: (``[project.entry-points."tlog.sources"]``: ``jsonl``, ``jsonl.gz``, ``kineto``);
#: another distribution adds a kind the same way, naming a :class:`Source` or a
#: function of no arguments that returns one.
SOURCES_GROUP = "tlog.sources"
#: tlog's own sources, tried first and in this order; plugins follow by entry-point name.
BUILTIN_KINDS = ("jsonl", "jsonl.gz", "kineto")

#: Sources added at run time by :func:`register_source` (by kind).
_registered: dict[str, Source] = {}


def _kineto_source() -> Source:
    from tlog.ingest.kineto import source

    return source()


def _load_entry_point(ep: Any) -> Source:
    obj = ep.load()
    if callable(obj) and not isinstance(obj, Source):
        obj = obj()
    if not isinstance(obj, Source):
        msg = f"it gives {type(obj).__name__}, not a tlog.ingest.sources.Source"
        raise TypeError(msg)
    return obj


@cache
def installed_sources() -> tuple[Source, ...]:
    """The sources installed distributions declare under :data:`SOURCES_GROUP`:
    tlog's own (:data:`BUILTIN_KINDS`) first, then the others by entry-point
    name. Read once per process.

    A plugin that fails to load (an import error, an exception, not a
    :class:`Source`, or an import that does not return within
    :func:`tlog.ingest.plugins.plugin_timeout_s`) is left out with a
    ``RuntimeWarning`` that names it and why: it never stops nor hangs an ingest. When tlog's own entry points are missing
    (the package's metadata is stale: ``pip install -e .`` again), its
    built-in sources are used all the same, with a warning.
    """
    eps = list(entry_points(group=SOURCES_GROUP))
    rank = {k: i for i, k in enumerate(BUILTIN_KINDS)}
    eps.sort(key=lambda e: (rank.get(e.name, len(rank)), e.name))
    out: list[Source] = []
    for ep in eps:
        try:
            source = load_plugin(partial(_load_entry_point, ep))
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop ingest
            warnings.warn(f"tlog: log source plugin {ep.name!r} ({ep.value}) failed to load "
                          f"and is left out: {type(exc).__name__}: {exc}", RuntimeWarning,
                          stacklevel=2)
            continue
        if all(s.kind != source.kind for s in out):
            out.append(source)
    have = {s.kind for s in out}
    missing = [k for k in BUILTIN_KINDS if k not in have]
    if missing:
        warnings.warn(f"tlog: the {SOURCES_GROUP!r} entry points of {', '.join(missing)} are "
                      f"not installed (stale package metadata: pip install -e . again); "
                      f"using tlog's built-in ones", RuntimeWarning, stacklevel=2)
        builtin = {"jsonl": lambda: JSONL, "jsonl.gz": lambda: JSONL_GZ,
                   "kineto": _kineto_source}
        found = {s.kind: s for s in out}
        found.update({k: builtin[k]() for k in missing})
        out = [found[k] for k in BUILTIN_KINDS] + [s for s in out if s.kind not in rank]
    return tuple(out)


def active_sources() -> list[Source]:
    """Sources tried on every run directory: :func:`installed_sources`, each
    replaced by a :func:`register_source` of the same kind, then the other
    registered ones in registration order. Files are claimed in
    :func:`claim_order` (a file claimed by an earlier source is not offered to
    a later one), which is this order unless a source names others in
    :attr:`Source.before`."""
    out = [_registered.get(s.kind, s) for s in installed_sources()]
    kinds = {s.kind for s in out}
    return out + [s for k, s in _registered.items() if k not in kinds]


def claim_order() -> list[Source]:
    """:func:`active_sources` in the order they claim files: each one that names
    kinds in :attr:`Source.before` moved just ahead of the first of them (a
    plugin's ``*.jsonl`` format ahead of ``jsonl``); the rest keep their order,
    a kind not present is ignored, and a source is never moved later."""
    sources = active_sources()
    out = list(sources)
    for src in [s for s in sources if s.before]:
        here = out.index(src)
        ahead = [i for i, s in enumerate(out) if s.kind in src.before and i < here]
        if ahead:
            out.pop(here)
            out.insert(min(ahead), src)
    return out


def register_source(source: Source) -> None:
    """Add (or replace, by ``kind``) a source of log files for this process; see
    the module docstring. A distribution declares its sources as entry points
    instead (:data:`SOURCES_GROUP`); this is for notebooks and tests."""
    _registered[source.kind] = source


def unregister_source(kind: str) -> None:
    """Undo :func:`register_source` of ``kind`` (an installed source of that
    kind is used again); nothing when none was registered."""
    _registered.pop(kind, None)


@dataclass
class LogFile:
    """One log file of a run and what is known of it.

    ``offset``/``lines``/``meta`` describe the part already loaded (from the
    ``files`` table); ``size``/``mtime``/``head`` are read from disk now.
    """

    path: Path
    rel: str
    source: Source
    size: int
    mtime: float
    offset: int = 0
    lines: int = 0
    head_hash: str | None = None
    meta: dict = field(default_factory=dict)
    known: bool = False
    rewritten: bool = False
    data: bytes | None = None   # in-memory content (:func:`ingest.ingest_lines`), else on disk
    #: ``(st_dev, st_ino)`` when planned: a file swapped before it is opened is noticed
    inode: tuple[int, int] | None = None
    #: the first :data:`HEAD_BYTES` of the file as read through the descriptor the
    #: pieces were read from (so the stored fingerprint is of the bytes loaded,
    #: even when the path is replaced mid-read); None until read
    read_head: bytes | None = None
    #: the path held another file when it was opened: nothing read, state kept
    swapped: bool = False
    #: the path is a symbolic link (to a file inside the run directory,
    #: :func:`discover`); any other path is opened without following a link
    link: bool = False
    #: why the file could not be opened when it was to be read (e.g. ``permission
    #: denied``): nothing read, state kept, a warning
    unreadable: str | None = None
    #: the stored path this file had (found renamed, by its fingerprint)
    moved_from: str | None = None
    #: the label the rows of the file stored under this path before get (it
    #: holds another file now)
    replaced_as: str | None = None
    _digests: dict[int, str] = field(default_factory=dict, repr=False)

    def head_digest(self, length: int) -> str:
        """blake2b of the first ``length`` bytes of the file (hex): of the bytes
        read (:attr:`read_head`) once the file was read, else of the path now."""
        if self.data is not None:
            head = self.data[:length]
        elif self.read_head is not None and len(self.read_head) >= length:
            head = self.read_head[:length]
        elif length in self._digests:       # read from the path when planning
            return self._digests[length]
        else:
            with open(self.path, "rb") as fh:
                head = fh.read(length)
            self._digests[length] = digest(head)
            return self._digests[length]
        return digest(head)

    def release(self) -> None:
        """Drop what was held while reading (the head read, cached digests,
        in-memory content): called once the file's row is stored, so a run of
        many files holds a few hundred bytes per file, not its head."""
        self.read_head = None
        self.data = None
        self._digests.clear()

    def head_length(self) -> int:
        """Bytes the head fingerprint covers: the consumed part, up to :data:`HEAD_BYTES`
        (on disk bytes: the offset for a seekable file, the size seen for others)."""
        consumed = self.offset if self.source.seekable else max(self.size, 0)
        return min(HEAD_BYTES, consumed)


def digest(head: bytes) -> str:
    """The fingerprint of a file's head (``files.head_hash``): blake2b, hex."""
    return hashlib.blake2b(head, digest_size=16).hexdigest()


#: Links out of the run directory, unreadable files and unreadable directories
#: named one by one in the warnings of an ingest (per kind); the rest are counted.
#: tlog's choice.
MAX_NAMED = 20


@dataclass
class Survey:
    """What a walk of a run directory found (paths relative to the root, POSIX).

    Hidden entries (a name starting with ``.``) are not looked at. Symbolic links
    are not followed while walking: a link to a directory is never entered.

    Attributes:
        files: regular, readable files.
        links_in: symbolic links whose target is an existing file inside the
            run directory -> the target, relative to the run directory.
        links_out: symbolic links whose target is outside the run directory.
        unreadable: files that cannot be read -> why (``permission denied``).
        unreadable_dirs: directories that cannot be listed -> why.
    """

    files: set[str] = field(default_factory=set)
    links_in: dict[str, str] = field(default_factory=dict)
    links_out: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)
    unreadable_dirs: dict[str, str] = field(default_factory=dict)

    def warnings(self) -> list[str]:
        """One line per link out, unreadable file and unreadable directory (the
        first :data:`MAX_NAMED` of each kind, then a count)."""
        out: list[str] = []

        def named(items: list[str], more: str) -> None:
            out.extend(items[:MAX_NAMED])
            if len(items) > MAX_NAMED:
                out.append(f"... and {len(items) - MAX_NAMED:,} more {more}")

        named([f"{rel} is a symbolic link out of the run directory: not followed, not "
               f"read (copy what it points to into the run directory to load it)"
               for rel in sorted(self.links_out)],
              "symbolic links out of the run directory, not followed")
        named([f"cannot read {rel} ({why}): not loaded; fix its permissions and ingest "
               f"again" for rel, why in sorted(self.unreadable.items())],
              "files that cannot be read, not loaded")
        named([f"cannot read directory {rel}/ ({why}): nothing in it is loaded; fix its "
               f"permissions and ingest again"
               for rel, why in sorted(self.unreadable_dirs.items())],
              "directories that cannot be read, not loaded")
        return out


def _inside(base: str, target: str) -> bool:
    return target == base or target.startswith(base.rstrip(os.sep) + os.sep)


def _why(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


def survey(root: Path) -> Survey:
    """Walk ``root`` without following links (see :class:`Survey`).

    Raises:
        OSError: ``root`` itself cannot be listed.
    """
    base = os.path.realpath(root)
    found = Survey()
    stack = [("", str(root))]
    first = True
    while stack:
        rel_dir, path = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as exc:
            if first:
                raise
            found.unreadable_dirs[rel_dir] = _why(exc)
            continue
        first = False
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _inside(base, target):
                        if os.path.exists(target):
                            found.links_out.append(rel)
                    elif os.path.isfile(target):
                        if os.access(target, os.R_OK):
                            found.links_in[rel] = (os.path.relpath(target, base)
                                                   .replace(os.sep, "/"))
                        else:
                            found.unreadable[rel] = "permission denied"
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((rel, entry.path))
                elif entry.is_file(follow_symlinks=False):
                    if os.access(entry.path, os.R_OK):
                        found.files.add(rel)
                    else:
                        found.unreadable[rel] = "permission denied"
            except OSError as exc:       # vanished or unreadable while looked at
                found.unreadable[rel] = _why(exc)
    return found


def _relative(path: Path, root: Path) -> str | None:
    """``path`` relative to ``root`` (POSIX), also when one is absolute and the
    other not; None when it is not below ``root``."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        try:
            return path.absolute().relative_to(root.absolute()).as_posix()
        except ValueError:
            return None


def discover(root: Path, warnings: list[str] | None = None) -> list[tuple[Path, Source]]:
    """Every log file below ``root`` with its source, sorted by path.

    What is read is what :func:`survey` saw: a regular readable file, or a
    symbolic link to a file inside the run directory that is not found under its
    own name (each file is read once, under its real name when both are
    found). Links out of the run directory are not followed; they, unreadable
    files and unreadable directories are appended to ``warnings``
    (:meth:`Survey.warnings`).

    Raises:
        OSError: ``root`` cannot be listed.
    """
    seen = survey(root)
    if warnings is not None:
        warnings.extend(seen.warnings())
    claims: list[tuple[str, Source]] = []
    claimed: set[str] = set()
    for source in claim_order():
        if source.match is not None:
            names = sorted(rel for rel in (*seen.files, *seen.links_in)
                           if source.match(rel.rsplit("/", 1)[-1]))
        else:
            names = [rel for p in source.find(root) if (rel := _relative(p, root)) is not None]
        for rel in names:
            if rel in claimed or rel.rsplit("/", 1)[-1] == MANIFEST:
                continue
            if rel in seen.files or rel in seen.links_in:
                claimed.add(rel)
                claims.append((rel, source))
    first: dict[str, str] = {}      # target -> the first claimed link to it, by name
    for rel, _ in sorted(claims, key=lambda c: c[0]):
        if rel in seen.links_in:
            first.setdefault(seen.links_in[rel], rel)
    found: list[tuple[Path, Source]] = []
    for rel, source in claims:
        target = seen.links_in.get(rel)
        if target is not None and (target in claimed or first[target] != rel):
            continue            # read once: under its own name, or the first link to it
        found.append((root / rel, source))
    found.sort(key=lambda item: item[0].relative_to(root).as_posix())
    return found


def _as_bytes(chunks: Iterable[bytes | str]) -> Iterator[bytes]:
    for chunk in chunks:
        yield chunk.encode("utf-8") if isinstance(chunk, str) else chunk


def _skip(chunks: Iterator[bytes], n: int) -> Iterator[bytes]:
    """Drop the first ``n`` bytes of a chunk stream."""
    for chunk in chunks:
        if n >= len(chunk):
            n -= len(chunk)
            continue
        yield chunk[n:] if n else chunk
        n = 0
        yield from chunks
        return


def decoded_from(log: LogFile, offset: int) -> Iterator[bytes]:
    """The decoded text of ``log`` from decoded byte ``offset`` on, in blocks."""
    if log.data is not None:
        return iter([log.data[offset:]])
    if log.source.seekable:
        def read() -> Iterator[bytes]:
            with open(log.path, "rb") as fh:
                fh.seek(offset)
                while block := fh.read(CHUNK_BYTES):
                    yield block
        return read()
    chunks = _as_bytes(log.source.decode(log.path))  # type: ignore[misc]
    return _skip(iter(chunks), offset)


@dataclass
class Piece:
    """Complete lines of one file: ``data`` starts at decoded ``start`` and
    its first line is number ``first_line``; ``end`` is the offset after it."""

    log: LogFile
    data: bytes | memoryview
    start: int
    first_line: int
    n_lines: int
    end: int
    last: bool          # the last piece of this file in this ingest
    partial: int = 0    # bytes of an incomplete last line left for later (on the last piece)
    error: str | None = None  # on the last piece: the decoder stopped at damage (DecodeError)
    #: A line longer than MAX_LINE_BYTES that did not fit a block: read past, not
    #: held; ``data`` is one empty line in its place, and this is
    #: ``(length without the line break, the first _LONG_KEEP bytes)``.
    skipped: tuple[int, bytes] | None = None


def pieces(log: LogFile, offset: int, first_line: int,
           chunk_bytes: int = CHUNK_BYTES) -> Iterator[Piece]:
    """Cut the decoded text of ``log`` from ``offset`` into pieces of complete
    lines of about ``chunk_bytes`` (a longer line is one piece of its own).
    Ends with a piece that has ``last=True`` (empty) carrying ``partial`` =
    bytes of an incomplete final line, so the file's new state is recorded
    even when nothing new was complete."""
    if log.source.seekable and log.data is None:
        yield from _pieces_seekable(log, offset, first_line, chunk_bytes)
        return
    pos, line = offset, first_line
    carry = b""
    error = None
    long: _LongLine | None = None     # reading past an over-long line
    blocks = _blocks_joined(decoded_from(log, offset), chunk_bytes)
    while True:
        try:
            buf = next(blocks, None)
        except DecodeError as exc:
            error = str(exc)
            break
        except OSError as exc:
            if pos == offset and not carry and long is None:   # could not open: nothing read
                log.unreadable = _why(exc)
                yield Piece(log, b"", pos, line, 0, pos, last=True)
                return
            raise
        if buf is None:
            break
        if long is not None:
            at = long.feed(buf)
            if at < 0:
                continue
            yield long.piece(log, pos, line)
            pos, line, long = pos + long.size, line + 1, None
            buf = buf[at:]
        if carry:
            buf = carry + buf
        cut = buf.rfind(b"\n") + 1
        carry = buf[cut:]
        if cut:
            n = buf.count(b"\n", 0, cut)
            yield Piece(log, memoryview(buf)[:cut], pos, line, n, pos + cut, last=False)
            pos += cut
            line += n
        if len(carry) > MAX_LINE_BYTES:          # too long already: do not hold it
            long, carry = _LongLine(carry), b""
    partial = long.size if long is not None else len(carry)
    yield Piece(log, b"", pos, line, 0, pos, last=True, partial=partial, error=error)


class _LongLine:
    """A line found longer than :data:`MAX_LINE_BYTES` before its end was read:
    its bytes are counted as they stream past, only its head is kept."""

    def __init__(self, first: bytes) -> None:
        self.head = bytes(first[:_LONG_KEEP])
        self.size = len(first)        # bytes so far (its line break too, once found)
        self.last = first[-1:]        # the byte before the next block
        self.cr = False               # the line break is \r\n

    def feed(self, block: bytes) -> int:
        """Count ``block``; return the index after the line break in it, or -1."""
        at = block.find(b"\n")
        self.head += block[:min(len(block) if at < 0 else at, _LONG_KEEP - len(self.head))]
        if at < 0:
            self.size += len(block)
            self.last = block[-1:] or self.last
            return -1
        self.size += at + 1
        before = block[at - 1:at] if at else self.last
        self.cr = before == b"\r"
        return at + 1

    def piece(self, log: LogFile, pos: int, line: int) -> Piece:
        """The one-line piece standing for the line (an empty line in its place)."""
        length = self.size - 1 - int(self.cr)
        return Piece(log, b"\n", pos, line, 1, pos + self.size, last=False,
                     skipped=(length, self.head[:length]))


def _pieces_seekable(log: LogFile, offset: int, first_line: int,
                     chunk_bytes: int) -> Iterator[Piece]:
    """:func:`pieces` of a plain file: each read starts at a line start (the
    incomplete tail of a block is read again with the next one), so a piece is
    a zero-copy view of its own block."""
    pos, line = offset, first_line
    partial = 0
    want = chunk_bytes
    try:
        fd = os.open(log.path, os.O_RDONLY | (0 if log.link else getattr(os, "O_NOFOLLOW", 0)))
    except OSError as exc:   # since planned: made unreadable, removed, or replaced by a link
        log.unreadable = ("replaced by a symbolic link" if exc.errno == errno.ELOOP
                          else _why(exc))
        yield Piece(log, b"", pos, line, 0, pos, last=True)
        return
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if log.inode is not None and (st.st_dev, st.st_ino) != log.inode:
            # replaced between the plan and now: its state was decided for the other file
            log.swapped = True
            yield Piece(log, b"", pos, line, 0, pos, last=True)
            return
        log.read_head = os.pread(fh.fileno(), HEAD_BYTES, 0)
        # a read of a small file asks for its size (+1 to see its end), not a
        # whole chunk: the buffer of a chunk-sized read is a fresh mapping
        # trimmed to whole pages, so 10,000 files of 700 bytes held 4 KiB each
        want = max(1, min(chunk_bytes, st.st_size - pos + 1))
        while True:
            fh.seek(pos)
            block = fh.read(want)
            if not block:
                break
            at_end = len(block) < want
            cut = block.rfind(b"\n") + 1
            if not cut:
                if len(block) > MAX_LINE_BYTES:   # too long: read past it, do not hold it
                    long = _LongLine(block)
                    while (more := fh.read(_SCAN_BYTES)) and long.feed(more) < 0:
                        pass
                    if not more:                  # no line break yet: left for later
                        partial = long.size
                        break
                    yield long.piece(log, pos, line)
                    pos, line, want = pos + long.size, line + 1, chunk_bytes
                    continue
                if at_end:
                    partial = len(block)
                    break
                want *= 2                  # a line longer than a block
                continue
            n = block.count(b"\n", 0, cut)
            if len(log.read_head) < min(pos + cut, HEAD_BYTES):   # it grew since opened
                log.read_head = os.pread(fh.fileno(), HEAD_BYTES, 0)
            yield Piece(log, memoryview(block)[:cut], pos, line, n, pos + cut, last=False)
            pos += cut
            line += n
            want = chunk_bytes
            if at_end:
                partial = len(block) - cut
                break
        log.read_head = os.pread(fh.fileno(), HEAD_BYTES, 0)
    yield Piece(log, b"", pos, line, 0, pos, last=True, partial=partial)


def _blocks_joined(chunks: Iterator[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """Decoded chunks of any size regrouped into blocks of about ``chunk_bytes``."""
    held: list[bytes] = []
    size = 0
    try:
        for chunk in chunks:
            held.append(chunk)
            size += len(chunk)
            if size >= chunk_bytes:
                yield b"".join(held)
                held, size = [], 0
    except DecodeError:
        if held:            # the good prefix first, then the error
            yield b"".join(held)
        raise
    if held:
        yield b"".join(held)


def line_offsets(data: bytes) -> np.ndarray:
    """Start offsets of the lines of ``data`` (which ends with a newline) plus
    ``len(data)``: line i is ``data[off[i]:off[i+1]]`` including its newline."""
    nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    offs = np.empty(len(nl) + 1, dtype=np.int64)
    offs[0] = 0
    offs[1:] = nl + 1
    return offs


def line_offsets_quotes(data: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
    """:func:`line_offsets` of ``data`` and the count of ``"`` in each line
    (int32), in one pass over the data: the positions of newlines and quotes
    are found together, and a line's quotes are the positions between its
    newline and the one before (two passes cost about a third more)."""
    a = np.frombuffer(data, dtype=np.uint8)
    mask = a == 10
    mask |= a == 34
    pos = np.flatnonzero(mask)
    del mask
    ends = np.flatnonzero(a[pos] == 10)     # indices in pos of the newlines
    offs = np.empty(len(ends) + 1, dtype=np.int64)
    offs[0] = 0
    np.add(pos[ends], 1, out=offs[1:])
    quotes = np.diff(ends, prepend=-1)
    quotes -= 1
    return offs, quotes.astype(np.int32)


@dataclass
class BadLine:
    """A line rejected before parsing (not UTF-8, or longer than :data:`MAX_LINE_BYTES`).
    ``raw``: its text (the start of it for a long line); ``code``/``reason`` as
    in ``rejects``."""

    fid: int
    line: int
    raw: str
    code: str = "not_json"
    reason: str = "not JSON: not UTF-8 text"


def char_counts(data: bytes | memoryview, offs: np.ndarray, char: bytes) -> np.ndarray:
    """Occurrences of the byte ``char`` in each line (int32 per line)."""
    at = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == char[0])
    return np.diff(np.searchsorted(at, offs)).astype(np.int32)


#: Longest line sampled for the templates (bytes): a template is a fast path for
#: the many lines of one shape, and a longer line is rare (tlog's choice).
SAMPLE_MAX_BYTES = 64 << 10


def sample_lines(batch: list[Piece], sample_at: tuple[float, ...] = (),
                 sample_head: int = 0) -> list[str]:
    """Lines of each piece sampled for :func:`ingest.templates.learn`, read
    from the piece's bytes before they are split: the first ``sample_head``
    lines and the line holding the byte at each fraction ``sample_at`` of the
    piece (1.0: its last line); past :data:`MAX_SAMPLES` lines in a batch, only
    the first line of each further piece. Lines longer than
    :data:`SAMPLE_MAX_BYTES` are not sampled. Templates are a fast path only,
    so which lines are sampled changes speed, never what is loaded."""
    samples: list[str] = []
    for piece in batch:
        data = piece.data
        if not piece.n_lines or not data:
            continue
        size = len(data)
        spans: set[tuple[int, int]] = set()
        at = 0
        for _ in range(sample_head if len(samples) < MAX_SAMPLES else 1):
            span = _line_span(data, at, size) if at < size else None
            if span is None:
                break
            spans.add(span)
            at = span[1] + 1
        if len(samples) < MAX_SAMPLES:
            for f in sample_at:
                span = _line_span(data, min(max(int(f * size), 0), size - 1), size)
                if span is not None:
                    spans.add(span)
        samples.extend(bytes(data[a:b]).decode("utf-8", "replace") for a, b in sorted(spans))
    return samples


def _line_span(data: bytes | memoryview, pos: int, size: int) -> tuple[int, int] | None:
    """``(start, end)`` of the line holding byte ``pos`` of ``data`` (its line
    break excluded; a line break belongs to the line it ends), or None when that
    line is longer than :data:`SAMPLE_MAX_BYTES`. Looks only at a window around
    ``pos`` (``data`` may be a memoryview, which has no ``find``)."""
    lo = max(0, pos - SAMPLE_MAX_BYTES)
    window = bytes(data[lo:pos + SAMPLE_MAX_BYTES + 1])
    rel = pos - lo
    before = window.rfind(b"\n", 0, rel)
    if before < 0 and lo > 0:
        return None
    after = window.find(b"\n", rel)
    if after < 0:
        if lo + len(window) < size:
            return None
        after = len(window)
    if after - before - 1 > SAMPLE_MAX_BYTES:
        return None
    return lo + before + 1, lo + after


def _line_batches(batch: list[Piece], fids: dict[int, int],
                  bad: list[BadLine]) -> Iterator[pa.RecordBatch]:
    """The lines of the batch as Arrow record batches ``(fid INT32, line INT64,
    raw STRING, quotes INT32)``, in line order, as each is made (``fid =
    fids[id(piece.log)]``; ``quotes``, the count of ``"`` in the line, feeds the
    template test of :mod:`ingest.templates`); lines too long or not valid
    UTF-8 are blanked and go to ``bad``.

    Record batches hold about :data:`ROWS_PER_RECORD_BATCH` rows whatever the
    number of pieces: the lines of small pieces (many small files) share one
    record batch (their text copied once), a large piece is sliced without a
    copy. DuckDB keeps per-record-batch state while it scans, so one record
    batch per file of a 10,000-file batch exhausted its memory limit.
    """
    group: list[list[pa.Array]] = []     # small pieces' columns waiting to be joined
    group_rows = 0

    def joined() -> pa.RecordBatch:
        return pa.record_batch([pa.concat_arrays([g[k] for g in group]) for k in range(4)],
                               names=_LINE_COLUMNS)

    big = [p for p in batch if p.n_lines and len(p.data) >= PARALLEL_PIECE_BYTES]
    pool = (ThreadPoolExecutor(max_workers=min(PREP_THREADS, len(big)),
                               thread_name_prefix="tlog-lines")
            if len(big) > 1 else None)
    try:
        ahead = ({id(p): pool.submit(_piece_columns, p) for p in big} if pool is not None
                 else {})
        for piece in batch:
            if not piece.n_lines:
                continue
            fid = fids[id(piece.log)]
            done = ahead.pop(id(piece), None)
            _data, offs, raw, quotes, found = (done.result() if done is not None
                                               else _piece_columns(piece))
            n = len(offs) - 1
            bad.extend(BadLine(fid, *b) for b in found)
            lines = np.arange(piece.first_line, piece.first_line + n, dtype=np.int64)
            fid_col = np.full(n, fid, dtype=np.int32)
            if n < ROWS_PER_RECORD_BATCH // 4:       # small: joined with its neighbours
                group.append([pa.array(fid_col), pa.array(lines), raw, pa.array(quotes)])
                group_rows += n
                if group_rows >= ROWS_PER_RECORD_BATCH:
                    yield joined()
                    group, group_rows = [], 0
                continue
            if group:
                yield joined()
                group, group_rows = [], 0
            for lo in range(0, n, ROWS_PER_RECORD_BATCH):
                hi = min(n, lo + ROWS_PER_RECORD_BATCH)
                yield pa.record_batch(
                    [pa.array(fid_col[lo:hi]), pa.array(lines[lo:hi]),
                     raw.slice(lo, hi - lo), pa.array(quotes[lo:hi])],
                    names=_LINE_COLUMNS)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if group:
        yield joined()


class LinesStream:
    """The lines table of a batch (:func:`_line_batches`), made on a thread of its
    own and handed over a record batch at a time, so that DuckDB parses the
    first lines while the rest are split (the first batch of an ingest has
    nothing else to overlap with: about 0.1 s of a 77 MB run, docs/DATABASE.md).

    :meth:`reader` gives the record batches as they are made, once, each cut
    to at most ``chunk_rows`` rows; :meth:`result` waits for the whole table and
    the rejected lines. An error while making them is raised by both.
    """

    def __init__(self, batch: list[Piece], fids: dict[int, int], chunk_rows: int) -> None:
        import queue
        import threading

        self._chunk_rows = chunk_rows
        self._made: list[pa.RecordBatch] = []
        self._bad: list[BadLine] = []
        self._queue: queue.SimpleQueue[pa.RecordBatch | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._read = False
        self._thread = threading.Thread(target=self._make, args=(batch, fids),
                                        name="tlog-lines-stream", daemon=True)
        self._thread.start()

    def _make(self, batch: list[Piece], fids: dict[int, int]) -> None:
        try:
            for rb in _line_batches(batch, fids, self._bad):
                for lo in range(0, rb.num_rows, self._chunk_rows):
                    part = rb.slice(lo, self._chunk_rows)    # no copy
                    self._made.append(part)
                    self._queue.put(part)
        except BaseException as exc:    # noqa: BLE001 - handed to the reading thread
            self._error = exc
        finally:
            self._done.set()
            self._queue.put(None)

    def reader(self) -> pa.RecordBatchReader:
        """The record batches as they are made (once per stream).

        Raises:
            RuntimeError: called a second time.
        """
        if self._read:
            raise RuntimeError("a LinesStream is read once; use result() for the table")
        self._read = True

        def parts() -> Iterator[pa.RecordBatch]:
            while (part := self._take()) is not None:
                yield part
            if self._error is not None:
                raise self._error

        return pa.RecordBatchReader.from_batches(_LINES_SCHEMA, parts())

    def _take(self) -> pa.RecordBatch | None:
        return self._queue.get()

    def result(self) -> tuple[pa.Table, list[BadLine]]:
        """The whole table and the rejected lines, once all are made."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return pa.Table.from_batches(self._made, schema=_LINES_SCHEMA), self._bad


#: Pieces of at least this many bytes are prepared (lines split, quotes
#: counted, UTF-8 checked) on :data:`PREP_THREADS` threads at once: numpy and
#: Arrow release the GIL, and while the first batch is prepared DuckDB has
#: nothing to do, so a second core would idle. tlog's choice (a smaller piece
#: costs less than the hand-off).
PARALLEL_PIECE_BYTES = 1 << 20
#: Threads preparing the large pieces of a batch (tlog's choice: the 2-core
#: machines tlog is measured on; more only raises peak memory).
PREP_THREADS = 2


def _piece_columns(piece: Piece) -> tuple[bytes | memoryview, np.ndarray, pa.Array, np.ndarray,
                                           list[tuple[int, str, str, str]]]:
    """The columns of one piece: ``(data, line offsets, raw strings, quotes per
    line, rejected lines as (line, raw, code, reason))``; the data is a copy
    with rejected lines blanked when there are any (too long, not UTF-8)."""
    found: list[tuple[int, str, str, str]] = []
    data = piece.data
    if piece.skipped is not None:
        size, head = piece.skipped
        found.append((piece.first_line, head.decode("utf-8", "replace"), "too_large",
                      _too_long(size)))
    offs, quotes = line_offsets_quotes(data)
    changed = False
    too_long = np.flatnonzero(np.diff(offs) > MAX_LINE_BYTES + 1)
    if len(too_long):
        data, offs, longs = _blank_long_lines(data, offs, too_long)
        found.extend((piece.first_line + i, text, "too_large", _too_long(size))
                     for i, size, text in longs)
        changed = True
    raw = _string_array(data, offs)
    if raw is None:
        data, offs, invalid = _blank_invalid_utf8(data, offs)
        found.extend((piece.first_line + i, text, "not_json", "not JSON: not UTF-8 text")
                     for i, text in invalid)
        raw = _string_array(data, offs)
        changed = True
    if changed:
        quotes = char_counts(data, offs, b'"')
    return data, offs, raw, quotes, found


#: Column names and schema of the lines table (:func:`_line_batches`).
_LINE_COLUMNS = ["fid", "line", "raw", "quotes"]
_LINES_SCHEMA = pa.schema([("fid", pa.int32()), ("line", pa.int64()), ("raw", pa.large_string()),
                           ("quotes", pa.int32())])
#: Sampled lines per batch before sampling thins out to one line per piece: a
#: batch of 10,000 small files would otherwise sample (and ``json.loads``)
#: nearly every line. Templates are a fast path only (``ingest.templates``), so
#: fewer samples cost speed, never correctness. tlog's choice.
MAX_SAMPLES = 4096


def _too_long(size: int) -> str:
    return f"line too long ({size:,} bytes, limit {MAX_LINE_BYTES:,})"


def _string_array(data: bytes, offs: np.ndarray) -> pa.Array | None:
    """Zero-copy Arrow strings over ``data``; ``None`` when it is not UTF-8."""
    arr = pa.LargeStringArray.from_buffers(len(offs) - 1, pa.py_buffer(offs), pa.py_buffer(data))
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return arr




def _blank_long_lines(data: bytes | memoryview, offs: np.ndarray, idx: np.ndarray,
                      ) -> tuple[bytes, np.ndarray, list[tuple[int, int, str]]]:
    """Replace the lines ``idx`` by empty lines (kept for numbering); returns the
    new data and offsets and ``(index, length without the line break, start of
    the text)`` of each. The rare path: one copy of the batch."""
    parts: list[bytes | memoryview] = []
    found: list[tuple[int, int, str]] = []
    mv = memoryview(data)
    prev = 0
    for i in idx.tolist():
        lo, hi = int(offs[i]), int(offs[i + 1])
        line_end = hi - 1 if bytes(mv[hi - 1:hi]) == b"\n" else hi
        if line_end > lo and bytes(mv[line_end - 1:line_end]) == b"\r":
            line_end -= 1
        found.append((i, line_end - lo, bytes(mv[lo:min(line_end, lo + _LONG_KEEP)])
                      .decode("utf-8", "replace")))
        parts.extend([mv[prev:lo], b"\n"])
        prev = hi
    parts.append(mv[prev:])
    fixed = b"".join(parts)
    return fixed, line_offsets(fixed), found


def _blank_invalid_utf8(data: bytes | memoryview, offs: np.ndarray) -> tuple[bytes, np.ndarray, list]:
    """Replace each line that is not UTF-8 by an empty line (kept for numbering).
    The rare path for damaged files: a Python loop over the lines."""
    out: list[bytes] = []
    found: list[tuple[int, str]] = []
    data = bytes(data)
    for i in range(len(offs) - 1):
        line = data[offs[i]:offs[i + 1]]
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            found.append((i, line.decode("utf-8", "replace").rstrip("\r\n")))
            line = b"\n"
        out.append(line)
    fixed = b"".join(out)
    return fixed, line_offsets(fixed), found


def stat(path: Path) -> tuple[int, float, tuple[int, int]]:
    """``(size in bytes, mtime in epoch s, (st_dev, st_ino))`` of ``path``."""
    st = os.stat(path)
    return st.st_size, st.st_mtime, (st.st_dev, st.st_ino)
