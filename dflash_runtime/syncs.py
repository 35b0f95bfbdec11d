"""Implicit host-device syncs caught: ``rec.catch_syncs()`` (or ``rec.instrument(..., syncs=True)``).

The calls that block the host until the device has run everything queued before
them are timed while an iteration is open, each as a ``sync``-kind child of the
phase it happens in (top-level when no phase is open), named after the operation
and the user's call site: ``optimizer_step/sync.item@train.py:212``
(:func:`dflash_runtime.format.sync_site_name`; docs/FORMAT.md "Implicit syncs").
The analysis carves it out of its parent (a child whose category differs) and the
``implicit_sync`` finding names the site with its milliseconds per iteration.

Caught (:data:`TENSOR_OPS`, :data:`SYNC_CALLS`): ``Tensor.item``, ``.tolist``,
``.cpu``, ``.to(...)`` whose result is on the CPU, ``.nonzero`` (its output
shape depends on the data), ``bool(t)``, ``float(t)``, ``int(t)`` of a tensor
that is not on the CPU; the ``synchronize`` of ``torch.cuda``, of its ``Stream`` and
of its ``Event``. Known gaps: syncs inside C++ (``torch.where(c)``
with one argument, ``masked_select``, ``unique``) and inside ``torch.compile``\\ d
graphs (traced away) are not seen.

Cost (``python -m benchmarks.bench_shim``): on a CPU tensor a patched method adds
one Python call and one ``is_cpu`` read (a few hundred ns on a call that costs about
as much; nothing else). On a device tensor: two clock reads, a frame read and a
dict lookup for the call site (the site's name is made once per call site, keyed
by code object and bytecode offset: no string work per call), and four list
appends into the iteration's raw log. No file I/O (the site's file name comes from
the code object, never from reading the source), no device access of its own.

One catcher per process at a time (:func:`catch_syncs` raises ``RuntimeError``
for a second); :meth:`SyncCatcher.remove` puts back every original attribute
(the very objects that were there). torch is imported only by :func:`catch_syncs`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Self

from .format import sync_site_name

_pc = time.perf_counter
_ENTER_X = 2  # recorder.ENTER_X (not imported: keeps this module's imports minimal)
_SYNC = "sync"

#: Tensor methods caught on a non-CPU tensor: attribute -> operation name in the phase.
TENSOR_OPS: dict[str, str] = {
    "item": "item", "tolist": "tolist", "cpu": "cpu", "nonzero": "nonzero",
    "__bool__": "bool", "__float__": "float", "__int__": "int",
}
#: Host-blocking calls caught always: (module path, owner attribute or None, name) -> op.
SYNC_CALLS: dict[tuple[str, str | None, str], str] = {
    ("torch.cuda", None, "synchronize"): "synchronize",
    ("torch.cuda", "Stream", "synchronize"): "stream_synchronize",
    ("torch.cuda", "Event", "synchronize"): "event_synchronize",
}

_lock = threading.Lock()
#: The active catcher (its ``_record``), read by the wrappers at each call.
_catcher: SyncCatcher | None = None
#: What ``Tensor.to``/``Tensor.cuda`` report host-to-device copies to
#: (:mod:`dflash_runtime.auto`): a callable ``(t0, t1)``, or None.
_h2d: Any = None
#: (owner, attribute, had it in its own __dict__, original) of each patch, in order.
_patched: list[tuple[Any, str, bool, Any]] = []
#: Call site (code object, bytecode offset, op) -> the raw-log entry of its phase.
_sites: dict[tuple, tuple] = {}
#: Directories whose frames are not the user's call site (torch, this package).
_skip_dirs: tuple[str, ...] = ()


class SyncCatcher:
    """The handle :func:`catch_syncs` returns: ``remove()`` (idempotent) undoes it.

    Attributes:
        rec: the recorder whose open iterations get the sync children.
        caught: syncs recorded so far (calls inside an open iteration).
    """

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.caught = 0
        self._active = True
        # per thread: inside a caught call (a tensor subclass's __torch_function__
        # calls the patched method again: the inner call is not a second sync)
        self._inside = threading.local()

    def _iteration(self):
        """The recorder's iteration open on this thread (begun one first), or None."""
        d = self.rec._tls.__dict__
        it = d.get("begun")
        if it is not None and it._active:
            return it
        it = d.get("it")
        return it if it is not None and it._active else None

    def _record(self, op: str, t0: float, t1: float, frame: Any) -> None:
        it = self._iteration()
        if it is None:
            return
        key = (frame.f_code, frame.f_lasti, op)
        entry = _sites.get(key)
        if entry is None:
            entry = _sites[key] = (_site_name(op, frame), _SYNC, None)
        app = it._app
        app(_ENTER_X)
        app(entry)
        app(t0)
        app(t1)
        self.caught += 1

    def remove(self) -> None:
        """Stop catching; puts back the original functions once nothing else needs them."""
        global _catcher
        with _lock:
            if not self._active:
                return
            self._active = False
            if _catcher is self:
                _catcher = None
            _maybe_unpatch()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et, ev, tb) -> None:
        self.remove()


def _site_name(op: str, frame: Any) -> str:
    """The phase name of ``op`` called from ``frame``: the first frame outside torch
    and this package (the user's line), as ``sync.<op>@<file base name>:<line>``."""
    f = frame
    while f is not None and f.f_code.co_filename.startswith(_skip_dirs):
        f = f.f_back
    if f is None:
        f = frame
    return sync_site_name(op, os.path.basename(f.f_code.co_filename) or "?", f.f_lineno or 0)


def catch_syncs(rec: Any) -> SyncCatcher:
    """Start catching implicit syncs into ``rec``'s iterations (module docstring).

    Returns the :class:`SyncCatcher` (``remove()`` stops it). Raises
    ``RuntimeError`` if another catcher is active in this process, ``ImportError``
    without torch.
    """
    global _catcher
    import torch  # noqa: F401 - lazily: `import dflash_runtime` stays standard-library only

    with _lock:
        if _catcher is not None:
            msg = ("dflash_runtime: implicit syncs are already being caught (one catcher per "
                   "process); remove() the first one")
            raise RuntimeError(msg)
        catcher = SyncCatcher(rec)
        _ensure_patched()
        _catcher = catcher
    return catcher


def set_h2d(callback: Any) -> None:
    """Report host-to-device copies (``Tensor.to``/``.cuda`` of a CPU tensor whose
    result is not on the CPU) to ``callback(t0, t1)`` (perf_counter seconds), or
    stop with None. Used by :mod:`dflash_runtime.auto`; patches like :func:`catch_syncs`."""
    global _h2d
    with _lock:
        if callback is not None:
            _ensure_patched()
            _h2d = callback
        else:
            _h2d = None
            _maybe_unpatch()


def patched() -> list[tuple[Any, str]]:
    """The ``(owner, attribute)`` pairs replaced now (empty when nothing is)."""
    return [(owner, name) for owner, name, _, _ in _patched]


# -- the patches ------------------------------------------------------------------------------

def _set(owner: Any, name: str, new: Any) -> None:
    own = name in vars(owner)
    _patched.append((owner, name, own, vars(owner)[name] if own else getattr(owner, name)))
    setattr(owner, name, new)


def _maybe_unpatch() -> None:
    if _catcher is not None or _h2d is not None:
        return
    while _patched:
        owner, name, own, orig = _patched.pop()
        if own:
            setattr(owner, name, orig)
        else:
            delattr(owner, name)


def _ensure_patched() -> None:
    global _skip_dirs
    if _patched:
        return
    import torch

    _skip_dirs = (os.path.dirname(torch.__file__) + os.sep,
                  os.path.dirname(os.path.abspath(__file__)) + os.sep)
    T = torch.Tensor
    for attr, op in TENSOR_OPS.items():
        _set(T, attr, _tensor_wrapper(getattr(T, attr), op, attr))
    _set(T, "to", _to_wrapper(T.to))
    _set(T, "cuda", _cuda_wrapper(T.cuda))
    for (mod_name, owner_name, attr), op in SYNC_CALLS.items():
        mod = sys.modules.get(mod_name) or __import__(mod_name, fromlist=["_"])
        owner = mod if owner_name is None else getattr(mod, owner_name, None)
        if owner is not None and hasattr(owner, attr):
            _set(owner, attr, _call_wrapper(getattr(owner, attr), op))


#: Methods called with no argument but the tensor: their wrapper takes none either
#: (packing ``*args, **kwargs`` costs ~60 ns a call on a CPU tensor).
_NO_ARGS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__"})


def _timed(c: SyncCatcher, op: str, fn: Any, args: tuple, kwargs: dict):
    """``fn(*args, **kwargs)`` timed as sync ``op`` of the wrapper's caller (two frames
    up); a call made inside another caught call (a tensor subclass's
    ``__torch_function__`` calling the patched method again) is not timed again."""
    inside = c._inside.__dict__
    if inside:
        return fn(*args, **kwargs)
    inside["x"] = True
    t0 = _pc()
    try:
        return fn(*args, **kwargs)
    finally:
        t1 = _pc()
        inside.clear()
        c._record(op, t0, t1, sys._getframe(2))


def _named(wrapper: Any, orig: Any, op: str) -> Any:
    wrapper.__name__ = wrapper.__qualname__ = getattr(orig, "__name__", op)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__wrapped__ = orig
    return wrapper


_NO_KWARGS: dict = {}


def _tensor_wrapper(orig: Any, op: str, attr: str = ""):
    if attr in _NO_ARGS:
        def wrapper0(self):
            if self.is_cpu:
                return orig(self)
            c = _catcher
            if c is None:
                return orig(self)
            return _timed(c, op, orig, (self,), _NO_KWARGS)

        return _named(wrapper0, orig, op)

    def wrapper(self, *args, **kwargs):
        if self.is_cpu:
            return orig(self, *args, **kwargs)
        c = _catcher
        if c is None:
            return orig(self, *args, **kwargs)
        return _timed(c, op, orig, (self, *args), kwargs)

    return _named(wrapper, orig, op)


def _call_wrapper(orig: Any, op: str):
    def wrapper(*args, **kwargs):
        c = _catcher
        if c is None:
            return orig(*args, **kwargs)
        return _timed(c, op, orig, args, kwargs)

    return _named(wrapper, orig, op)


def _to_wrapper(orig: Any):
    _getframe = sys._getframe

    def to(self, *args, **kwargs):
        if self.is_cpu:
            h = _h2d
            if h is None:
                return orig(self, *args, **kwargs)
            t0 = _pc()
            out = orig(self, *args, **kwargs)
            if out is not self and not out.is_cpu:
                h(t0, _pc())
            return out
        c = _catcher
        if c is None:
            return orig(self, *args, **kwargs)
        inside = c._inside.__dict__
        if inside:  # inside another caught call (see _timed)
            return orig(self, *args, **kwargs)
        inside["x"] = True
        t0 = _pc()
        try:
            out = orig(self, *args, **kwargs)
        finally:
            inside.clear()
        if out.is_cpu:
            c._record("to_cpu", t0, _pc(), _getframe(1))
        return out

    return _named(to, orig, "to")


def _cuda_wrapper(orig: Any):
    def cuda(self, *args, **kwargs):
        h = _h2d
        if h is None or not self.is_cpu:
            return orig(self, *args, **kwargs)
        t0 = _pc()
        out = orig(self, *args, **kwargs)
        h(t0, _pc())
        return out

    return _named(cuda, orig, "cuda")
