"""Findings on how far the run's data lets tlog judge: ``no_device_times``
(sync shares are upper bounds) and ``short_run`` (too few steady iterations).
docs/DIAGNOSIS.md section 7."""

from __future__ import annotations

from dataclasses import dataclass

from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.rules.base import Rule, RuleContext


@dataclass(frozen=True)
class CoveragePolicy:
    """How much steady data a confident verdict needs (``short_run`` and the
    verdict's confidence)."""

    #: Fewest steady iterations per worker for a confident verdict. Source: tlog's
    #: choice: the median of 20 samples has a 95% confidence interval spanning
    #: the 6th..15th order statistics (binomial), about a quartile either way.
    min_steady_iters: int = 20


class NoDeviceTimesRule(Rule):
    """``no_device_times`` (info): no device times on a run that may have had a
    GPU, so sync shares are upper bounds that can hide queued GPU compute
    (a run whose tags say it had no GPU is exact: ``analyze.verdict.host_only``;
    so is a run of timer logs, whose timers synchronise the device:
    ``analyze.verdict.timers_synced``)."""

    code = Code.NO_DEVICE_TIMES

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding unless ``ctx.exact_sync``; evidence: the largest stage sync share."""
        if ctx.exact_sync:
            return []
        sync_share = max((s.shares["sync"] for s in ctx.stages), default=0.0)
        return [Finding(
            self.code, Severity.INFO,
            "no device (gpu) times were recorded: sync shares are upper bounds that can hide "
            "queued GPU compute; record phases with a stream (it.phase(name, stream=s)) to split them",
            {"max_sync_share": sync_share})]


class ShortRunRule(Rule):
    """``short_run`` (warning): fewer than ``CoveragePolicy.min_steady_iters`` steady
    iterations on some worker (or none at all), or, in averaged timer logs,
    fewer logged intervals (``RuleContext.min_intervals_per_worker``): the
    verdict's confidence is low."""

    code = Code.SHORT_RUN

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding when ``ctx.short``."""
        if not ctx.short:
            return []
        want = ctx.policies.coverage.min_steady_iters
        fewest = ctx.min_steady_per_worker
        few = ctx.min_intervals_per_worker
        if few is not None and few < want and fewest >= want:
            return [Finding(
                self.code, Severity.WARNING,
                f"too few logged intervals to judge with confidence: the timer log's "
                f"{ctx.steady_iterations} steady iterations repeat the figures of "
                f"{few} logged interval{'s' if few != 1 else ''} on some worker "
                f"(want {want}); each interval is one observation",
                {"steady": ctx.steady_iterations, "min_per_worker": fewest,
                 "min_intervals_per_worker": few, "want_per_worker": want})]
        return [Finding(
            self.code, Severity.WARNING,
            f"too short to judge with confidence: {ctx.steady_iterations} steady iterations "
            f"(fewest on one worker: {fewest}; want {want} per worker)",
            {"steady": ctx.steady_iterations, "min_per_worker": fewest,
             "want_per_worker": want})]
