"""Send a run's files to a ``tlog serve`` on another host while they are written.

Used by ``tlog ship RUN_DIR --to URL`` and by the shim itself when
``TLOG_SERVER=URL`` is set (each process ships the files it writes). The
protocol (the service's side: ``tlog.web.spool``):

- each file is sent as byte ranges, ``POST URL/api/ship?run=RUN&path=REL&offset=N``,
  gzip-compressed, with ``Authorization: Bearer TOKEN`` (every write needs the
  service's token); the service appends a range only where its copy ends, so
  a range sent twice is written once;
- **at least once here**: the offset the service acknowledged for each file
  is kept on disk (``<run_dir>/.tlog-ship.json``, replaced atomically), with
  the file's identity (device and inode) and the SHA-256 of its first
  :data:`HEAD_BYTES` bytes (its fingerprint, as log shippers keep one); after
  a restart of either side the sender asks the service what it holds
  (``GET /api/ship?run=RUN``) and goes on from there;
- a file rewritten in place or replaced (its fingerprint changed, or it
  shrank) is sent again whole with ``replace=1``;
- **bounded**: the spool is the run's own files on disk, read one range of
  at most :data:`RANGE_BYTES` at a time: a slow or absent service costs no
  memory and never blocks training (the shim ships from a daemon thread and
  backs off up to :data:`MAX_BACKOFF_S` while the service is down).

Standard library only (the shim imports it).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Bytes of a file's start whose SHA-256 is its fingerprint (the service
#: imports this one). Source: tlog's choice, as Vector's and Filebeat's
#: checksum fingerprints read the first line or kilobyte.
HEAD_BYTES = 1024

#: Most bytes sent in one request, before gzip. Source: tlog's choice (the
#: service refuses more than 16 MiB once decompressed).
RANGE_BYTES = 1 << 20

#: Seconds between two passes over the files while shipping continues.
INTERVAL_S = 1.0

#: Longest wait between tries while the service does not answer.
MAX_BACKOFF_S = 30.0

#: Seconds one request may take.
TIMEOUT_S = 30.0

STATE_FILE = ".tlog-ship.json"


#: The file names a run directory's logs have (shim JSONL, ``run.json``,
#: torch.profiler traces, framework timer logs): what a sender ships by
#: default; checkpoints and other large outputs stay home.
LOG_SUFFIXES = (".jsonl", ".json", ".json.gz", ".log", ".txt", ".out")


def is_log(rel: str) -> bool:
    """Whether ``rel`` is a log file by its name (:data:`LOG_SUFFIXES`)."""
    return rel.lower().endswith(LOG_SUFFIXES)


class ShipRefused(Exception):
    """The service refused the shipment for good (bad token, bad run name ...):
    trying again will not help. The message is one line."""


class ServiceDown(Exception):
    """The service did not answer (or answered 5xx): try again later."""


@dataclass
class _File:
    dev_ino: tuple[int, int]
    head: str
    head_len: int
    sent: int

    def to_json(self) -> dict[str, object]:
        return {"dev_ino": list(self.dev_ino), "head": self.head, "head_len": self.head_len,
                "sent": self.sent}


def head_digest(path: Path, n: int) -> str:
    """SHA-256 (hex) of the first ``n`` bytes of ``path``: a file's fingerprint,
    here and on the service (``tlog.web.spool``)."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read(n)).hexdigest()


def safe_name(name: str) -> str:
    """``name`` as the service takes run names: letters, digits and ``_.+=@-``
    (others become ``_``), at most 128 characters, not starting with a dot."""
    return "".join(c if c.isalnum() or c in "_.+=@-" else "_" for c in name)[:128].lstrip(".")


def default_run_name(run_dir: Path) -> str:
    """The run's name on the service: ``run.json``'s ``run_id`` when it has
    one, else the directory's name (:func:`safe_name`)."""
    try:
        raw = json.loads((run_dir / "run.json").read_text())
        rid = raw.get("run_id") if isinstance(raw, dict) else None
    except (OSError, ValueError):
        rid = None
    return safe_name(rid if isinstance(rid, str) and rid else run_dir.name)


@dataclass
class Shipper:
    """Ships the files of ``run_dir`` to the service at ``url`` (module docstring).

    Args:
        run_dir: the run directory.
        url: the service's base URL (``http://host:8765``).
        token: the service's write token.
        run: the run's name on the service (default :func:`default_run_name`).
        only: ship only the files (relative paths) this returns True for
            (default :func:`is_log`; the shim: the files its own process writes).
        state_path: where the acknowledged offsets are kept (default
            ``<run_dir>/.tlog-ship.json``; the shim keeps one per process).
    """

    run_dir: Path
    url: str
    token: str | None
    run: str | None = None
    only: Callable[[str], bool] | None = None
    state_path: Path | None = None
    files: dict[str, _File] = field(default_factory=dict)
    bytes_sent: int = 0
    requests: int = 0
    _synced: bool = False

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        if self.run is not None:
            self.run = safe_name(self.run)
        if self.state_path is None:
            self.state_path = self.run_dir / STATE_FILE
        self._load_state()

    # --- the state on disk ------------------------------------------------------------

    def _load_state(self) -> None:
        try:
            raw = json.loads(Path(self.state_path).read_text())
            if raw.get("url") != self.url or (self.run and raw.get("run") != self.run):
                return            # another service or run: start from what it holds
            self.run = self.run or raw.get("run")
            self.files = {k: _File(tuple(v["dev_ino"]), v["head"], int(v["head_len"]),
                                   int(v["sent"])) for k, v in raw["files"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.files = {}

    def _save_state(self) -> None:
        path = Path(self.state_path)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        body = {"url": self.url, "run": self.run,
                "files": {k: f.to_json() for k, f in self.files.items()}}
        try:
            tmp.write_text(json.dumps(body))
            os.replace(tmp, path)
        except OSError:
            pass          # a full disk: offsets are asked of the service next time

    # --- requests -----------------------------------------------------------------------

    def _request(self, method: str, query: dict[str, str], body: bytes | None = None
                 ) -> tuple[int, dict]:
        target = (self.url.rstrip("/") + "/api/ship?" + urllib.parse.urlencode(query))
        req = urllib.request.Request(target, data=body, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if body is not None:
            req.add_header("Content-Type", "application/octet-stream")
            req.add_header("Content-Encoding", "gzip")
        self.requests += 1
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read() or b"{}")
            except (ValueError, OSError):
                answer = {}
            if exc.code == 409:
                return 409, answer
            if exc.code >= 500:
                raise ServiceDown(f"{exc.code} {answer.get('error') or exc.reason}") from None
            raise ShipRefused(f"tlog serve at {self.url} refused the run: "
                              f"{answer.get('error') or exc.reason} (HTTP {exc.code})") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServiceDown(str(getattr(exc, "reason", exc))) from None

    def _sync(self) -> None:
        """Take the service's sizes as the acknowledged offsets (after a restart)."""
        _, answer = self._request("GET", {"run": self.run or ""})
        held = answer.get("files") or {}
        for rel, f in list(self.files.items()):
            copy = held.get(rel)
            if copy is None:
                f.sent = 0
            elif copy["size"] < f.sent:
                f.sent = copy["size"]
        for rel, copy in held.items():
            if rel not in self.files:
                path = self.run_dir / rel
                try:
                    st = path.stat()
                except OSError:
                    continue
                n = min(copy["size"], HEAD_BYTES)
                if head_digest(path, n) == copy["head"] and copy["size"] <= st.st_size:
                    self.files[rel] = _File((st.st_dev, st.st_ino), head_digest(path, min(
                        st.st_size, HEAD_BYTES)), min(st.st_size, HEAD_BYTES), copy["size"])
        self._synced = True

    # --- one pass -------------------------------------------------------------------------

    def _candidates(self) -> list[str]:
        out = []
        for dirpath, dirnames, filenames in os.walk(self.run_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith(".") or name.endswith(".tmp"):
                    continue
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                rel = p.relative_to(self.run_dir).as_posix()
                if (self.only or is_log)(rel):
                    out.append(rel)
        return out

    def ship_once(self) -> int:
        """One pass: send what is new in every file; return the bytes sent.

        Raises:
            ServiceDown: the service did not answer (what was acknowledged is kept).
            ShipRefused: the service refused for good.
        """
        if self.run is None:
            self.run = default_run_name(self.run_dir)
        if not self._synced:
            self._sync()
        sent = 0
        for rel in self._candidates():
            sent += self._ship_file(rel)
        return sent

    def unsent(self) -> dict[str, int]:
        """Bytes of each file not acknowledged by the service yet (only those with some)."""
        out = {}
        for rel in self._candidates():
            try:
                size = (self.run_dir / rel).stat().st_size
            except OSError:
                continue
            f = self.files.get(rel)
            left = size - (f.sent if f is not None else 0)
            if left > 0:
                out[rel] = left
        return out

    def _ship_file(self, rel: str) -> int:
        path = self.run_dir / rel
        try:
            st = path.stat()
        except OSError:
            return 0
        f = self.files.get(rel)
        ident = (st.st_dev, st.st_ino)
        head_len = min(st.st_size, HEAD_BYTES)
        replace = False
        if f is not None:
            changed = (f.dev_ino != ident or st.st_size < f.sent
                       or (f.head_len and head_digest(path, f.head_len) != f.head))
            if changed:
                f, replace = None, True
        if f is None:
            f = _File(ident, head_digest(path, head_len), head_len, 0)
            self.files[rel] = f
        elif f.head_len < HEAD_BYTES and st.st_size > f.head_len:
            f.head_len, f.head = head_len, head_digest(path, head_len)
        total = 0
        while f.sent < st.st_size or replace:
            with open(path, "rb") as fh:
                fh.seek(f.sent)
                data = fh.read(RANGE_BYTES)
            status, answer = self._request(
                "POST", {"run": self.run or "", "path": rel, "offset": str(f.sent),
                         **({"replace": "1"} if replace else {})},
                gzip.compress(data, compresslevel=1))
            if status == 409:           # the service holds another length: go on from it
                size = int(answer.get("size", 0))
                mine = head_digest(path, min(size, HEAD_BYTES)) if size <= st.st_size else None
                if mine is not None and mine == answer.get("head"):
                    f.sent = size
                elif rel.endswith(".jsonl") and not replace:
                    # a log this sender never sent: another job's of the same run name
                    raise ShipRefused(
                        f"tlog serve at {self.url} holds another {rel} for run {self.run} "
                        f"(another job of the same name?): give this run its own name "
                        f"(tlog ship --run NAME, or TLOG_RUN_ID)")
                else:
                    f.sent, replace = 0, True      # its copy is an older version: replace
                continue
            f.sent = int(answer["size"])
            replace = False
            total += len(data)
            self.bytes_sent += len(data)
            self._save_state()
            if not data:
                break
        return total


class ShipThread(threading.Thread):
    """Ship ``shipper``'s run every :data:`INTERVAL_S` seconds from a daemon
    thread until :meth:`stop` (then one last pass); back off while the service
    is down; stop for good, telling ``warn`` once, when it refuses."""

    def __init__(self, shipper: Shipper, warn: Callable[[str], None],
                 interval_s: float = INTERVAL_S) -> None:
        super().__init__(name="tlog-ship", daemon=True)
        self.shipper = shipper
        self.warn = warn
        self.interval_s = interval_s
        self._halt = threading.Event()
        self.refused: str | None = None

    def run(self) -> None:
        backoff = self.interval_s
        said_down = False
        while True:
            halting = self._halt.is_set()
            try:
                self.shipper.ship_once()
                backoff, said_down = self.interval_s, False
                if halting:
                    return
            except ShipRefused as exc:
                self.refused = str(exc)
                self.warn(str(exc))
                return
            except ServiceDown as exc:
                if not said_down and not halting:
                    self.warn(f"tlog serve at {self.shipper.url} does not answer ({exc}); "
                              f"the logs stay on disk and are sent when it is back")
                    said_down = True
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                if halting:          # at exit: try again until stop()'s deadline
                    if time.monotonic() + 0.5 >= self._deadline:
                        return
                    time.sleep(0.5)
                    continue
            self._halt.wait(backoff)

    _deadline = 0.0

    def stop(self, timeout_s: float = 10.0) -> None:
        """Make a last pass (trying again for at most ``timeout_s`` while the
        service does not answer), then end; say on ``warn`` what stayed unsent,
        and the command that sends it."""
        self._deadline = time.monotonic() + timeout_s
        self._halt.set()
        if self.is_alive():
            self.join(timeout_s + 1.0)
        if self.refused is not None:
            return
        left = self.shipper.unsent()
        if left:
            s = self.shipper
            self.warn(f"{sum(left.values()):,} bytes of {', '.join(sorted(left))} were not "
                      f"sent to {s.url} (it did not answer in time); send them with: "
                      f"tlog ship {s.run_dir} --to {s.url} --run {s.run}")


SERVER_ENV, TOKEN_ENV = "TLOG_SERVER", "TLOG_TOKEN"

_threads: dict[tuple[int, str], ShipThread] = {}
_threads_lock = threading.Lock()


def _warn(message: str) -> None:
    import sys

    try:
        sys.stderr.write(f"tlog: {message}\n")
    except (OSError, ValueError):
        pass


def start_from_env(run_dir: Path, owned: Callable[[str], bool], name: str,
                   run: str | None = None) -> ShipThread | None:
    """With ``TLOG_SERVER`` set (and ``TLOG_TOKEN``, the service's write
    token), ship the files of ``run_dir`` that ``owned`` says this process
    writes, from a daemon thread (one per process and run directory);
    ``name`` names its state file (``.tlog-ship.<name>.json``); ``run``: the
    run's name on the service (the run id: every rank of every node sends to
    one run). Returns the thread, or None without ``TLOG_SERVER``."""
    url = os.environ.get(SERVER_ENV, "").strip()
    if not url:
        return None
    key = (os.getpid(), str(run_dir))
    with _threads_lock:
        thread = _threads.get(key)
        if thread is None:
            safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)
            shipper = Shipper(Path(run_dir), url, os.environ.get(TOKEN_ENV) or None,
                              run=run, only=owned,
                              state_path=Path(run_dir) / f".tlog-ship.{safe}.json")
            thread = ShipThread(shipper, _warn)
            thread.start()
            _threads[key] = thread
    return thread


def stop_all(timeout_s: float = 10.0) -> None:
    """End this process's ship threads after one last pass each (at exit)."""
    with _threads_lock:
        mine = [t for (pid, _), t in _threads.items() if pid == os.getpid()]
    for t in mine:
        t.stop(timeout_s)
