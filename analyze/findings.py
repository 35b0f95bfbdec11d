"""Findings: what diagnose tells the engineer, each with its evidence, and the
order they are reported in.

A :class:`Finding` has a ``code`` (:class:`Code`), a ``severity``
(``info`` < ``warning`` < ``critical``), a one-line ``message`` with the
figures, and ``evidence`` (a dict of the figures, stage, phase, ranks). The
rules that find them are ``analyze.rules`` (one object per finding, each
family's limits in its own frozen policy, ``analyze.rules.Policies``);
docs/DIAGNOSIS.md section 7 lists them all.

Findings are reported under one sort key, :func:`finding_key`: severity
(critical first), then ``gain`` (the throughput gain of fixing what the
finding names, largest first; findings without one after those with one),
then the rules' report order. The verdict is the first finding in that order
with a :class:`Headline` (``analyze.verdict``): a rule makes its finding lead
by giving it a headline, a severity and a gain, with no edit elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: The verdict line's length limit, in characters. Source: tlog's choice: two
#: lines of an 80-column terminal; the figures behind it are in the findings.
HEADLINE_MAX = 160


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


@dataclass(frozen=True)
class Headline:
    """The verdict sentence a finding gives when it leads, as parts in reading
    order, each with the order it is left out in to fit a length (0: never;
    the highest number goes first, the later part first among equals).

    Build it with :meth:`of`: ``Headline.of("Bottleneck: main is compute-bound",
    ("; backward takes 64% of its time", 2), ("; removing ... 2.80x faster", 1))``.
    """

    parts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, *parts: str | tuple[str, int] | None) -> Headline:
        """A headline of ``parts``: a text (never left out), a ``(text, order)``
        pair, or None (nothing: a part that does not apply)."""
        return cls(tuple((p, 0) if isinstance(p, str) else p for p in parts if p))

    def text(self, limit: int = HEADLINE_MAX) -> str:
        """The sentence in at most ``limit`` characters: optional parts left out
        in their order until it fits; what is still too long is cut, ending "…"."""
        keep = list(self.parts)
        while sum(len(p) for p, _ in keep) > limit:
            optional = [(order, i) for i, (_, order) in enumerate(keep) if order > 0]
            if not optional:
                break
            del keep[max(optional)[1]]
        out = "".join(p for p, _ in keep)
        return out if len(out) <= limit else out[:limit - 1].rstrip() + "…"


@dataclass
class Finding:
    """One observation with its figures.

    Attributes:
        code: what was found (a :class:`Code` for tlog's rules).
        severity: ``info``, ``warning`` or ``critical`` (:class:`Severity`).
        message: one line with the figures.
        evidence: the figures (seconds, shares as fractions), stage, phase, ranks.
        gain: the throughput gain (a fraction: 0.38 is 1.38x) of fixing what the
            finding names, where tlog models it (a straggler's ``gain_if_fixed``,
            the bottleneck phase's what-if gain); None where it does not, or where
            the finding is the symptom of another (the peers' sync wait for a
            straggler). The second part of :func:`finding_key`; not in the JSON.
        headline: the verdict the finding gives when it is the first with one
            (:func:`finding_key` order); None: it never leads. Not in the JSON
            (the verdict is).
    """

    code: str
    severity: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    gain: float | None = field(default=None, compare=False)
    headline: Headline | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``findings`` items)."""
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "evidence": self.evidence}


def finding_key(f: Finding) -> tuple[int, float]:
    """The findings' sort key: severity (critical first), then ``gain`` (largest
    first; a finding without one after those with one). Sorts that use it are
    stable, so equal keys keep the rules' report order.

    Raises:
        ValueError: the finding's severity is not one of :class:`Severity`.
    """
    return (SEVERITY_ORDER[Severity(f.severity)], -f.gain if f.gain is not None else math.inf)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """``findings`` in :func:`finding_key` order (stable: rules' order, then each rule's own).

    Raises:
        ValueError: a finding's severity is not one of :class:`Severity`.
    """
    return sorted(findings, key=finding_key)


def lead_finding(findings: Sequence[Finding]) -> Finding | None:
    """The finding the verdict leads with: the first in :func:`finding_key` order
    that has a headline; None when none has one."""
    return next((f for f in sort_findings(list(findings)) if f.headline is not None), None)


def and_list(items: Sequence[Any]) -> str:
    """``"1"``, ``"1 and 3"``, ``"0, 1 and 3"``."""
    words = [str(x) for x in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def merge_ranks(findings: list[Finding], by: tuple[str, ...] = ("stage",),
                figure: Callable[[dict[str, Any]], str] | None = None) -> list[Finding]:
    """Findings of one code about several ranks of one stage as one finding.

    Findings whose evidence has a ``rank`` and the same code and values of
    ``by`` (evidence keys) become one, where the first of the group appeared:
    its lead is the group's first in :func:`finding_key` order, whose
    severity, gain, headline, message and evidence it keeps; the message
    adds ``"; also rank 3 (1.30x)"`` (``figure`` of each other rank's
    evidence, when given), and the evidence gains ``ranks`` (lead first, then
    in key order) and ``per_rank`` (each rank's own evidence, same order).
    Other findings pass unchanged.
    """
    groups: dict[tuple, list[Finding]] = {}
    out: list[Finding | tuple] = []
    for f in findings:
        if "rank" not in f.evidence:
            out.append(f)
            continue
        key = (f.code, *(f.evidence.get(k) for k in by))
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(f)
    merged = []
    for item in out:
        if isinstance(item, Finding):
            merged.append(item)
            continue
        group = sort_findings(groups[item])
        lead = group[0]
        if len(group) == 1:
            merged.append(lead)
            continue
        others = [str(f.evidence["rank"]) + (f" ({figure(f.evidence)})" if figure else "")
                  for f in group[1:]]
        message = f"{lead.message}; also rank{'s' if len(others) > 1 else ''} {and_list(others)}"
        evidence = {**lead.evidence, "ranks": [f.evidence["rank"] for f in group],
                    "per_rank": [f.evidence for f in group]}
        merged.append(Finding(lead.code, lead.severity, message, evidence, gain=lead.gain,
                              headline=lead.headline))
    return merged
