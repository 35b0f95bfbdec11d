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
- ``data`` (starvation): from the previous step's end (or its log, evaluation or
  save) to ``on_step_begin``. The Trainer fetches all k micro-batches there
  (``get_batch_samples``), before the step's first callback;
- ``forward`` / ``backward`` (compute), summed over the micro-batches: from the root
  module's forward hooks (the Trainer has no callback between forward and
  backward). ``backward`` runs from the forward's end to the micro-batch's end
  (``on_substep_end``), or for the last micro-batch to ``on_pre_optimizer_step``: it
  holds the loss bookkeeping and gradient clipping too. Without forward hooks (a
  model that cannot take them) the two are one phase ``forward_backward``;
- ``optimizer`` (compute): ``on_pre_optimizer_step`` .. ``on_optimizer_step``;
- ``zero_grad`` (compute): ``on_optimizer_step`` .. ``on_step_end``: the learning
  rate scheduler's step and ``model.zero_grad()``.

Evaluation and checkpoint saves between steps are left out of the iterations and
recorded as events ``evaluate`` (from the step's end, or its log, to
``on_evaluate``) and ``checkpoint`` (to ``on_save``). ``samples`` is the sum of the
micro-batches' leading dimension, ``tokens`` the sum of their ``input_ids``
positions (padding included), both read in the forward hook.

Importing this module imports ``transformers``; ``import dflash_runtime`` does not.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ._common import StepClock, _pc, add_count, leading_dim, resolve_recorder, token_count


class TlogCallback(TrainerCallback):
    """Writes one tlog iteration per optimizer step of a ``transformers.Trainer``.

    Args:
        recorder: the :class:`~dflash_runtime.Recorder` to write to; default
            ``Recorder.from_env()`` (``TLOG_RUN_DIR``, ``RANK``...), closed at
            ``on_train_end`` (a recorder passed in is only flushed there).
        model_hooks: time ``forward`` and ``backward`` apart with forward hooks on the
            root module (registered at ``on_train_begin``, removed at
            ``on_train_end``); ``False``: one phase ``forward_backward``.

    Never raises into training beyond what the recorder raises (it does not).
    """

    def __init__(self, recorder: Any = None, *, model_hooks: bool = True) -> None:
        self.rec, self._owned = resolve_recorder(recorder)
        self._model_hooks = model_hooks
        self._clock = StepClock(self.rec)
        self._it: Any = None
        self._handles: list = []
        self._t_step = 0.0
        self._fw_open = False
        self._bw_open = False
        self._fw_seen = False
        self._in_eval = False
        self._log_span: tuple[float, float] | None = None

    # -- model hooks -------------------------------------------------------------------
    def _install(self, model: Any) -> None:
        if not self._model_hooks or model is None or self._handles:
            return
        try:
            self._handles = [
                model.register_forward_pre_hook(self._pre_forward, with_kwargs=True),
                model.register_forward_hook(self._post_forward, always_call=True),
            ]
        except (AttributeError, TypeError):  # not an nn.Module: one forward_backward phase
            self._handles = []

    def _pre_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        it = self._it
        if it is None or self._fw_open:  # not in a training step, or a nested call
            return
        if self._bw_open:
            it.end("backward")
            self._bw_open = False
        it.begin("forward")
        self._fw_open = self._fw_seen = True
        add_count(it, "samples", leading_dim(kwargs) or leading_dim(args))
        add_count(it, "tokens", token_count(kwargs))

    def _post_forward(self, module: Any, args: tuple, output: Any) -> None:
        if self._it is None or not self._fw_open:
            return
        self._it.end("forward")
        self._fw_open = False
        self._it.begin("backward")
        self._bw_open = True

    def _end_backward(self) -> None:
        if self._bw_open:
            self._it.end("backward")
            self._bw_open = False

    # -- Trainer callbacks -------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        """Installs the forward hooks; the first step's ``data`` starts here."""
        self._install(kwargs.get("model"))
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
            it.add_wait("data", log[1], t, "starvation")
        else:
            it.add_wait("data", self._clock.mark, t, "starvation")
        self._it = it
        self._t_step = t
        self._fw_seen = self._fw_open = self._bw_open = False

    def on_substep_end(self, args, state, control, **kwargs):
        """A micro-batch without an optimizer step ended: its backward ends here."""
        if self._it is not None:
            self._end_backward()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """The last micro-batch's backward (and clipping) ends; ``optimizer`` begins."""
        it = self._it
        if it is None:
            return
        self._end_backward()
        if not self._fw_seen:
            it.add_wait("forward_backward", self._t_step, _pc(), None)
        it.begin("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        """``optimizer`` ends; ``zero_grad`` (scheduler step, ``zero_grad()``) begins."""
        if self._it is not None:
            self._it.end("optimizer")
            self._it.begin("zero_grad")

    def on_step_end(self, args, state, control, **kwargs):
        """Ends the step's iteration."""
        if self._it is not None:
            self._it = None
            self._fw_open = self._bw_open = False
            self._clock.end()

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The training log after a step becomes the next iteration's ``log`` phase."""
        if self._it is None and not self._in_eval:
            t = _pc()
            self._log_span = (self._clock.mark, t)

    def on_prediction_step(self, args, state, control, **kwargs):
        """An evaluation batch: the evaluation is under way (no iteration is open)."""
        self._in_eval = True

    def on_evaluate(self, args, state, control, **kwargs):
        """Records the evaluation as event ``evaluate``; the next step starts after it."""
        start = self._log_span[1] if self._log_span is not None else self._clock.mark
        self._log_span = None
        self._in_eval = False
        self._clock.excluded("evaluate", start, step=state.global_step)

    def on_save(self, args, state, control, **kwargs):
        """Records the save as event ``checkpoint``; the next step starts after it."""
        start = self._log_span[1] if self._log_span is not None else self._clock.mark
        self._log_span = None
        self._clock.excluded("checkpoint", start, step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        """Ends a step left open, removes the hooks, flushes (closes an owned recorder)."""
        if self._it is not None:
            self._it = None
            self._clock.end()
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._owned:
            self.rec.close()
        else:
            self.rec.flush()
