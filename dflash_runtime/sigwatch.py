"""Make the shim's SIGTERM handler run even when the main thread sits in a blocking wait.

Why: CPython runs a Python-level signal handler only on the main thread, between
bytecodes or when a blocking call it made returns ``EINTR``. A signal that lands
after the main thread's last check but before it enters the wait (the classic race),
or that the kernel hands to another thread, only sets CPython's "tripped" flag: a
wait with no timeout is never interrupted and the handler never runs. Without tlog
SIGTERM's default action kills the process at once, so installing the shim's flush
handler must not make SIGTERM unreliable. It did: a ``multiprocessing.Pool`` worker
that records, ended by ``Pool.terminate()`` (the worker is in ``SemLock.acquire``,
the lock the parent holds for good), lived on in 1 to 5 of every 200 runs beside a
busy loop, and the parent's ``join()`` hung (tests/runtime/test_load.py;
tests/runtime/test_sigwatch.py makes the race certain by sending the signal to
another thread).

How: :func:`install` (main thread) points CPython's wakeup fd
(:func:`signal.set_wakeup_fd`) at a pipe of this module's, unless something else
(asyncio's loop, trio) already holds it, in which case nothing is installed and
the race stays as it is. CPython's C-level handler writes the signal's number to the
pipe at once, from whichever thread took it. A watcher thread (``tlog-signals``)
reads the pipe; when a watched signal arrives and the Python handler has not
started (:func:`note_started`) within :data:`POKE_AFTER_S`, it sends the signal
again to the main thread alone (:func:`signal.pthread_kill`). That interrupts the
main thread's wait with ``EINTR``, and CPython runs the handler before it retries
the wait (PEP 475). The poke repeats, each gap twice the last up to
:data:`POKE_MAX_GAP_S`, until the handler has started.

Only while ``should_poke()`` (the caller's) is true: the shim pokes only when its
handler ends the process (the previous handler was the default action), so that a
second run of the handler, if a poke crosses a late first run, cannot matter.
A handler that returns (a chained user handler, ``SIG_IGN``) keeps CPython's own
behaviour.

Fork: the child inherits the wakeup fd and the pipe but not the watcher thread;
:func:`after_fork_in_child` (called from the writer's fork hook) stops the child's
signals from reaching the parent's pipe and, where the child still has the handler,
installs a watch of its own.

Cost: one idle thread blocked in ``select``; one byte written per signal that has a
Python handler (SIGINT included), drained by the watcher.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable

#: Seconds the handler gets to start on its own before the first poke (tlog's
#: choice: a main thread running Python code starts the handler within a
#: switch interval, 5 ms; a long C call without a wait delays it either way).
POKE_AFTER_S = 0.05
#: Longest gap between two pokes (seconds; tlog's choice: each poke interrupts the
#: main thread's system call, which C code outside CPython may not retry).
POKE_MAX_GAP_S = 1.0

_lock = threading.Lock()
_pid = 0                   # the process whose watch this state is (0: none)
_fds: tuple[int, int] | None = None  # the pipe (read end, write end)
_signums: frozenset[int] = frozenset()
_should_poke: Callable[[], bool] = lambda: False
_started = 0               # handler starts counted by note_started()
_main_ident = 0


def install(signum: int, should_poke: Callable[[], bool]) -> bool:
    """Watch ``signum`` (its Python handler must already be installed) in this process.

    ``should_poke()`` is asked before each poke (from the watcher thread; it must not
    block). Call from the main thread. Returns ``True`` if the watch runs, ``False``
    if it cannot here: not the main thread, another wakeup fd is set (left as it was),
    or no pipe or thread could be made. Never raises.
    """
    global _pid, _fds, _signums, _should_poke, _main_ident
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if _pid == os.getpid():
            _signums = _signums | {signum}
            _should_poke = should_poke
            return True
        try:
            r, w = os.pipe()
        except OSError:
            return False
        try:
            os.set_blocking(w, False)  # set_wakeup_fd's rule: a full pipe must not block
            old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            _close(r, w)
            return False
        if old != -1:  # someone else's: give it back, watch nothing
            _restore(old)
            _close(r, w)
            return False
        _pid, _fds, _signums, _should_poke = os.getpid(), (r, w), frozenset({signum}), should_poke
        _main_ident = threading.main_thread().ident or 0
        try:
            threading.Thread(target=_watch, args=(r,), name="tlog-signals", daemon=True).start()
        except RuntimeError:  # no thread can be started (interpreter shutting down)
            _uninstall_locked()
            return False
        return True


def note_started() -> None:
    """The watched signal's Python handler has started (call it first thing in the
    handler)."""
    global _started
    _started += 1


def after_fork_in_child() -> None:
    """In a fork child (the writer's fork hook): let go of the parent's pipe and wakeup
    fd, so that the child's signals never reach the parent's watcher (which would poke
    the parent). The caller installs the child's own watch where it keeps the handler.
    """
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by a thread that is gone
    if _pid and _fds is not None:
        r, w = _fds
        if not _unset_wakeup_fd(w):  # cannot unset it here: make its writes go nowhere
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, w)
                os.close(null)
                _close(r)
                _reset()
                return
            except OSError:
                pass
        _close(r, w)
    _reset()


def _uninstall_locked() -> None:
    if _fds is not None:
        r, w = _fds
        _unset_wakeup_fd(w)
        _close(r, w)
    _reset()


def _unset_wakeup_fd(w: int) -> bool:
    """Unset CPython's wakeup fd if it is still ``w`` (one set by someone else since,
    asyncio's, stays); False if it could not be touched here."""
    try:
        old = signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        return False
    if old != w:
        _restore(old)
    return True


def _reset() -> None:
    global _pid, _fds, _signums
    _pid, _fds, _signums = 0, None, frozenset()


def _restore(fd: int) -> None:
    try:
        signal.set_wakeup_fd(fd)
    except (ValueError, OSError):
        pass


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _drain(r: int) -> bytes:
    """Read what the pipe holds now without blocking."""
    got = b""
    while True:
        try:
            ready, _, _ = select.select([r], [], [], 0)
            if not ready:
                return got
            data = os.read(r, 512)
        except InterruptedError:
            continue
        except OSError:
            return got
        if not data:
            return got
        got += data


def _watch(r: int) -> None:
    """The watcher thread: wait for a watched signal, poke until the handler starts."""
    while True:
        try:
            select.select([r], [], [])
        except InterruptedError:
            continue
        except (OSError, ValueError):  # the pipe was closed (fork child, uninstall)
            return
        got = _drain(r)
        if not got and _fds is None:
            return
        hit = next((b for b in got if b in _signums), None)
        if hit is None:
            continue
        if not _should_poke():  # asked as it arrives: another handler's signal is not ours
            continue
        seen, gap = _started, POKE_AFTER_S
        while True:
            time.sleep(gap)
            if _started != seen or not _should_poke() or _pid != os.getpid():
                break
            try:
                signal.pthread_kill(_main_ident, hit)
            except (OSError, ValueError):
                break
            gap = min(gap * 2, POKE_MAX_GAP_S)
        _drain(r)  # the pokes' own bytes


__all__ = ["POKE_AFTER_S", "POKE_MAX_GAP_S", "after_fork_in_child", "install", "note_started"]
