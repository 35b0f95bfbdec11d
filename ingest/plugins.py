"""Loading plugins (entry points of ``tlog.sources`` and ``tlog.rules``) with a time bound.

A plugin is third-party code that runs when tlog imports it. One whose import
never returns (a network call, a lock, a loop) must not hang ``tlog ingest``
or ``tlog diagnose``: :func:`load_plugin` runs the import in a daemon thread
and gives up once it has made no progress (no new module in ``sys.modules``)
for :func:`plugin_timeout_s` seconds, or has run :data:`HARD_FACTOR` times
that long, raising :class:`PluginTimeoutError`; the caller leaves the plugin
out with one warning. Progress, not total time: a plugin importing polars
and scipy from a cold disk on a loaded machine took 14 s (2.9 s of CPU), a
hang adds no module. The thread is abandoned (Python cannot stop it); as a
daemon it does not keep tlog from exiting.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Environment variable: seconds a plugin may take to load.
TIMEOUT_ENV = "TLOG_PLUGIN_TIMEOUT_S"
#: Default of :data:`TIMEOUT_ENV`, seconds (tlog's choice: a plugin that imports
#: torch takes 2-5 s on a loaded machine; a hang is seen within this bound).
DEFAULT_TIMEOUT_S = 10.0
#: A plugin still loading after this many times the bound is given up even while
#: it imports modules (tlog's choice).
HARD_FACTOR = 6
#: Seconds between two looks at the loading thread.
_POLL_S = 0.05


class PluginTimeoutError(Exception):
    """A plugin did not finish loading within the time bound."""


def plugin_timeout_s() -> float:
    """Seconds a plugin may take to load: ``$TLOG_PLUGIN_TIMEOUT_S`` when it is a
    positive number, else :data:`DEFAULT_TIMEOUT_S`."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def load_plugin(load: Callable[[], T], *, timeout_s: float | None = None) -> T:
    """``load()`` (import an entry point and make its object), bounded in time.

    Args:
        load: what loads the plugin, run in a daemon thread.
        timeout_s: the bound, seconds (default :func:`plugin_timeout_s`).

    Returns:
        What ``load`` returned.

    Raises:
        PluginTimeoutError: ``load`` made no progress (imported no module) for
            the bound, or ran :data:`HARD_FACTOR` times the bound.
        Exception: what ``load`` raised (an exception that is not an
            ``Exception``, such as ``SystemExit`` from the plugin, becomes a
            ``RuntimeError`` naming it, so a plugin cannot end tlog).
    """
    bound = plugin_timeout_s() if timeout_s is None else timeout_s
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = load()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="tlog-plugin-load", daemon=True)
    start = last = time.monotonic()
    modules = len(sys.modules)
    thread.start()
    while True:
        thread.join(_POLL_S)
        if not thread.is_alive():
            break
        now = time.monotonic()
        if len(sys.modules) != modules:
            modules, last = len(sys.modules), now
        if now - last >= bound:
            msg = (f"its import made no progress for {bound:g} s (it hangs; "
                   f"${TIMEOUT_ENV} sets the bound)")
            raise PluginTimeoutError(msg)
        if now - start >= HARD_FACTOR * bound:
            msg = (f"it did not load within {HARD_FACTOR * bound:g} s "
                   f"(${TIMEOUT_ENV} sets the bound, {HARD_FACTOR}x)")
            raise PluginTimeoutError(msg)
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, Exception):
            raise exc
        msg = f"{type(exc).__name__} {exc}".rstrip()
        raise RuntimeError(msg) from exc
    return box["value"]  # type: ignore[return-value]
