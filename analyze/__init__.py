"""tlog's analysis layer: DuckDB -> polars frames -> attribution, bottleneck, verdicts.

Public API (stable names; docs/DIAGNOSIS.md documents every rule):

- :func:`diagnose` ``(con, run_id, *, thresholds=None, rules=None) -> Diagnosis``:
  the verdict of one run; ``Diagnosis.to_dict()`` is ``tlog diagnose --json``.
  Findings come from :class:`Rule` objects (``analyze.rules``:
  :data:`DEFAULT_RULES`, limits in :class:`Thresholds`).
- :func:`load_run` ``(con, run_id) -> RunData``: the frames analysis reads.
- :func:`attribute` ``(con, run_id) -> RunAnalysis``: loaded, attributed,
  steady state marked (``analyze.frames``).
- :func:`attributed_iterations` ``(con, run_id) -> pl.DataFrame``: one row per
  iteration with seconds per category after device-aware attribution and the
  ``steady`` flag.
- :func:`attributed_phases` ``(con, run_id, *, steady_only=True) -> pl.DataFrame``:
  attributed seconds per (worker, phase, category).

analyze never imports torch, never prints and never plots.
"""

from __future__ import annotations

from typing import Any

#: Public name -> the module that defines it, imported on first use (module
#: ``__getattr__``): ``import tlog.analyze.history`` or the CLI's start-up does
#: not pay for polars and numpy until a figure is needed (issue 14).
_EXPORTS = {
    "Attributed": "attribution", "attribute_matrix": "attribution",
    "backlog_walk": "attribution", "fifo_credit": "attribution",
    "Code": "findings", "Finding": "findings", "Severity": "findings",
    "RunAnalysis": "frames", "analyze_data": "frames", "attributed_iterations": "frames",
    "attributed_phases": "frames", "iteration_frame": "frames", "phase_frame": "frames",
    "attribute": "frames",
    "RunData": "load", "load_run": "load",
    "DEFAULT_RULES": "rules", "Rule": "rules", "RuleContext": "rules", "Thresholds": "rules",
    "Diagnosis": "verdict", "diagnose": "verdict", "diagnose_analysis": "verdict",
}
_ALIASES = {"attribute": "analyze_run"}
_ERRORS = ("RunNotFoundError", "TlogError")


def __getattr__(name: str) -> Any:
    import importlib

    if name in _ERRORS:
        module = "tlog.ingest.errors"
    elif name in _EXPORTS:
        module = f"{__name__}.{_EXPORTS[name]}"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _ALIASES.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, *_ERRORS])


__all__ = [
    "DEFAULT_RULES",
    "Attributed",
    "Code",
    "Diagnosis",
    "Finding",
    "Rule",
    "RuleContext",
    "RunAnalysis",
    "RunData",
    "RunNotFoundError",
    "Severity",
    "Thresholds",
    "TlogError",
    "analyze_data",
    "attribute",
    "attribute_matrix",
    "attributed_iterations",
    "attributed_phases",
    "backlog_walk",
    "diagnose",
    "diagnose_analysis",
    "fifo_credit",
    "iteration_frame",
    "load_run",
    "phase_frame",
]
