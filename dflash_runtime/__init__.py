"""dflash_runtime: the tlog timing shim, cheap enough to leave on for whole training runs.

Standard library only; torch is used only when a CUDA feature is asked for (a
``stream=`` argument, ``mem`` sampling) and is never imported by the shim itself.

Example::

    from dflash_runtime import Recorder, TimedQueue

    rec = Recorder("runs/exp1", stage="drafter", rank=0, world_size=2)
    hs_queue = TimedQueue(8, name="hs_queue", get_phase="hs_get")
    rec.watch_ddp(model)                        # model: a DDP module; times its all-reduce
    for step in range(steps):
        with rec.iteration(tokens=16384) as it:
            batch = hs_queue.get()              # phase hs_get (starvation)
            it.lap("mask_build")                # time since the get ended
            with it.phase("draft_forward", stream=torch.cuda.current_stream()):
                loss = model(batch)             # host time + CUDA-event device time
            with it.phase("backward"):
                loss.backward()                 # + backward/ddp_allreduce_wait (sync)
    rec.close()

writes ``runs/exp1/rank0.drafter.jsonl``: a ``meta`` line, then one ``iter`` line per
iteration (docs/FORMAT.md). See docs/RUNTIME.md for the guarantees and measured costs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .format import FORMAT_VERSION, PHASE_KINDS, Kind, RecordType
from .lazy import lazy_exports

if TYPE_CHECKING:
    from .collectives import watch_ddp
    from .p2p import watch_p2p
    from .queues import TimedQueue, TimedQueueProxy, timed
    from .recorder import NULL_ITERATION, Iteration, Recorder, current_iteration

#: Public name -> the module that defines it, imported on first use: ingest and
#: analysis import only :mod:`dflash_runtime.format` (the log format), which
#: then costs ~5 ms instead of ~45 ms for the whole shim (writer, recorder).
_LAZY = {"watch_ddp": "collectives", "watch_p2p": "p2p", "TimedQueue": "queues", "TimedQueueProxy": "queues",
         "timed": "queues", "NULL_ITERATION": "recorder", "Iteration": "recorder",
         "Recorder": "recorder", "current_iteration": "recorder"}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "FORMAT_VERSION",
    "NULL_ITERATION",
    "PHASE_KINDS",
    "Iteration",
    "Kind",
    "RecordType",
    "Recorder",
    "TimedQueue",
    "TimedQueueProxy",
    "current_iteration",
    "timed",
    "watch_ddp",
    "watch_p2p",
]
