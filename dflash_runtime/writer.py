"""The writer side of the shim: one background thread per process serving every recorder.

Each recorder has a :class:`Sink`: its file, the deque the training thread appends to,
and the records still waiting for CUDA events. The writer thread wakes every
``flush_interval`` seconds (at most 1 s) and serves each sink in *bounded batches*:
at most :data:`BATCH_RECORDS` records, :data:`BATCH_BYTES` bytes or
:data:`BATCH_SECONDS` of serialising, read from the head of the deque, turned into
phase durations (:func:`build_phases`) and JSON, written with one ``os.write`` on an
``O_APPEND`` descriptor, and only then popped. A batch that stopped at a cap is
followed at once by the next (sinks take turns), so a loop recording faster than the
writer still sees its file grow every batch, and the deque, which holds every record
not yet on disk, stays under the recorder's ``max_pending`` cap (beyond it the
training thread drops new records and counts them).

Guarantees (tested in tests/runtime/):

- Lines are whole: only the writer (or a flush holding the sink's lock) writes a file,
  a batch is one buffer, so threads never interleave bytes and a killed process leaves
  complete lines plus at most one partial last line.
- A write at least every ``flush_interval`` (≤ 1 s) while records arrive, however
  fast; on ``Recorder.close()``, at exit (``atexit``, and multiprocessing's own exit
  finalizers in child processes, which leave through ``os._exit``) and on SIGTERM
  (then the previous handler runs, or the default action), also when the signal finds
  the main thread in a wait with no timeout (sigwatch.py).
- Every record is on disk or counted as dropped (``Recorder.stats()``), and the
  counts reach the file: a ``meta`` line ``{"type": "meta", "v": 1,
  "records_dropped": N, "iters_dropped": M}`` (cumulative for the file) when they
  changed, at most every :data:`DROPS_EVERY_S` and at close (FORMAT.md).
- Faults never raise into training: an unwritable directory, a full disk or a file
  deleted with its run directory warns once (``RuntimeWarning``), counts dropped
  records and (except a deleted file) retries later; after a failed partial write the
  next batch starts on a fresh line so only the broken line is lost.
- ``fork``: the child forgets every sink and disables the inherited recorders (it has
  no writer thread and must not write the parent's records into the parent's file).
"""

from __future__ import annotations

import atexit
import errno
import json
import operator
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

from . import sigwatch
from .format import CHILD_SEP, FORMAT_VERSION

# The clock pair that puts perf_counter readings on the wall clock (patched by tests).
_pc = time.perf_counter
_wall = time.time
# Indirection so tests can simulate a full disk without patching os for everyone.
_os_write = os.write

#: Wait between writer retries to open a file it could not open (seconds).
REOPEN_EVERY_S = 1.0
#: How long a SIGTERM flush may take (seconds): waiting for a busy sink, writing the
#: queue (what is left then is dropped and counted) and polling CUDA events.
SIGTERM_FLUSH_S = 1.0
#: Most records in one write (tlog's choice: 20-40 ms of serialising at 20-40 us per
#: record of 10 phases, so a batch holds a file back for a small part of an interval).
BATCH_RECORDS = 1024
#: Most bytes of JSON in one write (tlog's choice; bounds the writer's buffer).
BATCH_BYTES = 1 << 20
#: Most seconds the writer thread serialises before it writes what it has (tlog's
#: choice: under CPU contention a batch of BATCH_RECORDS can take far longer than
#: its CPU time, and the file must keep growing every interval).
BATCH_SECONDS = 0.05
#: Least seconds between two drop-count lines of one file (tlog's choice: each is a
#: ``meta`` line, which cuts the file into a new segment at ingest; the last counts
#: are always written at close and exit).
DROPS_EVERY_S = 5.0
#: ``exitpriority`` of the multiprocessing finalizer that flushes a child process at
#: exit (tlog's choice: above multiprocessing's own queue finalizers, 10, so the
#: flush runs first; any value >= 0 runs before ``os._exit``).
MP_EXIT_PRIORITY = 100

_ITER, _QUEUE, _EVENT = 0, 1, 2  # same tags as recorder.ITER/QUEUE/EVENT
_SYS = 3  # a ``sys`` record the writer queued itself: (_SYS, record dict)
_ENTER, _ENTER_X = 1, 2  # same markers as recorder.ENTER/ENTER_X
_ITER_LINE = '{"type":"iter"'  # how every iteration line _dumps writes begins


# One encoder for every line: json.dumps with options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False).encode


def _dumps(obj: dict) -> str:
    return _encode(obj) + "\n"


#: Most phase layouts whose line template :func:`_fast_iter_line` keeps (tlog's
#: choice: a loop that puts step numbers in phase names makes a layout per
#: iteration; the cache is emptied when it fills, so it stays bounded).
MAX_TEMPLATES = 256
_templates: dict[tuple, str | None] = {}
_INF = float("inf")
_sub = operator.sub
_ENTER_LIST = [1]        # a log that starts with a block (recorder.ENTER)
_INT_TYPE = {int}


def _template(names: tuple) -> str | None:
    """The ``%``-format of an iteration line whose phases are the laps ``names``
    (each once), or None when they are not all distinct ``str`` (the general
    path sums repeats). Phase values are written ``%.9f`` and ``ts`` ``%.6f``:
    the same numbers as :func:`_r9` and ``round(ts, 6)`` give (both round
    correctly to that many decimals), as plain decimals."""
    if len(_templates) >= MAX_TEMPLATES:
        _templates.clear()
    fmt = None
    if all(n.__class__ is str for n in names) and len(set(names)) == len(names):
        body = ",".join(json.dumps(n).replace("%", "%%") + ":%.9f" for n in names)
        fmt = (f'{{"type":"iter","v":{FORMAT_VERSION},"iter":%d,"ts":%.6f,"dur":%.9f,'
               f'"phases":{{{body}}}')
    _templates[names] = fmt
    return fmt


def _no_line(item: tuple, off: float) -> None:
    """Stands for :func:`_fast_iter_line` where every record takes the general path."""
    return


def _fast_iter_line(item: tuple, off: float) -> str | None:
    """The line of a queued iteration of laps only, or of blocks none of which
    is inside another (no kinds, CUDA events, memory or error;
    ``tokens``/``samples`` ints if given), formatted from a template per phase
    layout: about a quarter of the cost of building its dict and encoding it.
    None when the iteration needs the general path (:func:`_iter_record`);
    both write the same numbers."""
    _, n, t0, t1, cpu, log, start, end, tokens, samples, kinds, gpu, mem, err = item
    if kinds is not None or gpu or mem or err is not None or n.__class__ is not int:
        return None
    if log[start:start + 1] == _ENTER_LIST and not (end - start) & 3 and set(
            map(type, marks := log[start:end:4])) == _INT_TYPE and marks.count(_ENTER) == len(
            marks):
        # blocks side by side, none inside another (ENTER, name, begin, end: the
        # automatic mode's phases): each phase is its block's end minus begin
        blocks = True
        names = tuple(log[start + 1:end:4])
    elif not (end - start) & 1:     # laps: each phase is the time since the last mark
        blocks = False
        names = tuple(log[start:end:2])
    else:
        return None
    fmt = _templates.get(names, False)
    if fmt is False:
        fmt = _template(names)
    if fmt is None:                 # not all distinct names: a mixed or nested log too
        return None
    if blocks:
        vals = list(map(_sub, log[start + 3:end:4], log[start + 2:end:4]))
    else:
        times = log[start + 1:end:2]
        vals = list(map(_sub, times, [t0, *times[:-1]])) if times else []
    dur = t1 - t0
    if vals:
        # a negative, NaN or infinite value is clamped or refused by the general path
        if not (min(vals) >= 0.0 and 0.0 <= sum(vals) + dur < _INF):
            return None
        line = fmt % (n, t0 + off, dur, *vals)
    elif 0.0 <= dur < _INF:
        line = fmt % (n, t0 + off, dur)
    else:
        return None
    if cpu is not None:
        if not 0.0 <= cpu < _INF:
            return None
        line += f',"cpu":{cpu:.9f}'
    if tokens is not None:
        if tokens.__class__ is not int:
            return None
        line += f',"tokens":{tokens}'
    if samples is not None:
        if samples.__class__ is not int:
            return None
        line += f',"samples":{samples}'
    return line + "}\n"


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
    """One recorder's file and the records on their way to it (writer-side state).

    The training thread appends to ``q`` (the recorder's deque); only the holder of
    ``lock`` (the writer thread, or a ``flush()``/``close()``/exit flush) reads it. A
    batch is read from the head of ``q`` by index, serialised, written, and only then
    popped, so ``len(q)`` counts every record not yet on disk or counted (the
    recorder's ``max_pending`` cap covers the batch being written).

    Counters (records): ``written`` (on disk), ``dropped`` / ``dropped_iters``
    (lost on the writer side: write or open failures, a deleted file, a final flush
    past its deadline); the recorder adds its own overflow counts (``stats()``).
    """

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
        self.failing = False  # the last write (or open) failed
        self.waiting: list = []  # [record dict, [(full name, event pair), ...]]
        self.written = 0
        self.dropped = 0
        self.dropped_iters = 0
        self.overflow = (0, 0)  # the recorder's (iterations, other records) overflow, last read
        self.logged = (0, 0)  # (records_dropped, iters_dropped) in the last drop-count line
        self.drops_due = 0.0  # monotonic time from which the next drop-count line may go
        self.resolve_due = 0.0  # monotonic time of the next CUDA-event poll by the writer
        self.write_errors = 0
        self.gpu_dropped = 0
        self.warned: set[str] = set()
        self.next_open = 0.0
        self.closed = False
        self.vanished = False
        self.abandoned = False  # a final flush timed out: the writer thread finishes the sink
        self.writer_device = [-1]
        # ``sys`` sampling (dflash_runtime.sysinfo): seconds between samples (0: off)
        # and the monotonic time of the next; the first is taken at the first serve.
        self.sys_interval = float(getattr(rec, "_sys_interval", 0.0) or 0.0)
        self.sys_adaptive = bool(getattr(rec, "_sys_adaptive", False))
        self.sys_gap = self.sys_interval   # seconds to the next sample (sysinfo.next_gap)
        self.sys_due = 0.0
        self.sys_first: float | None = None   # monotonic time of the first sample
        self.sys_wait: tuple[float, float] | None = None   # (cpu_wait, time) last sampled
        if manifest is not None:
            with _manifest_lock:
                _manifest_order.append(self)
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
                self._warn("fault", f"cannot open a timing log in {self.run_dir}: {exc}")
            return False

    def _warn(self, what: str, message: str) -> None:
        """Count a fault; warn once per kind and sink. Never raises.

        Kinds (``what``): ``fault`` (open, write, manifest or writer errors: one warning
        for all, they usually share a cause) and ``vanished`` (the file was deleted).
        """
        self.write_errors += 1
        if what in self.warned:
            return
        self.warned.add(what)
        try:
            warnings.warn(
                f"dflash_runtime: {message}; dropping timing records and carrying on "
                "(stats() counts them)", RuntimeWarning, stacklevel=2,
            )
        except Exception:  # noqa: BLE001, S110 - warnings set to errors must still not raise
            pass

    def _gone(self) -> bool:
        """True once the file has no name left (its run directory or the file was deleted).

        Checked before each write (one ``fstat``): appending to an unlinked file would
        fill space nobody can read. Warned once; from then on records are dropped and
        counted, and the directory is not created again (it was removed on purpose).
        """
        if self.vanished:
            return True
        try:
            if os.fstat(self.fd).st_nlink > 0:
                return False
        except OSError:
            return False  # let the write report it
        self.vanished = True
        self._warn("vanished", f"the timing log {self.path} was deleted while recording "
                   "(was the run directory removed?)")
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.fd = None
        return True

    def _write(self, lines: list[str]) -> list[str]:
        """Write ``lines`` (and the meta line first, once) in one buffer; return the lines lost.

        Never raises: a failure warns once, is counted in ``write_errors`` and returns the
        lines whose newline did not reach the file (a cut line is ended by the next write).
        """
        if self.manifest is not None:
            self._write_manifest()
        if not lines and self.meta_written:
            return lines
        if self.vanished:
            return lines
        if self.fd is None and (time.monotonic() < self.next_open or not self._open(warn=True)):
            self.failing = True
            return lines
        if self._gone():
            return lines
        data = "".join(lines).encode("utf-8")
        head = b""
        if self.partial:  # end the line a failed write cut, so it is lost alone
            head = b"\n"
        if not self.meta_written:
            if self.sys_interval and "machine" not in self.meta:
                self._describe_machine()
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
            self.partial = done > 0 and data[done - 1] != 0x0A
            self.failing = True
            self._warn("fault", f"cannot write {self.path}: {exc}")
            return lines[len(lines) - lost:] if lost else []
        self.meta_written = True
        self.partial = False
        self.failing = False
        return []

    def _describe_machine(self) -> None:
        """Put the process's ``machine`` (:meth:`dflash_runtime.sysinfo.Sampler.machine`)
        into the meta line before it is first written. Never raises."""
        try:
            from .sysinfo import sampler

            self.meta["machine"] = sampler().machine(self.rec_ref())
        except Exception as exc:  # noqa: BLE001 - a machine we cannot describe is left out
            self._warn("fault", f"timing writer error: {exc!r}")

    def _sample_sys(self, now: float) -> None:
        """Queue a ``sys`` record (lock held) and set the next one's due time.

        The sample is appended to the recorder's queue like the training thread's
        records (a ``deque`` append is thread-safe) and written in the same batch.
        """
        from .sysinfo import next_gap, sampler

        if self.sys_first is None:
            self.sys_first = now
        self.sys_gap = next_gap(self.sys_interval, now - self.sys_first,
                                adapt=self.sys_adaptive)
        self.sys_due = now + self.sys_gap
        rec = self.rec_ref()
        if rec is None:
            return
        try:
            sample = sampler().sample(rec)
            self.q.append((_SYS, sample))
            self._note_run_queue(rec, sample.get("cpu_wait"), now)
        except Exception as exc:  # noqa: BLE001 - sampling must never stop the writer
            self._warn("fault", f"timing writer error: {exc!r}")

    def _note_run_queue(self, rec, wait: float | None, now: float) -> None:
        """Tell the recorder how long its threads waited for a core since the last
        sample, as a share of the time between (it picks its CPU clock by it)."""
        if wait is None:
            return
        prev, self.sys_wait = self.sys_wait, (wait, now)
        if prev is not None and now > prev[1]:
            rec._note_run_queue(max(wait - prev[0], 0.0) / (now - prev[1]))

    def _lose(self, lines: list[str]) -> None:
        """Count record lines that will never reach the file."""
        if lines:
            self.dropped += len(lines)
            self.dropped_iters += sum(1 for x in lines if x.startswith(_ITER_LINE))

    def _lose_items(self, items) -> None:
        """Count queued records (recorder tuples) that will never be serialised."""
        for item in items:
            self.dropped += 1
            if item[0] == _ITER:
                self.dropped_iters += 1

    def _write_records(self, lines: list[str]) -> None:
        lost = self._write(lines)
        self.written += len(lines) - len(lost)
        self._lose(lost)

    def drop_counts(self) -> tuple[int, int]:
        """``(records_dropped, iters_dropped)`` so far: the writer's and the recorder's."""
        rec = self.rec_ref()
        if rec is not None:
            self.overflow = (rec._overflow, rec._overflow_other)
        it, other = self.overflow
        return self.dropped + it + other, self.dropped_iters + it

    def _log_drops(self, force: bool) -> None:
        """Append the drop-count line when the counts changed (at most every DROPS_EVERY_S,
        or ``force``): ``{"type": "meta", "v": 1, "records_dropped": N, "iters_dropped": M}``."""
        counts = self.drop_counts()
        if counts == self.logged or not (force or time.monotonic() >= self.drops_due):
            return
        if self.failing or self.vanished:  # the file cannot take it now: next time
            return
        self.drops_due = time.monotonic() + DROPS_EVERY_S
        line = _dumps({"type": "meta", "v": FORMAT_VERSION, "records_dropped": counts[0],
                       "iters_dropped": counts[1]})
        if not self._write([line]):
            self.logged = counts

    def _write_manifest(self) -> None:
        """Write the pending ``run.json`` manifests of this process, oldest recorder first,
        up to this sink's: "the first manifest stays" then means the first recorder's,
        whichever thread gets to write first."""
        with _manifest_lock:
            while _manifest_order:
                sink = _manifest_order.pop(0)
                manifest, sink.manifest = sink.manifest, None
                if manifest is not None:
                    from .manifest import write_manifest

                    try:
                        write_manifest(sink.run_dir, manifest)
                    except OSError as exc:
                        sink._warn("fault", f"cannot write {sink.run_dir / 'run.json'}: {exc}")
                if sink is self:
                    return

    # -- flushing ---------------------------------------------------------------------
    def serve(self) -> bool:
        """The writer thread's turn: write one bounded batch if the lock is free.

        Returns True when the batch stopped at a cap (more may be queued), so the
        writer serves again before sleeping. Never raises.
        """
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self.closed:
                return False
            if self.abandoned:  # a close() timed out waiting for this thread: finish it
                self._finish(time.monotonic())
                return False
            now = time.monotonic()
            if self.sys_interval and now >= self.sys_due:
                self._sample_sys(now)
            poll = now >= self.resolve_due  # CUDA events: polled once per interval
            if poll:
                self.resolve_due = now + self.interval
            _, more = self._batch(poll, now + BATCH_SECONDS)
            self._log_drops(False)
            return more
        except Exception as exc:  # noqa: BLE001 - nothing may kill the writer thread
            self._warn("fault", f"timing writer error: {exc!r}")
            return False
        finally:
            self.lock.release()

    def flush(self, timeout: float = 2.0, *, final: bool = False, blocking: bool = True) -> bool:
        """Write what is queued now, in bounded batches; ``final`` also closes the file.

        ``timeout`` (seconds) bounds the wait for the sink's lock; with ``final`` it bounds
        the whole flush: batches are written until it passes, the records still queued
        then are dropped and counted, CUDA events are polled until it passes (records
        still waiting are written without ``gpu``), a last drop-count line is written
        and the file closed. If a final flush cannot take the lock in time (the writer
        thread is stuck in a write), the sink is marked ``abandoned`` and the writer
        thread finishes it the same way as soon as it can.

        Returns ``False`` if the lock could not be taken in time. Never raises.
        """
        global _main_flushing
        main = threading.current_thread() is threading.main_thread()
        if main:
            _main_flushing += 1  # a SIGTERM now waits for this flush (_on_sigterm)
        try:
            return self._flush(timeout, final, blocking)
        finally:
            if main:
                _main_flushing -= 1
                if not _main_flushing and _deferred is not None:
                    _deliver_deferred()

    def _flush(self, timeout: float, final: bool, blocking: bool) -> bool:
        deadline = time.monotonic() + max(timeout, 0.0)
        if blocking:
            ok = self.lock.acquire(timeout=max(timeout, 0.0))
        else:
            ok = self.lock.acquire(blocking=False)
        if not ok:
            if final:
                self.abandoned = True
            return False
        try:
            if self.closed:
                return True
            if final:
                self._finish(deadline)
            else:
                left = len(self.q)  # what was queued at the call, not what arrives meanwhile
                poll = True
                while True:
                    taken, _ = self._batch(poll, None)
                    poll = False
                    left -= taken
                    if left <= 0 or not taken:
                        break
                self._log_drops(False)
        except Exception as exc:  # noqa: BLE001 - never raise into training
            self._warn("fault", f"timing writer error: {exc!r}")
        finally:
            self.lock.release()
        return True

    def _finish(self, deadline: float) -> None:
        """Final flush (lock held): batches until ``deadline``, then drop and count the rest,
        poll CUDA events until ``deadline``, write the drop-count line, close the file."""
        try:
            q = self.q
            if self.sys_interval:   # the last sample of the file
                self._sample_sys(time.monotonic())
            while q and time.monotonic() < deadline:
                self._batch(False, deadline)
            if q:  # past the deadline: whatever is still queued is counted, not lost
                n = len(q)
                self._lose_items(q.popleft() for _ in range(n))
            if self.waiting:
                lines: list[str] = []
                self._resolve(lines, True, deadline)
                self._write_records(lines)
            self._write_records([])  # the meta line, if nothing was ever written
            self._log_drops(True)
        finally:
            self._close_fd()

    def _close_fd(self) -> None:
        self.closed = True
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def _batch(self, poll: bool, until: float | None) -> tuple[int, bool]:
        """Serialise and write one batch from the head of the queue (lock held).

        At most :data:`BATCH_RECORDS` records or :data:`BATCH_BYTES` bytes, and, when
        ``until`` (monotonic seconds) is given, no serialising past it. The records are
        read by index and popped after the write, so the queue keeps counting them
        until they are on disk or counted as dropped. ``poll``: also move records whose
        CUDA events completed into the batch. Returns ``(records taken from the queue,
        whether the batch stopped at a cap)``.
        """
        q = self.q
        n = len(q)
        capped = n >= BATCH_RECORDS
        if capped:
            n = BATCH_RECORDS
        lines: list[str] = []
        if n:
            off = _wall() - _pc()
            owner = self.rec_ref()
            coll = None if owner is None else owner._coll
            # measured collective waits are placed by the general path (_iter_record)
            fast = _fast_iter_line if coll is None or not coll.finished else _no_line
            size = 0
            k = 0
            while k < n:
                item = q[k]
                k += 1
                try:
                    line = ((item[0] == _ITER and fast(item, off))
                            or self._line(item, off, coll))
                except Exception as exc:  # noqa: BLE001 - a bad record costs itself only
                    self._lose_items((item,))
                    self._warn("fault", f"timing writer error: {exc!r}")
                    continue
                if line is None:
                    continue
                lines.append(line)
                size += len(line)
                if size >= BATCH_BYTES:
                    capped = True
                    break
                if until is not None and not k & 63 and time.monotonic() >= until:
                    capped = True
                    break
            n = k
        if poll and self.waiting:
            try:
                self._resolve(lines, False, 0.0)
            except Exception as exc:  # noqa: BLE001 - the batch is still written and popped
                self._warn("fault", f"timing writer error: {exc!r}")
        self._write_records(lines)
        pop = q.popleft
        for _ in range(n):
            pop()
        return n, capped

    def _line(self, item: tuple, off: float, coll: Any) -> str | None:
        """One queued record as a JSON line, or None if it now waits for CUDA events."""
        tag = item[0]
        if tag == _ITER:
            rec, pending = _iter_record(item, off, coll)
            if pending:
                self.waiting.append((rec, pending))
                return None
            return _dumps(rec)
        if tag == _SYS:
            return _dumps(item[1])
        if tag == _QUEUE:
            _, name, t, depth, cap = item
            rec = {"type": "queue", "v": FORMAT_VERSION, "name": name,
                   "ts": round(t + off, 6), "depth": depth}
            if cap is not None:
                rec["capacity"] = cap
            return _dumps(rec)
        _, name, t, dur, fields = item
        rec = {"type": "event", "v": FORMAT_VERSION, "name": name,
               "ts": round(t + off, 6), "dur": _r9(dur)}
        if fields:
            for k, v in fields.items():
                rec.setdefault(k, v)
        return _dumps(rec)

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
_manifest_lock = threading.Lock()
_manifest_order: list[Sink] = []  # sinks whose manifest is pending, in creation order
_sinks: list[Sink] = []
_thread: threading.Thread | None = None
_wake = threading.Event()
_atexit_installed = False
_sigterm_prev: Any = None
_sigterm_installed = False
_mp_finalizer_pid = 0  # the process whose multiprocessing finalizer is registered
_deferred: tuple | None = None  # (signum, frame) of a SIGTERM that arrived mid-flush
_main_flushing = 0  # flushes under way on the main thread (nested: flush_all, handler)
#: Held by the writer thread through each sink's turn; a fork waits for it. The writer
#: imports lazily on its first turns (sysinfo, psutil, pynvml, platform, manifest's
#: importlib.metadata, cuda, collectives): a fork in the middle of such an import
#: leaves the child that module's import lock held by a thread it does not have, and
#: the child's own first import of it hangs for good (tests/runtime/test_faults.py,
#: a DataLoader worker forked in the recorder's first second).
_fork_guard = threading.RLock()
_fork_guard_held = False
#: Longest wait of a fork for the writer's turn (seconds; tlog's choice: a turn is a
#: batch of at most BATCH_SECONDS of serialising plus one write; a write stuck on a
#: hung file system must not stop the fork, which then goes ahead unguarded).
FORK_WAIT_S = 2.0


def _interval() -> float:
    """Seconds the writer sleeps: the shortest flush or ``sys`` sampling interval."""
    return min((min(s.interval, s.sys_gap or s.interval) for s in _sinks), default=1.0)


def _writer_loop() -> None:
    """Every interval, serve each sink one batch; while a batch stopped at a cap, serve
    again at once (sinks take turns, so one busy recorder cannot starve another)."""
    while True:
        _wake.wait(_interval())
        _wake.clear()
        more = True
        while more:
            more = False
            for sink in _sinks.copy():
                with _fork_guard:  # a fork waits for this turn (_before_fork)
                    served = sink.serve()
                if served:
                    more = True
                elif sink.closed:  # finished here after its close() timed out
                    _forget(sink)


def _forget(sink: Sink) -> None:
    with _registry_lock:
        if sink in _sinks:
            _sinks.remove(sink)


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
    _ship(sink, manifest)    # before the writer thread writes (and drops) the manifest
    _wake.set()  # the writer may sleep a longer interval: write the meta line now
    _install_mp_finalizer()
    if handlers:
        _install_sigterm()
    return sink


def _ship(sink: Sink, manifest: dict | None) -> None:
    """With ``TLOG_SERVER`` set, send the files this process writes in the sink's
    run directory (its log; ``run.json`` when it writes the ``manifest``) to
    that service as they grow (:mod:`dflash_runtime.ship`)."""
    if not os.environ.get("TLOG_SERVER"):
        return
    from dflash_runtime import ship

    run_dir = sink.run_dir
    names = _shipped_names.setdefault(str(run_dir), set())
    names.add(sink.path.name)       # kept after close(): the exit pass still sends it
    if manifest is not None:
        names.add("run.json")

    def owned(rel: str) -> bool:
        return rel in names or any(s.run_dir == run_dir and s.path.name == rel
                                   for s in _sinks.copy())

    run_id = (manifest or {}).get("run_id") or os.environ.get("TLOG_RUN_ID") or None
    ship.start_from_env(run_dir, owned, sink.base, run=run_id)


#: Per run directory, the files this process writes there (:func:`_ship`).
_shipped_names: dict[str, set[str]] = {}


def _install_mp_finalizer() -> None:
    """Flush at exit of a multiprocessing child (fork, forkserver, spawn, Pool workers).

    Such a child leaves through ``os._exit`` after ``Process._bootstrap`` (fork,
    forkserver), which skips ``atexit``; ``_bootstrap`` first runs
    ``multiprocessing.util._exit_function``, which runs the finalizers registered with
    an ``exitpriority``. Registered once per process, only when ``multiprocessing`` is
    already imported (a child of it always has it; a process that imports it later is
    not a child of it and has ``atexit``). A fork child inherits no registration:
    ``_bootstrap`` clears the registry, and ``_mp_finalizer_pid`` tells it apart.
    """
    global _mp_finalizer_pid
    pid = os.getpid()
    if _mp_finalizer_pid == pid or "multiprocessing" not in sys.modules:
        return
    try:
        from multiprocessing import util

        util.Finalize(None, flush_all, exitpriority=MP_EXIT_PRIORITY)
    except Exception:  # noqa: BLE001 - no finalizer: atexit still covers a normal exit
        return
    _mp_finalizer_pid = pid


def unregister(sink: Sink, timeout: float) -> None:
    """Final flush of ``sink`` (at most ``timeout`` seconds, :meth:`Sink.flush`), then
    forget it; if the flush could not take the sink's lock in time, the writer thread
    finishes the sink and forgets it."""
    if sink.flush(timeout, final=True):
        _forget(sink)


def flush_all(timeout: float = 2.0) -> None:
    """Final flush of every sink (atexit, multiprocessing exit, at most ``timeout``
    seconds each). Never raises."""
    for sink in _sinks.copy():
        sink.flush(timeout, final=True)
        rec = sink.rec_ref()
        if rec is not None:
            rec.enabled = False
    if "dflash_runtime.ship" in sys.modules:     # the last lines reach the service too
        sys.modules["dflash_runtime.ship"].stop_all()


def _on_sigterm(signum, frame) -> None:
    """Flush every sink, then hand the signal on (previous handler or default action).

    A signal that arrives while the main thread itself is inside a flush (``close()``,
    the exit flush, e.g. a Pool worker being terminated while it exits) is handled
    when that flush ends: the flush cannot be entered again, and dying at once would
    lose the batch it holds.

    When the default action follows (the process dies), the flush is final: records
    still waiting for CUDA events get up to :data:`SIGTERM_FLUSH_S` seconds of polling
    and are then written without ``gpu``. Before a Python handler (which may keep the
    process alive) the flush leaves the files open and such records pending.
    """
    global _deferred
    sigwatch.note_started()
    if _main_flushing:  # the handler runs on the main thread, inside its own flush
        _deferred = (signum, frame)
        return
    prev = _sigterm_prev
    dying = _sigterm_ends_process()
    for sink in _sinks.copy():
        sink.flush(SIGTERM_FLUSH_S, final=dying)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _sigterm_ends_process() -> bool:
    """Whether :func:`_on_sigterm` is still SIGTERM's handler and ends with the default
    action (the process dies). A handler put in after the shim's (a framework's
    checkpoint-on-preemption, a CLI's stop request) got the signal itself: poking would
    deliver it to that handler again and again."""
    try:
        if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
            return False
    except (ValueError, OSError):
        return False
    prev = _sigterm_prev
    return not callable(prev) and prev != signal.SIG_IGN


def _deliver_deferred() -> None:
    global _deferred
    pending, _deferred = _deferred, None
    if pending is not None:
        _on_sigterm(*pending)


def _install_sigterm() -> None:
    """Install the SIGTERM flush once, from the main thread only, chaining the old
    handler, and the watch that makes it run while the main thread waits (sigwatch)."""
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
    sigwatch.install(signal.SIGTERM, _sigterm_ends_process)


def _before_fork() -> None:
    """Wait (at most FORK_WAIT_S) for the writer thread's turn to end, see _fork_guard."""
    global _fork_guard_held
    _fork_guard_held = _fork_guard.acquire(timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    global _fork_guard_held
    if _fork_guard_held:
        _fork_guard_held = False
        _fork_guard.release()


def _after_fork_in_child() -> None:
    global _thread, _registry_lock, _wake, _deferred, _manifest_lock, _main_flushing
    global _fork_guard, _fork_guard_held
    _fork_guard, _fork_guard_held = threading.RLock(), False
    _thread = None
    _deferred = None
    _main_flushing = 0
    _manifest_lock = threading.Lock()
    _manifest_order.clear()
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
    sigwatch.after_fork_in_child()
    if _sigterm_installed and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        sigwatch.install(signal.SIGTERM, _sigterm_ends_process)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)

__all__ = ["Sink", "build_phases", "flush_all", "register", "unregister"]
