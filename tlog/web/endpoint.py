"""Finding a live ``tlog serve`` for a database, and using it from another process.

DuckDB lets one process write a database file, or many read it, never both:
while ``tlog serve`` owns the file, another process cannot even open it
read-only. So the service announces itself in ``<db>.serve.json`` (its URL,
pid, watched directories and token; mode 0600, so only its user reads the
token) and holds an exclusive ``flock`` on that file for its lifetime: a
file whose lock nobody holds is stale (a service that died), never trusted.

Every command that reads the database goes through :func:`reading` (the CLI's
read commands, the facade :class:`tlog.api.Database`'s readers): when a live
service holds the file, it asks the service for a *lease* (``POST
/api/lease``): the service finishes what it is doing, closes its connection
and waits; the command opens the file read-only as usual, and on leaving
gives the lease back (``DELETE /api/lease/ID``), after which the service
reopens it. A lease whose process died is taken back by the service (it
checks the pid). Write commands call :func:`refuse_writes`: one line saying
what to do instead.

Standard library only (the CLI imports it on every read command).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlog.ingest.errors import DatabaseError, TlogError

#: Seconds a client waits for the service to answer one request (a lease
#: waits for the round being ingested to end). Source: tlog's choice.
CLIENT_TIMEOUT_S = 60.0


class ServedDatabaseError(TlogError):
    """The database is held by a live ``tlog serve``: a write must go another way."""


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

    def request(self, method: str, path: str, body: Any = None, *,
                timeout_s: float = CLIENT_TIMEOUT_S) -> Any:
        """Call the service's JSON API; return the decoded JSON answer.

        Raises:
            DatabaseError: the service did not answer, or answered an error
            (its one-line message).
        """
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url.rstrip("/") + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error") or exc.reason
            except (ValueError, AttributeError, OSError):
                message = exc.reason
            raise DatabaseError(f"tlog serve ({self.url}) refused {method} {path}: "
                                f"{message}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DatabaseError(f"tlog serve (pid {self.pid}, {self.url}) holds the database "
                                f"but does not answer ({reason}); stop it or wait") from None
        return json.loads(text) if text else None


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


def _db_path(db: str | os.PathLike[str] | None) -> Path:
    from tlog.ingest.db import default_db_path

    return Path(db).expanduser() if db is not None else default_db_path()


@contextlib.contextmanager
def reading(db: str | os.PathLike[str] | None) -> Iterator[ServiceInfo | None]:
    """Make ``db`` readable by this process for the ``with`` block.

    Without a live service this does nothing (yields None). With one, it takes
    a lease (module docstring) and gives it back on leaving, so that the
    block's own ``connect(db, read_only=True)`` works unchanged.

    Raises:
        DatabaseError: the service did not grant the lease.
    """
    info = live_service(_db_path(db))
    if info is None:
        yield None
        return
    lease = info.request("POST", "/api/lease", {"pid": os.getpid()})["lease"]
    try:
        yield info
    finally:
        with contextlib.suppress(DatabaseError):
            info.request("DELETE", f"/api/lease/{lease}")


def refuse_writes(db: str | os.PathLike[str] | None, command: str) -> None:
    """Raise :class:`ServedDatabaseError` when a live service owns ``db``:
    ``command`` (``ingest``, ``forget``) would need to write it.

    The message is one line naming the service and what to do instead.
    """
    info = live_service(_db_path(db))
    if info is None:
        return
    stop = f"stop it (Ctrl-C in its terminal, or kill {info.pid}) and run 'tlog {command}' again"
    if command == "ingest":
        where = ", ".join(info.watch) or "none"
        todo = (f"it ingests every run under its --watch directories ({where}): write the run "
                f"there, or {stop}")
    else:
        todo = stop
    raise ServedDatabaseError(f"the database {info.db} is held by 'tlog serve' (pid "
                              f"{info.pid}, {info.url}); {todo}")
