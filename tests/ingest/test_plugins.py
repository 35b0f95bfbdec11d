"""``ingest.plugins``: a plugin loaded with a time bound that a hang cannot pass."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest
from tlog.ingest.plugins import (
    DEFAULT_TIMEOUT_S,
    HARD_FACTOR,
    PluginTimeoutError,
    load_plugin,
    plugin_timeout_s,
)


@pytest.mark.parametrize(("value", "seconds"), [(None, DEFAULT_TIMEOUT_S), ("2.5", 2.5),
                                                ("0", DEFAULT_TIMEOUT_S),
                                                ("-1", DEFAULT_TIMEOUT_S),
                                                ("soon", DEFAULT_TIMEOUT_S)])
def test_the_bound(monkeypatch, value, seconds) -> None:
    if value is None:
        monkeypatch.delenv("TLOG_PLUGIN_TIMEOUT_S", raising=False)
    else:
        monkeypatch.setenv("TLOG_PLUGIN_TIMEOUT_S", value)
    assert plugin_timeout_s() == seconds


def test_what_load_returns_or_raises() -> None:
    assert load_plugin(lambda: 42, timeout_s=5) == 42
    with pytest.raises(KeyError, match="missing"):
        load_plugin(lambda: {}["missing"], timeout_s=5)
    # a plugin's sys.exit() must not end tlog
    with pytest.raises(RuntimeError, match="SystemExit 3"):
        load_plugin(lambda: sys.exit(3), timeout_s=5)


def test_a_hang_is_given_up_after_the_bound() -> None:
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(PluginTimeoutError, match=r"made no progress for 0.2 s"):
        load_plugin(release.wait, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 5.0
    release.set()


def test_progress_keeps_it_loading_up_to_the_hard_bound(monkeypatch) -> None:
    # a load that adds a module every 0.05 s never stalls for 0.1 s, but it is given
    # up at HARD_FACTOR (6) times the bound
    stop = threading.Event()

    def busy():
        k = 0
        while not stop.is_set():
            name = f"_tlog_test_plugin_mod_{k}"
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
            k += 1
            time.sleep(0.02)

    t0 = time.monotonic()
    with pytest.raises(PluginTimeoutError, match=r"did not load within 0.6 s"):
        load_plugin(busy, timeout_s=0.1)
    assert time.monotonic() - t0 >= HARD_FACTOR * 0.1
    stop.set()
