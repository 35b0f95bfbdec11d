"""Fixtures of the runtime-shim tests: a frozen, settable clock."""

from __future__ import annotations

import pytest
from runtime_helpers import WALL0, FakeClock

from dflash_runtime import queues, recorder, writer


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Freeze the shim's clocks: perf_counter -> ``clock.t``, wall = WALL0 + perf_counter,
    thread CPU time (either clock the recorder picks) -> ``clock.cpu.t``."""
    c = FakeClock(100.0)
    c.cpu = FakeClock(10.0)
    monkeypatch.setattr(recorder, "_pc", c)
    monkeypatch.setattr(queues, "_pc", c)
    monkeypatch.setattr(writer, "_pc", lambda: c.t)
    monkeypatch.setattr(writer, "_wall", lambda: WALL0 + c.t)
    monkeypatch.setattr(recorder, "_tt", c.cpu)
    monkeypatch.setattr(recorder, "_booked_thread_time", c.cpu)
    return c
