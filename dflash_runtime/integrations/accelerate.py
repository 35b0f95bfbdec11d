"""tlog iterations for a Hugging Face Accelerate training loop.

Accelerate has no callbacks; wrap the loop's data loader instead::

    from dflash_runtime.integrations.accelerate import track

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in track(loader, accelerator, model, optimizer):   # Recorder.from_env()
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

One iteration per optimizer step: Accelerate's own ``accelerator.sync_gradients``
(set by ``accumulate()``: true on the micro-batch whose ``optimizer.step()`` really
steps) ends it when the next batch is asked for, so the micro-batches of a
gradient accumulation are summed into it. Phases (docs/INTEGRATIONS.md):

- ``data_fetch`` (starvation): the loader's ``next`` (Accelerate's loader also
  moves the batch to the device there);
- ``forward``, ``backward``, ``grad_clip``, ``optimizer_step``, ``zero_grad``
  (compute): the automatic phases of :func:`dflash_runtime.auto.instrument`
  (``iterations=False``) on the model and optimizer given, installed while the loop
  runs: the root module's forward hooks, the whole ``backward()`` call (under
  ``accelerator.backward``), ``clip_grad_norm_`` (under
  ``accelerator.clip_grad_norm_``), the step hooks of the torch optimizer inside
  Accelerate's wrapper (only the micro-batch that steps has ``optimizer_step``),
  ``zero_grad``.

What else the loop body does (a scheduler step, logging) is the iteration's
unaccounted time. Wrap an evaluation inside the loop in ``with
tracker.outside("evaluate"):`` to leave it out (an event). Everything ``instrument``
hooked is restored when the loop ends or is left early.

Importing this module imports nothing of Accelerate: it only calls the objects given.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..auto import FETCH, _batch_size
from ._common import StepClock, _pc, add_count, resolve_recorder, token_count


class Tracker:
    """An iterable over ``loader``'s batches that records one iteration per optimizer step.

    Made by :func:`track` (see the module docstring). Iterate it once. Attributes:
    ``rec`` (the recorder). Never raises into training beyond what the loader, the
    accelerator or the optimizer raise (passed on unchanged); an ``instrument`` that
    cannot be installed warns (``RuntimeWarning``) and only ``data_fetch`` is timed.
    """

    def __init__(self, loader: Any, accelerator: Any, model: Any = None, optimizer: Any = None,
                 recorder: Any = None, syncs: bool = False) -> None:
        self.loader = loader
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.syncs = syncs
        self.rec, self._owned = resolve_recorder(recorder)
        self._clock = StepClock(self.rec)
        self._it: Any = None

    def _instrument(self) -> Any:
        if not self.rec.enabled or (self.model is None and self.optimizer is None):
            return None
        from ..auto import instrument

        try:
            return instrument(self.rec, self.model, self.optimizer, iterations=False,
                              syncs=self.syncs)
        except (RuntimeError, TypeError, AttributeError) as exc:
            warnings.warn(f"tlog: track: model-level phases not timed ({exc})",
                          RuntimeWarning, stacklevel=3)
            return None

    def _end_body(self, last: bool = False) -> None:
        """A batch's loop body ended: end the iteration if its optimizer stepped."""
        if self._it is not None and (last or self.accelerator.sync_gradients):
            self._it = None
            self._clock.end()

    def __iter__(self) -> Iterator[Any]:
        inst = self._instrument()
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
                    it.add_wait(FETCH, t0, t1, "starvation")
                add_count(it, "samples", _batch_size(batch))
                add_count(it, "tokens", token_count(batch))
                yield batch
        finally:
            self._end_body(last=True)
            if inst is not None:
                inst.remove()
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
        self._end_body()
        t0 = _pc()
        try:
            yield
        finally:
            self.rec.add_event(name, t0, _pc(), **fields)


def track(loader: Any, accelerator: Any, model: Any = None, optimizer: Any = None, *,
          recorder: Any = None, syncs: bool = False) -> Tracker:
    """Iterate ``loader`` recording one tlog iteration per optimizer step.

    Args:
        loader: the (prepared) data loader, or any iterable of batches.
        accelerator: the ``accelerate.Accelerator`` (its ``sync_gradients`` ends the
            iterations).
        model: the prepared model (its forward is timed; ``None``: no ``forward``).
        optimizer: the prepared optimizer (its step and ``zero_grad`` are timed).
        recorder: the :class:`~dflash_runtime.Recorder`; default
            ``Recorder.from_env()``, closed when the loop ends (one passed in is
            flushed).
        syncs: passed to ``instrument``: also catch implicit host-device syncs.

    Returns a :class:`Tracker`; iterate it in place of ``loader``.
    """
    return Tracker(loader, accelerator, model, optimizer, recorder, syncs)
