"""CUDA features of the shim: event pool, non-blocking resolution, allocator figures.

Imported only when a CUDA feature is used; it never imports torch itself: it works on
the ``torch`` module the training code already imported (``sys.modules``).

No function here synchronises: completion is learnt from ``Event.query()`` (returns at
once), and ``Event.elapsed_time`` is only called on pairs whose end event has
completed. torch's ``memory_stats()`` reads host-side allocator counters.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any


class EventPool:
    """Bounded pool of ``(start, end, device)`` timing-event pairs for one device.

    ``acquire`` runs on the training thread, ``release`` on the writer thread; both use
    a ``deque`` (thread-safe append/pop). At most ``cap`` pairs exist; when all are in
    flight, ``acquire`` returns ``None`` and counts the phase in :attr:`dropped`.
    """

    __slots__ = ("_created", "_dev", "_free", "_torch", "cap", "dropped")

    def __init__(self, torch: Any, device: int, cap: int) -> None:
        self._torch = torch
        self._dev = device
        self._free: deque = deque()
        self._created = 0
        self.cap = cap
        self.dropped = 0

    def acquire(self):
        try:
            return self._free.pop()
        except IndexError:
            pass
        if self._created >= self.cap:
            self.dropped += 1
            return None
        self._created += 1
        event = self._torch.cuda.Event
        return (event(enable_timing=True), event(enable_timing=True), self._dev, self)

    def release(self, pair) -> None:
        self._free.append(pair)


def pairs_done(pairs) -> bool:
    """True when every end event in ``pairs`` has completed (``Event.query()``, no sync)."""
    for p in pairs:
        if not p[1].query():
            return False
    return True


def set_writer_device(torch: Any, device: int, current: list) -> None:
    """Make ``device`` current on the writer thread (events are queried with its context).

    Only for the shim's own writer thread: it changes the calling thread's current
    device. ``current`` is a one-element list holding the writer thread's device.
    """
    if device >= 0 and current[0] != device:
        torch.cuda.set_device(device)
        current[0] = device


def device_context(torch: Any, device: int):
    """A context making ``device`` current and restoring the previous one afterwards.

    For flushes on other threads (``close()``, ``atexit``, SIGTERM on the training
    thread), whose current device must not change.
    """
    if device < 0:
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def memory_figures(torch: Any) -> dict[str, int] | None:
    """Allocator figures for the ``mem`` field, or ``None`` without initialised CUDA.

    From ``torch.cuda.memory_stats()`` (host-side counters, no synchronisation):
    ``allocated`` = ``allocated_bytes.all.current``, ``reserved`` =
    ``reserved_bytes.all.current`` (bytes), ``alloc_retries`` = ``num_alloc_retries``,
    ``device_allocs`` = ``num_device_alloc`` (cumulative counts; docs/FORMAT.md ``mem``).
    """
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return None
        s = cuda.memory_stats()
    except Exception:  # noqa: BLE001 - a stats failure must not reach training
        return None
    out = {
        "allocated": s.get("allocated_bytes.all.current"),
        "reserved": s.get("reserved_bytes.all.current"),
        "alloc_retries": s.get("num_alloc_retries"),
        "device_allocs": s.get("num_device_alloc"),
    }
    return {k: int(v) for k, v in out.items() if v is not None} or None
