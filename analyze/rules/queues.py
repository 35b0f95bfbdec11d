"""Queues in the steady window: how long each sat empty or full
(:func:`queue_waits`, from the get/put waits), their depth samples, their
state (:func:`queue_states`) and the ``queue_empty`` / ``queue_full`` findings
(info: corroboration for the verdict). docs/DIAGNOSIS.md section 4."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.rules.base import ItemRule, RuleContext
from tlog.analyze.text import pct

if TYPE_CHECKING:
    from tlog.analyze.frames import RunAnalysis

#: Suffixes of the phases a ``TimedQueue`` (dflash_runtime/queues.py) records for
#: the waits in ``get`` (the queue empty) and ``put`` (the queue full).
GET_SUFFIX, PUT_SUFFIX = "_get", "_put"


@dataclass(frozen=True)
class QueuePolicy:
    """When a queue is "empty" or "full" (its state, and the ``queue_empty`` /
    ``queue_full`` findings)."""

    #: A queue is "always empty" / "always full" when this share of its samples
    #: are at depth 0 / at capacity. Source: tlog's choice (nine in ten).
    state_share: float = 0.90
    #: A queue is "always empty" / "always full" when its consumers waited in
    #: ``get`` / its producers in ``put`` (the queue empty / full) this share of
    #: their steady time (:func:`queue_waits`). Source: tlog's choice: more than
    #: half the time is the queue's usual state; time-weighted, so lower than
    #: the samples' nine in ten (a 68% starved consumer's queue).
    time_share: float = 0.50


def queue_waits(analysis: RunAnalysis, names: list[str]) -> dict[str, dict[str, float]]:
    """How long each queue sat empty and full over the steady state, from the
    get/put waits its workers recorded (time-weighted, unlike depth samples).

    A ``TimedQueue`` named ``q`` records each blocking ``get`` as the phase
    ``q_get`` and each blocking ``put`` as ``q_put`` (``<parent>/q_get`` inside a
    phase block). A ``get`` blocks only while the queue is empty and a ``put``
    only while it is full, so a worker's steady seconds in ``q_get`` over its
    steady wall time is the share of its time the queue sat empty while it
    wanted an item. Depth sampled right after each get/put (the shim's
    ``queue`` records, at most one per 0.1 s) under-reads that: the put that
    ends an empty spell is the operation that samples it, at depth 1; a run
    whose consumer waited 68% of its time read 0% empty.

    Args:
        analysis: the attributed run.
        names: the queue names of its ``queue`` records.

    Returns:
        ``{name: {"empty_share", "full_share"}}`` (0..1; the largest share
        over the workers that waited on it), for each queue with a
        ``<name>_get`` or ``<name>_put`` phase in the steady state; a queue
        whose waits carry other names (``phase=`` of ``get``/``put``) is
        absent (its samples judge it).
    """
    phases = analysis.all_phases
    if not names or phases.height == 0:
        return {}
    pnames = analysis.data.phase_names
    it = analysis.iterations.filter(pl.col("steady"))
    wall = dict(it.group_by("wid").agg(pl.col("dur").sum()).iter_rows())
    steady = (phases.filter(pl.col("part").is_not_null())
              .group_by("wid", "pid").agg(pl.col("host_s").sum()))
    out: dict[str, dict[str, float]] = {}
    for wid, pid, secs in steady.iter_rows():
        leaf = pnames[pid].rsplit("/", 1)[-1]
        for name in names:
            if leaf in (name + GET_SUFFIX, name + PUT_SUFFIX) and wall.get(wid):
                key = "empty_share" if leaf.endswith(GET_SUFFIX) else "full_share"
                got = out.setdefault(name, {"empty_share": 0.0, "full_share": 0.0})
                got[key] = max(got[key], min(float(secs) / wall[wid], 1.0))
    return out


def queue_states(queues: pl.DataFrame, steady_windows: list[tuple[float, float]],
                 share: float = QueuePolicy.state_share,
                 waits: dict[str, dict[str, float]] | None = None,
                 time_share: float = QueuePolicy.time_share) -> list[dict]:
    """Summarise each queue within the steady window(s).

    Where ``waits`` (:func:`queue_waits`) has the queue, ``empty_share`` and
    ``full_share`` are the shares of time it sat empty and full, judged
    against ``time_share`` (``QueuePolicy.time_share``), and ``weighted``
    is True; else they are shares of its depth samples, judged against
    ``share`` (``QueuePolicy.state_share``).

    Returns:
        ``{name, samples, mean_depth, capacity, empty_share, full_share,
        weighted, state}`` per queue, ``state`` being ``"empty"`` (consumer
        starved by its producer), ``"full"`` (producer held by its consumer)
        or ``"mixed"``.
    """
    if queues.height == 0:
        return []
    q = queues
    if steady_windows:
        lo = min(a for a, _ in steady_windows)
        hi = max(b for _, b in steady_windows)
        inside = q.filter((pl.col("ts") >= lo) & (pl.col("ts") <= hi))
        if inside.height:
            q = inside
    out = []
    for (name,), g in q.group_by("name", maintain_order=True):
        depth = g["depth"].to_numpy()
        cap = g["capacity"].drop_nulls()
        capacity = int(cap.max()) if len(cap) else None
        empty = float(np.mean(depth <= 0))
        full = float(np.mean(depth >= capacity)) if capacity else 0.0
        limit, timed = share, (waits or {}).get(name)
        if timed is not None:
            empty, full, limit = timed["empty_share"], timed["full_share"], time_share
        state = ("empty" if empty >= limit and empty >= full else
                 "full" if full >= limit else "mixed")
        out.append({"name": name, "samples": len(depth), "mean_depth": float(depth.mean()),
                    "capacity": capacity, "empty_share": empty, "full_share": full,
                    "weighted": timed is not None, "state": state})
    return out


class QueueEmptyRule(ItemRule):
    """``queue_empty`` (info): a queue empty ``QueuePolicy.time_share`` of
    the steady time (its consumers' ``get`` waits, :func:`queue_waits`), else,
    without such waits, in ``QueuePolicy.state_share`` of its steady
    samples: its consumer is starved by its producer."""

    code = Code.QUEUE_EMPTY
    over = "queues"

    def items(self, ctx: RuleContext) -> list[dict[str, Any]]:
        """The queue states, in ``ctx.queues`` order."""
        return ctx.queues

    def evaluate_item(self, ctx: RuleContext, q: dict[str, Any]) -> list[Finding]:
        """A finding when the queue's state is ``empty``."""
        if q["state"] != "empty":
            return []
        how = (f"empty {pct(q['empty_share'])} of the time (its consumer waited in get "
               f"that share of its steady time)" if q.get("weighted") else
               f"empty in {pct(q['empty_share'])} of {q['samples']} samples")
        return [Finding(self.code, Severity.INFO,
                        f"queue {q['name']} is {how}: its consumer is starved by its producer",
                        dict(q))]


class QueueFullRule(ItemRule):
    """``queue_full`` (info): a queue full ``QueuePolicy.time_share`` of
    the steady time (its producers' ``put`` waits, :func:`queue_waits`), else,
    without such waits, in ``QueuePolicy.state_share`` of its steady
    samples: its producer is held by its consumer."""

    code = Code.QUEUE_FULL
    over = "queues"

    def items(self, ctx: RuleContext) -> list[dict[str, Any]]:
        """The queue states, in ``ctx.queues`` order."""
        return ctx.queues

    def evaluate_item(self, ctx: RuleContext, q: dict[str, Any]) -> list[Finding]:
        """A finding when the queue's state is ``full``."""
        if q["state"] != "full":
            return []
        how = (f"full {pct(q['full_share'])} of the time (its producer waited in put "
               f"that share of its steady time)" if q.get("weighted") else
               f"full in {pct(q['full_share'])} of {q['samples']} samples")
        return [Finding(self.code, Severity.INFO,
                        f"queue {q['name']} is {how}: its producer is held by its consumer",
                        dict(q))]
