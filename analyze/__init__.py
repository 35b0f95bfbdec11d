"""tlog's analysis layer: DuckDB -> polars frames -> attribution, bottleneck, verdicts.

Public API (stable names; docs/DIAGNOSIS.md documents every rule):

- :func:`diagnose` ``(con, run_id) -> Diagnosis``: the verdict of one run;
  ``Diagnosis.to_dict()`` is ``tlog diagnose --json``.
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

from tlog.analyze.attribution import Attributed, attribute_matrix, backlog_walk, fifo_credit
from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.frames import (
    RunAnalysis,
    analyze_data,
    attributed_iterations,
    attributed_phases,
    iteration_frame,
    phase_frame,
)
from tlog.analyze.frames import analyze_run as attribute
from tlog.analyze.load import RunData, load_run
from tlog.analyze.verdict import Diagnosis, diagnose, diagnose_analysis
from tlog.ingest.errors import RunNotFoundError, TlogError

__all__ = [
    "Attributed",
    "Code",
    "Diagnosis",
    "Finding",
    "RunAnalysis",
    "RunData",
    "RunNotFoundError",
    "Severity",
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
