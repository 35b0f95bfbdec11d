"""Fixtures of the whole suite.

``sys`` sampling off by default (``TLOG_SYS_INTERVAL=0``, inherited by the
subprocesses tests start): the shim writes a ``sys`` record every 2 s of wall
time, so their number in a run depends on how long it took, while most tests
assert the exact records and counts of the kinds they are about. Tests of the
sampler and of what is built on it turn it on themselves: ``Recorder(...,
sys_interval=...)`` (an argument wins over the environment) or
``monkeypatch.setenv("TLOG_SYS_INTERVAL", ...)``.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Sampling off for module- and session-scoped fixtures too: they run before
    the function-scoped fixture below (a module fixture's loop recorded ``sys``
    samples at the default 2 s, and its run got the machine's findings)."""
    os.environ["TLOG_SYS_INTERVAL"] = "0"


@pytest.fixture(autouse=True)
def _sys_sampling_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLOG_SYS_INTERVAL", "0")
