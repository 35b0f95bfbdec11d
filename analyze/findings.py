"""Findings: what diagnose tells the engineer besides the verdict, each with its evidence.

A :class:`Finding` has a ``code`` (:class:`Code`), a ``severity``
(``info`` < ``warning`` < ``critical``), a one-line ``message`` with the
figures, and ``evidence`` (a dict of the figures, stage, phase, ranks). The
rules that find them are ``analyze.rules`` (one object per finding, their
thresholds in :class:`analyze.rules.Thresholds`); docs/DIAGNOSIS.md section 7
lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Code(StrEnum):
    """Finding codes of tlog's own rules (stable: scripts match on them). A
    plugin rule (``tlog.rules`` entry point) may use codes of its own."""

    STARVATION = "starvation"
    BACKPRESSURE = "backpressure"
    COMPUTE_BOUND = "compute_bound"
    SYNC_BOUND = "sync_bound"
    STRAGGLER = "straggler"
    DRIFT = "drift"
    UNACCOUNTED = "unaccounted"
    ALLOCATOR_THRASH = "allocator_thrash"
    HOST_BOUND = "host_bound"
    BLOCKED_IN_COMPUTE = "blocked_in_compute"
    NO_DEVICE_TIMES = "no_device_times"
    SHORT_RUN = "short_run"
    QUEUE_EMPTY = "queue_empty"
    QUEUE_FULL = "queue_full"
    MEMORY_GROWTH = "memory_growth"
    CPU_CONTENTION = "cpu_contention"
    GPU_UNDERUSED = "gpu_underused"
    GPU_THROTTLED = "gpu_throttled"
    IMPLICIT_SYNC = "implicit_sync"
    PIPELINE_BUBBLE = "pipeline_bubble"


class Severity(StrEnum):
    """How much a finding matters."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass
class Finding:
    """One observation with its figures.

    Attributes:
        code: what was found (a :class:`Code` for tlog's rules).
        severity: ``info``, ``warning`` or ``critical`` (:class:`Severity`).
        message: one line with the figures.
        evidence: the figures (seconds, shares as fractions), stage, phase, ranks.
    """

    code: str
    severity: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``findings`` items)."""
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "evidence": self.evidence}


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, stable otherwise (rules' order, then each rule's own).

    Raises:
        ValueError: a finding's severity is not one of :class:`Severity`.
    """
    return sorted(findings, key=lambda f: SEVERITY_ORDER[Severity(f.severity)])
