"""Queues that record their waits: drop-in ``queue.Queue`` plus a wrapper for any queue.

``TimedQueue(maxsize, name="hs_queue")`` is a ``queue.Queue``. When ``get`` or ``put``
runs inside an iteration of a recorder on the calling thread (``with
rec.iteration() as it:``), the time it blocked becomes a phase of that iteration:

- ``get`` -> phase ``get_phase`` (default ``"<name>_get"``) with kind ``starvation``
  (the consumer waited for input);
- ``put`` -> phase ``put_phase`` (default ``"<name>_put"``) with kind ``backpressure``
  (the producer waited for room).

Override the phase name per call with ``q.get(phase="hs_get")`` / ``q.put(x,
phase="hs_put")``. Like any phase, the next ``it.lap()`` measures from the end of the
wait, and inside a ``with it.phase(p)`` block the wait is the child ``p/<phase>``.

Depth samples (``queue`` records: depth and capacity) go to ``recorder`` (or, if not
given, to the recorder of the calling thread's current iteration), at most one per
``sample_interval`` seconds per queue, taken after a get or put.

:func:`timed` wraps any object with ``get``/``put`` (``multiprocessing.Queue``,
``torch.multiprocessing.Queue``) the same way without subclassing it.

Outside an iteration nothing is timed (there is no iteration to charge the wait to)
but depth samples are still taken when ``recorder`` is given.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from .format import Kind
from .recorder import Recorder, current_iteration

_pc = time.perf_counter

#: Default minimum seconds between two depth samples of one queue (10 Hz is enough to
#: see a queue fill or drain over an iteration of tens of milliseconds).
DEFAULT_SAMPLE_INTERVAL_S = 0.1

_STARVATION = Kind.STARVATION.value
_BACKPRESSURE = Kind.BACKPRESSURE.value


class _Timing:
    """The shared bookkeeping of :class:`TimedQueue` and :class:`TimedQueueProxy`."""

    def _setup(self, name: str, recorder: Recorder | None, get_phase: str | None,
               put_phase: str | None, sample_interval: float) -> None:
        if not name:
            msg = "a timed queue needs a non-empty name"
            raise ValueError(msg)
        self.name = name
        self.recorder = recorder
        self.get_phase = get_phase or f"{name}_get"
        self.put_phase = put_phase or f"{name}_put"
        self.sample_interval = sample_interval
        self._next_sample = 0.0

    def _after(self, it, phase: str, kind: str, t0: float, t1: float) -> None:
        if it is not None:
            it.add_wait(phase, t0, t1, kind)
        if t1 >= self._next_sample:
            rec = self.recorder
            if rec is None and it is not None:
                rec = it._rec
            if rec is not None:
                self._next_sample = t1 + self.sample_interval
                rec.queue_sample(self.name, self._depth(), self._capacity())

    def _depth(self) -> int:
        try:
            return int(self.qsize())
        except (NotImplementedError, OSError):  # macOS multiprocessing.Queue
            return -1

    def _capacity(self) -> int | None:
        return None


class TimedQueue(queue.Queue, _Timing):
    """A ``queue.Queue`` that records get/put waits and depth (see the module docstring).

    Args:
        maxsize: as ``queue.Queue`` (0 = unbounded).
        name: queue name in ``queue`` records and the default phase names.
        recorder: where depth samples go (default: the current iteration's recorder).
        get_phase / put_phase: default phase names of the waits.
        sample_interval: minimum seconds between depth samples.
    """

    def __init__(self, maxsize: int = 0, *, name: str = "queue", recorder: Recorder | None = None,
                 get_phase: str | None = None, put_phase: str | None = None,
                 sample_interval: float = DEFAULT_SAMPLE_INTERVAL_S) -> None:
        queue.Queue.__init__(self, maxsize)
        self._setup(name, recorder, get_phase, put_phase, sample_interval)

    def get(self, block: bool = True, timeout: float | None = None, *, phase: str | None = None):
        it = current_iteration()
        t0 = _pc()
        try:
            return queue.Queue.get(self, block, timeout)
        finally:
            self._after(it, phase or self.get_phase, _STARVATION, t0, _pc())

    def put(self, item: Any, block: bool = True, timeout: float | None = None, *,
            phase: str | None = None) -> None:
        it = current_iteration()
        t0 = _pc()
        try:
            queue.Queue.put(self, item, block, timeout)
        finally:
            self._after(it, phase or self.put_phase, _BACKPRESSURE, t0, _pc())

    def _capacity(self) -> int | None:
        return self.maxsize or None


class TimedQueueProxy(_Timing):
    """Wraps a queue-like object (``get``/``put``/``qsize``) to record its waits.

    Other attributes are passed through to the wrapped queue.
    """

    def __init__(self, q: Any, *, name: str = "queue", recorder: Recorder | None = None,
                 capacity: int | None = None, get_phase: str | None = None,
                 put_phase: str | None = None,
                 sample_interval: float = DEFAULT_SAMPLE_INTERVAL_S) -> None:
        self._q = q
        self._cap = capacity if capacity is not None else (getattr(q, "maxsize", 0) or None)
        self._setup(name, recorder, get_phase, put_phase, sample_interval)

    def get(self, *args: Any, phase: str | None = None, **kwargs: Any):
        it = current_iteration()
        t0 = _pc()
        try:
            return self._q.get(*args, **kwargs)
        finally:
            self._after(it, phase or self.get_phase, _STARVATION, t0, _pc())

    def put(self, item: Any, *args: Any, phase: str | None = None, **kwargs: Any) -> None:
        it = current_iteration()
        t0 = _pc()
        try:
            self._q.put(item, *args, **kwargs)
        finally:
            self._after(it, phase or self.put_phase, _BACKPRESSURE, t0, _pc())

    def qsize(self) -> int:
        return self._q.qsize()

    def _capacity(self) -> int | None:
        return self._cap

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._q, attr)


def timed(q: Any, **kwargs: Any) -> TimedQueueProxy:
    """Wrap ``q`` (e.g. a ``multiprocessing.Queue``) so its waits are recorded.

    Keyword arguments as :class:`TimedQueueProxy`; for ``multiprocessing.Queue`` pass
    ``capacity=`` (it does not expose its maxsize).
    """
    return TimedQueueProxy(q, **kwargs)
