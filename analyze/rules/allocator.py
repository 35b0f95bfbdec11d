"""``allocator_thrash``: the caching allocator retries or keeps allocating
during the steady state. docs/DIAGNOSIS.md section 7."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl
from tlog.analyze.findings import Code, Finding, Severity, merge_ranks
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.statistics import block_medians, kendall_trend
from tlog.analyze.text import ms

if TYPE_CHECKING:
    from tlog.analyze.rules.drift import DriftPolicy


@dataclass(frozen=True)
class AllocatorPolicy:
    """The limits of the ``allocator_thrash`` finding (the trend test of kept
    memory is ``DriftPolicy``'s)."""

    #: Device allocations (``mem.device_allocs``) per steady iteration that mean
    #: the caching allocator is not reusing its blocks. Source: PyTorch's CUDA
    #: caching allocator reuses cached blocks once shapes repeat, so a steady
    #: loop allocates ~0 new segments; one per 100 iterations is already a leak
    #: or a shape churn.
    device_alloc_rate: float = 0.01


def _holds_what_it_allocates(g: pl.DataFrame, trend: DriftPolicy) -> bool:
    """Whether a worker's allocated device memory rises with its allocations over
    the second half of its steady iterations ``g`` (sorted by ``iter``): the
    block medians of ``mem_allocated`` (``trend.blocks`` of them) ordered
    upwards with Kendall's tau at least ``trend.consistent``. New allocations
    that are kept are growth (a leak: ``memory_growth``), not an allocator
    that frees and allocates again."""
    held = g["mem_allocated"].drop_nulls()
    held = held[len(held) // 2:].cast(pl.Float64).to_numpy()
    if len(held) < 3 or held[-1] <= held[0]:
        return False
    tau, _ = kendall_trend(block_medians(held, trend.blocks))
    return tau >= trend.consistent


class AllocatorThrashRule(Rule):
    """``allocator_thrash`` (warning): allocation retries (cache flushes), or
    device allocations rising by ``AllocatorPolicy.device_alloc_rate`` per
    iteration or more over the second half of a worker's steady state while
    the memory they give is not kept: without retries, allocations that come
    with steadily rising allocated memory are a leak's growth
    (``memory_growth``), not thrash. The evidence compares iterations with and
    without a retry. Several ranks of a stage are one finding listing them."""

    code = Code.ALLOCATOR_THRASH

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per stage whose workers' allocators thrash."""
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
                # per iteration, not per reading: ``mem`` comes every ``mem_every`` iterations
                read = g.filter(pl.col("mem_device_allocs").is_not_null())
                half, at = allocs[len(allocs) // 2:], read["iter"][len(allocs) // 2:]
                rate = float(half[-1] - half[0]) / max(int(at[-1] - at[0]), 1)
                if rate >= ctx.policies.allocator.device_alloc_rate and not (
                        not reasons and _holds_what_it_allocates(g, ctx.policies.drift)):
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
        return merge_ranks(out)
