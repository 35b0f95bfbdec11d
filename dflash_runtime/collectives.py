"""Measured collective waits: a DDP communication hook that times the gradient all-reduce.

``Recorder.watch_ddp(ddp_model)`` (or :func:`watch_ddp`) registers a DDP communication
hook that does DDP's own averaging all-reduce (the same arithmetic as
``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook``: divide
the bucket by the group size, ``all_reduce`` with ``async_op=True``, one ``then``) and
also records, per gradient bucket, two ``perf_counter()`` readings:

- *ready*: when DDP handed the bucket to the hook (its last gradient was computed),
  on the autograd thread;
- *done*: when the bucket's all-reduce future completed (the ``then`` callback, on
  the process group's thread for gloo).

One backward pass is a *round*: the buckets up to and including the one whose
``bucket.is_last()`` is true. When every bucket of a round is done, its **exposed
wait** is ``max(done) - max(ready)``, clipped at 0: the part of backward after the
last gradient was ready during which the host only waited for communication (for a
rank that reached the all-reduce early, mostly the wait for the slowest peer). No
device synchronisation, no reading of tensor values, no file I/O.

Handoff between threads (the hook and callbacks never touch an ``Iteration``): rounds
go into a small per-recorder :class:`CollectiveSlot` (a lock held for a few
assignments per bucket); the writer thread, when it turns an iteration record into
JSON, takes the finished rounds whose *done* time falls inside the iteration and
writes each as the child phase ``<parent>/ddp_allreduce_wait`` of the top-level phase
that was open (on the recording thread) at *done* - normally ``backward`` - with
``kinds[...] = "sync"`` (:func:`place_waits`). The training thread pays nothing for
it: the phase hot path is unchanged whether a hook is registered or not.

On CUDA the hook also records a timing-event pair (from the recorder's event pool):
start on the current stream at the last bucket's readiness, end in that bucket's
completion callback (which runs on streams that wait for the collective). The
writer resolves it by polling like any phase's events; its elapsed time is the
device-side exposed wait and lands in the record's ``gpu`` field under the same
name. The host-side value in ``phases`` is then what the host itself waited inside
backward (near 0 with NCCL, whose futures complete when the work is queued).

torch is imported only inside :func:`watch_ddp` (``import dflash_runtime`` stays
standard-library only).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from typing import Any

from .format import CHILD_SEP

_pc = time.perf_counter

#: Name of the measured wait phase (a child of the phase holding the collective).
WAIT_PHASE = "ddp_allreduce_wait"
#: Kind written for it in ``kinds`` (FORMAT.md categories: the host blocked on other ranks).
WAIT_KIND = "sync"
#: Finished rounds kept for the writer; beyond it the oldest are dropped and counted
#: (tlog's choice: bounded memory when no iteration ever claims them, e.g. a backward
#: outside any ``rec.iteration()``; 1024 rounds is minutes of a fast loop).
MAX_ROUNDS = 1024

_ENTER, _ENTER_X = 1, 2  # raw-log markers (recorder.ENTER / ENTER_X)


class CollectiveSlot:
    """Per-recorder handoff of measured all-reduce rounds (hook threads -> writer thread).

    :meth:`ready` is called by the hook once per bucket, :meth:`done` by the bucket's
    completion callback; both take ``perf_counter`` seconds. A finished round is the
    tuple ``(t_ready, t_done, pair)``: the latest readiness and the latest completion
    of its buckets (seconds) and an optional CUDA event pair. :meth:`take` hands them
    to the writer. Thread-safe (one lock; a few assignments under it per bucket).
    """

    __slots__ = ("_lock", "dropped", "finished", "n_done", "n_ready", "pair", "seen_last",
                 "t_done", "t_ready", "unmatched")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished: deque = deque()
        self.dropped = 0     # rounds pushed out of a full ``finished``
        self.unmatched = 0   # rounds that completed in no iteration of this recorder
        self._reset()

    def _reset(self) -> None:
        self.n_ready = 0
        self.n_done = 0
        self.t_ready = float("-inf")
        self.t_done = float("-inf")
        self.seen_last = False
        self.pair = None

    def ready(self, t: float, is_last: bool, pair: Any = None) -> None:
        """Bucket handed to the hook at ``t``; ``is_last`` ends the round's bucket list."""
        with self._lock:
            self.n_ready += 1
            self.t_ready = max(self.t_ready, t)
            if is_last:
                self.seen_last = True
                if pair is not None:
                    self.pair = pair

    def done(self, t: float) -> None:
        """A bucket's collective completed at ``t``; closes the round when it is the last."""
        with self._lock:
            self.n_done += 1
            self.t_done = max(self.t_done, t)
            if self.seen_last and self.n_done >= self.n_ready:
                if len(self.finished) >= MAX_ROUNDS:
                    old = self.finished.popleft()
                    self.dropped += 1
                    _release(old[2])
                self.finished.append((self.t_ready, self.t_done, self.pair))
                self._reset()

    def take(self, t0: float, t1: float) -> list[tuple]:
        """Remove and return the finished rounds completed in ``[t0, t1]`` (an iteration).

        Rounds completed before ``t0`` belong to no later iteration either: they are
        dropped (their event pair returned to its pool) and counted in
        :attr:`unmatched`. Rounds completed after ``t1`` stay for later iterations.
        """
        out = []
        with self._lock:
            fin = self.finished
            while fin and fin[0][1] <= t1:
                r = fin.popleft()
                if r[1] >= t0:
                    out.append(r)
                else:
                    self.unmatched += 1
                    _release(r[2])
        return out


def _release(pair: Any) -> None:
    if pair is not None:
        pair[3].release(pair)


def exposed_wait(t_ready: float, t_done: float, begin: float = float("-inf")) -> float:
    """Exposed wait of a round: ``t_done - max(t_ready, begin)`` clipped at 0 (seconds).

    ``t_ready`` is the latest bucket readiness, ``t_done`` the latest completion
    (``perf_counter`` seconds); ``begin`` the start of the phase holding it (the wait
    is counted inside that phase only).
    """
    return max(0.0, t_done - max(t_ready, begin))


def top_level_spans(log: list, t0: float, start: int = 0, end: int | None = None):
    """The top-level phases of an iteration's raw log as ``[(name, begin, end), ...]``.

    Same raw-log format as :func:`dflash_runtime.writer.build_phases` (times are
    ``perf_counter`` seconds); a lap spans from the previous top-level mark to its
    reading. Blocks still open at the log's end get ``end = +inf``.
    """
    spans = []
    depth = 0
    mark = t0
    i = start
    n = len(log) if end is None else end
    top_name = top_begin = None
    while i < n:
        e = log[i]
        c = e.__class__
        if c is float:
            i += 1
            if depth:
                depth -= 1
                if depth == 0:
                    spans.append((top_name, top_begin, e))
                    mark = e
            continue
        if c is str:
            if i + 1 >= n:
                break
            t = log[i + 1]
            i += 2
            if depth == 0:
                spans.append((e, mark, t))
                mark = t
            continue
        if i + 2 >= n:
            break
        name = log[i + 1] if e == _ENTER else log[i + 1][0]
        t = log[i + 2]
        i += 3
        if depth == 0:
            top_name, top_begin = name, t
        depth += 1
    if depth:
        spans.append((top_name, top_begin, float("inf")))
    return spans


def place_waits(phases: dict, kinds: dict | None, spans: list, rounds: list,
                t0: float, t1: float):
    """Write measured rounds into an iteration's ``phases`` and ``kinds``.

    Each round ``(t_ready, t_done, pair)`` goes to the top-level phase ``P`` whose span
    holds ``t_done`` (the last such span: a name may recur), as ``P/ddp_allreduce_wait``
    with :func:`exposed_wait` measured from ``max(t_ready, span begin)``; several rounds
    sum. A round completed in no top-level phase (unaccounted time) becomes a top-level
    ``ddp_allreduce_wait`` clipped to the gap it lies in. Each name gets kind ``sync``.
    The new name is placed after its parent's last child (or, top-level, before the
    first phase that starts after it), keeping FORMAT.md's first-start order.

    Returns ``(phases, kinds, pending)``: new dicts, and ``[(full name, pair), ...]``
    for rounds carrying a CUDA event pair (resolved by the writer into ``gpu``).
    """
    add: dict[str, float] = {}
    began: dict[str, float] = {}
    pending = []
    for t_ready, t_done, pair in rounds:
        holder = None
        gap_begin = t0
        for name, b, e in spans:
            if b <= t_done <= e:
                holder = (name, b)
            if e <= t_done:
                gap_begin = e
        if holder is not None:
            full = holder[0] + CHILD_SEP + WAIT_PHASE
            w = exposed_wait(t_ready, t_done, holder[1])
        else:
            full = WAIT_PHASE
            w = exposed_wait(t_ready, min(t_done, t1), gap_begin)
            began.setdefault(full, max(t_ready, gap_begin))
        add[full] = add.get(full, 0.0) + w
        if pair is not None:
            pending.append((full, pair))
    out = dict(phases)
    for full, w in add.items():
        if full in out:
            out[full] += w
            continue
        out = _insert(out, full, w, spans, began.get(full, t1))
    kinds = dict(kinds or {})
    for full in add:
        kinds[full] = WAIT_KIND
    return out, kinds, pending


def _insert(phases: dict, full: str, w: float, spans: list, begin: float) -> dict:
    keys = list(phases)
    if CHILD_SEP in full:
        parent = full.split(CHILD_SEP, 1)[0]
        pos = len(keys)
        for i, k in enumerate(keys):
            if k == parent or k.startswith(parent + CHILD_SEP):
                pos = i + 1
    else:
        first = {}
        for name, b, _ in spans:
            first.setdefault(name, b)
        pos = len(keys)
        for i, k in enumerate(keys):
            if CHILD_SEP not in k and first.get(k, begin) > begin:
                pos = i
                break
    return dict([*[(k, phases[k]) for k in keys[:pos]], (full, w),
                 *[(k, phases[k]) for k in keys[pos:]]])


def watch_ddp(ddp_model: Any, rec: Any, *, hook: Any = None, state: Any = None) -> bool:
    """Register the measuring communication hook on ``ddp_model`` for recorder ``rec``.

    Args:
        ddp_model: a ``torch.nn.parallel.DistributedDataParallel`` module.
        rec: the :class:`~dflash_runtime.Recorder` whose iterations get the waits.
        hook: a DDP communication hook ``hook(state, bucket) -> Future`` to wrap
            (DDP accepts one hook per model: pass yours here instead of registering
            it yourself). Default: the averaging all-reduce DDP does without a hook.
        state: the state passed to ``hook`` (default: the process group DDP uses).

    Returns ``False`` (and registers nothing, so DDP keeps its built-in all-reduce)
    when ``rec`` is disabled; ``True`` once registered.

    Called again for a model whose wait ``rec`` already measures (``rec.instrument``
    registers this hook on a DDP model), it returns ``True`` and registers nothing;
    with a ``hook`` of yours it raises ``RuntimeError`` saying to call it before
    ``instrument`` (a user following README's DDP section after the one-line
    ``instrument`` got "pass yours as hook=", the hook being tlog's own).

    Raises ``RuntimeError`` if ``ddp_model`` already has a communication hook (DDP
    allows only one per model), ``TypeError`` if it has no ``register_comm_hook``.
    On CUDA (a parameter on a GPU) a ``RuntimeWarning`` at registration says what is
    measured there (module doc).
    The wrapper costs a few microseconds of host time per bucket (docs/RUNTIME.md).
    """
    if not getattr(rec, "enabled", False):
        return False
    register = getattr(ddp_model, "register_comm_hook", None)
    if register is None:
        msg = f"watch_ddp needs a DistributedDataParallel module, got {type(ddp_model).__name__}"
        raise TypeError(msg)
    if getattr(ddp_model, WATCHED_ATTR, None) is rec:
        if hook is None:
            return True
        msg = ("dflash_runtime.watch_ddp: this DDP model's wait is already measured by tlog "
               "(rec.instrument registers it); to wrap a communication hook of yours, call "
               "rec.watch_ddp(model, hook=...) before rec.instrument(...)")
        raise RuntimeError(msg)
    import torch  # lazily, here: `import dflash_runtime` stays standard-library only
    import torch.distributed as dist

    slot = rec._coll
    if slot is None:
        slot = rec._coll = CollectiveSlot()
    pg = state if state is not None else getattr(ddp_model, "process_group", None)
    group = pg if pg is not None else dist.group.WORLD
    pc = _pc
    s_ready, s_done = slot.ready, slot.done
    if any(getattr(p, "is_cuda", False) for p in ddp_model.parameters()):
        _warn_cuda()

    def callback(pair, first):
        def cb(fut):
            if pair is not None:  # runs on streams that wait for the collective
                pair[1].record(torch.cuda.current_stream())
            s_done(pc())
            v = fut.value()
            return v[0] if first else v
        return cb

    cb_default, cb_hook = callback(None, True), callback(None, False)

    def measured(st, bucket):
        t = pc()
        buf = bucket.buffer()
        last = bucket.is_last()
        pair = None
        if last and buf.is_cuda:
            stream = torch.cuda.current_stream(buf.device)
            pair = rec._acquire_events(stream)
            if pair is not None:
                pair[0].record(stream)
        s_ready(t, last, pair)
        if hook is None:  # default_hooks.allreduce_hook's arithmetic, one then()
            buf.div_(group.size())
            fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
            return fut.then(cb_default if pair is None else callback(pair, True))
        return hook(st, bucket).then(cb_hook if pair is None else callback(pair, False))

    try:
        register(pg, measured)
    except RuntimeError as exc:
        msg = ("dflash_runtime.watch_ddp: this DDP model already has a communication hook "
               "(DDP allows one per model); pass yours as watch_ddp(model, rec, hook=..., "
               f"state=...) instead of registering it ({exc})")
        raise RuntimeError(msg) from exc
    object.__setattr__(ddp_model, WATCHED_ATTR, rec)
    return True


#: Attribute a watched DDP module carries: the recorder whose hook it has (DDP cannot
#: unregister a communication hook, so it stays for the module's life).
WATCHED_ATTR = "_tlog_watched_by"


def _warn_cuda() -> None:
    warnings.warn(
        "dflash_runtime.watch_ddp on CUDA: '<phase>/ddp_allreduce_wait' in 'phases' is the "
        "host-side wait (near 0 with NCCL, whose work returns once queued); the device-side "
        "exposed wait is measured with CUDA events into 'gpu' (docs/RUNTIME.md)",
        RuntimeWarning, stacklevel=4,
    )
