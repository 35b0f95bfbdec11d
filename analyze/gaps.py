"""Time between iterations: the wall time a worker spends outside ``rec.iteration()``.

The most common PyTorch loop fetches its batch *before* the iteration begins::

    for x, y in loader:                    # the DataLoader fetch: between iterations
        with rec.iteration() as it:
            ...

The fetch then falls between one iteration's end (``ts + dur``) and the next
one's start, where no record covers it. Left out, it makes throughput
(iterations over the seconds of their ``dur``) too high and hides the loss
entirely: a loop that waits 45% of its time for data read as compute-bound at
1.8x its real it/s (a first-time user's run). So the gap
before each iteration is counted as part of that iteration: its start moves
back to the previous iteration's end and its ``dur`` grows by the gap, which
attribution then finds in no phase (``unaccounted``). Throughput becomes what
the loop's own it/s shows (iterations over wall time), and the verdict and the
``unaccounted`` finding say how much of that time lay between iterations.

Rules (each tlog's choice):

- Only consecutive iterations of one worker (``iter`` one more than the
  previous one's) are joined: a renumbered iteration (a restart, a second
  attempt) starts afresh.
- A gap longer than :data:`PAUSE_FACTOR` times the worker's median cycle
  (gap + ``dur``: an iteration as the loop sees it) is a pause (an evaluation, a checkpoint not logged as an ``event``), not a
  per-iteration cost: it is not absorbed, and the run's notes count the pauses.
- A gap that an ``event`` (a checkpoint, an evaluation) overlaps belongs to
  the event, not to the next iteration, which is then judged as it was logged.
  The events are those that leave iterations out (``analyze.steady``:
  not scoped to their rank, span markers excepted).
- Negative gaps (overlapping iterations, clock steps) count as zero, and so
  do gaps under :data:`MIN_GAP_S` (clock noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from tlog.analyze.steady import disruptive_events, worker_slices

#: A gap longer than this many median cycles (gap + dur) of its worker is a pause,
#: not a per-iteration cost (tlog's choice: a DataLoader fetch, a logging call or a
#: ``for`` loop's own overhead is at most a few iterations' time; an evaluation or a
#: checkpoint is many).
PAUSE_FACTOR = 10.0

#: What time between iterations most likely is, and what to do (the words the
#: verdict and the ``unaccounted`` finding use). The loader is tlog's guess: it
#: is where the common ``for batch in loader:`` loop spends that time.
BETWEEN_WORDS = ("in a `for batch in loader:` loop that is the data loader's fetch "
                 "(tlog's guess: no phase times it); time it inside the iteration as a "
                 "phase, e.g. `with it.phase(\"next_batch\"): batch = next(batches)`")

#: What time between iterations is when the worker's thread waited runnable for a
#: core at least that long (the scheduler's run-queue delay, measured): a loop
#: that loses its core loses it wherever it runs, between iterations included,
#: so no data loader is guessed there. ``{share}``: the run-queue share.
CORE_WAIT_WORDS = ("its thread waited runnable for a core {share} of its time (the "
                   "scheduler's run-queue delay), at least as long as the time between "
                   "iterations: that time is a wait for a core, not a data loader "
                   "(see cpu_contention)")


def between_words(core_wait: float | None, between_share: float) -> str:
    """What the time between iterations most likely is, in words.

    Args:
        core_wait: the largest measured run-queue share of the stage's workers
            (the share of wall time a thread waited runnable for a core;
            None without run-queue figures).
        between_share: the stage's time between iterations over its wall time.

    Returns:
        :data:`CORE_WAIT_WORDS` when ``core_wait`` is at least ``between_share``
        (the wait for a core can hold all of it), else :data:`BETWEEN_WORDS`
        (tlog's guess: the loader's fetch of a ``for batch in loader:`` loop).
    """
    if core_wait is not None and core_wait > 0 and core_wait >= between_share:
        from tlog.analyze.text import pct

        return CORE_WAIT_WORDS.format(share=pct(core_wait))
    return BETWEEN_WORDS


def between_short_words(core_wait: float | None, between_share: float) -> str:
    """:func:`between_words` in a few words, for the verdict line: ``"a wait
    for a core (the thread waited 41% of its time)"`` or ``"likely the data
    loader's fetch (tlog's guess)"``; the finding gives the whole text."""
    if core_wait is not None and core_wait > 0 and core_wait >= between_share:
        from tlog.analyze.text import pct

        return f"a wait for a core (its thread waited {pct(core_wait)} of its time)"
    return "likely the data loader's fetch (tlog's guess)"


#: Gaps shorter than this are clock noise, not time (seconds; tlog's choice: writers
#: round ``ts`` and ``dur`` to the microsecond, and ``ts`` (wall clock) and ``dur``
#: (monotonic clock) drift apart by a few microseconds per iteration).
MIN_GAP_S = 1e-5

#: Share of a stage's unaccounted time that must lie between iterations for the
#: verdict and the finding to say so (tlog's choice: "most of it").
BETWEEN_MOSTLY = 0.5

#: Column that :func:`absorb_gaps` adds: the seconds before each iteration, now
#: inside its ``dur``. float32: it only feeds shares (summed in float64), and
#: 10M iterations' worth costs 38 MiB instead of 76 MiB.
BETWEEN_COLUMN = "between_s"


@dataclass(frozen=True)
class Pauses:
    """Gaps between iterations too long to be a per-iteration cost (not absorbed).

    Attributes:
        count: how many.
        seconds: their total length (seconds).
    """

    count: int
    seconds: float


def absorb_gaps(it: pl.DataFrame, events: pl.DataFrame | None = None
                ) -> tuple[pl.DataFrame, Pauses]:
    """Count the wall time before each iteration as part of it (module docstring).

    Args:
        it: iterations grouped by worker (``wid``) and in ``iter`` order within
            (``analyze.load`` orders them so), with ``wid``, ``iter``, ``ts``
            (epoch seconds) and ``dur`` (seconds).
        events: the run's events (``ts``, ``dur``), or None.

    Returns:
        The frame with ``ts`` moved back and ``dur`` grown by each absorbed gap,
        and :data:`BETWEEN_COLUMN` (float32 seconds) holding the gap (the frame
        unchanged, without that column, when no gap was absorbed), and the
        pauses left out.
    """
    n = it.height
    if n == 0:
        return it, Pauses(0, 0.0)
    wid = it["wid"].to_numpy()
    iters = it["iter"].to_numpy()
    ts = it["ts"].to_numpy()
    dur = it["dur"].to_numpy()
    cut = None
    if events is not None and events.height:
        cut, _ = disruptive_events(events, ts, dur)
        cut = cut.select("ts", pl.col("dur").fill_null(0.0)).to_numpy()
    # Worker by worker (contiguous blocks), so that no temporary is run-sized
    # (memory at 10M iterations): only the float32 result is.
    between = np.zeros(n, dtype=np.float32)
    count, paused = 0, 0.0
    for _, a, b in worker_slices(wid):
        if b - a < 2:
            continue
        t, d = ts[a:b], dur[a:b]
        gap = t[1:] - (t[:-1] + d[:-1])
        ok = (iters[a + 1:b] == iters[a:b - 1] + 1) & (gap >= MIN_GAP_S)
        gap = np.where(ok, gap, 0.0)
        if cut is not None and gap.any():
            start = t[1:] - gap
            for ev_ts, ev_dur in cut:
                gap[(ev_ts <= t[1:]) & (ev_ts + ev_dur >= start)] = 0.0
        if not gap.any():
            continue
        limit = PAUSE_FACTOR * float(np.median(np.r_[d[0], gap + d[1:]]))
        pause = gap > limit
        count += int(pause.sum())
        paused += float(gap[pause].sum())
        gap[pause] = 0.0
        between[a + 1:b] = gap
    pauses = Pauses(count, paused)
    if not between.any():
        return it, pauses
    shift = between.astype(np.float64)
    return (it.with_columns(ts=pl.Series(ts - shift), dur=pl.Series(dur + shift),
                            **{BETWEEN_COLUMN: pl.Series(between)}), pauses)


def pauses_note(p: Pauses) -> str | None:
    """The run note for pauses left out, or None when there were none."""
    if not p.count:
        return None
    return (f"{p.count} pause(s) between iterations ({p.seconds:.1f} s in all, each longer "
            f"than {PAUSE_FACTOR:g}x its worker's median iteration) are not counted in any "
            f"iteration: an evaluation or checkpoint not logged as an event?")
