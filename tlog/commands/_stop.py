"""Stopping a follow loop (``tlog watch``, ``tlog ingest --follow``) on Ctrl-C or
SIGTERM, between two rounds.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT
comes. Inside a DuckDB statement, DuckDB (2.0.1) does not let it through:
it becomes ``RuntimeError('Query interrupted')`` (the statement polls for
signals) or a ``duckdb.Error`` wrapping it (Python code run by the
statement: a registered Arrow table's scan, a function), which an ``except
duckdb.Error`` fallback of ingest takes for a failed statement (the Ctrl-C
is lost). Measured on this project (tests/watch/test_watch_interrupt.py): of
400 Ctrl-Cs at random times of ``tlog watch --interval 0.3``, 274 ended it
with ``RuntimeError: Query interrupted`` (exit 1, "internal error"), 4 with
other DuckDB errors, and one was lost in ``BatchLoader._full_pass``'s
fallback (the view went on refreshing).

So while following, a signal only asks to stop (:class:`StopRequest`): the
round in progress (ingest, diagnosis store, view) finishes, and the loop
stops at its next wait between rounds; a signal that comes during that wait
(where the main thread is in ``time.sleep`` or ``select``, in no library)
stops it at once. Either way the follow loop then stores the diagnosis one
last time (:meth:`tlog.api.Database.follow`). A second Ctrl-C before the
loop stopped (a long first ingest, a long last store) stops at once where it
lands: the transaction in progress rolls back; :attr:`StopRequest.forced`
tells the command to take whatever exception comes out as that stop. A
second SIGTERM never forces (the stop under way goes on).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM while following: ends it as Ctrl-C does (the round in progress
    finished, the diagnosis stored, the terminal's mode restored); the
    command then exits 143."""


class StopRequest:
    """Signals that ask a follow loop to stop at its next wait (module docstring).

    Args:
        signals: the signals handled while :meth:`handling` (SIGINT, and
            SIGTERM where the command ends on it as on Ctrl-C).

    Attributes:
        signum: the first signal that came (None: none yet).
        forced: a second Ctrl-C came before the loop stopped: it was raised
            where it landed (inside DuckDB it may come out as another
            exception, or not at all).
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGINT,)) -> None:
        self.signals = signals
        self.signum: int | None = None
        self.forced = False
        self._waiting = False

    @property
    def asked(self) -> bool:
        """Whether a signal asked to stop."""
        return self.signum is not None

    def _stop(self) -> KeyboardInterrupt:
        return Terminated() if self.signum == signal.SIGTERM else KeyboardInterrupt()

    def _handler(self, signum: int, _frame: Any) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if self._waiting:                   # in the wait between rounds: stop now
            self._waiting = False
            raise self._stop()
        if not first and signum == signal.SIGINT:
            self.forced = True              # Ctrl-C again: at once, where it lands
            raise KeyboardInterrupt

    def sleep(self, wait: Callable[[float], None]) -> Callable[[float], None]:
        """``wait`` (the follow loop's wait between rounds) made the place where
        a stop asked for earlier is raised, and where a signal raises at once."""

        def sleep(seconds: float) -> None:
            self._waiting = True            # first: a signal from here on raises
            try:
                if self.signum is not None:
                    raise self._stop()
                wait(seconds)
            finally:
                self._waiting = False

        return sleep

    @contextmanager
    def ending(self, on: bool = True) -> Iterator[None]:
        """Around a follow loop and around its close: the stop asked for ends
        it quietly (``KeyboardInterrupt``, :class:`Terminated`, or ``q``'s
        :class:`~tlog.commands.watch.QuitKey`), and after a second Ctrl-C so
        does whatever exception that came out as inside DuckDB (:attr:`forced`).
        Off (``on`` false: a one-shot ingest), nothing is caught."""
        if not on:
            yield
            return
        try:
            yield
        except KeyboardInterrupt:
            pass
        except Exception:
            if not self.forced:
                raise

    @property
    def forced_note(self) -> str:
        """What a command's last line adds after a second Ctrl-C ("" else)."""
        return (" (Ctrl-C twice: stopped at once, a transaction in progress rolled back)"
                if self.forced else "")

    @contextmanager
    def handling(self, on: bool = True) -> Iterator[StopRequest]:
        """While inside, the signals only ask to stop (``on`` and the main
        thread only: a signal handler can only be set there; else nothing
        changes)."""
        if not on or threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handler) for s in self.signals}
        try:
            yield self
        finally:
            for s, h in previous.items():
                if h is not None:      # None: a handler not set from Python, kept
                    signal.signal(s, h)
