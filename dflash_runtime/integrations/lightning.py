"""A PyTorch Lightning callback that writes tlog iterations for ``Trainer.fit``.

::

    from dflash_runtime.integrations.lightning import TlogCallback

    trainer = lightning.Trainer(max_epochs=3, callbacks=[TlogCallback()])  # TLOG_RUN_DIR
    trainer.fit(module, train_loader, val_loader)

One iteration per optimizer step: with ``accumulate_grad_batches=k`` the k training
batches are summed into it (the iteration ends at the ``on_train_batch_end`` of the
batch during which ``on_before_optimizer_step`` ran). Phases, in order, from
Lightning's own hook pairs (docs/INTEGRATIONS.md):

- ``data_fetch`` (starvation): the training loader's fetches that ran between the
  previous batch's end (or the end of a validation) and ``on_train_batch_start``:
  each ``next`` of Lightning's data fetcher on the loader's iterator, timed by
  wrapping the trainer's profiler (``trainer.profiler.start``/``stop`` with action
  ``[_TrainingEpochLoop].train_dataloader_next``, which Lightning calls around exactly
  that ``next``), plus, at an epoch's start, ``on_train_epoch_start`` .. the first
  fetch (the loader's ``iter()``: a DataLoader starts its workers there);
- ``lightning_loop`` (compute): the rest of that gap: Lightning's own per-batch
  work (``batch_to_device``, logging, progress, other callbacks' batch-end hooks,
  epoch-end hooks such as a checkpoint save);
- ``forward`` (compute): ``on_train_batch_start`` .. ``on_before_zero_grad`` /
  ``on_before_backward``: ``training_step``;
- ``zero_grad`` (compute): ``on_before_zero_grad`` .. ``on_before_backward`` (the
  first batch of an accumulation only: Lightning zeroes after its forward);
- ``backward`` (compute): ``on_before_backward`` .. ``on_after_backward``;
- ``optimizer_step`` (compute): ``on_before_optimizer_step`` ..
  ``on_train_batch_end``: gradient clipping, the optimizer's step and the
  step-interval schedulers.

The names are those of :mod:`dflash_runtime.auto` (``instrument``), plus
``lightning_loop``. Lightning gives a hook pair for each compute phase; the fetch is
timed through the trainer's profiler, whose ``start``/``stop`` are wrapped on the
instance from ``on_train_start`` and put back at ``on_train_end``/``teardown``/
``on_exception``. Lightning's fetcher may look one batch ahead (a loader without
``len``): the fetch timed in a gap is then that of the next batch, which is what the
loop waited on there. If no training fetch was ever seen through the profiler (a
Lightning that calls it differently), the whole gap is ``data_fetch`` as before.

Validation inside ``fit`` (``on_validation_start`` .. ``on_validation_end``) is left
out of the iterations and recorded as event ``validation`` (``sanity_check: true``
for the sanity check before training). ``samples`` is the sum of the batches'
leading dimension (the first tensor in the batch: ``auto``'s count).

Importing this module imports ``lightning.pytorch`` (else ``pytorch_lightning``);
``import dflash_runtime`` does not.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    from pytorch_lightning.callbacks import Callback

from ..auto import BACKWARD, FETCH, FORWARD, STEP, ZERO, _batch_size
from ._common import StepClock, _pc, add_count

#: The phase of Lightning's own work between batches (module docstring).
LOOP = "lightning_loop"
#: Suffix of the profiler action Lightning's training epoch loop starts and stops
#: around each ``next`` of its data fetcher (lightning 2.x ``_TrainingEpochLoop``).
FETCH_ACTION = ".train_dataloader_next"


class TlogCallback(Callback):
    """Writes one tlog iteration per optimizer step of a Lightning ``Trainer.fit``.

    Args:
        recorder: the :class:`~dflash_runtime.Recorder` to write to; default
            ``Recorder.from_env()`` (``TLOG_RUN_DIR``...) made at ``setup`` with the
            trainer's rank and world size, closed at ``on_train_end`` (a recorder
            passed in is only flushed there).

    A batch that raised ends its iteration with the exception's name as ``error``
    (``on_exception``). Never raises into training.
    """

    def __init__(self, recorder: Any = None) -> None:
        self.rec = recorder
        self._owned = recorder is None
        self._clock: Any = None if recorder is None else StepClock(recorder)
        self._it: Any = None
        self._open: str | None = None  # the phase begun by a hook and not yet ended
        self._free = 0.0  # perf_counter at the previous batch's end (data starts there)
        self._stepped = False
        self._val0: float | None = None
        self._fetches: list[tuple[float, float]] = []  # timed fetches since the last batch
        self._f0: float | None = None  # start of the fetch in progress
        self._iter0: float | None = None  # on_train_epoch_start (the loader's iter() follows)
        self._seen = False  # a training fetch was timed through the profiler
        self._prof: Any = None  # the profiler whose start/stop are wrapped
        self._prof_saved: dict[str, Any] = {}

    def _wrap_profiler(self, trainer) -> None:
        """Wrap ``trainer.profiler.start``/``stop`` on the instance to time the fetches."""
        prof = getattr(trainer, "profiler", None)
        if prof is None or self._prof is not None:
            return
        start, stop = prof.start, prof.stop
        d = getattr(prof, "__dict__", None)
        if d is None:
            return
        self._prof_saved = {k: d[k] for k in ("start", "stop") if k in d}

        def timed_start(action_name: str, *a: Any, **k: Any) -> Any:
            out = start(action_name, *a, **k)
            if isinstance(action_name, str) and action_name.endswith(FETCH_ACTION):
                t = _pc()
                self._f0 = t if self._iter0 is None else self._iter0
                self._iter0 = None
            return out

        def timed_stop(action_name: str, *a: Any, **k: Any) -> Any:
            if self._f0 is not None and isinstance(action_name, str) \
                    and action_name.endswith(FETCH_ACTION):
                self._fetches.append((self._f0, _pc()))
                self._f0 = None
                self._seen = True
            return stop(action_name, *a, **k)

        prof.start, prof.stop = timed_start, timed_stop
        self._prof = prof

    def _unwrap_profiler(self) -> None:
        """Put the profiler's ``start``/``stop`` back as they were."""
        prof, self._prof = self._prof, None
        if prof is None:
            return
        for k in ("start", "stop"):
            if k in self._prof_saved:
                setattr(prof, k, self._prof_saved[k])
            else:
                prof.__dict__.pop(k, None)
        self._prof_saved = {}

    def _gap(self, t0: float, t1: float) -> None:
        """Record the gap ``[t0, t1]`` before a batch: the timed fetches in it as
        ``data_fetch``, the rest as ``lightning_loop`` (the whole gap as ``data_fetch``
        when no fetch was ever timed)."""
        it, fetches = self._it, self._fetches
        self._fetches = []
        if not self._seen:
            it.add_wait(FETCH, t0, t1, "starvation")
            return
        t = t0
        for a, b in fetches:
            a, b = max(a, t), min(b, t1)
            if b <= a:
                continue
            if a > t:
                it.add_wait(LOOP, t, a, "compute")
            it.add_wait(FETCH, a, b, "starvation")
            t = b
        if t1 > t:
            it.add_wait(LOOP, t, t1, "compute")

    def _switch(self, name: str | None) -> None:
        """End the phase a hook began (if any) and begin ``name`` (if given)."""
        it = self._it
        if self._open is not None:
            it.end(self._open)
        if name is not None:
            it.begin(name)
        self._open = name

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Makes the recorder when none was given: ``Recorder.from_env()`` with the
        trainer's ``global_rank`` and ``world_size`` (Lightning's own launcher sets no
        ``RANK`` for the processes it starts)."""
        if self.rec is None:
            from dflash_runtime.recorder import Recorder

            self.rec = Recorder.from_env(rank=trainer.global_rank,
                                         world_size=trainer.world_size)
            self._clock = StepClock(self.rec)

    def on_train_start(self, trainer, pl_module) -> None:
        """The first step's gap starts here; the profiler is wrapped to time fetches."""
        self._wrap_profiler(trainer)
        self._fetches = []
        self._clock.mark = self._free = _pc()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        """The loader's ``iter()`` for the epoch follows: it counts with the first fetch."""
        self._iter0 = _pc()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """Begins the step's iteration (first batch) or its next batch's ``data_fetch``."""
        t = _pc()
        if self._it is None:
            self._it = self.rec.begin_iteration(start=self._clock.mark)
            self._stepped = False
            self._gap(self._clock.mark, t)
        else:  # a later batch of a gradient accumulation
            self._switch(None)
            self._gap(self._free, t)
        add_count(self._it, "samples", _batch_size(batch))
        self._switch(FORWARD)

    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None:
        """``forward`` ends; ``zero_grad`` begins."""
        if self._it is not None:
            self._switch(ZERO)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        """``forward`` (or ``zero_grad``) ends; ``backward`` begins."""
        if self._it is not None:
            self._switch(BACKWARD)

    def on_after_backward(self, trainer, pl_module) -> None:
        """``backward`` ends."""
        if self._it is not None and self._open == BACKWARD:
            self._switch(None)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        """``optimizer_step`` begins; this batch ends the iteration."""
        if self._it is not None:
            self._switch(STEP)
            self._stepped = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Ends the iteration after an optimizer step; else the next ``data_fetch`` starts."""
        if self._it is None:
            return
        self._switch(None)
        if self._stepped:
            self._it = None
            self._clock.end()
        self._free = _pc()

    def on_validation_start(self, trainer, pl_module) -> None:
        """A validation begins (left out of the iterations)."""
        self._val0 = _pc()

    def on_validation_end(self, trainer, pl_module) -> None:
        """Records the validation as event ``validation``; the next ``data_fetch`` starts now."""
        if self._val0 is None:
            return
        fields = {"step": trainer.global_step}
        if trainer.sanity_checking:
            fields["sanity_check"] = True
        self._free = self._clock.excluded("validation", self._val0, **fields)
        self._val0 = None

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Ends an open iteration with the exception's class name as ``error``."""
        self._unwrap_profiler()
        if self._it is not None:
            self._it = None
            self._open = None
            self.rec.end_iteration(exception)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """Puts the profiler's ``start``/``stop`` back (if ``on_train_end`` did not)."""
        self._unwrap_profiler()

    def on_train_end(self, trainer, pl_module) -> None:
        """Ends a step left open (none normally); flushes (closes an owned recorder);
        puts the profiler's ``start``/``stop`` back."""
        self._unwrap_profiler()
        if self._it is not None:
            self._switch(None)
            self._it = None
            self._clock.end()
        if self._owned:
            self.rec.close()
        else:
            self.rec.flush()
