"""Device-aware attribution: where each second of each iteration went.

DESIGN.md ("Attribution"), per iteration and worker:

1. Each top-level phase's host wall time goes to its category (the host rules
   of ``dflash_runtime.format``, applied at ingest); ``dur - sum(top-level phases)``
   is ``unaccounted``. Children (``forward/mask_build``) are inside their
   parent and never counted again -- except a **carved child**: a direct
   child of a top-level phase whose category differs from its parent's
   (``backward/ddp_allreduce_wait`` with kind sync inside a compute
   ``backward``). Its host time is taken out of the parent and goes to its
   own category; for the walk it is a phase of its own right after its
   parent (the parent keeps its device time).
2. With device times (``gpu``), a sync phase is not all sync. The
   **device-backlog walk** runs over the iteration's top-level phases in
   ``seq`` order, keeping the backlog ``b`` of device seconds queued and not
   yet run. A phase with host time ``h`` and device time ``g`` queues ``g``
   and lets the device run for ``h``::

       b_i       = max(0, b_{i-1} + g_i - h_i)        (a Lindley recursion, b_0 = 0)
       drained_i = b_{i-1} + g_i - b_i                 (device seconds retired in phase i)

   ``drained_i <= h_i`` always. For a sync phase, ``drained_i`` is
   **compute** (the host was waiting for its own queued work) and only
   ``h_i - drained_i`` is **sync**. The compute is credited first in, first
   out to the phases whose device work was drained (a stream runs its queue
   in order): phase ``j``'s work occupies ``(D_{j-1}, D_j]`` of the
   cumulative queued device time ``D``; the sync phase ``k`` retires
   ``(R_{k-1}, R_k]`` with ``R = D - b``; ``j`` is credited the overlap. The
   backlog starts empty at every iteration (a training step ends with a
   host-device sync: the loss ``.item()``, a grad-norm check, a logging read).

   Worked example: host ``forward 5 ms, backward 8, loss_item 100``
   with device ``forward 20, backward 25``: the backlog is 15 ms after the
   forward, 32 after the backward; the ``.item()`` drains 32 -> 32 ms compute
   (7 credited to forward, 25 to backward) and 68 ms sync.

A top-level phase timed on the host only whose direct children (``a/b``)
carry device times queues their device work: the walk uses the sum of the
children's device times for it.

Only sync phases are split. A starvation or backpressure phase keeps its
host time even while the device drains queued work meanwhile: the loop was
still held by its input or its output, and that is what limits it. A sync
phase named as a collective (``dflash_runtime.format.is_collective``:
``grad_allreduce``, ``collective_wait``, ``sparse_data_dist_sync``) is not
split either: it waits for other ranks or for a communication stream, not for
the work its own stream queued, and the walk's single queue would credit work
of other streams that ran meanwhile. Measured on the torchrec trace
``hta/trace_diff/test``: the copies that block the host inside
``## sparse_data_dist ##`` sit on a stream that ran 7 ms of kernels in their
314 ms, while backward kernels on other streams ran; walked, the trace read
compute-bound with 7% sync, against ~43% sync measured from its events.
Known limit: a collective phase whose host also waits for its own queued
device work (gloo on CUDA tensors copies them to the host) has that part
counted as sync; time the copy as its own phase to see it.

The walk is vectorised over iterations: the phases of one layout (the same
phase names in the same order, ``analyze.load.Layout``) form a dense
``iterations x phases`` matrix, and each step of the recursion is one column
operation over all the layout's iterations. Matrices are processed in chunks
of :data:`CHUNK` iterations to bound memory.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tlog.analyze.load import BACKPRESSURE, COMPUTE, STARVATION, SYNC, Layout, RunData

from dflash_runtime.format import is_collective

if TYPE_CHECKING:
    import polars as pl

#: Iterations per chunk of the attribution (memory: ~10 float64 matrices of
#: CHUNK x phases each).
CHUNK = 1 << 17


def backlog_walk(host: np.ndarray, gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run the device-backlog walk over the top-level phases of many iterations.

    Arrays are phase-major: row ``j`` holds phase ``j`` of every iteration
    (contiguous columns of work for numpy).

    Args:
        host: float64 ``(K, n)``, host seconds of the K phases (in order) of n iterations.
        gpu: float64 ``(K, n)``, device seconds (0 where none).

    Returns:
        ``(backlog, drained)``, both ``(K, n)``: device seconds still queued
        after each phase, and device seconds retired during it.

    >>> b, d = backlog_walk(np.array([[0.005], [0.008], [0.100]]),
    ...                     np.array([[0.020], [0.025], [0.0]]))
    >>> b[:, 0].round(3).tolist(), d[:, 0].round(3).tolist()
    ([0.015, 0.032, 0.0], [0.005, 0.008, 0.032])
    """
    k, n = host.shape
    backlog = np.empty((k, n))
    drained = np.empty((k, n))
    queued = np.empty(n)
    b = np.zeros(n)
    for j in range(k):
        np.add(b, gpu[j], out=queued)
        np.subtract(queued, host[j], out=backlog[j])
        np.maximum(backlog[j], 0.0, out=backlog[j])
        np.subtract(queued, backlog[j], out=drained[j])
        b = backlog[j]
    return backlog, drained


def fifo_credit(gpu: np.ndarray, backlog: np.ndarray, take: np.ndarray) -> np.ndarray:
    """Credit the device time drained by the phases in ``take`` to the phases
    whose device work it was, first queued first run (module docstring).

    Args:
        gpu: float64 ``(K, n)`` device seconds (phase-major, as :func:`backlog_walk`).
        backlog: ``(K, n)`` from :func:`backlog_walk`.
        take: bool ``(K,)``, the phases whose drained time moves (sync phases).

    Returns:
        float64 ``(K, n)`` seconds credited to each phase; each iteration's
        total is the drained time of its ``take`` phases.
    """
    k, n = gpu.shape
    credit = np.zeros((k, n))
    if n == 0 or not take.any():
        return credit
    last = int(np.flatnonzero(take)[-1]) + 1  # phases after the last sync phase never drain
    d_incl = np.empty((last, n))
    np.copyto(d_incl[0], gpu[0])
    for j in range(1, last):
        np.add(d_incl[j - 1], gpu[j], out=d_incl[j])
    retired = d_incl - backlog[:last]
    has_gpu = gpu.any(axis=1)
    zero = np.zeros(n)
    starts: dict[int, np.ndarray] = {}
    top = np.empty(n)
    bottom = np.empty(n)
    for col in np.flatnonzero(take):
        lo = retired[col - 1] if col else zero
        hi = retired[col]
        if not (hi > lo).any():
            continue
        for j in np.flatnonzero(has_gpu[: col + 1]):
            if j not in starts:
                starts[j] = d_incl[j] - gpu[j]
            # overlap of (starts_j, d_incl_j] with (lo, hi], clipped at 0
            np.minimum(d_incl[j], hi, out=top)
            np.maximum(starts[j], lo, out=bottom)
            np.subtract(top, bottom, out=top)
            np.maximum(top, 0.0, out=top)
            credit[j] += top
    return credit


@dataclass(frozen=True)
class Attributed:
    """Attribution of a block of iterations' top-level phases.

    Per iteration (length ``n``): ``starvation``, ``backpressure``,
    ``compute``, ``sync`` seconds after the walk. Per phase and iteration
    (``(K, n)``, phase-major): ``moved``, the drained seconds taken out of
    each sync phase, and ``credit``, those seconds credited as compute to the
    phases whose device work they drained (``moved.sum() == credit.sum()``).
    """

    starvation: np.ndarray
    backpressure: np.ndarray
    compute: np.ndarray
    sync: np.ndarray
    moved: np.ndarray | None
    credit: np.ndarray | None


def attribute_matrix(host: np.ndarray, gpu: np.ndarray | None, cat: np.ndarray,
                     collective: np.ndarray | None = None) -> Attributed:
    """Attribute the host time of the top-level phases of ``n`` iterations.

    Args:
        host: float64 ``(K, n)`` host seconds, phase-major (:func:`backlog_walk`).
        gpu: float64 ``(K, n)`` device seconds (0 where none), or None.
        cat: int8 ``(K,)`` host-rule category code of each phase
            (``analyze.load.CAT_CODE``).
        collective: bool ``(K,)``, the phases named as collectives
            (``dflash_runtime.format.is_collective``): a sync phase among them is
            a wait for peers or for a communication stream, never split by
            the walk (module docstring). None: no phase is.

    Returns:
        :class:`Attributed`; ``moved`` and ``credit`` are None when nothing
        moved (no device times, or no sync phase).

    >>> a = attribute_matrix(np.array([[0.005], [0.008], [0.100]]),
    ...                      np.array([[0.020], [0.025], [0.0]]), np.array([2, 2, 3]))
    >>> a.compute.round(3).tolist(), a.sync.round(3).tolist(), a.credit[:, 0].round(3).tolist()
    ([0.045], [0.068], [0.007, 0.025, 0.0])
    """
    def total(code: int) -> np.ndarray:
        rows = np.flatnonzero(cat == code)
        if len(rows) == 1:
            return host[rows[0]].copy()
        return host[rows].sum(axis=0) if len(rows) else np.zeros(host.shape[1])

    starvation, backpressure, compute, sync = (total(c) for c in
                                               (STARVATION, BACKPRESSURE, COMPUTE, SYNC))
    is_sync = cat == SYNC
    if collective is not None:
        is_sync = is_sync & ~collective
    if gpu is None or not is_sync.any() or not gpu.any():
        return Attributed(starvation, backpressure, compute, sync, None, None)
    backlog, drained = backlog_walk(host, gpu)
    moved = drained * is_sync[:, None]
    credit = fifo_credit(gpu, backlog, is_sync)
    return Attributed(starvation, backpressure, compute + credit.sum(axis=0),
                      sync - moved.sum(axis=0), moved, credit)


#: Per-phase quantities summed by :func:`attribute_run`, in column order.
#: ``carved_s``: host seconds taken out of a top-level phase by its carved
#: children (module docstring), so its category keeps ``host_s - carved_s``.
PHASE_SUMS = ("n", "host_s", "gpu_s", "gpu_n", "credit_s", "moved_s", "carved_s")


@dataclass
class RunAttribution:
    """Attribution of a whole run.

    Attributes:
        iteration: float64 ``(6, n_iter)`` per iteration (``RunData.iterations``
            order): starvation, backpressure, compute, sync seconds after the
            walk, the sum of top-level host times, device seconds of
            top-level phases.
        iteration_has_gpu: bool per iteration, a device time was recorded.
        phase_keys: int64 ``(m, 5)``: group, pid, category code, top (0/1:
            a top-level phase), counted (0/1: its seconds are in the
            iteration's category sums: top-level phases and carved children).
        phase_sums: float64 ``(m, len(PHASE_SUMS))`` summed over the group's
            iterations (``group`` is the caller's per-iteration key).
    """

    iteration: np.ndarray
    iteration_has_gpu: np.ndarray
    phase_keys: np.ndarray
    phase_sums: np.ndarray


def _matrix(values: np.ndarray, start: np.ndarray, length: np.ndarray, k: int, *,
            contiguous: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """``(K, n)`` matrix of ``values[start + j]`` (0 past a list's length or for
    a start of -1) and the presence mask (None when every list is whole).

    Lists stored back to back (the usual case: ingest writes a worker's
    iterations in order) are a strided view of ``values``; with
    ``contiguous`` it is copied once so that each phase's row is contiguous
    (what the walk reads), else the view itself is returned.
    """
    n = len(start)
    whole = bool((length >= k).all() and (start >= 0).all())
    if whole and n and int(start[-1] - start[0]) == (n - 1) * k and \
            (n == 1 or bool((np.diff(start) == k).all())):
        s0 = int(start[0])
        view = values[s0:s0 + n * k].reshape(n, k).T
        return (np.ascontiguousarray(view) if contiguous else view), None
    cols = np.arange(k)[:, None]
    if whole:
        return values[start[None, :] + cols], None
    present = (cols < length[None, :]) & (start >= 0)[None, :]
    idx = np.where(present, start[None, :] + cols, 0)
    out = values[idx] if len(values) else np.zeros(idx.shape, dtype=values.dtype)
    out[~present] = 0
    return out, present


def _chunks(starts: np.ndarray, k: int) -> list[tuple[int, int]]:
    """Chunk boundaries: at most CHUNK iterations each, cut where the lists stop
    being back to back (so most chunks are views, see :func:`_matrix`)."""
    n = len(starts)
    cuts = set(range(0, n, CHUNK)) | {n}
    breaks = np.flatnonzero(np.diff(starts) != k) + 1
    if len(breaks) <= max(n // 1024, 64):
        cuts |= set(breaks.tolist())
    edges = sorted(cuts)
    return list(itertools.pairwise(edges))


def _segment_sums(acc: np.ndarray, matrix: np.ndarray, seg_starts: np.ndarray,
                  seg_groups: np.ndarray) -> None:
    """``acc[:, g] += sum of matrix[:, i]`` over the iterations ``i`` of each group
    ``g``, for a chunk whose group key is constant between ``seg_starts``."""
    sums = np.add.reduceat(matrix, seg_starts, axis=1, dtype=np.float64)
    np.add.at(acc.T, seg_groups, sums.T)


def _child_folds(lay: Layout, names: list[str]) -> list[tuple[int, np.ndarray]]:
    """For each top-level phase of a layout with direct children (``a/b``):
    its row among the top-level rows and the layout positions of its children."""
    top_rows = {int(pos): i for i, pos in enumerate(np.flatnonzero(lay.top))}
    by_name = {names[lay.pid[pos]]: pos for pos in top_rows}
    kids: dict[int, list[int]] = {}
    for pos in np.flatnonzero(~lay.top):
        name = names[lay.pid[pos]]
        head, _, rest = name.partition("/")
        if rest and "/" not in rest and head in by_name:
            kids.setdefault(top_rows[by_name[head]], []).append(int(pos))
    return [(row, np.array(ps)) for row, ps in sorted(kids.items())]


def carved_children(lay: Layout, names: list[str]) -> list[tuple[int, int]]:
    """The carved children of a layout: ``(child position, parent position)``
    of each direct child (``a/b``) of a top-level phase ``a`` whose category
    differs from ``a``'s (module docstring; docs/DIAGNOSIS.md section 1).
    Sorted by parent, then child position."""
    by_name = {names[lay.pid[pos]]: int(pos) for pos in np.flatnonzero(lay.top)}
    out = []
    for pos in np.flatnonzero(~lay.top):
        head, _, rest = names[lay.pid[pos]].partition("/")
        parent = by_name.get(head)
        if rest and "/" not in rest and parent is not None and lay.cat[pos] != lay.cat[parent]:
            out.append((int(pos), parent))
    return sorted(out, key=lambda cp: (cp[1], cp[0]))


def _shape(lay: Layout, names: list[str]) -> tuple:
    """What the walk of a layout depends on, without its phase names: length,
    categories, top-level flags, collective flags, the children folded into
    host-only parents (:func:`_child_folds`) and the carved children
    (:func:`carved_children`). Layouts of equal shape are walked together."""
    coll = np.array([is_collective(names[p]) for p in lay.pid], dtype=bool)
    folds = tuple((row, tuple(int(x) for x in kids)) for row, kids in _child_folds(lay, names))
    return (len(lay), lay.cat.tobytes(), lay.top.tobytes(), len(coll), coll.tobytes(), folds,
            tuple(carved_children(lay, names)))


def _first_gpu(gpu_start: np.ndarray) -> int | None:
    """Smallest flat device-time position of the given list starts (None: no list)."""
    g = gpu_start[gpu_start >= 0]
    return int(g.min()) if len(g) else None


def _first_host(host_start: np.ndarray, length: np.ndarray) -> int | None:
    """Smallest flat host-time position of the given non-empty lists (None: none)."""
    h = host_start[length > 0]
    return int(h.min()) if len(h) else None


def layout_ids(layout: pl.Series) -> np.ndarray:
    """The layout id of each iteration, -1 where it has no phases; a view of the
    column when none is null (no copy: memory at 10M iterations)."""
    return (layout.fill_null(-1) if layout.null_count() else layout).to_numpy()


def _at(arr: np.ndarray, rows: np.ndarray | range) -> np.ndarray:
    """``arr[rows]``; a view for a ``range`` of rows."""
    return arr[rows.start:rows.stop] if isinstance(rows, range) else arr[rows]


def _sorted_blocks(row_shape: np.ndarray, layout: np.ndarray) -> list[range] | None:
    """The walk's blocks (the rows of each shape ordered by layout, then row:
    what a stable sort by (shape, layout) gives) as ranges of rows, when the rows
    already are in that order (every run of equal (shape, layout) after the
    previous one, the usual case: a worker's iterations share a layout); else None."""
    n = len(row_shape)
    if n == 0:
        return []
    change = np.flatnonzero((row_shape[1:] != row_shape[:-1]) | (layout[1:] != layout[:-1])) + 1
    if len(change) > 4096:
        return None
    starts = np.concatenate([[0], change]).astype(np.int64)
    keys = list(zip(row_shape[starts].tolist(), layout[starts].tolist(), strict=True))
    if any(b <= a for a, b in itertools.pairwise(keys)):
        return None
    out: list[range] = []
    ends = [*starts[1:].tolist(), n]
    for (shape, _), a, b in zip(keys, starts.tolist(), ends, strict=True):
        if out and row_shape[out[-1].start] == shape:
            out[-1] = range(out[-1].start, b)
        else:
            out.append(range(a, b))
    return out


def _min_or(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def attribute_run(data: RunData, group: np.ndarray, n_groups: int, *,
                  release: bool = False) -> RunAttribution:
    """Attribute every iteration of a run, layout by layout, chunk by chunk.

    Args:
        data: the loaded run.
        group: int32 or int64 per iteration (``data.iterations`` order), in
            ``0 .. n_groups-1``: the key the per-phase sums are grouped by
            (diagnose uses worker x part of the steady state).
        n_groups: number of groups.
        release: free the device and host times as the walk passes them
            (:meth:`RunData.release_device_times_before`,
            :meth:`RunData.release_host_times_before`: after each chunk, the
            positions below the first one any later chunk reads), so that they
            and the output are not held whole together (memory at scale). The
            caller must not read ``data.times.gpu`` or
            ``data.times.host`` afterwards (then call
            :meth:`RunData.release_device_times` and
            :meth:`RunData.release_host_times`). The figures are the same.
    """
    it = data.iterations
    n_iter = it.height
    out = np.zeros((6, n_iter))
    has_gpu_it = np.zeros(n_iter, dtype=bool)
    t = data.times
    keys: list[np.ndarray] = []
    sums: list[np.ndarray] = []
    layout = layout_ids(it["layout"])
    src_all = it["src"].to_numpy()
    # Layouts that differ only in their phase names (``step_123_fwd``: a new
    # layout every iteration) have the same walk; they form one block, so the
    # per-block work is paid once per distinct shape, not once per layout.
    shape_of: dict[int, int] = {}
    shapes: dict[tuple, int] = {}
    prep: dict[int, tuple] = {}
    for lid, lay in data.layouts.items():
        sig = _shape(lay, data.phase_names)
        sid = shapes.setdefault(sig, len(shapes))
        shape_of[lid] = sid
        if sid not in prep:
            prep[sid] = (lay, sig)
    lids = np.array(sorted(shape_of), dtype=np.int64)
    if len(lids):
        at = np.clip(np.searchsorted(lids, layout), 0, len(lids) - 1)
        known = (layout >= 0) & (lids[at] == layout)
        # int16 while the shapes fit (memory at 10M iterations)
        sdt = np.int16 if len(shapes) < np.iinfo(np.int16).max else np.int32
        row_shape = np.where(known, np.array([shape_of[int(x)] for x in lids],
                                             dtype=sdt)[at], sdt(-1))
        del at, known
    else:
        row_shape = np.full(n_iter, -1, dtype=np.int16)
    # Blocks: the rows of each shape, by layout, then row. A block is a ``range``
    # when its rows are (no index array: memory at 10M iterations).
    blocks: list[np.ndarray] | list[range] | None = _sorted_blocks(row_shape, layout)
    if blocks is None:
        # by shape, then layout, then row (stable): a block's layouts are contiguous
        order = np.lexsort((layout, row_shape))
        key = row_shape[order]
        blocks = np.split(order, np.flatnonzero(np.diff(key)) + 1)
        del key
    walked = [rows for rows in blocks if len(rows) and row_shape[rows[0]] >= 0]
    # First device-time position read by each walked block and by all after it.
    later: list[int | None] = [None] * (len(walked) + 1)
    later_h: list[int | None] = [None] * (len(walked) + 1)   # the same for host times
    if release:
        for b in range(len(walked) - 1, -1, -1):
            src_b = _at(src_all, walked[b])
            later[b] = _min_or(_first_gpu(t.gpu_start[src_b]), later[b + 1])
            later_h[b] = _min_or(_first_host(t.host_start[src_b], t.length[src_b]),
                                 later_h[b + 1])
            del src_b
    for b, rows in enumerate(walked):
        lay, sig = prep[int(row_shape[rows[0]])]
        k = len(lay)
        top = lay.top
        all_top = bool(top.all())
        # A block that is a range of rows of one layout (then ``rows`` is that
        # range: distinct rows, the stable sort keeps one layout's rows ascending):
        # views instead of gathers, and no sort for np.unique (memory at 10M
        # iterations; the same values either way).
        lo, hi = ((rows[0], rows[-1]) if isinstance(rows, range)
                  else (int(rows.min()), int(rows.max())))
        span = slice(lo, hi + 1)
        if hi - lo + 1 == len(rows) and bool((layout[span] == layout[lo]).all()):
            src_block, lay_block = src_all[span], layout[span]
            block_lids = lay_block[:1].copy()
            lay_idx = np.broadcast_to(np.int64(0), lay_block.shape)
        else:
            src_block = src_all[rows]
            lay_block = layout[rows]
            block_lids, lay_idx = np.unique(lay_block, return_inverse=True)
        seg_keys: list[np.ndarray] = []
        seg_sums: list[np.ndarray] = []   # each (len(PHASE_SUMS), k, segments)
        folds = [(row, np.array(kids)) for row, kids in sig[5]]
        carved = list(sig[6])
        coll = np.frombuffer(sig[4], dtype=bool)
        if carved:
            # The walk's rows: each top-level phase followed by its carved children.
            kids_of: dict[int, list[int]] = {}
            for c, p in carved:
                kids_of.setdefault(p, []).append(c)
            top_pos = np.flatnonzero(top)
            walk_pos = np.array([q for p in top_pos for q in (int(p), *kids_of.get(int(p), []))])
            # row in the walk of each top-level phase, and (walk row, parent walk row) per child
            walk_row = {int(q): i for i, q in enumerate(walk_pos)}
            top_walk = np.array([walk_row[int(p)] for p in top_pos])
            carved_rows = [(walk_row[c], walk_row[p]) for c, p in carved]
            counted = top.copy()
            counted[[c for c, _ in carved]] = True
        else:
            counted = top
        chunks = _chunks(t.host_start[src_block], k)
        if release:
            # first device-time position read by each chunk of the block and all after it
            ahead: list[int | None] = [later[b + 1]] * (len(chunks) + 1)
            ahead_h: list[int | None] = [later_h[b + 1]] * (len(chunks) + 1)
            for ci in range(len(chunks) - 1, -1, -1):
                a0, a1 = chunks[ci]
                src_c = src_block[a0:a1]
                ahead[ci] = _min_or(_first_gpu(t.gpu_start[src_c]), ahead[ci + 1])
                ahead_h[ci] = _min_or(_first_host(t.host_start[src_c], t.length[src_c]),
                                      ahead_h[ci + 1])
        for ci, (a0, a1) in enumerate(chunks):
            r = rows[a0:a1]
            if isinstance(r, range):
                r = slice(r.start, r.stop)
            elif int(r[-1] - r[0]) == len(r) - 1 and (len(r) == 1 or
                                                        bool((np.diff(r) == 1).all())):
                r = slice(int(r[0]), int(r[-1]) + 1)  # contiguous rows: views, not gathers
            src = src_block[a0:a1]
            length = t.length[src]
            host, present = _matrix(t.host, t.host_start[src], length, k)
            gstart = t.gpu_start[src]
            measured = gstart >= 0
            if measured.any():
                # read as far as this chunk's lists go (a lazily loaded run)
                data.fill_device_times(int((gstart[measured] + length[measured]).max()))
                gpu, _ = _matrix(t.gpu, gstart, length, k)
                gvalid, _ = _matrix(t.gpu_valid, gstart, length, k, contiguous=False)
            else:
                gpu = gvalid = None
            htop = host if all_top else host[top]
            gtop = None if gpu is None else (gpu if all_top else gpu[top])
            if gpu is not None and folds:
                gtop = gtop.copy()
                gvalid_top = gvalid[top]
                for row, kids in folds:
                    # A parent timed on the host only: its children's device time
                    # is the device work it queued.
                    gtop[row] = np.where(gvalid_top[row], gtop[row], gpu[kids].sum(axis=0))
            if carved:
                # Children carved out of their parents (module docstring).
                hw = host[walk_pos]
                gw = np.zeros_like(hw) if gtop is None else gpu[walk_pos].copy()
                if gtop is not None:
                    gw[top_walk] = gtop
                for crow, prow in carved_rows:
                    np.subtract(hw[prow], hw[crow], out=hw[prow])
                np.maximum(hw, 0.0, out=hw)
                a = attribute_matrix(hw, None if gtop is None else gw, lay.cat[walk_pos],
                                     coll[walk_pos])
            else:
                a = attribute_matrix(htop, gtop, lay.cat[top], coll[top])
            out[0, r] += a.starvation
            out[1, r] += a.backpressure
            out[2, r] += a.compute
            out[3, r] += a.sync
            out[4, r] += htop.sum(axis=0)
            if gpu is not None:
                out[5, r] += gtop.sum(axis=0)
                for j in range(k):  # row by row: gvalid is a strided view
                    has_gpu_it[r] |= gvalid[j]
            # Per-phase sums by (layout of the block, group) segment.
            g = lay_idx[a0:a1].astype(np.int64) * n_groups + group[r]
            seg = np.concatenate([[0], np.flatnonzero(np.diff(g)) + 1])
            n_seg = len(seg)
            part = np.zeros((len(PHASE_SUMS), k, n_seg))
            if present is None:
                part[0] = np.diff(np.append(seg, len(g)))[None, :]
            else:
                part[0] = np.add.reduceat(present, seg, axis=1, dtype=np.float64)
            part[1] = np.add.reduceat(host, seg, axis=1, dtype=np.float64)
            if gpu is not None:
                part[2] = np.add.reduceat(gpu, seg, axis=1, dtype=np.float64)
                part[3] = np.add.reduceat(gvalid, seg, axis=1, dtype=np.float64)
            if a.credit is not None:
                for q, moved in ((4, a.credit), (5, a.moved)):
                    if all_top:
                        part[q] = np.add.reduceat(moved, seg, axis=1, dtype=np.float64)
                    else:
                        full = np.zeros((k, moved.shape[1]))
                        full[walk_pos if carved else top] = moved
                        part[q] = np.add.reduceat(full, seg, axis=1, dtype=np.float64)
            if carved:
                cut = np.zeros((k, host.shape[1]))
                for c, p in carved:
                    cut[p] += host[c]
                np.minimum(cut, host, out=cut)
                part[6] = np.add.reduceat(cut, seg, axis=1, dtype=np.float64)
            seg_keys.append(g[seg])
            seg_sums.append(part)
            if release:
                del gpu, gvalid, gtop
                nxt = ahead[ci + 1]
                data.release_device_times_before(len(t.gpu) if nxt is None else nxt)
                del host, present, htop
                nxt = ahead_h[ci + 1]
                data.release_host_times_before(len(t.host) if nxt is None else nxt)
        # Sum the segments of each (layout, group), in chunk order (as a running total).
        uniq, inv = np.unique(np.concatenate(seg_keys), return_inverse=True)
        acc = np.zeros((len(PHASE_SUMS), k, len(uniq)))
        np.add.at(acc.transpose(2, 0, 1), inv, np.concatenate(seg_sums, axis=2).transpose(2, 0, 1))
        ell, g_of = np.divmod(uniq, n_groups)
        pid = np.stack([data.layouts[int(x)].pid for x in block_lids])[ell]   # (u, k)
        n_u = len(uniq)
        c_idx = np.tile(np.arange(k), n_u)
        u_idx = np.repeat(np.arange(n_u), k)
        flat = acc.transpose(0, 2, 1).reshape(len(PHASE_SUMS), -1)       # (u, k) order
        live = flat[0] > 0
        keys.append(np.column_stack([
            block_lids[ell][u_idx][live], c_idx[live], g_of[u_idx][live],
            pid.ravel()[live], lay.cat[c_idx[live]], top[c_idx[live]].astype(np.int64),
            counted[c_idx[live]].astype(np.int64)]))
        sums.append(flat[:, live].T)
    if keys:
        allk = np.concatenate(keys)
        # In (layout, phase position, group) order, as the layouts were once walked one by one.
        order = np.lexsort((allk[:, 2], allk[:, 1], allk[:, 0]))
        phase_keys = allk[order][:, 2:]
        phase_sums = np.concatenate(sums)[order]
    else:
        phase_keys = np.empty((0, 5), dtype=np.int64)
        phase_sums = np.empty((0, len(PHASE_SUMS)))
    return RunAttribution(iteration=out, iteration_has_gpu=has_gpu_it,
                          phase_keys=phase_keys.astype(np.int64), phase_sums=phase_sums)
