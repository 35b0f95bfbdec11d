"""Open a report in headless Chromium and read back what happened.

Used by the report tests and the report benchmark, and handy on a headless
box to check a report before sharing it. It speaks the Chrome DevTools
Protocol over ``--remote-debugging-pipe`` (JSON messages ending in ``\\0`` on
file descriptors 3 and 4), so it needs no websocket library and no network
port. It records:

- console errors (``Runtime.consoleAPICalled`` with type ``error`` or
  ``assert``), uncaught exceptions (``Runtime.exceptionThrown``) and browser
  log errors (``Log.entryAdded`` level ``error``: failed loads, CSP refusals);
- every request for something other than ``file:``, ``data:``, ``blob:`` or
  ``about:`` (the browser is also put offline and its DNS resolver disabled);
- JavaScript dialogs (an ``alert()`` that ran is one: the XSS check);
- the page's ``window.tlogStatus`` (see :mod:`reports.html`) and its text.

Chromium is found as ``$TLOG_CHROMIUM``, else ``chromium``,
``chromium-browser``, ``google-chrome`` on ``PATH`` (:func:`find_chromium`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlog.ingest.errors import TlogError

#: Environment variable naming the Chromium executable to use.
CHROMIUM_ENV = "TLOG_CHROMIUM"
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Flags for a quiet, offline, throw-away browser (the issue's list, plus
#: ``--disable-dev-shm-usage`` for containers and a resolver that resolves nothing).
CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--window-size=1280,2000",
    "--remote-debugging-pipe",
)

_LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome-error:")


class BrowserError(TlogError):
    """Headless Chromium could not be started, or did not answer in time."""


@dataclass
class BrowserResult:
    """What a page did in headless Chromium.

    Attributes:
        console_errors: console ``error``/``assert`` messages, uncaught
            exceptions and browser log errors, in order.
        requests: URLs of every non-local request the page tried.
        dialogs: messages of JavaScript dialogs (``alert`` etc.) that opened.
        status: the page's ``window.tlogStatus`` (``{}`` when it has none).
        text: the page's visible text (``document.body.innerText``).
        values: results of the extra expressions asked for, by name.
        wall_s: seconds from navigation start until the page said it was done
            (or the timeout).
        timed_out: the page did not finish within the timeout.
    """

    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    timed_out: bool = False


_TRAMPOLINE = (
    "import os,sys; r,w=int(sys.argv[1]),int(sys.argv[2]); os.dup2(r,3); os.dup2(w,4); "
    "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])"
)


def _high_pipe() -> tuple[int, int]:
    """A pipe whose two ends are file descriptors >= 10 (close-on-exec)."""
    import fcntl

    ends = []
    for fd in os.pipe():
        ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return ends[0], ends[1]


def find_chromium() -> str | None:
    """Path of a Chromium executable, or ``None`` when none is installed."""
    env = os.environ.get(CHROMIUM_ENV)
    if env:
        return shutil.which(env) or (env if Path(env).is_file() else None)
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class _Pipe:
    """The DevTools protocol over a pair of pipes: send commands, collect events."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int, read_fd: int) -> None:
        self.proc = proc
        self.write_fd = write_fd
        self.read_fd = read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.replies: dict[int, dict[str, Any]] = {}

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> int:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self.write_fd, data)
            data = data[n:]
        return self.next_id

    def _read_some(self, deadline: float) -> None:
        import select

        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([self.read_fd], [], [], min(left, 0.5))
        if not ready:
            if self.proc.poll() is not None:
                msg = f"chromium exited with code {self.proc.returncode}"
                raise BrowserError(msg)
            return
        chunk = os.read(self.read_fd, 1 << 20)
        if not chunk:
            msg = "chromium closed the DevTools pipe"
            raise BrowserError(msg)
        self.buffer += chunk
        while b"\0" in self.buffer:
            raw, _, self.buffer = self.buffer.partition(b"\0")
            msg_obj = json.loads(raw)
            if "id" in msg_obj:
                self.replies[msg_obj["id"]] = msg_obj
                continue
            self.events.append(msg_obj)
            if msg_obj.get("method") == "Page.javascriptDialogOpening":
                # A dialog blocks the page (and every Runtime.evaluate): close it now.
                self.send("Page.handleJavaScriptDialog", {"accept": True}, msg_obj.get("sessionId"))

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        *,
        deadline: float,
    ) -> dict[str, Any]:
        ident = self.send(method, params, session)
        while ident not in self.replies:
            self._read_some(deadline)
        reply = self.replies.pop(ident)
        if "error" in reply:
            msg = f"DevTools {method} failed: {reply['error'].get('message')}"
            raise BrowserError(msg)
        return reply.get("result", {})

    def pump(self, deadline: float) -> None:
        """Read whatever arrives until ``deadline`` or one read cycle."""
        try:
            self._read_some(deadline)
        except TimeoutError:
            pass


def _remote_text(obj: dict[str, Any]) -> str:
    if "value" in obj:
        return str(obj["value"])
    return str(obj.get("description") or obj.get("unserializableValue") or obj.get("type"))


def open_page(
    path: str | Path,
    *,
    timeout_s: float = 60.0,
    evaluate: dict[str, str] | None = None,
    chromium: str | None = None,
    screenshot: str | Path | None = None,
) -> BrowserResult:
    """Load ``path`` in a fresh headless Chromium, offline, and wait until it is drawn.

    "Drawn" means ``window.tlogStatus.done`` is true (a tlog report), or, for
    any other page, the load event plus a quiet second.

    Args:
        path: the HTML file.
        timeout_s: give up (``timed_out=True``) after this many seconds.
        evaluate: extra JavaScript expressions to evaluate at the end, by
            name; their JSON-able values land in :attr:`BrowserResult.values`.
        chromium: executable (default :func:`find_chromium`).
        screenshot: if given, a full-page PNG is written there at the end.

    Raises:
        BrowserError: Chromium is missing, cannot start, or stops answering.
    """
    exe = chromium or find_chromium()
    if exe is None:
        msg = f"no Chromium found: install Debian's 'chromium' package or set ${CHROMIUM_ENV}"
        raise BrowserError(msg)
    url = Path(path).resolve().as_uri()
    result = BrowserResult()
    with tempfile.TemporaryDirectory(prefix="tlog-chromium-") as profile:
        to_chrome_r, to_chrome_w = _high_pipe()
        from_chrome_r, from_chrome_w = _high_pipe()
        # Chromium reads commands on fd 3 and writes replies on fd 4. The pipe
        # ends sit at fds >= 10 (never 3 or 4), and a tiny Python trampoline
        # moves them into place before exec.
        cmd = [
            sys.executable,
            "-c",
            _TRAMPOLINE,
            str(to_chrome_r),
            str(from_chrome_w),
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
        ]
        try:
            proc = subprocess.Popen(
                cmd,
                pass_fds=(to_chrome_r, from_chrome_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            msg = f"cannot start chromium ({exe}): {exc.strerror}"
            raise BrowserError(msg) from exc
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        pipe = _Pipe(proc, to_chrome_w, from_chrome_r)
        try:
            _drive(pipe, url, result, timeout_s, evaluate or {}, screenshot)
        finally:
            try:
                pipe.send("Browser.close")
            except OSError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(to_chrome_w)
            os.close(from_chrome_r)
    return result


def _drive(
    pipe: _Pipe,
    url: str,
    result: BrowserResult,
    timeout_s: float,
    evaluate: dict[str, str],
    screenshot: str | Path | None,
) -> None:
    start_deadline = time.monotonic() + 30.0
    try:
        targets = pipe.call("Target.getTargets", deadline=start_deadline)["targetInfos"]
        page = next((t for t in targets if t["type"] == "page"), None)
        if page is None:
            target_id = pipe.call(
                "Target.createTarget", {"url": "about:blank"}, deadline=start_deadline
            )["targetId"]
        else:
            target_id = page["targetId"]
        session = pipe.call(
            "Target.attachToTarget",
            {"targetId": target_id, "flatten": True},
            deadline=start_deadline,
        )["sessionId"]
        for method, params in (
            ("Runtime.enable", {}),
            ("Log.enable", {}),
            ("Page.enable", {}),
            ("Network.enable", {}),
            (
                "Network.emulateNetworkConditions",
                {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            ),
        ):
            pipe.call(method, params, session, deadline=start_deadline)
    except TimeoutError:
        msg = "chromium did not answer on the DevTools pipe within 30 s"
        raise BrowserError(msg) from None

    t0 = time.monotonic()
    deadline = t0 + timeout_s
    try:
        pipe.call("Page.navigate", {"url": url}, session, deadline=deadline)
        loaded_at: float | None = None
        next_poll = 0.0
        done = False
        while not done:
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError
            for event in _take_events(pipe, session):
                if event["method"] == "Page.loadEventFired" and loaded_at is None:
                    loaded_at = time.monotonic()
                _record(pipe, session, event, result)
            if now >= next_poll:
                next_poll = now + 0.05
                state = pipe.call(
                    "Runtime.evaluate",
                    {
                        "expression": "window.tlogStatus ? (window.tlogStatus.done ? 1 : 0) : -1",
                        "returnByValue": True,
                    },
                    session,
                    deadline=deadline,
                )["result"].get("value")
                if state == 1 or (
                    state == -1 and loaded_at is not None and time.monotonic() - loaded_at > 1.0
                ):
                    done = True
                    result.wall_s = time.monotonic() - t0
                    break
            pipe.pump(min(deadline, time.monotonic() + 0.05))
    except TimeoutError:
        result.timed_out = True
        result.wall_s = time.monotonic() - t0
        deadline = time.monotonic() + 10.0
    # Let late console messages arrive, then read the page's state.
    settle = time.monotonic() + 0.2
    while time.monotonic() < settle:
        pipe.pump(settle)
    for event in _take_events(pipe, session):
        _record(pipe, session, event, result)
    exprs = {
        "status": "window.tlogStatus ? JSON.parse(JSON.stringify(window.tlogStatus)) : {}",
        "text": "document.body ? document.body.innerText : ''",
        **evaluate,
    }
    values: dict[str, Any] = {}
    for name, expr in exprs.items():
        reply = pipe.call(
            "Runtime.evaluate",
            {"expression": expr, "returnByValue": True},
            session,
            deadline=time.monotonic() + 10.0,
        )
        if "exceptionDetails" in reply:
            values[name] = None
            result.console_errors.append(
                f"evaluating {name}: {reply['exceptionDetails'].get('text')}"
            )
        else:
            values[name] = reply["result"].get("value")
    if screenshot is not None:
        import base64

        shot = pipe.call(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True},
            session,
            deadline=time.monotonic() + 30.0,
        )
        Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
    result.status = values.pop("status") or {}
    result.text = values.pop("text") or ""
    result.values = values


def _take_events(pipe: _Pipe, session: str) -> list[dict[str, Any]]:
    events = [e for e in pipe.events if e.get("sessionId") in (session, None)]
    pipe.events.clear()
    return events


def _record(pipe: _Pipe, session: str, event: dict[str, Any], result: BrowserResult) -> None:
    method = event.get("method")
    params = event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        result.console_errors.append(" ".join(_remote_text(a) for a in params.get("args", [])))
    elif method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        exc = details.get("exception") or {}
        result.console_errors.append(str(exc.get("description") or details.get("text")))
    elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        result.console_errors.append(
            f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip()
        )
    elif method == "Network.requestWillBeSent":
        req_url = params.get("request", {}).get("url", "")
        if not req_url.startswith(_LOCAL_SCHEMES):
            result.requests.append(req_url)
    elif method == "Page.javascriptDialogOpening":
        result.dialogs.append(str(params.get("message")))
