"""Point-to-point waits measured: ``rec.watch_p2p()`` (or ``rec.instrument(...)``, which
calls it).

A pipeline-parallel stage spends much of its step blocked on its neighbours: a
``recv`` of activations before a forward, of gradients before a backward, a
``send`` the peer has not yet taken. Without a timer there, that wait is time in
no phase (unaccounted), or, inside a phase of the user's, compute. This module
times it as a ``sync`` phase in the iteration open on the calling thread:

==================  =========================================================
phase               what is timed
==================  =========================================================
``recv_wait``       ``dist.recv(...)``; an ``irecv(...)`` call and its
                    ``work.wait()``
``send_wait``       ``dist.send(...)``; an ``isend(...)`` call and its
                    ``work.wait()``
``send_recv_wait``  ``work.wait()`` of a batch mixing sends and receives
                    (``batch_isend_irecv`` with a coalescing backend, NCCL)
==================  =========================================================

The host inside a point-to-point call is communication, not the model's work:
issuing one can block too (gloo's ``c10d::send`` of a 24 KB tensor took up to
24 ms on a loaded machine, tests/pp), so the calls are timed with the waits.

Each is kind ``sync`` (the host blocked on another rank), top-level when no phase
is open, else a child of the open one (``forward/recv_wait``), which the analysis
carves out of its parent (docs/DIAGNOSIS.md section 1). The names are
:data:`dflash_runtime.format.P2P_WAIT_PHASES`; the analysis reads a worker whose
steady iterations hold them as a pipeline stage (docs/DIAGNOSIS.md "Pipeline
parallelism").

How: ``torch.distributed.{send, recv, isend, irecv, batch_isend_irecv}`` are
replaced, in ``torch.distributed`` and in ``torch.distributed.distributed_c10d``
alike (``P2POp`` checks its ``op`` against the latter's globals, and
``torch.distributed.pipelining`` builds its ``P2POp``\\ s from the former at call
time), by wrappers: ``send``/``recv``/``isend``/``irecv`` are timed around the
call; ``isend``/``irecv`` return the backend's ``Work`` inside a
:class:`TimedWork` whose ``wait()`` is timed (every other attribute is the ``Work``'s).
``torch.distributed.pipelining``'s schedules (GPipe, 1F1B, interleaved, zero
bubble) wait on exactly those works (``schedules._wait_batch_p2p``).
:meth:`P2PWatch.remove` puts the originals back. A ``P2POp`` built before the
watch started with the original ``isend`` fails ``batch_isend_irecv``'s check
while it runs (build them per step, as the schedules do).

Cost: a ``send``/``recv``/``wait`` outside any iteration pays one Python call
and a dict lookup; inside one, a phase begin and end (about 2 us). One watch per
process at a time. torch is imported only by :func:`watch_p2p`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Self

from .format import P2P_RECV_WAIT, P2P_SEND_RECV_WAIT, P2P_SEND_WAIT

_KIND = "sync"
#: The replaced functions of ``torch.distributed`` (module docstring).
PATCHED = ("send", "recv", "isend", "irecv", "batch_isend_irecv")

_lock = threading.Lock()
_active: P2PWatch | None = None
#: Per thread: inside a timed wait (a blocking ``send`` implemented with ``isend(...).wait()``
#: times once, as the outer call).
_inside = threading.local()


def open_iteration(rec: Any) -> Any:
    """The iteration of ``rec`` open on the calling thread (``with rec.iteration()`` or
    ``rec.begin_iteration()``), or None."""
    if not rec.enabled:
        return None
    d = rec._tls.__dict__
    for key in ("begun", "it"):
        it = d.get(key)
        if it is not None and it._active:
            return it
    return None


def _timed(fn: Callable, name: str, it: Any, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` timed as the ``sync`` phase ``name`` of ``it``."""
    _inside.on = True
    it.begin(name, kind=_KIND)
    try:
        return fn(*args, **kwargs)
    finally:
        it.end(name)
        _inside.on = False


def _where_now(where: Callable[[], Any]) -> Any:
    """``where()``, or None inside a wait already timed on this thread."""
    return None if getattr(_inside, "on", False) else where()


def _timed_call(fn: Callable, name: str, where: Callable[[], Any]) -> Callable:
    def call(*args, **kwargs):
        it = _where_now(where)
        if it is None:
            return fn(*args, **kwargs)
        return _timed(fn, name, it, args, kwargs)
    call.__name__ = call.__qualname__ = fn.__name__
    call.__doc__ = fn.__doc__
    call.__wrapped__ = fn
    return call


class TimedWork:
    """A ``torch.distributed`` ``Work`` whose ``wait()`` is timed as phase ``name``.

    Every attribute other than ``wait`` is the wrapped work's (``is_completed``,
    ``get_future``, ``exception``...). ``work`` is the backend's own object."""

    __slots__ = ("_where", "name", "work")

    def __init__(self, work: Any, name: str, where: Callable[[], Any]) -> None:
        self.work = work
        self.name = name
        self._where = where

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        """The work's ``wait()``, timed as a ``sync`` phase when an iteration is open."""
        it = _where_now(self._where)
        if it is None:
            return self.work.wait(*args, **kwargs)
        return _timed(self.work.wait, self.name, it, args, kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.work, attr)

    def __bool__(self) -> bool:
        return self.work is not None


class P2PWatch:
    """What :func:`watch_p2p` returns: the wrappers in place; :meth:`remove` undoes them."""

    def __init__(self, rec: Any, where: Callable[[], Any]) -> None:
        self.rec = rec
        self._where = where
        self._undo: list[tuple[Any, str, Any]] = []
        self._removed = False

    def _install(self, dist: Any, c10d: Any) -> None:
        where = self._where
        orig = {name: getattr(c10d, name) for name in PATCHED}

        def wrap_async(fn: Callable, name: str) -> Callable:
            def call(*args, **kwargs):
                it = _where_now(where)
                work = fn(*args, **kwargs) if it is None else _timed(fn, name, it, args, kwargs)
                return TimedWork(work, name, where) if work is not None else work
            call.__name__ = call.__qualname__ = fn.__name__
            call.__doc__ = fn.__doc__
            call.__wrapped__ = fn
            return call

        isend = wrap_async(orig["isend"], P2P_SEND_WAIT)
        irecv = wrap_async(orig["irecv"], P2P_RECV_WAIT)
        batch = orig["batch_isend_irecv"]

        def batch_isend_irecv(p2p_op_list):
            works = batch(p2p_op_list)
            ops = {getattr(p, "op", None) for p in p2p_op_list}
            name = (P2P_SEND_WAIT if ops <= {isend, orig["isend"]} else
                    P2P_RECV_WAIT if ops <= {irecv, orig["irecv"]} else P2P_SEND_RECV_WAIT)
            return [w if isinstance(w, TimedWork) or w is None else TimedWork(w, name, where)
                    for w in works]
        batch_isend_irecv.__doc__ = batch.__doc__
        batch_isend_irecv.__wrapped__ = batch

        new = {"send": _timed_call(orig["send"], P2P_SEND_WAIT, where),
               "recv": _timed_call(orig["recv"], P2P_RECV_WAIT, where),
               "isend": isend, "irecv": irecv, "batch_isend_irecv": batch_isend_irecv}
        for owner in (c10d, dist):
            for name in PATCHED:
                if getattr(owner, name, None) is orig[name]:
                    self._undo.append((owner, name, orig[name]))
                    setattr(owner, name, new[name])

    def remove(self) -> None:
        """Put back the original functions (the very objects). Idempotent."""
        global _active
        if self._removed:
            return
        self._removed = True
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)
        self._undo.clear()
        with _lock:
            if _active is self:
                _active = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et, ev, tb) -> None:
        self.remove()


def watch_p2p(rec: Any, *, where: Callable[[], Any] | None = None) -> P2PWatch | None:
    """Time ``torch.distributed``'s point-to-point waits into ``rec``'s iterations.

    Args:
        rec: the :class:`~dflash_runtime.Recorder`.
        where: returns the iteration a wait goes into, or None to leave it untimed;
            default: ``rec``'s iteration open on the calling thread
            (:func:`open_iteration`). ``rec.instrument`` passes its own (its
            automatic iteration, begun at a wait when none is open).

    Returns the :class:`P2PWatch` (``remove()`` undoes it), or None when ``rec`` is
    disabled or ``torch.distributed`` is not available.

    Raises ``RuntimeError`` when another watch is active in this process.
    """
    global _active
    if not rec.enabled:
        return None
    import torch.distributed as dist  # lazily: `import dflash_runtime` stays stdlib-only

    if not dist.is_available():
        return None
    from torch.distributed import distributed_c10d as c10d

    with _lock:
        if _active is not None:
            msg = ("dflash_runtime.watch_p2p: point-to-point waits are already watched in "
                   "this process; call that watch's remove() first")
            raise RuntimeError(msg)
        watch = P2PWatch(rec, where if where is not None else (lambda: open_iteration(rec)))
        _active = watch
    try:
        watch._install(dist, c10d)
    except BaseException:
        watch.remove()
        raise
    return watch


def active() -> P2PWatch | None:
    """The watch active in this process, or None."""
    return _active
