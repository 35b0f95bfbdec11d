"""The service's side of shipping: runs sent from other hosts, kept in a spool directory.

A sender (``tlog ship``, or the shim with ``TLOG_SERVER``:
:mod:`dflash_runtime.ship`) sends each file of a run as byte ranges:
``POST /api/ship?run=RUN&path=REL&offset=N`` with the bytes from offset
``N`` (gzip on the wire). The service appends them to
``<spool>/<RUN>/<REL>`` only when ``N`` is the size its copy has, so a range
sent twice (the sender restarted, or its acknowledgement was lost) is never
written twice: the copy is always a prefix of the sender's file, and
``409`` with the copy's size and the digest of its first bytes tells the
sender where to go on. A file rewritten in place (``run.json``) is sent
again whole with ``replace=1``. Each write is flushed to disk (``fsync``)
before it is acknowledged, so a service killed after answering has the
bytes. The watcher ingests ``<spool>/<RUN>`` as any run directory: the
ingest's own file identity and offsets load each line exactly once.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_runtime.ship import HEAD_BYTES, head_digest
from tlog.ingest.errors import UsageError

#: Most bytes one request may carry once decompressed: a bound on what one
#: request makes the service hold (a gzip bomb stops here). Source: tlog's
#: choice (a sender sends at most 1 MiB a request).
MAX_RANGE_BYTES = 16 * 2**20

#: Most path components below the run directory.
MAX_DEPTH = 6

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@-]{0,127}")


class ShipConflict(Exception):
    """The range does not start where the copy ends (``size``, ``head``: the copy's)."""

    def __init__(self, size: int, head: str) -> None:
        super().__init__(f"the service holds {size} bytes of this file")
        self.size = size
        self.head = head


@dataclass(frozen=True)
class Copy:
    """One spooled file: ``size`` in bytes and ``head``, the SHA-256 of its first
    min(size, :data:`HEAD_BYTES`) bytes."""

    size: int
    head: str

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "head": self.head}


def head_of(path: Path, size: int | None = None) -> str:
    """SHA-256 (hex) of the first min(size, :data:`HEAD_BYTES`) bytes of ``path``:
    the sender's fingerprint (:func:`dflash_runtime.ship.head_digest`), one definition."""
    return head_digest(path, HEAD_BYTES if size is None else min(size, HEAD_BYTES))


def check_name(value: str, what: str) -> str:
    """``value`` if it is a safe file name (letters, digits, ``_.+=@-``, not
    starting with a dot); else UsageError."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or value in (".", ".."):
        raise UsageError(f"bad {what} {value!r}: use letters, digits and _.+=@- (not starting "
                         f"with a dot), at most 128 characters")
    return value


def check_rel(rel: str) -> tuple[str, ...]:
    """The components of a relative file path inside a run (each :func:`check_name`,
    at most :data:`MAX_DEPTH`); UsageError otherwise."""
    parts = tuple(rel.split("/")) if isinstance(rel, str) else ()
    if not parts or len(parts) > MAX_DEPTH:
        raise UsageError(f"bad file path {rel!r}: a relative path of 1 to {MAX_DEPTH} parts")
    for p in parts:
        check_name(p, "file path part")
    return parts


def gunzip(body: bytes, limit: int = MAX_RANGE_BYTES) -> bytes:
    """``body`` decompressed (gzip), at most ``limit`` bytes; UsageError when it
    is not gzip or holds more."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise UsageError(f"the body is not gzip data ({exc})") from None
    if len(out) > limit or d.unconsumed_tail:
        raise UsageError(f"a range holds more than {limit} bytes once decompressed: send "
                         f"smaller ranges")
    if not d.eof:
        raise UsageError("the gzip data is cut short")
    return out


class Spool:
    """The spool directory of a service: ``<root>/<run>/<path>`` (module docstring).

    Thread-safe: one lock per service (appends are small and fast).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _path(self, run: str, rel: str) -> Path:
        return self.root.joinpath(check_name(run, "run"), *check_rel(rel))

    def files(self, run: str) -> dict[str, Copy]:
        """The copies of run ``run``'s files by relative path (empty: none yet)."""
        base = self.root / check_name(run, "run")
        out: dict[str, Copy] = {}
        if not base.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                p = Path(dirpath) / name
                size = p.stat().st_size
                out[p.relative_to(base).as_posix()] = Copy(size, head_of(p, size))
        return out

    def append(self, run: str, rel: str, offset: int, data: bytes, *,
               replace: bool = False) -> Copy:
        """Write ``data`` at ``offset`` of the copy of ``rel`` (``replace``: the
        copy starts anew with ``data``, ``offset`` must be 0); fsync; return the copy.

        Raises:
            ShipConflict: ``offset`` is not the copy's size (nothing written).
            UsageError: a bad name or path, or ``replace`` with an offset.
        """
        path = self._path(run, rel)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise UsageError(f"bad offset {offset!r}: a byte offset, 0 or more")
        if replace and offset:
            raise UsageError("replace=1 sends a file from its start: offset must be 0")
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            if replace:
                tmp = path.with_name(f".{path.name}.replacing")
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
                size = len(data)
            else:
                size = path.stat().st_size if path.exists() else 0
                if offset != size:
                    raise ShipConflict(size, head_of(path, size) if size else
                                       hashlib.sha256(b"").hexdigest())
                with open(path, "ab") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                size += len(data)
        return Copy(size, head_of(path, size))
