"""The reference DFlash-style training pipeline, instrumented with the shim.

A small but faithful DFlash drafter training loop that runs on CPU cores in
about a minute (and on GPUs where present): target ranks run a tiny frozen
decoder and hand the hidden states of evenly spaced layers through a bounded
queue to drafter ranks, which train a block-diffusion drafter with KV injection
and all-reduce its gradients. Every phase is recorded with
:class:`dflash_runtime.Recorder`. Scenarios inject a known bottleneck, so the
diagnosis has a right answer (docs/PIPELINE.md).

    >>> from dflash_runtime.pipeline import run_pipeline
    >>> run_dir = run_pipeline("runs", scenario="heavy-target", steps=40)  # doctest: +SKIP

``run_pipeline`` and the rest of :mod:`~dflash_runtime.pipeline.train` import
torch; importing this package does not (the scenario table is torch-free).
"""

from __future__ import annotations

from typing import Any

from dflash_runtime.pipeline.scenarios import (
    DEFAULT_STEPS,
    DEFAULT_WORLD_SIZE,
    SCENARIOS,
    PipelineConfig,
    Scenario,
    make_config,
)

__all__ = [
    "DEFAULT_STEPS", "DEFAULT_WORLD_SIZE", "SCENARIOS", "PipelineConfig", "Scenario",
    "make_config", "run_pipeline",
]


def __getattr__(name: str) -> Any:
    if name == "run_pipeline":
        from dflash_runtime.pipeline.train import run_pipeline

        return run_pipeline
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
