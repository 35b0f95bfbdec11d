"""Framework integrations: tlog phases from a training framework's own hooks.

Each submodule imports its framework when it is imported, never before; ``import
dflash_runtime`` (and this package) needs only the standard library:

- :mod:`dflash_runtime.integrations.hf`: ``TlogCallback``, a Hugging Face
  ``transformers.TrainerCallback``.
- :mod:`dflash_runtime.integrations.lightning`: ``TlogCallback``, a PyTorch
  Lightning ``Callback`` for ``Trainer.fit``.
- :mod:`dflash_runtime.integrations.accelerate`: ``track``, a wrapper around the
  data loader of an ``accelerator.accumulate`` loop.

All three write one iteration per optimizer step (gradient accumulation's
micro-batches summed into it), time the batch fetch as the starvation phase
``data``, and leave evaluation out of the iterations (recorded as an event).
docs/INTEGRATIONS.md gives the phases of each and a copy-paste example.
"""
