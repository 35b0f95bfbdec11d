"""What the bottleneck stage's loss is put down to: which family's finding
carries the verdict's headline (docs/DIAGNOSIS.md section 8).

The bottleneck (``analyze.pipeline.find_bottleneck``) names a stage and a
category; its cause is, in this order:

1. ``pipeline_parallel``: the stage runs as a pipeline-parallel schedule
   (``analyze.pp``): its limiting rank (``pipeline_bubble``);
2. ``straggler``: a straggler of the stage whose fix is worth most
   (:func:`analyze.rules.stragglers.leading_straggler`): the stage's category
   (often sync, the peers' wait for it) is its symptom;
3. ``cpu_contention``: a worker of the stage waited for a core at least as
   long as the stage's largest wait (``analyze.rules.machine.contention``'s
   ``leads``);
4. ``category``: the category's own finding (``starvation``,
   ``backpressure``, ``sync_bound``, ``unaccounted``, ``compute_bound``).

Source: tlog's choice (the verdict follows the gain; a symptom never leads
its cause). The finding of the cause gets the headline and its gain; the
others of the bottleneck stage keep their severity and lose neither figure
nor line, only the lead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tlog.analyze.stragglers import Straggler

if TYPE_CHECKING:
    from tlog.analyze.rules.base import RuleContext


@dataclass(frozen=True)
class Cause:
    """The bottleneck's cause.

    Attributes:
        kind: ``"pipeline_parallel"``, ``"straggler"``, ``"cpu_contention"`` or
            ``"category"`` (module docstring).
        stage: the bottleneck stage.
        straggler: the leading straggler (``kind`` ``"straggler"``), else None.
    """

    kind: str
    stage: str
    straggler: Straggler | None = None


def bottleneck_cause(ctx: RuleContext) -> Cause | None:
    """The cause of ``ctx.bottleneck`` (module docstring), or None without one."""
    bn = ctx.bottleneck
    if bn is None:
        return None
    if any(p.stage == bn.stage for p in ctx.pipeline_parallel):
        return Cause("pipeline_parallel", bn.stage)
    from tlog.analyze.rules.machine import contention
    from tlog.analyze.rules.stragglers import leading_straggler

    lead = leading_straggler(ctx)
    if lead is not None:
        return Cause("straggler", bn.stage, lead)
    if any(c["leads"] for c in contention(ctx)):
        return Cause("cpu_contention", bn.stage)
    return Cause("category", bn.stage)
