"""tlog's analysis layer: DuckDB -> polars frames -> attribution, bottleneck, verdicts.

Public API (stable names; docs/DIAGNOSIS.md documents every rule), one way per job:

- :func:`diagnose` ``(con, run_id, *, policies=None, rules=None) -> Diagnosis``:
  the verdict of one run, typed (``tlog.analyze.results``); ``Diagnosis.to_dict()``
  is ``tlog diagnose --json``; ``Diagnosis.analysis`` holds its attributed frames.
  Findings come from :class:`Rule` objects (``analyze.rules``:
  :data:`DEFAULT_RULES`, each family's limits a frozen policy, all in :class:`Policies`).
- :func:`attribute` ``(con, run_id) -> RunAnalysis``: the attributed frames
  without a verdict: ``.iteration_frame()`` (one row per iteration, seconds
  per category after device-aware attribution, ``steady`` flag) and
  ``.phase_frame(steady_only=True)`` (attributed seconds per worker, phase,
  category).
- :func:`load_run` ``(con, run_id) -> RunData``: the frames analysis reads.

analyze never imports torch, never prints and never plots.
"""

from __future__ import annotations

from dflash_runtime.lazy import lazy_exports

#: Public name -> the module that defines it, imported on first use (module
#: ``__getattr__``): ``import tlog.analyze.history`` or the CLI's start-up does
#: not pay for polars and numpy until a figure is needed.
_EXPORTS = {
    "Attributed": "attribution", "attribute_matrix": "attribution",
    "backlog_walk": "attribution", "fifo_credit": "attribution",
    "Code": "findings", "Finding": "findings", "Severity": "findings",
    "RunAnalysis": "frames", "attribute": "frames",
    "RunData": "load", "load_run": "load",
    "DEFAULT_RULES": "rules", "Rule": "rules", "RuleContext": "rules", "Policies": "rules",
    "Diagnosis": "verdict", "diagnose": "verdict",
    **{name: "results" for name in (
        "BottleneckResult", "CategoryShares", "IterationCounts", "LeadingStraggler",
        "PipelineSummary", "QueueState", "StageResult", "Throughput", "TopPhase", "WhatIf")},
    "Straggler": "stragglers", "Lockstep": "lockstep",
}
_EXPORTS.update(dict.fromkeys(("RunNotFoundError", "TlogError"), "tlog.ingest.errors"))

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "DEFAULT_RULES",
    "Attributed",
    "BottleneckResult",
    "CategoryShares",
    "Code",
    "Diagnosis",
    "Finding",
    "IterationCounts",
    "LeadingStraggler",
    "Lockstep",
    "PipelineSummary",
    "Policies",
    "QueueState",
    "Rule",
    "RuleContext",
    "RunAnalysis",
    "RunData",
    "RunNotFoundError",
    "Severity",
    "StageResult",
    "Straggler",
    "Throughput",
    "TlogError",
    "TopPhase",
    "WhatIf",
    "attribute",
    "attribute_matrix",
    "backlog_walk",
    "diagnose",
    "fifo_credit",
    "load_run",
]
