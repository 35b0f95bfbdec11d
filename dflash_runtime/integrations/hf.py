"""A Hugging Face ``transformers.Trainer`` callback that writes tlog iterations.

::

    from dflash_runtime.integrations.hf import TlogCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[TlogCallback()])     # Recorder.from_env(): TLOG_RUN_DIR
    trainer.train()

One iteration per optimizer step (``on_step_begin`` .. ``on_step_end``; with
``gradient_accumulation_steps=k`` the k micro-batches are summed into it). Phases,
in order (docs/INTEGRATIONS.md):

- ``log`` (compute): the Trainer's logging after the previous step (its loss
  ``.item()``, the ``on_log`` callbacks), when it logged then;
- ``data_fetch`` (starvation): from the previous step's end (or its log,
  evaluation or save) to ``on_step_begin``. The Trainer fetches all k micro-batches
  there (``get_batch_samples``), before the step's first callback;
- ``forward``, ``backward``, ``grad_clip``, ``optimizer_step``, ``zero_grad``
  (compute), summed over the micro-batches: the automatic phases of
  :func:`dflash_runtime.auto.instrument` (root-module forward hooks, the whole
  ``backward()`` call, ``clip_grad_norm_``, the optimizer's step hooks, the
  ``zero_grad`` calls), installed at ``on_train_begin`` and removed at
  ``on_train_end``. The Trainer has no callback between forward and backward.
  When ``instrument`` cannot be used (another instrumentation is active, or
  ``instrument=False``), the callbacks' own pairs give ``forward_backward``
  (``on_step_begin`` .. ``on_pre_optimizer_step``), ``optimizer_step`` (..
  ``on_optimizer_step``) and ``zero_grad`` (.. ``on_step_end``: the scheduler's
  step too).

Evaluation and checkpoint saves between steps are left out of the iterations and
recorded as events ``evaluate`` (from the step's end, or its log, to
``on_evaluate``) and ``checkpoint`` (to ``on_save``). ``samples`` is the sum of the
micro-batches' leading dimension, ``tokens`` the sum of their ``input_ids``
positions (padding included), both read in a forward pre-hook on the model.

Importing this module imports ``transformers``; ``import dflash_runtime`` does not.
"""

from __future__ import annotations

import warnings
from typing import Any

from transformers import TrainerCallback

from ..auto import BACKWARD, FETCH, FORWARD, STEP, ZERO, _batch_size
from ._common import StepClock, _pc, add_count, resolve_recorder, token_count


class TlogCallback(TrainerCallback):
    """Writes one tlog iteration per optimizer step of a ``transformers.Trainer``.

    Args:
        recorder: the :class:`~dflash_runtime.Recorder` to write to; default
            ``Recorder.from_env()`` (``TLOG_RUN_DIR``, ``RANK``...), closed at
            ``on_train_end`` (a recorder passed in is only flushed there).
        instrument: time the model-level phases with
            :func:`dflash_runtime.auto.instrument` (``iterations=False``: its phases
            go into this callback's iterations); ``False``: the callbacks' own
            coarser phases (module docstring).
        syncs: passed to ``instrument``: also catch implicit host-device syncs.

    Never raises into training beyond what the recorder raises (it does not); an
    ``instrument`` that cannot be installed warns (``RuntimeWarning``) and the
    callback falls back to its own phases.
    """

    def __init__(self, recorder: Any = None, *, instrument: bool = True,
                 syncs: bool = False) -> None:
        self.rec, self._owned = resolve_recorder(recorder)
        self._want_inst = instrument
        self._syncs = syncs
        self._inst: Any = None
        self._clock = StepClock(self.rec)
        self._it: Any = None
        self._handles: list = []
        self._t_step = 0.0
        self._in_eval = False
        self._log_span: tuple[float, float] | None = None

    # -- the model ---------------------------------------------------------------------
    def _install(self, model: Any, optimizer: Any) -> None:
        if model is None or not self.rec.enabled:
            return
        try:  # samples and tokens of each micro-batch
            self._handles = [model.register_forward_pre_hook(self._count, with_kwargs=True)]
        except (AttributeError, TypeError):  # not an nn.Module
            return
        if not self._want_inst:
            return
        from ..auto import instrument

        try:
            self._inst = instrument(self.rec, model, optimizer, iterations=False,
                                    syncs=self._syncs)
        except (RuntimeError, TypeError, AttributeError) as exc:
            warnings.warn(f"tlog: TlogCallback: model-level phases not timed ({exc}); "
                          "recording forward_backward instead", RuntimeWarning, stacklevel=2)

    def _count(self, module: Any, args: tuple, kwargs: dict) -> None:
        it = self._it
        if it is not None and module.training:
            add_count(it, "samples", _batch_size(kwargs) or _batch_size(args))
            add_count(it, "tokens", token_count(kwargs))

    # -- Trainer callbacks -------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        """Installs the model hooks; the first step's ``data_fetch`` starts here."""
        self._install(kwargs.get("model"), kwargs.get("optimizer"))
        self._clock.mark = _pc()

    def on_step_begin(self, args, state, control, **kwargs):
        """Begins the step's iteration at the previous step's end (see the module doc)."""
        t = _pc()
        if self._it is not None:  # a step that never ended (should not happen)
            self._clock.end()
        log = self._log_span
        self._log_span = None
        it = self.rec.begin_iteration(start=self._clock.mark)
        if log is not None and log[0] >= self._clock.mark:
            it.add_wait("log", log[0], log[1], None)
            it.add_wait(FETCH, log[1], t, "starvation")
        else:
            it.add_wait(FETCH, self._clock.mark, t, "starvation")
        self._it = it
        self._t_step = t

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """Without ``instrument``: ``forward_backward`` ends, ``optimizer_step`` begins."""
        it = self._it
        if it is not None and self._inst is None:
            it.add_wait(f"{FORWARD}_{BACKWARD}", self._t_step, _pc(), None)
            it.begin(STEP)

    def on_optimizer_step(self, args, state, control, **kwargs):
        """Without ``instrument``: ``optimizer_step`` ends, ``zero_grad`` begins."""
        if self._it is not None and self._inst is None:
            self._it.end(STEP)
            self._it.begin(ZERO)

    def on_step_end(self, args, state, control, **kwargs):
        """Ends the step's iteration."""
        if self._it is not None:
            self._it = None
            self._clock.end()

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The training log after a step becomes the next iteration's ``log`` phase."""
        if self._it is None and not self._in_eval:
            self._log_span = (self._clock.mark, _pc())

    def on_prediction_step(self, args, state, control, **kwargs):
        """An evaluation batch: the evaluation is under way (no iteration is open)."""
        self._in_eval = True

    def on_evaluate(self, args, state, control, **kwargs):
        """Records the evaluation as event ``evaluate``; the next step starts after it."""
        self._excluded("evaluate", state)
        self._in_eval = False

    def on_save(self, args, state, control, **kwargs):
        """Records the save as event ``checkpoint``; the next step starts after it."""
        self._excluded("checkpoint", state)

    def _excluded(self, name: str, state: Any) -> None:
        start = self._log_span[1] if self._log_span is not None else self._clock.mark
        self._log_span = None
        self._clock.excluded(name, start, step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        """Ends a step left open, removes the hooks, flushes (closes an owned recorder)."""
        if self._it is not None:
            self._it = None
            self._clock.end()
        if self._inst is not None:
            self._inst.remove()
            self._inst = None
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._owned:
            self.rec.close()
        else:
            self.rec.flush()
