"""The writer side of the shim: one background thread per process serving every recorder.

Each recorder has a :class:`Sink`: its file, the deque the training thread appends to,
and the records still waiting for CUDA events. The writer thread wakes every
``flush_interval`` seconds (at most 1 s), drains each deque, rebuilds phase durations
from the raw logs (:func:`build_phases`), serialises with ``json.dumps`` and writes the
batch with one ``os.write`` on an ``O_APPEND`` descriptor.

Guarantees (tested in tests/runtime/):

- Lines are whole: only the writer (or a flush holding the sink's lock) writes a file,
  a batch is one buffer, so threads never interleave bytes and a killed process leaves
  complete lines plus at most one partial last line.
- Flush at least every ``flush_interval`` (≤ 1 s), on ``Recorder.close()``, at exit
  (``atexit``) and on SIGTERM (then the previous handler runs, or the default action).
- Faults never raise into training: an unwritable directory or a full disk warns once
  (``RuntimeWarning``), counts dropped records and retries later; after a failed partial
  write the next batch starts on a fresh line so only the broken line is lost.
- ``fork``: the child forgets every sink and disables the inherited recorders (it has
  no writer thread and must not write the parent's records into the parent's file).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import signal
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

from .schema import CHILD_SEP, FORMAT_VERSION

# The clock pair that puts perf_counter readings on the wall clock (patched by tests).
_pc = time.perf_counter
_wall = time.time
# Indirection so tests can simulate a full disk without patching os for everyone.
_os_write = os.write

#: Wait between writer retries to open a file it could not open (seconds).
REOPEN_EVERY_S = 1.0
#: How long a SIGTERM flush may wait for a busy sink or for CUDA events (seconds).
SIGTERM_FLUSH_S = 1.0

_ITER, _QUEUE, _EVENT = 0, 1, 2  # same tags as recorder.ITER/QUEUE/EVENT
_ENTER, _ENTER_X = 1, 2  # same markers as recorder.ENTER/ENTER_X


def _dumps(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str, allow_nan=False) + "\n"


def build_phases(log: list, t0: float, t1: float, start: int = 0, end: int | None = None):
    """Turn an iteration's raw log into ``(phases, kinds, slots)``.

    ``log`` is the flat list the training thread appended (format in
    :mod:`dflash_runtime.recorder`): laps ``name, t``;
    blocks ``ENTER, name, t`` / ``ENTER_X, (name, kind, slot), t`` ended by a float
    ``t``. Times are ``perf_counter`` seconds; ``t0``/``t1`` bound the iteration, whose
    entries are ``log[start:end]``.

    Returns ``phases`` (full name -> seconds, in order of first start; children named
    ``parent/child``; repeated names summed), ``kinds`` (full name -> kind, or None)
    and ``slots`` (CUDA event slot -> full name, or None). Blocks still open at ``t1``
    end there; a truncated trailing entry is ignored.
    """
    phases: dict[str, float] = {}
    kinds: dict[str, str] | None = None
    slots: dict[int, str] | None = None
    prefix = ""
    mark = t0
    stack: list = []
    i = start
    n = len(log) if end is None else end
    while i < n:
        e = log[i]
        c = e.__class__
        if c is float:  # the innermost block ends
            i += 1
            if stack:
                full, began, prefix = stack.pop()
                phases[full] += e - began
                mark = e
            continue
        if c is str:  # lap
            if i + 1 >= n:
                break
            t = log[i + 1]
            i += 2
            full = prefix + e if prefix else e
            phases[full] = phases.get(full, 0.0) + (t - mark)
            mark = t
            continue
        # block start
        if i + 2 >= n:
            break
        kind = slot = None
        if e == _ENTER:
            name = log[i + 1]
        else:
            name, kind, slot = log[i + 1]
        t = log[i + 2]
        i += 3
        full = prefix + name if prefix else name
        if full not in phases:
            phases[full] = 0.0
        stack.append((full, t, prefix))
        if kind is not None:
            if kinds is None:
                kinds = {}
            kinds[full] = kind
        if slot is not None:
            if slots is None:
                slots = {}
            slots[slot] = full
        prefix = full + CHILD_SEP
        mark = t
    while stack:
        full, began, prefix = stack.pop()
        phases[full] += t1 - began
    return phases, kinds, slots


def _r9(x: float) -> float:
    return round(x, 9) if x > 0.0 else 0.0


class Sink:
    """One recorder's file and the records on their way to it (writer-side state)."""

    def __init__(self, rec, meta: dict, manifest: dict | None, interval: float) -> None:
        self.rec_ref = weakref.ref(rec)
        self.q = rec._q
        self.meta = meta
        self.manifest = manifest
        self.interval = interval
        self.run_dir = Path(rec.run_dir)
        self.base = f"rank{rec.rank}.{rec.stage}"
        self.path = self.run_dir / f"{self.base}.jsonl"
        self.lock = threading.Lock()
        self.fd: int | None = None
        self.meta_written = False
        self.partial = False
        self.waiting: list = []  # [record dict, [(full name, event pair), ...]]
        self.written = 0
        self.dropped = 0
        self.write_errors = 0
        self.gpu_dropped = 0
        self.warned = False
        self.next_open = 0.0
        self.closed = False
        self.writer_device = [-1]
        self._open(warn=True)

    # -- file handling ----------------------------------------------------------------
    def _open(self, *, warn: bool) -> bool:
        """Create the run directory and claim a file name no other writer uses.

        ``rank{r}.{stage}.jsonl``, else ``rank{r}.{stage}.{k}.jsonl`` for the first free
        ``k`` (a restarted rank or two recorders with the same rank and stage must not
        append to one file). With ``k``, a recorder whose worker was not named
        becomes worker ``<stage>-<rank>.<k>``: a restarted process counts ``iter``
        from 0 again, and under the first process's worker name its iterations
        would be taken at ingest for duplicates of the first's and dropped.
        """
        self.next_open = time.monotonic() + REOPEN_EVERY_S
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
            for k in range(1000):
                path = self.run_dir / (f"{self.base}.jsonl" if k == 0 else f"{self.base}.{k}.jsonl")
                try:
                    self.fd = os.open(path, flags, 0o644)
                except FileExistsError:
                    continue
                self.path = path
                rec = self.rec_ref()
                if k and not self.meta_written and rec is not None and not rec.worker_named:
                    rec.worker = self.meta["worker"] = f"{rec.stage}-{rec.rank}.{k}"
                return True
            msg = f"no free file name for {self.base} in {self.run_dir}"
            raise OSError(msg)
        except OSError as exc:
            if warn:
                self._warn(f"cannot open a timing log in {self.run_dir}: {exc}")
            return False

    def _warn(self, message: str) -> None:
        self.write_errors += 1
        if self.warned:
            return
        self.warned = True
        try:
            warnings.warn(
                f"dflash_runtime: {message}; dropping timing records and carrying on "
                "(stats() counts them)", RuntimeWarning, stacklevel=2,
            )
        except Exception:  # noqa: BLE001, S110 - warnings set to errors must still not raise
            pass

    def _write(self, lines: list[str], n_records: int) -> None:
        if not lines and self.meta_written:
            return
        if self.fd is None and (time.monotonic() < self.next_open or not self._open(warn=True)):
            self.dropped += n_records
            return
        data = "".join(lines).encode("utf-8")
        head = b""
        if self.partial:  # end the line a failed write cut, so it is lost alone
            head = b"\n"
        if not self.meta_written:
            head += _dumps(self.meta).encode("utf-8")
        data = head + data
        view = memoryview(data)
        done = 0
        total = len(data)
        try:
            while done < total:
                try:
                    n = _os_write(self.fd, view[done:])
                except InterruptedError:
                    continue
                if n <= 0:
                    raise OSError(errno.EIO, "write() wrote nothing")
                done += n
        except OSError as exc:
            if done >= len(head):
                self.meta_written = True
            # records whose newline did not reach the file are lost
            lost = data.count(b"\n", max(done, len(head)))
            self.dropped += lost
            self.written += n_records - lost
            self.partial = done > 0 and data[done - 1] != 0x0A
            self._warn(f"cannot write {self.path}: {exc}")
            return
        self.meta_written = True
        self.partial = False
        self.written += n_records

    def _write_manifest(self) -> None:
        manifest, self.manifest = self.manifest, None
        from .manifest import write_manifest

        try:
            write_manifest(self.run_dir, manifest)
        except OSError as exc:
            self._warn(f"cannot write {self.run_dir / 'run.json'}: {exc}")

    # -- flushing ---------------------------------------------------------------------
    def flush(self, timeout: float = 2.0, *, final: bool = False, blocking: bool = True) -> bool:
        """Drain, serialise and write; ``final`` also waits up to ``timeout`` for CUDA events.

        Returns ``False`` if the sink's lock could not be taken in time. Never raises.
        """
        if blocking:
            ok = self.lock.acquire(timeout=max(timeout, 0.0))
        else:
            ok = self.lock.acquire(blocking=False)
        if not ok:
            return False
        try:
            if self.closed:
                return True
            self._flush_locked(final, time.monotonic() + timeout)
            if final:
                self._close_fd()
        except Exception as exc:  # noqa: BLE001 - nothing may kill the writer thread
            self._warn(f"timing writer error: {exc!r}")
        finally:
            self.lock.release()
        return True

    def _close_fd(self) -> None:
        self.closed = True
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def _flush_locked(self, final: bool, deadline: float) -> None:
        if self.manifest is not None:
            self._write_manifest()
        off = _wall() - _pc()
        lines: list[str] = []
        q = self.q
        waiting = self.waiting
        owner = self.rec_ref()
        coll = None if owner is None else owner._coll
        while True:
            try:
                item = q.popleft()
            except IndexError:
                break
            tag = item[0]
            if tag == _ITER:
                rec, pending = _iter_record(item, off, coll)
                if pending:
                    waiting.append((rec, pending))
                else:
                    lines.append(_dumps(rec))
            elif tag == _QUEUE:
                _, name, t, depth, cap = item
                rec = {"type": "queue", "v": FORMAT_VERSION, "name": name,
                       "ts": round(t + off, 6), "depth": depth}
                if cap is not None:
                    rec["capacity"] = cap
                lines.append(_dumps(rec))
            else:
                _, name, t, dur, fields = item
                rec = {"type": "event", "v": FORMAT_VERSION, "name": name,
                       "ts": round(t + off, 6), "dur": _r9(dur)}
                if fields:
                    for k, v in fields.items():
                        rec.setdefault(k, v)
                lines.append(_dumps(rec))
        if waiting:
            self._resolve(lines, final, deadline)
        self._write(lines, len(lines))

    def _resolve(self, lines: list[str], final: bool, deadline: float) -> None:
        """Move records whose CUDA events completed from ``waiting`` to ``lines``."""
        from .cuda import device_context, pairs_done, set_writer_device

        on_writer = threading.current_thread() is _thread
        while True:
            still = []
            for rec, pending in self.waiting:
                pairs = [p for _, p in pending]
                dev = pairs[0][2]
                torch = pairs[0][3]._torch
                if on_writer:
                    set_writer_device(torch, dev, self.writer_device)
                    done = pairs_done(pairs)
                else:
                    with device_context(torch, dev):
                        done = pairs_done(pairs)
                if done:
                    gpu: dict[str, float] = {}
                    for full, p in pending:
                        ms = p[0].elapsed_time(p[1])  # both complete: returns at once
                        gpu[full] = gpu.get(full, 0.0) + ms / 1e3
                        p[3].release(p)
                    rec["gpu"] = {k: _r9(v) for k, v in gpu.items()}
                    lines.append(_dumps(rec))
                else:
                    still.append((rec, pending))
            self.waiting = still
            if not still or not final:
                return
            if time.monotonic() >= deadline:
                for rec, pending in still:
                    self.gpu_dropped += len(pending)
                    lines.append(_dumps(rec))
                self.waiting = []
                return
            time.sleep(0.002)


def _iter_record(item: tuple, off: float, coll: Any = None):
    _, n, t0, t1, cpu, log, start, end, tokens, samples, kinds, gpu, mem, err = item
    phases, log_kinds, slots = build_phases(log, t0, t1, start, end)
    waits = None
    if coll is not None and coll.finished:  # measured collective waits (watch_ddp)
        rounds = coll.take(t0, t1)
        if rounds:
            from .collectives import place_waits, top_level_spans

            spans = top_level_spans(log, t0, start, end)
            phases, log_kinds, waits = place_waits(phases, log_kinds, spans, rounds, t0, t1)
    rec: dict[str, Any] = {
        "type": "iter", "v": FORMAT_VERSION, "iter": n, "ts": round(t0 + off, 6),
        "dur": _r9(t1 - t0), "phases": {k: _r9(v) for k, v in phases.items()},
    }
    if cpu is not None:
        rec["cpu"] = _r9(cpu)
    if tokens is not None:
        rec["tokens"] = tokens
    if samples is not None:
        rec["samples"] = samples
    if log_kinds or kinds:
        merged = dict(log_kinds or {})
        if kinds:
            merged.update(kinds)
        rec["kinds"] = merged
    if mem:
        rec["mem"] = mem
    if err is not None:
        rec["error"] = err
    pending = None
    if gpu:
        pending = [(slots[i], p) for i, p in enumerate(gpu) if slots and i in slots]
    if waits:
        pending = (pending or []) + waits
    return rec, pending


# -- the process-wide writer ---------------------------------------------------------------
_registry_lock = threading.Lock()
_sinks: list[Sink] = []
_thread: threading.Thread | None = None
_wake = threading.Event()
_atexit_installed = False
_sigterm_prev: Any = None
_sigterm_installed = False


def _interval() -> float:
    return min((s.interval for s in _sinks), default=1.0)


def _writer_loop() -> None:
    while True:
        _wake.wait(_interval())
        _wake.clear()
        for sink in _sinks:
            sink.flush(0.0, blocking=False)


def _ensure_thread() -> None:
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_writer_loop, name="tlog-writer", daemon=True)
        _thread.start()


def register(rec, meta: dict, manifest: dict | None, interval: float, handlers: bool) -> Sink:
    """Create the recorder's sink and make sure the writer thread runs."""
    global _atexit_installed
    sink = Sink(rec, meta, manifest, interval)
    with _registry_lock:
        _sinks.append(sink)
        if not _atexit_installed:
            atexit.register(flush_all)
            _atexit_installed = True
        _ensure_thread()
    if handlers:
        _install_sigterm()
    return sink


def unregister(sink: Sink, timeout: float) -> None:
    """Final flush of ``sink`` (waiting up to ``timeout`` for CUDA events), then forget it."""
    sink.flush(timeout, final=True)
    with _registry_lock:
        if sink in _sinks:
            _sinks.remove(sink)


def flush_all(timeout: float = 2.0) -> None:
    """Final flush of every sink (atexit). Never raises."""
    for sink in _sinks:
        sink.flush(timeout, final=True)
        rec = sink.rec_ref()
        if rec is not None:
            rec.enabled = False


def _on_sigterm(signum, frame) -> None:
    """Flush every sink, then hand the signal on (previous handler or default action).

    When the default action follows (the process dies), the flush is final: records
    still waiting for CUDA events get up to :data:`SIGTERM_FLUSH_S` seconds of polling
    and are then written without ``gpu``. Before a Python handler (which may keep the
    process alive) the flush leaves the files open and such records pending.
    """
    prev = _sigterm_prev
    dying = not callable(prev) and prev != signal.SIG_IGN
    for sink in _sinks.copy():
        sink.flush(SIGTERM_FLUSH_S, final=dying)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm() -> None:
    """Install the SIGTERM flush once, from the main thread only, chaining the old handler."""
    global _sigterm_prev, _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        prev = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter, or an embedded runtime
        return
    _sigterm_prev = prev
    _sigterm_installed = True


def _after_fork_in_child() -> None:
    global _thread, _registry_lock, _wake
    _thread = None
    _registry_lock = threading.Lock()
    _wake = threading.Event()
    for sink in _sinks:
        if sink.fd is not None:
            try:
                os.close(sink.fd)
            except OSError:
                pass
            sink.fd = None
        sink.closed = True
        rec = sink.rec_ref()
        if rec is not None:
            rec._after_fork_in_child()
    _sinks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["Sink", "build_phases", "flush_all", "register", "unregister"]
