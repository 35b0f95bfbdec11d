"""What the framework integrations share: the recorder, batch sizes, the step clock.

No framework (and not torch) is imported here.
"""

from __future__ import annotations

import time
from typing import Any

_pc = time.perf_counter


def resolve_recorder(recorder: Any) -> tuple[Any, bool]:
    """``(recorder, owned)``: the given recorder, else ``Recorder.from_env()`` (owned).

    An owned recorder is closed by the integration when training ends; one passed in
    is only flushed (the caller closes it).
    """
    if recorder is not None:
        return recorder, False
    from dflash_runtime.recorder import Recorder

    return Recorder.from_env(), True


def token_count(obj: Any) -> int | None:
    """Positions in a batch's ``input_ids`` (``numel()``, padding included), or ``None``.

    Hugging Face's own ``num_input_tokens_seen`` counts the same way by default
    (``include_num_input_tokens_seen="all"``). ``obj``: a mapping with ``input_ids``.
    """
    if isinstance(obj, dict):
        ids = obj.get("input_ids")
        numel = getattr(ids, "numel", None)
        if numel is not None:
            return int(numel())
    return None


class StepClock:
    """Where the next training iteration starts, and the spans left out of iterations.

    A framework calls its callbacks after the batch was fetched, so the iteration of an
    optimizer step is begun late with ``start`` at the previous step's end (or the end
    of an evaluation or save between them): the fetch before the first callback is
    recorded as phase ``data_fetch``. ``mark`` is that ``time.perf_counter()`` reading.
    """

    __slots__ = ("mark", "rec")

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.mark = _pc()

    def excluded(self, name: str, start: float | None = None, **fields: Any) -> float:
        """Record ``[start (default: mark), now]`` as event ``name``; the next step starts now.

        Returns now (``perf_counter`` seconds).
        """
        t = _pc()
        self.rec.add_event(name, self.mark if start is None else start, t, **fields)
        self.mark = t
        return t

    def begin(self, data_until: float | None = None, samples: int | None = None,
              tokens: int | None = None) -> Any:
        """Begin the iteration at ``mark``; ``[mark, data_until (default now)]`` is ``data_fetch``.

        Returns the iteration (``rec.begin_iteration``'s, a no-op one when disabled).
        """
        from ..auto import FETCH

        t = _pc() if data_until is None else data_until
        it = self.rec.begin_iteration(tokens=tokens, samples=samples, start=self.mark)
        it.add_wait(FETCH, self.mark, t, "starvation")
        return it

    def end(self, error: Any = None) -> None:
        """End the open iteration; the next one starts now."""
        self.rec.end_iteration(error)
        self.mark = _pc()


def add_count(it: Any, field: str, n: int | None) -> None:
    """Add ``n`` to ``it.samples`` or ``it.tokens`` (``field``); ``None`` leaves it."""
    if n is None:
        return
    cur = getattr(it, field, None)
    setattr(it, field, n if cur is None else cur + n)
