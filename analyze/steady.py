"""Steady state: which iterations the verdict is computed from.

DESIGN.md ("Verdict"): leave out warm-up and iterations that overlap an
``event``, and say how many were left out. Periodic stalls are *not* left out:
a loader that stalls 3 s every fourth iteration is the finding, not noise, so
nothing here drops an iteration for being slow.

**Warm-up** (per worker, in ``iter`` order): the reference is the median
iteration time of the worker's second half (:data:`WARMUP_REFERENCE_FROM`),
which a warm-up at the start cannot move. Warm-up ends at the first iteration
``i`` that is itself within :data:`WARMUP_TOLERANCE` above the reference and
whose forward window ``i .. i+W-1`` (:data:`WARMUP_WINDOW`) has its median
within the tolerance of it (the rolling median has settled). A median ignores
stalls that hit fewer than half the iterations of a window, so periodic stalls
do not extend the warm-up. Warm-up never exceeds :data:`WARMUP_MAX_SHARE` of a
worker's iterations, and workers with fewer than :data:`WARMUP_MIN_ITERS`
iterations keep them all (too few to tell; the ``short_run`` finding says so).

**Events**: an iteration of any worker that overlaps an event's interval
``[ts, ts + dur]`` is left out. Events are not scoped to their own rank: a
checkpoint on rank 0 holds its peers at their next collective, and a stalled
producer starves its consumers during the event. An event spanning more than
:data:`EVENT_MAX_SPAN_SHARE` of the run is a span marker and is ignored.

**Attempts** (:func:`find_attempts`): a job restarted after a failure
(torchrun ``--max-restarts``, a resubmission into the same run directory)
logs each rank once per attempt: the shim names the restarted recorder
``<stage>-<rank>.<k>`` and counts ``iter`` from 0 again. Workers of one stage
that share a rank and whose spans ``[first ts, last ts + dur]`` do not overlap
ran one after the other: they are successive attempts of that rank. (The
``.k`` suffix alone proves nothing: the shim also gives it to a second
recorder of the same rank and stage running at the same time, RUNTIME.md;
workers that overlap in time ran at once, whatever their names.) The rank
with the most such workers sets the attempts (their first ``ts``); every
worker of the stage belongs to the attempt whose start is nearest its own
first ``ts`` (clock offsets between hosts are far smaller than the time
between attempts). A stage is judged on ONE attempt - the one with the most
steady iterations (ties: the last) - since the ranks of different attempts
never ran together: matching them by ``iter`` as one lockstep group, or
adding their rates, is wrong. Every iteration of the other attempts is left
out (``excluded`` ``"attempt"``, which wins over warm-up and event).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

import numpy as np
import polars as pl

#: Forward window of the settling test (iterations). Five is the smallest odd
#: window whose median ignores a stall every other iteration but one; source:
#: tlog's choice, in line with torch.utils.benchmark's short warm-up runs.
WARMUP_WINDOW = 5
#: How close to the reference an iteration and its window median must be (20%).
#: Source: tlog's choice, the same 20% XProf uses for "highly" input-bound:
#: a difference smaller than that does not change a verdict.
WARMUP_TOLERANCE = 0.20
#: Warm-up is at most this share of a worker's iterations (a run that never
#: settles is judged on its last three quarters rather than not at all).
WARMUP_MAX_SHARE = 0.25
#: The reference time is the median of the iterations from this fraction on.
WARMUP_REFERENCE_FROM = 0.5
#: Workers with fewer iterations than this get no warm-up detection.
WARMUP_MIN_ITERS = 8

#: An event longer than this share of the run's wall span is a span marker
#: ("epoch 1", "training"), not a disruption: it leaves nothing out. Source:
#: tlog's choice; checkpoints and evaluations are short against a run.
EVENT_MAX_SPAN_SHARE = 0.5

#: Reasons an iteration is left out (the ``excluded`` column).
EXCLUDED_WARMUP = "warmup"
EXCLUDED_EVENT = "event"
EXCLUDED_ATTEMPT = "attempt"
#: The ``excluded`` column's type inside analysis: an Enum (1 byte a row) built
#: without strings; the public frames (``analyze.frames``) hold it as String.
#: A String column built with ``when/then`` took about 490 MiB at 10M
#: iterations, the Enum about 50 (memory at scale).
EXCLUDED_TYPE = pl.Enum([EXCLUDED_WARMUP, EXCLUDED_EVENT, EXCLUDED_ATTEMPT])


def warmup_length(dur: np.ndarray) -> int:
    """Number of leading warm-up iterations of one worker (module docstring).

    Args:
        dur: the worker's iteration times in seconds, in ``iter`` order.

    >>> warmup_length(np.array([5.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    2
    """
    n = len(dur)
    if n < WARMUP_MIN_ITERS:
        return 0
    ref = float(np.median(dur[int(n * WARMUP_REFERENCE_FROM):]))
    cap = int(n * WARMUP_MAX_SHARE)
    if ref <= 0:
        return 0
    head = dur[: cap + WARMUP_WINDOW]
    window = min(WARMUP_WINDOW, len(head))
    medians = np.median(np.lib.stride_tricks.sliding_window_view(head, window), axis=1)
    limit = ref * (1 + WARMUP_TOLERANCE)
    ok = (head[: len(medians)] <= limit) & (np.abs(medians - ref) <= WARMUP_TOLERANCE * ref)
    hits = np.flatnonzero(ok[: cap + 1])
    return int(hits[0]) if len(hits) else cap


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    group = np.cumsum(new) - 1
    ms = s[new]
    me = np.full(len(ms), -np.inf)
    np.maximum.at(me, group, e)
    return ms, me


def overlaps_events(ts: np.ndarray, dur: np.ndarray, events: pl.DataFrame) -> np.ndarray:
    """Bool per iteration: does ``[ts, ts + dur)`` overlap any event's ``[ts, ts + dur]``?

    A zero-length event (a marker) hits the iteration it falls in.
    """
    if events.height == 0 or len(ts) == 0:
        return np.zeros(len(ts), dtype=bool)
    es = events["ts"].to_numpy().astype(np.float64)
    ee = es + events["dur"].fill_null(0.0).to_numpy().astype(np.float64)
    ms, me = _merge(es, ee)
    end = np.maximum(ts + dur, ts + 1e-12)
    hit = np.zeros(len(ts), dtype=bool)
    # The first merged interval ending at or after the iteration's start, and
    # the one after it (the first may only touch the start).
    first = np.searchsorted(me, ts, side="left")
    for k in (first, first + 1):
        valid = k < len(ms)
        kk = np.where(valid, k, 0)
        s, e = ms[kk], me[kk]
        inside = np.where(e == s, (s >= ts) & (s < end), (s < end) & (e > ts))
        hit |= valid & inside
    return hit


def worker_slices(wid: np.ndarray) -> list[tuple[int, int, int]]:
    """``(wid, start, end)`` of each run of equal worker ids (one per worker)."""
    n = len(wid)
    if n == 0:
        return []
    starts = np.concatenate([[0], np.flatnonzero(np.diff(wid)) + 1])
    ends = np.append(starts[1:], n)
    return [(int(wid[a]), int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def disruptive_events(events: pl.DataFrame, ts: np.ndarray, dur: np.ndarray
                      ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split events into those that leave iterations out and span markers
    (longer than :data:`EVENT_MAX_SPAN_SHARE` of the run's wall span)."""
    if events.height == 0 or len(ts) == 0:
        return events, events.head(0)
    span = float((ts + dur).max() - ts.min())
    long = pl.col("dur").fill_null(0.0) > EVENT_MAX_SPAN_SHARE * span
    return events.filter(~long), events.filter(long)


def shared_warmup_end(wid: np.ndarray, ts: np.ndarray, lengths: dict[int, tuple[int, int, int]],
                      stage_of: dict[int, str]) -> float | None:
    """When a pipeline's start-up ends for all its stages (epoch seconds), or None
    for a run of one stage.

    Stages of a pipeline start up together: while a drafter stage warms up
    (compiles, fills its caches), the target that feeds it runs against an
    empty or filling queue, so its first iterations are start-up too even
    where its own times look settled (drafters lost 16-28 iterations to
    warm-up and the target 0-1, and a start-up stall stayed in the target's
    figures). Per stage, the start of its workers' first steady iteration
    (:func:`warmup_length`; a worker without warm-up: its first iteration),
    their median (one slow rank does not set it); the latest of the stages.

    Args:
        wid, ts: the run's iterations' worker indices and starts, sorted by worker.
        lengths: ``wid -> (first row, end row, warm-up iterations)``.
        stage_of: ``wid -> stage``.
    """
    if len(set(stage_of.values())) < 2:
        return None
    ends: dict[str, list[float]] = {}
    for w, (a, b, k) in lengths.items():
        if b > a:
            ends.setdefault(stage_of[w], []).append(float(ts[a + min(k, b - a - 1)]))
    return max(float(np.median(v)) for v in ends.values()) if ends else None


def steady_flags(iterations: pl.DataFrame, events: pl.DataFrame,
                 workers: pl.DataFrame | None = None) -> pl.DataFrame:
    """Mark the steady-state iterations of a run.

    Warm-up is judged per worker (:func:`warmup_length`); in a run of several
    stages (``workers`` given), every worker's iterations that start before
    the pipeline's shared start-up end (:func:`shared_warmup_end`) are warm-up
    too, at most :data:`WARMUP_MAX_SHARE` of the worker's iterations (workers
    with fewer than :data:`WARMUP_MIN_ITERS` keep them all).

    Args:
        iterations: rows sorted by worker then ``iter`` with columns ``wid``,
            ``ts``, ``dur`` (``analyze.load.RunData.iterations``).
        events: rows with ``ts`` and ``dur``.
        workers: ``wid``, ``stage`` of each worker (``RunData.workers``), or None.

    Returns:
        A frame parallel to ``iterations`` with ``steady`` (bool) and
        ``excluded`` (``"warmup"``, ``"event"`` or null; warm-up wins; typed
        :data:`EXCLUDED_TYPE`).
    """
    n = iterations.height
    wid = iterations["wid"].to_numpy()
    dur = iterations["dur"].to_numpy().astype(np.float64)
    ts = iterations["ts"].to_numpy().astype(np.float64)
    warm = np.zeros(n, dtype=bool)
    if n:
        bounds = np.flatnonzero(np.diff(wid)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [n]])
        lengths = {}
        for a, b in zip(starts, ends, strict=True):
            k = warmup_length(dur[a:b])
            warm[a: a + k] = True
            lengths[int(wid[a])] = (int(a), int(b), k)
        stage_of = ({} if workers is None else
                    dict(zip(workers["wid"].to_list(), workers["stage"].cast(pl.String).to_list(),
                             strict=True)))
        shared = (shared_warmup_end(wid, ts, lengths, stage_of)
                  if set(lengths) <= set(stage_of) else None)
        if shared is not None:
            for a, b, k in lengths.values():
                if b - a < WARMUP_MIN_ITERS:
                    continue
                before = int(np.searchsorted(ts[a:b], shared, side="left"))
                more = min(before, int((b - a) * WARMUP_MAX_SHARE))
                if more > k:
                    warm[a: a + more] = True
    event = overlaps_events(ts, dur, disruptive_events(events, ts, dur)[0]) & ~warm
    return pl.DataFrame({"warm": warm, "event": event}).select(
        steady=~(pl.col("warm") | pl.col("event")),
        excluded=pl.when("warm").then(pl.lit(EXCLUDED_WARMUP, dtype=EXCLUDED_TYPE))
        .when("event").then(pl.lit(EXCLUDED_EVENT, dtype=EXCLUDED_TYPE))
        .otherwise(pl.lit(None, dtype=EXCLUDED_TYPE)),
    )


@dataclass(frozen=True)
class StageAttempts:
    """The successive attempts of one restarted stage (module docstring, "Attempts").

    Attributes:
        stage: the stage.
        wids: worker indices of each attempt, attempts in time order.
        starts: first ``ts`` of each attempt (epoch seconds).
        iterations: iterations of each attempt (all of them).
        steady: steady iterations of each attempt by the warm-up and event rules.
        kept: index of the attempt the stage is judged on.
    """

    stage: str
    wids: tuple[tuple[int, ...], ...]
    starts: tuple[float, ...]
    iterations: tuple[int, ...]
    steady: tuple[int, ...]
    kept: int

    @property
    def left_out(self) -> tuple[int, ...]:
        """Worker indices of the attempts not judged."""
        return tuple(w for k, ws in enumerate(self.wids) if k != self.kept for w in ws)

    @property
    def left_out_iterations(self) -> int:
        """Iterations of the attempts not judged (all left out of the steady state)."""
        return sum(n for k, n in enumerate(self.iterations) if k != self.kept)

    def note(self) -> str:
        """The sentence ``tlog diagnose`` adds to its notes."""
        n = len(self.wids)
        at = ", ".join(datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                       for t in self.starts[1:])
        which = ("the last" if self.kept == n - 1 else
                 "the first" if self.kept == 0 else f"attempt {self.kept + 1}")
        others = "earlier attempt" if (n == 2 and self.kept == 1) else (
            "later attempt" if n == 2 else "other attempts")
        return (f"run holds {n} attempts of stage {self.stage} "
                f"({'a restart' if n == 2 else 'restarts'} at {at}; workers that share a rank "
                f"and ran one after the other): judged on {which} (the most steady "
                f"iterations), {self.steady[self.kept]} steady iterations; "
                f"{self.left_out_iterations} iterations of the {others} left out "
                f"(its ranks never ran with the judged ones)")


def find_attempts(iterations: pl.DataFrame, workers: pl.DataFrame, steady: np.ndarray
                  ) -> list[StageAttempts]:
    """The stages that hold several attempts (module docstring, "Attempts").

    Args:
        iterations: rows sorted by worker with ``wid``, ``ts``, ``dur``
            (``analyze.load.RunData.iterations``).
        workers: ``wid, stage, rank, worker`` (``RunData.workers``).
        steady: bool per row of ``iterations`` (:func:`steady_flags`).

    Returns:
        One :class:`StageAttempts` per stage with two or more attempts (an
        empty list for a run without restarts).
    """
    if iterations.height == 0 or workers.height < 2:
        return []
    wid = iterations["wid"].to_numpy()
    ts = iterations["ts"].to_numpy().astype(np.float64)
    end = ts + iterations["dur"].fill_null(0.0).to_numpy().astype(np.float64)
    bounds = np.flatnonzero(np.diff(wid)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(wid)]])
    span = {int(wid[a]): (float(ts[a:b].min()), float(end[a:b].max()), b - a,
                          int(steady[a:b].sum()))
            for a, b in zip(starts, ends, strict=True)}
    out = []
    for (stage,), w in workers.sort("wid").group_by("stage", maintain_order=True):
        wids = [int(x) for x in w["wid"].to_list() if int(x) in span]
        ranks = dict(zip(w["wid"].to_list(), w["rank"].to_list(), strict=True))
        by_rank: dict[int, list[int]] = {}
        for x in wids:
            if ranks[x] is not None:
                by_rank.setdefault(int(ranks[x]), []).append(x)
        best: list[int] = []
        for rank in sorted(by_rank):
            chain = sorted(by_rank[rank], key=lambda x: span[x][0])
            apart = all(span[b][0] >= span[a][1] for a, b in pairwise(chain))
            if len(chain) > len(best) and apart:
                best = chain
        if len(best) < 2:
            continue
        anchors = np.array([span[x][0] for x in best])
        groups: list[list[int]] = [[] for _ in best]
        for x in wids:
            groups[int(np.argmin(np.abs(anchors - span[x][0])))].append(x)
        its = [sum(span[x][2] for x in g) for g in groups]
        st = [sum(span[x][3] for x in g) for g in groups]
        kept = max(range(len(groups)), key=lambda k: (st[k], k))
        out.append(StageAttempts(
            stage=str(stage), wids=tuple(tuple(g) for g in groups),
            starts=tuple(min(span[x][0] for x in g) if g else float(anchors[k])
                         for k, g in enumerate(groups)),
            iterations=tuple(its), steady=tuple(st), kept=kept))
    return out


def exclude_attempts(flags: pl.DataFrame, iterations: pl.DataFrame,
                     attempts: list[StageAttempts]) -> pl.DataFrame:
    """``flags`` (:func:`steady_flags`) with every iteration of the attempts not
    judged marked ``steady`` False, ``excluded`` ``"attempt"``."""
    left = [w for a in attempts for w in a.left_out]
    if not left:
        return flags
    hit = iterations["wid"].is_in(left)
    return flags.with_columns(
        steady=pl.col("steady") & ~hit,
        excluded=pl.when(hit).then(pl.lit(EXCLUDED_ATTEMPT, dtype=EXCLUDED_TYPE))
        .otherwise(pl.col("excluded")))
