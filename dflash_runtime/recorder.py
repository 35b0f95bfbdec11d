"""The recorder: the part of the shim that runs on the training thread.

Hot-path design (budgets in DESIGN.md "Budgets"; measured by ``benchmarks/bench_shim.py``):

- An iteration appends raw names and ``perf_counter()`` readings to a flat list shared
  by the thread's consecutive iterations (no list, no tuple per phase: nothing for the
  allocator to regrow or the garbage collector to track); nothing is subtracted,
  summed, named or serialised on the training thread.
- ``it.lap(name)`` is one clock read and two ``list.append`` calls; ``with
  it.phase(name)`` is one clock read and a few appends on each side, with a context
  object reused for the whole iteration (no allocation per phase).
- At iteration end its slice of the raw log is handed to the writer as one tuple in a
  ``collections.deque`` (thread-safe without a lock in CPython). The writer thread
  (:mod:`dflash_runtime.writer`) turns it into phase durations, child names
  (``parent/child``), sums of repeated names, wall-clock ``ts`` and JSON.
- ``enabled=False`` returns a shared no-op iteration whose ``with`` hooks are C
  builtins and whose ``lap``/``phase`` are empty methods.

Nothing here reads or writes a file, takes a lock, or touches the device other than
recording CUDA events on the stream the caller names.

The raw log format (read by :func:`dflash_runtime.writer.build_phases`):
``name, t`` a lap ending at ``t``;
``ENTER, name, t`` a block starting at ``t``; ``ENTER_X, (name, kind, slot), t`` a
block with a kind and/or a CUDA event slot; a float ``t`` alone: the innermost open
block ends at ``t``.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from pathlib import Path
from typing import Any, Self

from . import writer as _writer
from .format import FORMAT_VERSION, check_kind
from .sysinfo import adaptive as _sys_adaptive
from .sysinfo import sys_interval as _sys_interval

_pc = time.perf_counter
_tt = time.thread_time

try:  # Linux: the thread's CPU time as the scheduler last booked it (no system call into it)
    import resource as _resource

    _RUSAGE_THREAD = _resource.RUSAGE_THREAD
    _getrusage = _resource.getrusage
except (ImportError, AttributeError):
    _getrusage = None


def _booked_thread_time() -> float:
    """The calling thread's CPU seconds as the scheduler last booked them
    (``getrusage(RUSAGE_THREAD)``: user + system, Linux).

    Unlike ``time.thread_time()`` (``clock_gettime(CLOCK_THREAD_CPUTIME_ID)``), it
    does not bring the thread's CPU time up to date, so it never ends the thread's
    time slice: on a core shared with other runnable tasks, Linux's EEVDF scheduler
    (6.6+) preempts a thread whose slice is used up at the next ``thread_time()``
    call, and a read at every iteration's end moved nearly all of a contended
    loop's lost time between its iterations. The reading lags the true CPU time by
    at most one scheduler tick (updated at ticks and context switches).
    """
    r = _getrusage(_RUSAGE_THREAD)
    return r.ru_utime + r.ru_stime


#: Share of wall time the recording threads waited runnable for a core, over the
#: last two ``sys`` samples, from which iterations read their CPU time with
#: :func:`_booked_thread_time` instead of ``time.thread_time()`` (tlog's choice:
#: any run-queue delay means other tasks share the core, where ``thread_time()``
#: hands it away at the iteration boundary; 1% keeps an idle machine's scheduler
#: noise on the precise clock).
CONTENDED_SHARE = 0.01

#: Record tags in the tuples handed to the writer.
ITER, QUEUE, EVENT = 0, 1, 2
#: Markers in the raw log (ints: not str, not float, not tracked by the GC).
ENTER, ENTER_X = 1, 2

#: Entries after which an iteration starts a new raw log list. The log of one thread
#: is one list shared by consecutive iterations (each record names its slice), so an
#: iteration allocates no list and pays no small-list regrowth (~15 ns per phase).
LOG_CHUNK = 16384

#: Thread CPU time (``cpu``) sampling. ``time.thread_time()`` is a system call (about
#: 0.5 us on this machine, measured by ``python -m benchmarks.bench_shim``; it has no
#: vDSO fast path on Linux), several times a whole recorded phase. So:
#: an iteration that starts back to back with the previous one on the same thread
#: (within :data:`CPU_CHAIN_GAP_S`) reuses that iteration's end reading as its start
#: (one read per iteration, error at most the CPU spent in the gap). Every iteration
#: that follows one of :data:`CPU_SAMPLE_INTERVAL_S` or more carries ``cpu`` (so do all
#: iterations of a loop of such iterations); after a shorter one, the next reading
#: waits :data:`CPU_SAMPLE_INTERVAL_S`, so loops of short iterations carry ``cpu``
#: about once per interval. The clock then costs at most two reads per interval of
#: wall time (~0.1%).
CPU_CHAIN_GAP_S = 50e-6
#: See :data:`CPU_CHAIN_GAP_S` (2 reads of 0.5 us per 1 ms: 0.1% of wall time at most).
CPU_SAMPLE_INTERVAL_S = 1e-3

#: Most records waiting for the writer per recorder: queued, or in the batch being
#: written (the writer pops a batch only once it is written). Beyond it new records are
#: dropped and counted (bounded memory if the writer cannot keep up or the disk
#: stalls). A queued 10-phase iteration holds about 0.2-1 kB (its tuple and its slice
#: of the raw log), so at most ~20-100 MB; a loop of 10,000 iterations a second fills
#: it in 10 s if the writer stopped. tlog's choice.
DEFAULT_MAX_PENDING = 100_000

#: Most CUDA event pairs in flight per device (bounded memory when the host runs far
#: ahead of the device and never synchronises); phases beyond it get no ``gpu`` time
#: and are counted in ``stats()["gpu_dropped"]``.
DEFAULT_MAX_GPU_EVENTS = 4096

_NEG_INF = float("-inf")
_POS_INF = float("inf")

class _Ref:
    __slots__ = ("value",)


def _returning(value: Any) -> Any:
    """A C-level callable that takes zero or one argument and returns ``value``.

    Used as ``__enter__`` of the hot-path context managers. ``with`` looks special
    methods up on the type and calls a non-descriptor with no arguments, while
    ``contextlib.ExitStack.enter_context`` (and any code calling
    ``type(cm).__enter__(cm)``) passes the manager: ``getattr(ref, "value"[, cm])``
    accepts both (the second is getattr's unused default), and being C code it
    costs no interpreter frame (about 10 ns more than ``repeat().__next__``,
    which only accepts the first form).
    """
    ref = _Ref()
    ref.value = value
    return functools.partial(getattr, ref, "value")


# A C-level callable returning None (see _PhaseCtx.__enter__).
_RETURN_NONE = _returning(None)

# Live enabled recorders, for current_iteration().
_RECORDERS: weakref.WeakSet = weakref.WeakSet()


def current_iteration() -> Iteration | None:
    """The iteration open on the calling thread, or ``None`` outside any iteration.

    If iterations of several recorders are open on this thread, the latest started.
    Costs about a microsecond; used by :class:`~dflash_runtime.queues.TimedQueue`.
    """
    best = None
    for rec in list(_RECORDERS):
        it = rec._tls.__dict__.get("it")
        if it is not None and it._active and (best is None or it._t0 > best._t0):
            best = it
    return best


class _PhaseCtx:
    """Context manager returned by ``it.phase(name)``; one per iteration, reused."""

    __slots__ = ("_app",)

    def __init__(self, app) -> None:
        self._app = app

    # A C callable: ``with`` calls __enter__ from C, where a Python method costs a full
    # interpreter entry (see _returning: works under ``with`` and ExitStack alike).
    __enter__ = _RETURN_NONE

    def __exit__(self, et, ev, tb) -> None:
        self._app(_pc())


class _StreamPhaseCtx:
    """Context manager of a phase timed with CUDA events: records the end event on exit."""

    __slots__ = ("_app", "_end", "_stream")

    def __init__(self, app, end, stream) -> None:
        self._app = app
        self._end = end
        self._stream = stream

    __enter__ = _RETURN_NONE  # see _PhaseCtx

    def __exit__(self, et, ev, tb) -> None:
        self._end.record(self._stream)
        self._app(_pc())


class Iteration:
    """One iteration of one worker loop; returned by :meth:`Recorder.iteration`.

    Use it as ``with rec.iteration(tokens=n) as it:``. Inside:

    - ``it.lap(name)``: phase ``name`` is the time since the previous mark (the
      iteration start, the previous lap, or the end of the previous phase block at the
      same level). Inside a ``with it.phase(p)`` block it makes the child ``p/name``.
    - ``with it.phase(name):`` times a block; phases opened inside it are its children
      (``name/child``), counted inside it (docs/FORMAT.md ``phases``).
    - ``with it.phase(name, stream=s):`` also records CUDA events on stream ``s``; the
      device time lands in the record's ``gpu`` field once the writer sees the events
      complete (never by synchronising this thread).
    - ``kind=`` on ``phase`` (or :meth:`set_kind`, also for laps) sets the phase's category
      in the record's ``kinds`` (one of ``starvation``, ``backpressure``, ``compute``,
      ``sync``); ``ValueError`` for anything else.
    - ``it.tokens`` / ``it.samples`` may be set during the iteration.

    The iteration starts when :meth:`Recorder.iteration` is called (use it only in a
    ``with`` statement). A name used twice in one iteration sums. Phase order in the record is the order in
    which phases first started. Objects are reused per thread: do not keep ``it`` past
    its ``with`` block. If the block raises, the iteration is still recorded, with
    ``"error": "<exception class name>"``, and the exception propagates.
    """

    __slots__ = (
        "_active", "_app", "_c0", "_c_end", "_counter", "_cpu_ok_at", "_ctx", "_ev_open", "_gpu",
        "_kinds", "_log", "_max_pending", "_mem_every", "_n", "_open", "_q", "_rec", "_scan_i",
        "_scan_log", "_scan_n", "_start", "_t0", "_t_end", "_t_from", "_t_last", "samples",
        "tokens",
    )

    def __init__(self, rec: Recorder) -> None:
        self._rec = rec
        self._counter = rec._counter
        self._log: list = []
        self._app = self._log.append
        self._ctx = _PhaseCtx(self._app)
        self._start = 0
        self._t0 = 0.0
        self._t_end = _NEG_INF  # perf_counter of the end reading a next iteration may chain on
        self._c0 = None
        self._c_end = 0.0
        self._t_from = 0.0  # perf_counter of the reading c0 is (the start, or a chained end)
        self._t_last = _NEG_INF  # perf_counter of the previous iteration's end
        # perf_counter from which an iteration start reads the CPU clock (+inf: cpu off)
        self._cpu_ok_at = _NEG_INF if rec._cpu else _POS_INF
        self._n = -1
        self.tokens = self.samples = None
        self._kinds = self._gpu = None
        self._active = False
        self._q = rec._q
        self._max_pending = rec._max_pending
        self._mem_every = rec._mem_every
        # begin()/end() bookkeeping (see _open_blocks): the names of the blocks open,
        # as read from the raw log up to _scan_i of iteration _scan_n.
        self._open: list = []
        self._ev_open: list = []  # [depth, end event, stream] of blocks begun with a stream
        self._scan_i = 0
        self._scan_n = -1
        self._scan_log = None

    # -- the hot path -----------------------------------------------------------------
    def lap(self, name: str) -> None:
        """Record the time since the previous mark as phase ``name`` (seconds, host wall).

        No ``kind=`` here (each argument costs the hot path ~9 ns, 0.07x of the budget):
        give a lap a category with :meth:`set_kind`.
        """
        app = self._app
        app(name)
        app(_pc())

    def phase(self, name: str, stream: Any = None, kind: str | None = None):
        """Time the ``with`` block as phase ``name``; see the class docstring."""
        if stream is None and kind is None:
            app = self._app
            app(ENTER)
            app(name)
            app(_pc())
            return self._ctx
        return self._phase_slow(name, stream, kind)

    def _phase_slow(self, name: str, stream: Any, kind: str | None):
        if kind is not None:
            check_kind(kind)
        pair = None
        slot = None
        if stream is not None:
            pair = self._rec._acquire_events(stream)
            if pair is not None:
                if self._gpu is None:
                    self._gpu = []
                slot = len(self._gpu)
                self._gpu.append(pair)
        app = self._app
        app(ENTER_X)
        app((name, kind, slot))
        app(_pc())
        if pair is None:
            return self._ctx
        pair[0].record(stream)
        return _StreamPhaseCtx(app, pair[1], stream)

    # -- the callback-friendly form: phases begun and ended by calls ---------------------------
    def begin(self, name: str, kind: str | None = None, stream: Any = None) -> None:
        """Start phase ``name`` without a ``with`` block; :meth:`end` ends it.

        The same record as ``with it.phase(name, stream=stream, kind=kind):`` (children,
        sums, ``kinds``, ``gpu``), for code that gets called at a phase's start and
        end instead of wrapping it (framework callbacks, hooks: see
        :mod:`dflash_runtime.auto`). Costs what ``phase`` costs (three list appends,
        one clock read; no allocation). Blocks still open when the iteration ends
        end with it. ``ValueError`` for an unknown ``kind`` (as ``phase``).
        """
        if stream is None and kind is None:
            app = self._app
            app(ENTER)
            app(name)
            app(_pc())
            return
        ctx = self._phase_slow(name, stream, kind)
        if ctx is not self._ctx:  # a stream phase: end() records its end event
            depth = len(self._open_blocks())
            self._ev_open.append((depth, ctx._end, stream))

    def end(self, name: str | None = None) -> None:
        """End the innermost open phase (or, given ``name``, the open phase so named).

        Never raises: ending a phase that is not open warns once per recorder
        (``RuntimeWarning``) and records nothing; ending an outer phase while
        phases begun inside it are still open ends those at the same instant (as a
        ``with`` block left by an exception would), and warns once. Costs a scan of
        the raw log entries made since the last ``begin``/``end`` (about 0.1 us
        per entry).
        """
        t = _pc()
        opened = self._open_blocks()
        if not opened:
            self._rec._mismatch("end", f"it.end({name!r}) with no phase open")
            return
        k = 1
        if name is not None and opened[-1] != name:
            try:
                k = len(opened) - _rindex(opened, name)
            except ValueError:
                self._rec._mismatch("end", f"it.end({name!r}): no open phase is named so "
                                    f"(open: {'/'.join(opened)})")
                return
            self._rec._mismatch("end-outer", f"it.end({name!r}) while {opened[-1]!r} begun "
                                "inside it is still open: both end now")
        app = self._app
        ev = self._ev_open
        for _ in range(k):
            depth = len(opened)
            if ev and ev[-1][0] == depth:
                _, end_ev, stream = ev.pop()
                end_ev.record(stream)
            opened.pop()
            app(t)
        self._scan_i = len(self._log)

    def _open_blocks(self) -> list:
        """Names of the phase blocks open now, outermost first (read from the raw log).

        The log is scanned from where the last call stopped, so ``with`` blocks,
        laps and queue waits recorded in between are seen too. The list is reused.
        """
        log = self._log
        opened = self._open
        if self._scan_n != self._n or self._scan_log is not log:
            opened.clear()
            self._ev_open.clear()
            self._scan_n = self._n
            self._scan_log = log
            self._scan_i = self._start
        i = self._scan_i
        n = len(log)
        ev = self._ev_open
        while i < n:
            e = log[i]
            c = e.__class__
            if c is float:
                i += 1
                if opened:
                    if ev and ev[-1][0] == len(opened):  # a with block closed it: stale
                        ev.pop()
                    opened.pop()
            elif c is str:
                i += 2
            else:
                if i + 2 >= n:
                    break
                nm = log[i + 1]
                opened.append(nm if e == ENTER else nm[0])
                i += 3
        self._scan_i = i
        return opened

    def _end_open_events(self) -> None:
        """Record the end events of the stream phases begun and still open."""
        self._open_blocks()  # drops entries of blocks a with block closed
        for _, end_ev, stream in self._ev_open:
            end_ev.record(stream)
        self._ev_open.clear()

    def add_wait(self, name: str, t0: float, t1: float, kind: str | None) -> None:
        """Record a block that ran from ``t0`` to ``t1`` (``perf_counter`` seconds) as a phase.

        Used by :class:`~dflash_runtime.queues.TimedQueue` for get/put waits; the next lap
        measures from ``t1``.
        """
        app = self._app
        app(ENTER_X)
        app((name, kind, None))
        app(t0)
        app(t1)

    def set_kind(self, name: str, kind: str) -> None:
        """Give phase ``name`` (full name, e.g. ``forward/mask``) the category ``kind``."""
        check_kind(kind)
        if self._kinds is None:
            self._kinds = {}
        self._kinds[name] = kind

    @property
    def number(self) -> int:
        """This iteration's ``iter`` number (0-based, per recorder)."""
        return self._n

    def __enter__(self) -> Self:  # nested iterations; the per-thread one uses a C builtin
        return self

    # -- per iteration ----------------------------------------------------------------
    def __exit__(self, et, ev, tb) -> None:
        t1 = _pc()
        if self._ev_open:  # stream phases begun and still open end here
            self._end_open_events()
        self._active = False
        cpu = None
        c0 = self._c0
        last = self._t_last
        self._t_last = t1
        if c0 is not None:
            rec = self._rec
            c1 = rec._cpu_clock()
            cpu = c1 - c0
            # chained on a reading older than the previous iteration (short iterations):
            # this one's cycle's share of the span (the time since that end, gap included)
            span = t1 - self._t_from
            cycle = t1 - (last if last > self._t_from else self._t_from)  # noqa: FURB136 - no call
            if span > cycle > 0.0:
                cpu *= cycle / span
            if cpu < 0.0:  # noqa: PLR1730 - the clock changed between the reads (a tick at most)
                cpu = 0.0
            if rec._cpu_booked:  # every end reading is the next one's start (see _booked...)
                self._c_end = c1
                self._t_end = t1
                self._cpu_ok_at = t1 if t1 - self._t0 >= CPU_SAMPLE_INTERVAL_S else (
                    t1 + CPU_SAMPLE_INTERVAL_S)
            elif t1 - self._t0 >= CPU_SAMPLE_INTERVAL_S:  # long: the next one gets cpu too
                self._c_end = c1
                self._t_end = t1
                self._cpu_ok_at = t1
            else:  # short: cut the chain, read again CPU_SAMPLE_INTERVAL_S from now
                self._t_end = _NEG_INF
                self._cpu_ok_at = t1 + CPU_SAMPLE_INTERVAL_S
        mem = None
        if self._mem_every and self._n % self._mem_every == 0:
            mem = self._rec._memory_stats()
        q = self._q
        if len(q) < self._max_pending:
            q.append((ITER, self._n, self._t0, t1, cpu, self._log, self._start, len(self._log),
                      self.tokens, self.samples, self._kinds, self._gpu, mem,
                      None if et is None else et.__name__))
        else:
            self._rec._overflow += 1
        if self._kinds is not None or self._gpu is not None:
            self._kinds = self._gpu = None


def _new_iteration(rec: Recorder) -> Iteration:
    """An :class:`Iteration` whose ``__enter__`` is a C builtin returning it.

    Each (recorder, thread) gets its own subclass, made once, so that ``with`` can
    return the instance without running Python code (see :meth:`Recorder.iteration`).
    """
    cls = type("Iteration", (Iteration,), {"__slots__": (), "__module__": __name__})
    it = cls(rec)
    rec._threads.append(threading.get_native_id())
    cls.__enter__ = _returning(it)
    return it


def _rindex(items: list, value: Any) -> int:
    """Index of the last ``value`` in ``items``; ``ValueError`` if absent."""
    for i in range(len(items) - 1, -1, -1):
        if items[i] == value:
            return i
    raise ValueError(value)


class _ErrorName:
    """Stands for an exception class in ``Iteration.__exit__`` (which reads ``__name__``)."""

    __slots__ = ("__name__",)

    def __init__(self, name: str) -> None:
        self.__name__ = name


class _NullCtx:
    __slots__ = ()

    __enter__ = _RETURN_NONE  # see _PhaseCtx
    __exit__ = "".format  # C builtin taking (et, ev, tb), returning "" (falsy: no swallowing)


_NULL_CTX = _NullCtx()


class _NullIteration:
    """What a disabled recorder hands out: every method is an empty call."""

    __slots__ = ("samples", "tokens")

    number = -1

    def lap(self, name: str) -> None:
        pass

    def phase(self, name: str, stream: Any = None, kind: str | None = None) -> _NullCtx:
        return _NULL_CTX

    def add_wait(self, name: str, t0: float, t1: float, kind: str | None) -> None:
        pass

    def begin(self, name: str, kind: str | None = None, stream: Any = None) -> None:
        pass

    def end(self, name: str | None = None) -> None:
        pass

    def set_kind(self, name: str, kind: str) -> None:
        pass


NULL_ITERATION = _NullIteration()
# The ``with`` hooks of the no-op iteration are C builtins, not Python methods (each
# Python call costs ~30 ns; the disabled budget is 0.3x a bare clock pair per phase).
# Special methods are looked up on the type and builtins do not bind ``self``:
# ``__enter__()`` returns NULL_ITERATION; ``__exit__(et, ev, tb)`` returns "" (falsy,
# so exceptions propagate).
_NullIteration.__enter__ = _returning(NULL_ITERATION)
_NullIteration.__exit__ = "".format


class _EventCtx:
    __slots__ = ("_fields", "_name", "_rec", "_t0")

    def __init__(self, rec: Recorder, name: str, fields: dict | None) -> None:
        self._rec = rec
        self._name = name
        self._fields = fields

    def __enter__(self) -> Self:
        self._t0 = _pc()
        return self

    def __exit__(self, et, ev, tb) -> None:
        t1 = _pc()
        self._rec._push((EVENT, self._name, self._t0, t1 - self._t0, self._fields))


#: Environment variables :meth:`Recorder.from_env` reads that ``tlog run`` sets for
#: every rank: the run directory, the run id, and the tags as one JSON object
#: (docs/RUNTIME.md).
RUN_DIR_ENV, RUN_ID_ENV, TAGS_ENV = "TLOG_RUN_DIR", "TLOG_RUN_ID", "TLOG_TAGS"


def _env_tags(text: str) -> dict[str, Any]:
    """``TLOG_TAGS``, a JSON object, as a dict; ``ValueError`` naming the variable
    for anything else."""
    import json

    try:
        tags = json.loads(text)
    except ValueError:
        tags = None
    if not isinstance(tags, dict):
        msg = (f"environment variable {TAGS_ENV}={text!r} is not a JSON object "
               f"(e.g. {{\"lr\": \"3e-4\"}})")
        raise ValueError(msg)  # noqa: TRY004 - a bad value of a variable, as RANK
    return tags


class Recorder:
    """Per-process timing recorder writing ``<run_dir>/rank{rank}.{stage}.jsonl`` (v1).

    Args:
        run_dir: the run directory (created by the writer thread if missing).
        stage: pipeline stage of this process/loop (``target``, ``drafter``; default ``main``).
        rank: global rank (``RANK`` under torchrun); part of the file name.
        worker: worker name, default ``<stage>-<rank>`` (docs/FORMAT.md default), or
            ``<stage>-<rank>.<k>`` when the file needed the suffix ``k`` (a
            restarted process: its ``iter`` starts at 0 again and must not be
            taken for the first process's).
        enabled: ``False`` makes every call a cheap no-op and writes nothing.
        world_size: number of ranks, written to ``meta`` and ``run.json``.
        flush_interval: seconds between writer flushes (at most 1.0; guarantee: a record
            reaches the file within about this long plus the time its CUDA events take).
        cpu: record the thread CPU time ``cpu`` of each iteration.
        mem_every: every N-th iteration, attach ``mem`` (allocator figures from
            ``torch.cuda.memory_stats()``, never synchronising); 0 disables. Only when
            torch is imported and CUDA is initialised.
        max_pending: records waiting for the writer (queued or being written) beyond
            which new ones are dropped and counted (:data:`DEFAULT_MAX_PENDING`).
        max_gpu_events: CUDA event pairs in flight per device (see
            :data:`DEFAULT_MAX_GPU_EVENTS`).
        run_id, name, tags, config, phase_kinds: written to ``run.json`` by rank 0
            (docs/FORMAT.md "run.json"); ``tags`` is merged over the automatic ``git_sha``,
            ``git_branch``, ``torch``, ``python`` and ``host`` tags.
        install_handlers: install the SIGTERM flush handler (main thread only).
        sys_interval: seconds between ``sys`` samples of the process and its device
            (CPU time, RSS, load, threads; the CUDA allocator; NVML), taken by the
            writer thread, never this one; also one at close. ``None``: the
            ``TLOG_SYS_INTERVAL`` environment variable, else the adaptive pace
            (every 50 ms at first, the recorder's age over 32 later, at most 2 s:
            ``dflash_runtime.sysinfo.next_gap``); 0 turns sampling and the
            ``meta`` line's ``machine`` off (:mod:`dflash_runtime.sysinfo`).

    Faults never raise into training: an unwritable directory or a full disk warns once
    (``RuntimeWarning``), counts the dropped records in :meth:`stats` and keeps going.
    Raises ``ValueError`` only for bad arguments (empty stage, negative rank, bad kind).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        stage: str = "main",
        rank: int = 0,
        worker: str | None = None,
        enabled: bool = True,
        world_size: int | None = None,
        flush_interval: float = 0.5,
        cpu: bool = True,
        mem_every: int = 100,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_gpu_events: int = DEFAULT_MAX_GPU_EVENTS,
        run_id: str | None = None,
        name: str | None = None,
        tags: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        phase_kinds: dict[str, str] | None = None,
        install_handlers: bool = True,
        sys_interval: float | None = None,
    ) -> None:
        if not stage or not isinstance(stage, str) or "/" in stage:
            msg = f"stage must be a non-empty name without '/', got {stage!r}"
            raise ValueError(msg)
        if not isinstance(rank, int) or rank < 0:
            msg = f"rank must be an int >= 0, got {rank!r}"
            raise ValueError(msg)
        if world_size is not None and (not isinstance(world_size, int) or world_size <= rank):
            msg = f"world_size must be an int > rank ({rank}), got {world_size!r}"
            raise ValueError(msg)
        if not 0 < flush_interval <= 1.0:
            msg = f"flush_interval must be in (0, 1] seconds, got {flush_interval!r}"
            raise ValueError(msg)
        for k in (phase_kinds or {}).values():
            check_kind(k)
        self._sys_interval = _sys_interval(sys_interval)
        self._sys_adaptive = _sys_adaptive(sys_interval)
        self.run_dir = Path(run_dir)
        self.stage = stage
        self.rank = rank
        self.worker = worker or f"{stage}-{rank}"
        self.worker_named = worker is not None   # else a restart renames it (writer.Sink._open)
        self.world_size = world_size
        self.enabled = bool(enabled)
        self._cpu = bool(cpu)
        self._mem_every = int(mem_every) if mem_every else 0
        self._max_pending = int(max_pending)
        self._max_gpu_events = int(max_gpu_events)
        self._overflow = 0  # iterations dropped at a full queue (training thread)
        self._overflow_other = 0  # queue/event records dropped at a full queue
        self._mismatches = 0  # begin/end calls that did not pair (begin_iteration, it.end)
        self._warned: set[str] = set()
        self._q: deque = deque()
        self._counter = itertools.count()
        self._tls = threading.local()
        self._pools: dict[int, Any] = {}
        self._coll: Any = None  # collectives.CollectiveSlot once watch_ddp registered a hook
        self._cuda: Any = None  # torch module once CUDA timing is known to work; False if not
        self._closed = False
        # Native ids of the threads that ran this recorder's iterations (one append per
        # thread, never per iteration): the sys sampler reads their run-queue wait.
        self._threads: list[int] = []
        # The thread CPU clock of the iterations: time.thread_time, or, while the
        # sys samples show the recording threads waiting for a core (and until the
        # first two samples tell), the booked time that never ends a time slice.
        self._cpu_clock = _tt
        self._cpu_booked = False
        self._cpu_chain_gap = CPU_CHAIN_GAP_S
        if _getrusage is not None and self._sys_interval and self.enabled:
            self._use_booked(True)
        self._sink = None
        if not self.enabled:
            return
        wall, mono = _writer._wall(), _pc()
        meta = {
            "type": "meta", "v": FORMAT_VERSION, "rank": rank, "stage": stage,
            "worker": self.worker, "host": socket.gethostname(), "pid": os.getpid(),
            "world_size": world_size, "clock": {"wall": wall, "mono": mono},
        }
        local_rank = os.environ.get("LOCAL_RANK")
        if local_rank is not None and local_rank.isdigit():
            meta["local_rank"] = int(local_rank)
        manifest = None
        if rank == 0:
            manifest = {
                "v": FORMAT_VERSION, "run_id": run_id, "name": name, "started": wall,
                "world_size": world_size, "tags": dict(tags or {}), "config": config,
                "phase_kinds": dict(phase_kinds) if phase_kinds else None,
            }
        self._sink = _writer.register(self, meta, manifest, flush_interval, install_handlers)
        _RECORDERS.add(self)

    @property
    def path(self) -> Path | None:
        """The file this recorder writes (``None`` when disabled)."""
        return None if self._sink is None else self._sink.path

    # -- construction from the environment ------------------------------------------------
    @classmethod
    def from_env(cls, run_dir: str | os.PathLike | None = None, **kwargs: Any) -> Recorder:
        """A recorder configured from the ``torchrun`` environment.

        Reads ``RANK``, ``WORLD_SIZE`` (set by torchrun), ``TLOG_RUN_DIR`` (the run
        directory), ``TLOG_RUN_ID`` (the run id written to ``run.json``),
        ``TLOG_TAGS`` (a JSON object of tags for ``run.json``, e.g.
        ``{"lr": "3e-4"}``; ``tlog run`` sets these three), ``TLOG_STAGE``
        (default ``main``), ``TLOG_WORKER`` and ``TLOG_ENABLED``
        (``0``/``false``/``no``/``off`` disables). Keyword arguments override the
        environment; ``tags=`` is merged over ``TLOG_TAGS`` key by key. Without a
        run directory the recorder is disabled,
        so the call can stay in code that sometimes runs untraced; rank 0 then warns
        once (``RuntimeWarning``) unless ``TLOG_ENABLED`` says off.

        Raises ``ValueError`` naming the variable if ``RANK`` or ``WORLD_SIZE`` is not
        an integer, or ``TLOG_TAGS`` is not a JSON object.
        """
        env = os.environ
        if run_dir is None:
            run_dir = env.get(RUN_DIR_ENV) or None
        for key, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
            if key not in kwargs and env.get(var, "") != "":
                try:
                    kwargs[key] = int(env[var])
                except ValueError:
                    msg = f"environment variable {var}={env[var]!r} is not an integer"
                    raise ValueError(msg) from None
        kwargs.setdefault("stage", env.get("TLOG_STAGE") or "main")
        if "run_id" not in kwargs and env.get(RUN_ID_ENV):
            kwargs["run_id"] = env[RUN_ID_ENV]
        if env.get(TAGS_ENV, "").strip():
            kwargs["tags"] = {**_env_tags(env[TAGS_ENV]), **(kwargs.get("tags") or {})}
        if "worker" not in kwargs and env.get("TLOG_WORKER"):
            kwargs["worker"] = env["TLOG_WORKER"]
        if "enabled" not in kwargs:
            flag = env.get("TLOG_ENABLED", "1").strip().lower()
            kwargs["enabled"] = flag not in ("0", "false", "no", "off")
        if run_dir is None:
            if kwargs["enabled"] and kwargs.get("rank", 0) == 0:
                # Said once, by rank 0: a job that meant to record must not find
                # out after the run that nothing was written.
                warnings.warn("tlog: TLOG_RUN_DIR is not set, so nothing is recorded; set it "
                              "to a run directory (or TLOG_ENABLED=0 to silence this)",
                              RuntimeWarning, stacklevel=2)
            kwargs["enabled"] = False
            run_dir = "."
        return cls(run_dir, **kwargs)

    # -- the training-thread API -------------------------------------------------------------
    def iteration(self, tokens: int | None = None, samples: int | None = None):
        """Start an iteration: ``with rec.iteration(tokens=n) as it: ...``.

        ``tokens``/``samples``: work done in the iteration (throughput is derived from
        them). Returns an :class:`Iteration` (a no-op one when disabled or closed).
        """
        if not self.enabled:
            return NULL_ITERATION
        try:
            it = self._tls.it
        except AttributeError:
            it = self._tls.it = _new_iteration(self)
        if it._active:  # nested iteration of the same recorder on this thread
            it = Iteration(self)
        it.tokens = tokens
        it.samples = samples
        # The start of the iteration is here, not in __enter__: a Python __enter__ is
        # called from C by the ``with`` statement, a full interpreter entry (~35 ns more
        # than this specialised call), so Iteration.__enter__ is a C builtin returning it.
        log = it._log
        start = len(log)
        if start >= LOG_CHUNK:  # a fresh log; handed-off records keep the old one alive
            log = it._log = []
            it._app = it._ctx._app = log.append
            start = 0
        it._start = start
        it._n = next(it._counter)
        it._active = True
        t0 = it._t0 = _pc()
        if t0 >= it._cpu_ok_at:  # cpu wanted: chain on the previous end reading or read
            if t0 - it._t_end < self._cpu_chain_gap:
                it._c0 = it._c_end
                it._t_from = it._t_end
            else:
                it._c0 = self._cpu_clock()
                it._t_from = t0
        else:
            it._c0 = None
        return it

    # -- the callback-friendly form: iterations begun and ended by calls -----------------------
    def begin_iteration(self, tokens: int | None = None, samples: int | None = None,
                        start: float | None = None):
        """Start an iteration without a ``with`` block; :meth:`end_iteration` ends it.

        For code called at a step's start and end instead of wrapping it: framework
        callbacks (Hugging Face ``TrainerCallback.on_step_begin``/``on_step_end``,
        Lightning ``on_train_batch_start``/``end``), hooks, :mod:`dflash_runtime.auto`.
        Returns the :class:`Iteration` (phases: ``it.begin(name)``/``it.end()``, or
        ``it.phase``/``it.lap`` as usual); the record is the one ``with
        rec.iteration(...)`` writes, with the same hot-path cost. Begin and end on
        the same thread; one begun iteration per thread at a time.

        Never raises into training: beginning while an iteration begun this way is
        still open on this thread warns once (``RuntimeWarning``), drops that one
        (its end is unknown; counted in ``stats()["begin_end_mismatches"]``) and
        starts the new one. A no-op iteration when disabled.

        ``start``: a ``time.perf_counter()`` reading at which the iteration began, for
        callers that learn of a step's start only after it (a framework callback
        called after the batch was fetched: the fetch is then recorded with
        ``it.add_wait(name, start, now, kind)``); default and any later value: now.
        Thread CPU time ``cpu`` is still counted from the call.
        """
        if not self.enabled:
            return NULL_ITERATION
        tls = self._tls
        prev = tls.__dict__.get("begun")
        if prev is not None and prev._active:
            self._mismatch("begin", "rec.begin_iteration() while the iteration begun before "
                           "is still open: that one is dropped")
            prev._active = False
            if prev._kinds is not None or prev._gpu is not None:
                prev._kinds = prev._gpu = None
        it = tls.begun = self.iteration(tokens, samples)
        if start is not None and start < it._t0:  # begun late: the step began at ``start``
            it._t0 = start
        return it

    def end_iteration(self, error: BaseException | type | str | None = None) -> None:
        """End the iteration :meth:`begin_iteration` started on this thread and queue its record.

        ``error``: the exception that ended the step (an instance, its class or a class
        name), written as the record's ``"error"`` as a ``with`` block left by that
        exception would be; ``None`` for a normal end. Phases still open end here.
        Never raises: without an open begun iteration it warns once and does
        nothing.
        """
        if not self.enabled:
            return
        tls = self._tls
        it = tls.__dict__.get("begun")
        if it is None or not it._active:
            self._mismatch("end_iteration", "rec.end_iteration() with no iteration begun "
                           "on this thread")
            return
        tls.begun = None
        et = None
        if error is not None:
            if isinstance(error, str):
                et = _ErrorName(error)
            elif isinstance(error, type):
                et = error
            else:
                et = type(error)
        it.__exit__(et, None, None)

    @property
    def begun_iteration(self):
        """The iteration :meth:`begin_iteration` started on this thread and not yet ended, or ``None``."""
        it = self._tls.__dict__.get("begun")
        return it if it is not None and it._active else None

    def _mismatch(self, key: str, msg: str) -> None:
        """Count a begin/end mismatch and warn once per recorder and ``key``."""
        self._mismatches += 1
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"tlog: {msg} (warned once; counted in stats()"
                          "['begin_end_mismatches'])", RuntimeWarning, stacklevel=3)

    def watch_ddp(self, ddp_model: Any, *, hook: Any = None, state: Any = None) -> bool:
        """Measure the exposed gradient all-reduce wait of ``ddp_model`` (a DDP module).

        Registers a DDP communication hook (the averaging all-reduce DDP does anyway)
        that times each bucket's readiness and completion; each backward's exposed
        wait is written as ``<phase>/ddp_allreduce_wait`` (kind ``sync``) under the
        top-level phase open when the all-reduce finished, normally ``backward``.
        No-op returning ``False`` when disabled. ``hook``/``state``: a communication
        hook of yours to wrap (DDP takes one per model). Raises ``RuntimeError`` if the
        model already has a hook. See :func:`dflash_runtime.collectives.watch_ddp`.
        """
        if not self.enabled:
            return False
        from .collectives import watch_ddp

        return watch_ddp(ddp_model, self, hook=hook, state=state)

    def instrument(self, model: Any = None, optimizer: Any = None, loader: Any = None,
                   **options: Any):
        """Record a PyTorch training loop without naming phases: ``inst =
        rec.instrument(model, optimizer, loader)``; ``inst.remove()`` undoes it.

        Phases ``data_fetch``, ``h2d_copy``, ``forward``, ``backward``, ``grad_clip``,
        ``optimizer_step``, ``zero_grad`` (and the DDP all-reduce wait), one iteration
        per optimizer step. ``options``: ``syncs=True`` also catches implicit syncs;
        ``iterations=False`` records into your own ``rec.iteration()`` blocks;
        ``samples=``, ``ddp=``. See :func:`dflash_runtime.auto.instrument` (arguments,
        errors) and docs/RUNTIME.md. torch is imported here, not before.
        """
        from .auto import instrument

        return instrument(self, model, optimizer, loader, **options)

    def watch_p2p(self):
        """Time ``torch.distributed``'s point-to-point waits (``send``, ``recv``, the
        ``wait()`` of ``isend``/``irecv``/``batch_isend_irecv`` works) as ``sync``
        phases ``recv_wait``/``send_wait`` in the iteration open on the calling
        thread; returns a handle whose ``remove()`` stops it (``rec.instrument`` does
        this itself). See :mod:`dflash_runtime.p2p`. ``None`` when disabled.
        ``RuntimeError`` when another watch is active in this process.
        """
        if not self.enabled:
            return None
        from .p2p import watch_p2p

        return watch_p2p(self)

    def catch_syncs(self):
        """Time implicit host-device syncs (``Tensor.item``, ``Tensor.cpu``, ``synchronize``...)
        of non-CPU tensors as ``sync`` children of the open phase, named after their
        call site (``sync.item@train.py:212``); returns a handle whose ``remove()``
        stops it. See :mod:`dflash_runtime.syncs`. ``None`` when disabled.
        """
        if not self.enabled:
            return None
        from .syncs import catch_syncs

        return catch_syncs(self)

    def queue_sample(self, name: str, depth: int, capacity: int | None = None) -> None:
        """Record a ``queue`` sample: ``depth`` items in queue ``name`` of size ``capacity``."""
        if self.enabled:
            self._push((QUEUE, name, _pc(), depth, capacity))

    def event(self, name: str, **fields: Any) -> _EventCtx | _NullCtx:
        """``with rec.event("checkpoint"):`` records an ``event`` with its ``ts`` and ``dur``.

        Extra keyword fields (JSON-serialisable) are written into the record. Iterations
        that overlap an event are left out of steady-state figures by the analysis.
        """
        if not self.enabled:
            return _NULL_CTX
        return _EventCtx(self, name, fields or None)

    def add_event(self, name: str, start: float, end: float, **fields: Any) -> None:
        """Record an ``event`` that ran from ``start`` to ``end`` (``time.perf_counter()`` seconds).

        The ``with rec.event(name)`` record for code told of an event only when it
        ended (a framework's evaluation callback). ``end`` before ``start`` records
        ``dur`` 0.
        """
        if self.enabled:
            self._push((EVENT, name, start, max(0.0, end - start), fields or None))

    def mark(self, name: str, **fields: Any) -> None:
        """Record an instantaneous ``event`` (``dur`` 0), e.g. ``warmup_done``."""
        if self.enabled:
            self._push((EVENT, name, _pc(), 0.0, fields or None))

    def flush(self, timeout: float = 2.0) -> bool:
        """Write everything recorded so far now (blocking, on the calling thread).

        Records whose CUDA events are not complete stay pending. Returns ``False`` if
        the writer was busy for longer than ``timeout`` seconds.
        """
        if self._sink is None:
            return True
        return self._sink.flush(timeout=timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Flush and close the file. Idempotent; later calls record nothing.

        Takes at most about ``timeout`` seconds: the wait for the writer thread's
        current batch, writing the queue, and polling outstanding CUDA events
        (``Event.query()``, never synchronising). Records still queued when it passes
        are dropped and counted; records whose events are still incomplete are written
        without ``gpu`` and counted in ``gpu_dropped``; the drop counts are written
        into the file last. If the writer thread is stuck in a write for all of
        ``timeout`` (a hung file system), it finishes the file the same way when the
        write returns.
        """
        if self._closed:
            return
        self._closed = True
        self.enabled = False
        _RECORDERS.discard(self)
        if self._sink is not None:
            _writer.unregister(self._sink, timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et, ev, tb) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        """Counters (records unless named otherwise).

        ``records_written`` (on disk), ``records_dropped`` (never written: a full queue
        (``max_pending``), write or open failures, a deleted file, a final flush past
        its timeout), ``iters_dropped`` (the iterations among them), ``pending``
        (queued or being written), ``write_errors`` (failed writes and opens),
        ``gpu_dropped`` (phases without device time), ``gpu_pending`` (records waiting
        for CUDA events), once :meth:`watch_ddp` ran, ``ddp_rounds_lost``, and, once
        a ``begin``/``end`` call did not pair, ``begin_end_mismatches`` (calls).
        Every record made is in exactly one of written, dropped, pending or
        gpu_pending. The drop counts are also written into the file (FORMAT.md,
        "Drop counts").
        """
        s = self._sink
        gpu_dropped = sum(p.dropped for p in self._pools.values())
        out = {
            "records_written": 0, "records_dropped": self._overflow + self._overflow_other,
            "iters_dropped": self._overflow, "pending": len(self._q), "write_errors": 0,
            "gpu_dropped": gpu_dropped, "gpu_pending": 0,
        }
        if self._mismatches:
            out["begin_end_mismatches"] = self._mismatches
        if self._coll is not None:  # rounds no iteration claimed, or pushed out unread
            out["ddp_rounds_lost"] = self._coll.unmatched + self._coll.dropped
        if s is not None:
            dropped, iters = s.drop_counts()
            if s.closed:  # an iteration that ended on another thread after close()
                late = list(s.q)
                dropped += len(late)
                iters += sum(1 for item in late if item[0] == ITER)
                out["pending"] = 0
            out["records_written"] = s.written
            out["records_dropped"] = dropped
            out["iters_dropped"] = iters
            out["write_errors"] = s.write_errors
            out["gpu_dropped"] += s.gpu_dropped
            out["gpu_pending"] = len(s.waiting)
        return out

    # -- internals ------------------------------------------------------------------------
    def _push(self, item: tuple) -> None:
        q = self._q
        if len(q) < self._max_pending:
            q.append(item)
        else:
            self._overflow_other += 1

    def _note_run_queue(self, share: float) -> None:
        """Pick the CPU clock of the iterations from ``share``: the share of wall time
        the recording threads waited runnable for a core since the previous ``sys``
        sample (called by the writer thread; see :data:`CONTENDED_SHARE`)."""
        if _getrusage is not None:
            self._use_booked(share >= CONTENDED_SHARE)

    def _use_booked(self, booked: bool) -> None:
        """Read the iterations' CPU time with :func:`_booked_thread_time` (``booked``)
        or ``time.thread_time``. The booked time lags by up to a scheduler tick, and
        a thread just switched in has its time fresh: a reading at an iteration's
        start after a wait would sit systematically closer to the truth than the one
        at its end (seen as 40% too little CPU in a contended loop). So in that mode
        every end reading starts the next span, whatever the gap, and an iteration
        gets the span's CPU time times its share of the span's wall time."""
        self._cpu_booked = booked
        self._cpu_clock = _booked_thread_time if booked else _tt
        self._cpu_chain_gap = _POS_INF if booked else CPU_CHAIN_GAP_S

    def _acquire_events(self, stream: Any):
        """A (start, end, device) CUDA event triple from the pool, or ``None``."""
        torch = self._cuda
        if torch is None:
            torch = self._cuda = _cuda_module()
        if torch is False:
            return None
        dev = getattr(stream, "device_index", None)
        if dev is None:
            dev = -1
        pool = self._pools.get(dev)
        if pool is None:
            from .cuda import EventPool

            pool = self._pools[dev] = EventPool(torch, dev, self._max_gpu_events)
        return pool.acquire()

    def _memory_stats(self):
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        from .cuda import memory_figures

        return memory_figures(torch)

    def _after_fork_in_child(self) -> None:
        # The child must not write the parent's records nor into the parent's file.
        self.enabled = False
        self._closed = True
        self._q = deque()
        self._sink = None
        self._tls = threading.local()
        self._pools = {}
        self._coll = None
        _RECORDERS.discard(self)


def _cuda_module():
    """torch if it is already imported and CUDA is available, else ``False``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return torch if torch.cuda.is_available() else False
    except Exception:  # noqa: BLE001 - a broken CUDA setup means no device times
        return False
