"""Device-aware attribution: where each second of each iteration went.

DESIGN.md ("Attribution"), per iteration and worker:

1. Each top-level phase's host wall time goes to its category (the host rules
   of ``ingest.categories``, applied at ingest); ``dur - sum(top-level phases)``
   is ``unaccounted``. Children (``forward/mask_build``) are inside their
   parent and are never counted again.
2. With device times (``gpu``), a sync phase is not all sync. The
   **device-backlog walk** runs over the iteration's top-level phases in
   ``seq`` order, keeping the backlog ``b`` of device seconds queued and not
   yet run. A phase with host time ``h`` and device time ``g`` queues ``g`` and
   lets the device run for ``h``::

       b_i       = max(0, b_{i-1} + g_i - h_i)        (a Lindley recursion, b_0 = 0)
       drained_i = b_{i-1} + g_i - b_i                 (device seconds retired in phase i)

   ``drained_i <= h_i`` always. For a sync phase, ``drained_i`` is **compute**
   (the host was waiting for its own queued work) and only ``h_i - drained_i``
   is **sync**. The compute is credited FIFO to the phases whose device work
   was drained (the device runs its queue in order): phase ``j``'s work
   occupies ``(D_{j-1}, D_j]`` of the cumulative queued device time ``D``, the
   sync phase ``k`` retires ``(R_{k-1}, R_k]`` with ``R = D - b``, and ``j`` is
   credited the overlap. The backlog starts empty at every iteration (loops
   end each step with a host-device sync: a loss ``.item()``, the optimizer
   step's ``_foreach`` checks, or a logging read).

   Worked example (issue 5): host ``forward 5 ms, backward 8, loss_item 100``
   with device ``forward 20, backward 25``: the backlog is 15 ms after the
   forward, 32 after the backward; the ``.item()`` drains 32 -> 32 ms compute
   (7 credited to forward, 25 to backward) and 68 ms sync.

The walk is vectorised: rows of one iteration are contiguous, so step ``p``
of the recursion updates every iteration's ``p``-th phase at once (as many
numpy passes as the longest iteration has phases).

Only host categories of phases are changed by the walk; starvation and
backpressure phases keep their host time even when the device drained work
meanwhile (their wait still held the loop).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analyze.load import BACKPRESSURE, COMPUTE, STARVATION, SYNC, PhaseRows, RunData


@dataclass(frozen=True)
class PhaseAttribution:
    """Attributed seconds of every top-level phase row (parallel to :class:`PhaseRows`).

    Attributes:
        starvation, backpressure, compute, sync: float64 seconds of the row
            in each category after the walk; they sum to the row's host time
            plus the compute credited to it minus the compute moved away from
            it (a sync row keeps only its sync part).
        drained: float64 device seconds retired during the row's host time.
        credit: float64 seconds of sync-phase wall time credited to this row's
            device work (part of ``compute``).
    """

    starvation: np.ndarray
    backpressure: np.ndarray
    compute: np.ndarray
    sync: np.ndarray
    drained: np.ndarray
    credit: np.ndarray


def _positions(ix: np.ndarray) -> tuple[np.ndarray, int]:
    """Position of each row within its (contiguous) iteration, and the largest."""
    n = len(ix)
    if n == 0:
        return np.empty(0, dtype=np.int64), -1
    start = np.empty(n, dtype=bool)
    start[0] = True
    np.not_equal(ix[1:], ix[:-1], out=start[1:])
    idx = np.arange(n, dtype=np.int64)
    first = np.maximum.accumulate(np.where(start, idx, 0))
    pos = idx - first
    return pos, int(pos.max())


def backlog_walk(ix: np.ndarray, host: np.ndarray, gpu: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the device-backlog walk over phase rows.

    Args:
        ix: iteration of each row; rows of one iteration contiguous, in order.
        host: host seconds of each row.
        gpu: device seconds of each row (0 when none).

    Returns:
        ``(backlog, drained, position)``: float64 device seconds still queued
        after the row, float64 device seconds retired during the row, int64
        position of the row in its iteration.
    """
    pos, max_pos = _positions(ix)
    n = len(ix)
    backlog = np.zeros(n)
    drained = np.zeros(n)
    x = gpu - host
    for p in range(max_pos + 1):
        rows = np.flatnonzero(pos == p)
        prev = backlog[rows - 1] if p else 0.0
        b = np.maximum(prev + x[rows], 0.0)
        backlog[rows] = b
        drained[rows] = prev + gpu[rows] - b
    return backlog, drained, pos


def fifo_credit(pos: np.ndarray, gpu: np.ndarray, backlog: np.ndarray, take: np.ndarray
                ) -> np.ndarray:
    """Credit the device time drained by the rows in ``take`` to the rows whose
    device work it was, first queued first run (see the module docstring).

    Args:
        pos: position of each row in its iteration (rows contiguous).
        gpu: device seconds of each row.
        backlog: backlog after each row (:func:`backlog_walk`).
        take: bool, rows whose drained time moves to other rows (sync phases).

    Returns:
        float64 seconds credited to each row; the total equals the drained
        time of the ``take`` rows.
    """
    n = len(pos)
    credit = np.zeros(n)
    if n == 0 or not take.any():
        return credit
    # Cumulative queued device time D (inclusive) and retired R = D - b, per iteration.
    csum = np.cumsum(gpu)
    first = np.maximum.accumulate(np.where(pos == 0, np.arange(n), 0))
    d_incl = csum - (csum[first] - gpu[first])
    d_excl = d_incl - gpu
    retired = d_incl - backlog
    retired_prev = np.where(pos > 0, np.concatenate([[0.0], retired[:-1]]), 0.0)
    k_rows = np.flatnonzero(take & (retired > retired_prev))
    if len(k_rows) == 0:
        return credit
    k_pos = pos[k_rows]
    lo_k = retired_prev[k_rows]
    hi_k = retired[k_rows]
    for d in range(int(k_pos.max()) + 1):
        sel = k_pos >= d
        k = k_rows[sel]
        j = k - d
        overlap = np.minimum(d_incl[j], hi_k[sel]) - np.maximum(d_excl[j], lo_k[sel])
        credit[j] += np.maximum(overlap, 0.0)
    return credit


def attribute_phases(phases: PhaseRows) -> PhaseAttribution:
    """Attribute every top-level phase row's host time to categories (module docstring).

    Rows without device times pass through unchanged (host time to the host
    category); iterations without any device time are unaffected by the walk.
    """
    host = phases.host
    cat = phases.cat
    by_cat = [np.where(cat == code, host, 0.0) for code in (STARVATION, BACKPRESSURE, COMPUTE, SYNC)]
    starvation, backpressure, compute, sync = by_cat
    zeros = np.zeros(len(host))
    if len(host) == 0 or not phases.has_gpu.any():
        return PhaseAttribution(starvation, backpressure, compute, sync, zeros, zeros.copy())
    backlog, drained, pos = backlog_walk(phases.ix, host, phases.gpu)
    is_sync = cat == SYNC
    credit = fifo_credit(pos, phases.gpu, backlog, is_sync)
    moved = np.where(is_sync, drained, 0.0)
    sync = sync - moved
    compute = compute + credit
    # A credit to a non-compute row (device work queued by a starvation or
    # sync phase, e.g. a host-to-device copy) is compute all the same.
    return PhaseAttribution(starvation, backpressure, compute, np.maximum(sync, 0.0),
                            drained, credit)


def iteration_seconds(data: RunData, attr: PhaseAttribution) -> pl.DataFrame:
    """Per-iteration category seconds after attribution.

    Returns:
        A frame with one row per iteration (in ``data.iterations`` order) and
        float64 columns ``starvation_s``, ``backpressure_s``, ``compute_s``,
        ``sync_s``, ``unaccounted_s`` (``max(0, dur - sum of top-level host
        times)``), ``phase_s`` (sum of top-level host times), ``gpu_s``
        (device seconds of top-level phases, null when none was measured).
    """
    n = data.iterations.height
    ix = data.phases.ix

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(ix, weights=values, minlength=n) if len(ix) else np.zeros(n)

    phase_s = total(data.phases.host)
    dur = data.iterations["dur"].to_numpy()
    gpu_s = total(data.phases.gpu)
    has_gpu = (np.bincount(ix, weights=data.phases.has_gpu.astype(np.float64), minlength=n) > 0
               if len(ix) else np.zeros(n, dtype=bool))
    return pl.DataFrame({
        "starvation_s": total(attr.starvation),
        "backpressure_s": total(attr.backpressure),
        "compute_s": total(attr.compute),
        "sync_s": total(attr.sync),
        "unaccounted_s": np.maximum(dur - phase_s, 0.0),
        "phase_s": phase_s,
        "gpu_s": pl.Series(np.where(has_gpu, gpu_s, np.nan), dtype=pl.Float64).fill_nan(None),
    })
