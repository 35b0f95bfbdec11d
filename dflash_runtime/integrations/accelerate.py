"""tlog iterations for a Hugging Face Accelerate training loop.

Accelerate has no callbacks; wrap the loop's data loader instead::

    from dflash_runtime.integrations.accelerate import track

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in track(loader, accelerator, optimizer):       # Recorder.from_env()
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

One iteration per optimizer step: Accelerate's own ``accelerator.sync_gradients``
(set by ``accumulate()``: true on the micro-batch whose ``optimizer.step()`` really
steps) ends it when the next batch is asked for, so the micro-batches of a
gradient accumulation are summed into it. Phases, in order (docs/INTEGRATIONS.md):

- ``data`` (starvation): the loader's ``next`` (Accelerate's loader also moves the
  batch to the device there);
- ``forward`` (compute): from the batch's hand-off to ``accelerator.backward``;
- ``backward`` (compute): ``accelerator.backward(loss)``;
- ``clip_grad`` (compute): ``accelerator.clip_grad_norm_`` / ``clip_grad_value_``;
- ``optimizer`` / ``zero_grad`` (compute): ``optimizer.step()`` /
  ``optimizer.zero_grad()`` of the optimizer passed, on the micro-batch that steps
  (on the others Accelerate's wrappers do nothing).

What else the loop body does (a scheduler step, logging) is the iteration's
unaccounted time. Wrap an evaluation inside the loop in ``with
tracker.outside("evaluate"):`` to leave it out (an event). ``track`` patches
``accelerator.backward``/``clip_grad_*`` and the optimizer's ``step``/``zero_grad``
on those objects only (instance attributes) while the loop runs, and restores them
when it ends (or the loop is left early).

Importing this module imports nothing of Accelerate: it only calls the objects given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._common import StepClock, _pc, add_count, leading_dim, resolve_recorder, token_count

_MISSING = object()


class Tracker:
    """An iterable over ``loader``'s batches that records one iteration per optimizer step.

    Made by :func:`track` (see the module docstring). Iterate it once. Attributes:
    ``rec`` (the recorder). Never raises into training beyond what the loader, the
    accelerator or the optimizer raise (passed on unchanged).
    """

    def __init__(self, loader: Any, accelerator: Any, optimizer: Any = None,
                 recorder: Any = None) -> None:
        self.loader = loader
        self.accelerator = accelerator
        self.optimizer = optimizer
        self.rec, self._owned = resolve_recorder(recorder)
        self._clock = StepClock(self.rec)
        self._it: Any = None
        self._open: str | None = None
        self._saved: list[tuple[Any, str, Any]] = []

    # -- phases ------------------------------------------------------------------------
    def _switch(self, name: str | None) -> None:
        it = self._it
        if self._open is not None:
            it.end(self._open)
        if name is not None:
            it.begin(name)
        self._open = name

    def _timed(self, name: str, fn: Any, only_when_stepping: bool) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._it is None or (only_when_stepping and not self.accelerator.sync_gradients):
                return fn(*args, **kwargs)
            self._switch(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self._switch(None)

        return call

    def _patch(self, obj: Any, attr: str, name: str, only_when_stepping: bool) -> None:
        fn = getattr(obj, attr, None)
        if obj is None or fn is None:
            return
        self._saved.append((obj, attr, obj.__dict__.get(attr, _MISSING)))
        setattr(obj, attr, self._timed(name, fn, only_when_stepping))

    def _install(self) -> None:
        acc = self.accelerator
        self._patch(acc, "backward", "backward", False)
        self._patch(acc, "clip_grad_norm_", "clip_grad", False)
        self._patch(acc, "clip_grad_value_", "clip_grad", False)
        self._patch(self.optimizer, "step", "optimizer", True)
        self._patch(self.optimizer, "zero_grad", "zero_grad", True)

    def _uninstall(self) -> None:
        for obj, attr, old in reversed(self._saved):
            if old is _MISSING:
                obj.__dict__.pop(attr, None)
            else:
                setattr(obj, attr, old)
        self._saved = []

    def _end_body(self, last: bool = False) -> None:
        """The loop body of a batch ended: end its open phase, and the iteration if it stepped."""
        if self._it is None:
            return
        self._switch(None)
        if last or self.accelerator.sync_gradients:
            self._it = None
            self._clock.end()

    # -- the loop ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self._install()
        try:
            batches = iter(self.loader)
            while True:
                self._end_body()
                t0 = _pc()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                t1 = _pc()
                it = self._it
                if it is None:
                    self._clock.mark = t0
                    it = self._it = self._clock.begin(t1)
                else:
                    it.add_wait("data", t0, t1, "starvation")
                add_count(it, "samples", leading_dim(batch))
                add_count(it, "tokens", token_count(batch))
                self._switch("forward")
                yield batch
        finally:
            self._end_body(last=True)
            self._uninstall()
            if self._owned:
                self.rec.close()
            else:
                self.rec.flush()

    @contextmanager
    def outside(self, name: str = "evaluate", **fields: Any) -> Iterator[None]:
        """Leave the block out of the iterations: it becomes event ``name`` (with ``fields``).

        Used inside the loop body after the optimizer step (an evaluation every N
        steps): the step's iteration ends where the block begins. Used in the middle
        of a gradient accumulation, the open iteration overlaps the event (the
        analysis then leaves it out of steady-state figures).
        """
        if self._it is not None and self.accelerator.sync_gradients:
            self._end_body()
        t0 = _pc()
        try:
            yield
        finally:
            self.rec.add_event(name, t0, _pc(), **fields)


def track(loader: Any, accelerator: Any, optimizer: Any = None, *,
          recorder: Any = None) -> Tracker:
    """Iterate ``loader`` recording one tlog iteration per optimizer step.

    Args:
        loader: the (prepared) data loader, or any iterable of batches.
        accelerator: the ``accelerate.Accelerator`` (its ``sync_gradients`` ends the
            iterations; its ``backward`` and ``clip_grad_*`` are timed).
        optimizer: the prepared optimizer whose ``step``/``zero_grad`` are timed
            (``None``: no ``optimizer``/``zero_grad`` phases).
        recorder: the :class:`~dflash_runtime.Recorder`; default
            ``Recorder.from_env()``, closed when the loop ends (one passed in is
            flushed).

    Returns a :class:`Tracker`; iterate it in place of ``loader``.
    """
    return Tracker(loader, accelerator, optimizer, recorder)
