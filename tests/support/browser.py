"""Open a tlog report in headless Chromium, offline, and read back what happened.

Used by the browser tests (tests/reports/test_report_browser.py) and the report
benchmark (benchmarks/bench_report.py). It drives Debian's ``chromium`` by its
path with Playwright (``executable_path``; Playwright's own browser download
is never used: set ``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1`` when installing).
Each page gets a fresh browser context (its own profile, nothing shared with
other pages), offline, with DNS resolving nothing. It records:

- console errors: ``console.error``/``console.assert`` messages, browser log
  errors (failed loads, CSP refusals: Chromium reports them as console
  messages of type ``error``) and uncaught exceptions (``pageerror``);
- every request for something other than ``file:``, ``data:``, ``blob:`` or
  ``about:``;
- JavaScript dialogs (an ``alert()`` that ran is one: the XSS check); each is
  accepted so it cannot block the page;
- the page's ``window.tlogStatus`` (see :mod:`tlog.reports.html`) and its text.

Chromium is ``$TLOG_CHROMIUM``, else ``chromium``, ``chromium-browser``,
``google-chrome`` on ``PATH`` (:func:`find_chromium`).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

#: Environment variable naming the Chromium executable to use.
CHROMIUM_ENV = "TLOG_CHROMIUM"
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Flags for a quiet, offline browser: the issue's three, then a resolver that
#: resolves nothing, no QUIC, and /tmp instead of a small /dev/shm in containers.
#: (Playwright adds its own quiet-browser defaults: no first run, no sync, ...)
CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--disable-quic",
    "--disable-dev-shm-usage",
)
#: Viewport of every page, CSS pixels (the reports lay out for a desktop width).
VIEWPORT = {"width": 1280, "height": 2000}

_LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome-error:")
_DONE = "() => !!(window.tlogStatus && window.tlogStatus.done)"


class BrowserError(RuntimeError):
    """Chromium is missing or could not be started."""


@dataclass
class BrowserResult:
    """What a page did in headless Chromium.

    Attributes:
        console_errors: console ``error``/``assert`` messages, browser log
            errors and uncaught exceptions, in order.
        requests: URLs of every non-local request the page tried.
        dialogs: messages of JavaScript dialogs (``alert`` etc.) that opened.
        status: the page's ``window.tlogStatus`` (``{}`` when it has none).
        text: the page's visible text (``document.body.innerText``).
        values: results of the extra expressions asked for, by name.
        wall_s: seconds from navigation start until ``window.tlogStatus.done``
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


class Browser:
    """One headless Chromium, started on ``__enter__`` and closed on ``__exit__``.

    Open any number of pages with :meth:`open`; each gets a fresh context.

    Args:
        chromium: executable (default :func:`find_chromium`).
        loopback: let ``127.0.0.1`` through the resolver rules (for
            :meth:`service_page`; every other host still resolves to nothing).

    Raises:
        BrowserError: (on ``__enter__``) Chromium is missing or cannot start.
    """

    def __init__(self, chromium: str | None = None, *, loopback: bool = False) -> None:
        self.executable = chromium or find_chromium()
        self.flags = list(CHROMIUM_FLAGS)
        if loopback:    # a local service: 127.0.0.1 resolves, every other name still not
            self.flags = [f + ", EXCLUDE 127.0.0.1" if f.startswith("--host-resolver-rules=")
                          else f for f in self.flags]
        self._pw: Any = None
        self._browser: Any = None

    def __enter__(self) -> Self:
        from playwright.sync_api import Error, sync_playwright

        if self.executable is None:
            msg = f"no Chromium found: install Debian's 'chromium' package or set ${CHROMIUM_ENV}"
            raise BrowserError(msg)
        self._pw = sync_playwright().start()
        try:
            self._browser = self._pw.chromium.launch(
                executable_path=self.executable, args=self.flags, headless=True
            )
        except Error as exc:
            self._pw.stop()
            msg = f"cannot start chromium ({self.executable}): {exc.message.splitlines()[0]}"
            raise BrowserError(msg) from exc
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._browser.close()
        finally:
            self._pw.stop()

    @contextmanager
    def service_page(self, origin: str) -> Iterator[ServicePage]:
        """A page for the HTTP service at ``origin`` (``http://127.0.0.1:PORT``),
        in a fresh context: every request elsewhere is refused and recorded,
        console errors and dialogs are recorded (the XSS checks)."""
        result = BrowserResult()
        context = self._browser.new_context(viewport=VIEWPORT)

        def _route(route: Any) -> None:
            url = route.request.url
            if url.startswith((origin + "/", "data:", "blob:", "about:")):
                route.continue_()
            else:
                result.requests.append(url)
                route.abort()

        try:
            context.route("**/*", _route)
            page = context.new_page()
            page.on("console", lambda m: _console(m, result))
            page.on("pageerror", lambda e: result.console_errors.append(e.stack or e.message))

            def _dialog(dialog: Any) -> None:
                result.dialogs.append(dialog.message)
                dialog.accept()

            page.on("dialog", _dialog)
            yield ServicePage(page, result)
        finally:
            context.close()

    def open(
        self,
        path: str | Path,
        *,
        timeout_s: float = 60.0,
        evaluate: dict[str, str] | None = None,
        screenshot: str | Path | None = None,
    ) -> BrowserResult:
        """Load ``path`` offline and wait until ``window.tlogStatus.done`` is true.

        Args:
            path: the HTML file.
            timeout_s: give up (``timed_out=True``) after this many seconds.
            evaluate: extra JavaScript expressions to evaluate at the end, by
                name; their JSON-able values land in :attr:`BrowserResult.values`
                (``None``, and a console error, when one throws).
            screenshot: if given, a full-page PNG is written there at the end.
        """
        from playwright.sync_api import Error
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        result = BrowserResult()
        context = self._browser.new_context(offline=True, viewport=VIEWPORT)
        try:
            page = context.new_page()
            page.on("console", lambda m: _console(m, result))
            page.on("pageerror", lambda e: result.console_errors.append(e.stack or e.message))
            context.on("request", lambda r: _request(r.url, result))

            def _dialog(dialog: Any) -> None:
                result.dialogs.append(dialog.message)
                dialog.accept()

            page.on("dialog", _dialog)
            url = Path(path).resolve().as_uri()
            t0 = time.monotonic()
            try:
                page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
                left_ms = max(1.0, (t0 + timeout_s - time.monotonic()) * 1000)
                page.wait_for_function(_DONE, polling="raf", timeout=left_ms)
            except PlaywrightTimeout:
                result.timed_out = True
            result.wall_s = time.monotonic() - t0
            page.wait_for_timeout(200)  # let late console messages arrive
            exprs = {
                "status": "window.tlogStatus ? JSON.parse(JSON.stringify(window.tlogStatus)) : {}",
                "text": "document.body ? document.body.innerText : ''",
                **(evaluate or {}),
            }
            values: dict[str, Any] = {}
            for name, expr in exprs.items():
                try:
                    values[name] = page.evaluate(expr)
                except Error as exc:
                    values[name] = None
                    result.console_errors.append(f"evaluating {name}: {exc.message}")
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            context.close()
        result.status = values.pop("status") or {}
        result.text = values.pop("text") or ""
        result.values = values
        return result


class ServicePage:
    """A page of a local HTTP service held open in a fresh context (:meth:`Browser.service_page`).

    Attributes:
        page: the Playwright page (navigate with ``goto``; evaluate; wait).
        result: console errors, dialogs and requests to anywhere but the
            service's origin (those are refused), as :class:`BrowserResult`.
    """

    def __init__(self, page: Any, result: BrowserResult) -> None:
        self.page = page
        self.result = result

    def goto(self, url: str, *, timeout_s: float = 60.0) -> None:
        """Load ``url`` and wait for its ``window.tlogStatus.done`` when it has one."""
        self.page.goto(url, wait_until="load", timeout=timeout_s * 1000)
        has_status = self.page.evaluate("() => document.querySelector('#run') !== null")
        if has_status:
            self.page.wait_for_function(_DONE, polling=100, timeout=timeout_s * 1000)

    def text(self) -> str:
        return self.page.evaluate("document.body.innerText")

    def status(self) -> dict[str, Any]:
        return self.page.evaluate(
            "window.tlogStatus ? JSON.parse(JSON.stringify(window.tlogStatus)) : {}")


def open_page(path: str | Path, *, chromium: str | None = None, **kwargs: Any) -> BrowserResult:
    """:meth:`Browser.open` in a browser started for this one page (see there for ``kwargs``).

    Raises:
        BrowserError: Chromium is missing or cannot start.
    """
    with Browser(chromium) as browser:
        return browser.open(path, **kwargs)


def _console(message: Any, result: BrowserResult) -> None:
    if message.type in ("error", "assert"):
        result.console_errors.append(message.text)


def _request(url: str, result: BrowserResult) -> None:
    if not url.startswith(_LOCAL_SCHEMES):
        result.requests.append(url)
