"""Queue depth samples: their state in the steady window (:func:`queue_states`)
and the ``queue_empty`` / ``queue_full`` findings (info: corroboration for the
verdict). docs/DIAGNOSIS.md section 4."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.rules.base import DEFAULT_THRESHOLDS, ItemRule, RuleContext
from tlog.analyze.text import pct


def queue_states(queues: pl.DataFrame, steady_windows: list[tuple[float, float]],
                 share: float = DEFAULT_THRESHOLDS.queue_state_share) -> list[dict]:
    """Summarise each queue's depth samples within the steady window(s).

    Returns:
        ``{name, samples, mean_depth, capacity, empty_share, full_share,
        state}`` per queue, ``state`` being ``"empty"`` (consumer starved by
        its producer), ``"full"`` (producer held by its consumer) or ``"mixed"``
        (``share`` of the samples: ``Thresholds.queue_state_share``).
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
        state = ("empty" if empty >= share else
                 "full" if full >= share else "mixed")
        out.append({"name": name, "samples": len(depth), "mean_depth": float(depth.mean()),
                    "capacity": capacity, "empty_share": empty, "full_share": full,
                    "state": state})
    return out


class QueueEmptyRule(ItemRule):
    """``queue_empty`` (info): a queue empty in ``Thresholds.queue_state_share``
    of its steady samples: its consumer is starved by its producer."""

    code = Code.QUEUE_EMPTY
    over = "queues"

    def items(self, ctx: RuleContext) -> list[dict[str, Any]]:
        """The queue states, in ``ctx.queues`` order."""
        return ctx.queues

    def evaluate_item(self, ctx: RuleContext, q: dict[str, Any]) -> list[Finding]:
        """A finding when the queue's state is ``empty``."""
        if q["state"] != "empty":
            return []
        return [Finding(self.code, Severity.INFO,
                        f"queue {q['name']} is empty in {pct(q['empty_share'])} of "
                        f"{q['samples']} samples: its consumer is starved by its producer",
                        dict(q))]


class QueueFullRule(ItemRule):
    """``queue_full`` (info): a queue full in ``Thresholds.queue_state_share``
    of its steady samples: its producer is held by its consumer."""

    code = Code.QUEUE_FULL
    over = "queues"

    def items(self, ctx: RuleContext) -> list[dict[str, Any]]:
        """The queue states, in ``ctx.queues`` order."""
        return ctx.queues

    def evaluate_item(self, ctx: RuleContext, q: dict[str, Any]) -> list[Finding]:
        """A finding when the queue's state is ``full``."""
        if q["state"] != "full":
            return []
        return [Finding(self.code, Severity.INFO,
                        f"queue {q['name']} is full in {pct(q['full_share'])} of "
                        f"{q['samples']} samples: its producer is held by its consumer",
                        dict(q))]
