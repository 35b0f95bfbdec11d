"""Finding a live ``tlog serve`` for a database, and calling it from another process.

DuckDB lets one process write a database file, or many read it, never both:
while ``tlog serve`` owns the file, another process cannot even open it
read-only. So the service announces itself in ``<db>.serve.json`` (its URL,
pid, watched directories and token; mode 0600, so only its user reads the
token) and holds an exclusive ``flock`` on that file for its lifetime: a
file whose lock nobody holds is stale (a service that died), never trusted.

Every call of the facade :class:`tlog.api.Database` (and so every CLI
command, which goes through it) first asks :func:`live_service`; with a live
service the call is made *in the service* (:meth:`ServiceInfo.call`,
``POST /api/call``): reads run on a snapshot of the service's own
connection, so they never wait for an ingest round, and writes (ingest,
forget) join the service's one writer. The answer comes back as the same
typed object (or the same :class:`~tlog.ingest.errors.TlogError`) the call
gives without a service, pickled: the client unpickles only what the
service it found through its own user's 0600 file sends.

Standard library only (the CLI imports it on every command).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlog.ingest.errors import DatabaseError

#: Seconds a client waits for the service to answer one request (a write waits
#: for the ingest round in progress to end; a diagnosis of a huge run takes a
#: minute). Source: tlog's choice.
CLIENT_TIMEOUT_S = 600.0

#: The media type of a pickled answer of ``POST /api/call``.
PICKLE_TYPE = "application/vnd.tlog.pickle"


def service_file(db: str | os.PathLike[str]) -> Path:
    """``<db>.serve.json``: where the service that owns ``db`` announces itself."""
    p = Path(db).expanduser()
    return p.with_name(p.name + ".serve.json")


@dataclass(frozen=True)
class ServiceInfo:
    """What ``<db>.serve.json`` says about a live service.

    Attributes:
        url: its base URL (``http://127.0.0.1:8765``).
        pid: its process id.
        db: the database file it owns (absolute).
        watch: the directories it ingests runs from (absolute).
        token: the token requests must carry (None: none needed, loopback).
    """

    url: str
    pid: int
    db: str
    watch: list[str] = field(default_factory=list)
    token: str | None = None

    def call(self, method: str, **kwargs: Any) -> Any:
        """Make the facade call ``Database.<method>(**kwargs)`` in the service;
        return its result, or raise the error it raised (module docstring).

        ``kwargs`` must be JSON (run ids, numbers, lists, dicts of text).

        Raises:
            TlogError: what the call raised in the service (the same class
            and one-line message as without a service).
            DatabaseError: the service did not answer, or refused the request.
        """
        import pickle
        import urllib.error
        import urllib.request

        data = json.dumps({"method": method, "kwargs": kwargs}).encode()
        req = urllib.request.Request(self.url.rstrip("/") + "/api/call", data=data,
                                     method="POST")
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", PICKLE_TYPE)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT_S) as resp:
                kind = resp.headers.get("content-type", "")
                body = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error") or exc.reason
            except (ValueError, AttributeError, OSError):
                message = exc.reason
            raise DatabaseError(f"tlog serve ({self.url}) refused {method}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DatabaseError(f"tlog serve (pid {self.pid}, {self.url}) holds the database "
                                f"but does not answer ({reason}); stop it or wait") from None
        if not kind.startswith(PICKLE_TYPE):
            raise DatabaseError(f"tlog serve ({self.url}) sent {kind or 'no type'} for {method}: "
                                f"is it the same version of tlog?")
        outcome, value = pickle.loads(body)
        if outcome == "error":
            raise value
        return value


def live_service(db: str | os.PathLike[str]) -> ServiceInfo | None:
    """The live service that owns ``db``, or None (no file, or nobody holds its lock).

    Raises:
        DatabaseError: the file is held but unreadable for 2 s (a service still starting
            writes it under its lock).
    """
    path = service_file(db)
    deadline = time.monotonic() + 2.0
    while True:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DatabaseError(f"cannot read {path}: {exc.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pass                      # held: a live service
            else:
                return None               # nobody holds it: a stale file
            with os.fdopen(os.dup(fd), "rb") as fh:
                text = fh.read()
        finally:
            os.close(fd)
        try:
            raw = json.loads(text)
            return ServiceInfo(url=raw["url"], pid=int(raw["pid"]), db=raw["db"],
                               watch=list(raw.get("watch") or []), token=raw.get("token"))
        except (ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                raise DatabaseError(f"{path} is held by a process but unreadable: is a "
                                    f"'tlog serve' starting?") from None
            time.sleep(0.05)


class Announcement:
    """The service's side: ``<db>.serve.json`` written (mode 0600) and locked
    until :meth:`close` removes it.

    Raises:
        DatabaseError: another live service already owns the database.
    """

    def __init__(self, info: ServiceInfo) -> None:
        self.path = service_file(info.db)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            other = live_service(info.db)
            who = f" (pid {other.pid}, {other.url})" if other else ""
            raise DatabaseError(f"the database {info.db} is already served by another "
                                f"'tlog serve'{who}: stop it, or pass another --db") from None
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        body = {"url": info.url, "pid": info.pid, "db": info.db, "watch": info.watch,
                "token": info.token}
        os.write(fd, json.dumps(body, indent=2).encode())
        os.fsync(fd)
        self._fd: int | None = fd

    def close(self) -> None:
        """Remove the file, then let go of its lock."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = None
