"""``allocator_thrash``: the caching allocator retries or keeps allocating
during the steady state. docs/DIAGNOSIS.md section 7."""

from __future__ import annotations

from typing import Any

import polars as pl
from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.text import ms


class AllocatorThrashRule(Rule):
    """``allocator_thrash`` (warning): allocation retries (cache flushes), or
    device allocations rising by ``Thresholds.device_alloc_rate`` per
    iteration or more over the second half of a worker's steady state; the
    evidence compares iterations with and without a retry."""

    code = Code.ALLOCATOR_THRASH

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per worker whose allocator thrashes."""
        it = ctx.analysis.steady
        out: list[Finding] = []
        if it.select(pl.col("mem_alloc_retries", "mem_device_allocs").null_count().sum()).row(0) \
                == (it.height, it.height):
            return out  # no allocator figures recorded
        for (stage, rank, worker), g in it.group_by("stage", "rank", "worker", maintain_order=True):
            g = g.sort("iter")
            retries = g["mem_alloc_retries"].drop_nulls()
            allocs = g["mem_device_allocs"].drop_nulls()
            ev: dict[str, Any] = {"stage": stage, "rank": rank, "worker": worker,
                                  "iterations": g.height}
            reasons = []
            if len(retries) >= 2 and retries[-1] > retries[0]:
                d = int(retries[-1] - retries[0])
                ev["alloc_retries"] = d
                reasons.append(f"{d} allocator retries (cache flushes)")
                # Iterations in which the retry count rose, against the others.
                rose = g.with_columns(rose=pl.col("mem_alloc_retries").diff().fill_null(0) > 0)
                slow = rose.filter("rose")["dur"].mean()
                fast = rose.filter(~pl.col("rose"))["dur"].mean()
                if slow is not None and fast is not None:
                    ev["dur_with_retry_s"] = float(slow)
                    ev["dur_without_retry_s"] = float(fast)
            if len(allocs) >= 2:
                half = allocs[len(allocs) // 2:]
                rate = float(half[-1] - half[0]) / max(len(half) - 1, 1)
                if rate >= ctx.thresholds.device_alloc_rate:
                    ev["device_allocs"] = int(allocs[-1] - allocs[0])
                    ev["device_allocs_per_iter"] = rate
                    reasons.append(f"{ev['device_allocs']} new device allocations "
                                   f"({rate:.2f} per iteration in the second half)")
            if reasons:
                msg = f"rank {rank} of {stage}: {' and '.join(reasons)} during steady state"
                if "dur_with_retry_s" in ev:
                    msg += (f"; iterations with a retry take {ms(ev['dur_with_retry_s'])} "
                            f"vs {ms(ev['dur_without_retry_s'])}")
                out.append(Finding(self.code, Severity.WARNING, msg, ev))
        return out
