"""Findings on implicit host-device syncs caught by the shim: ``implicit_sync``.
docs/DIAGNOSIS.md section 7.

The shim's ``catch_syncs`` (``rec.instrument(..., syncs=True)``) writes each
``.item()``, ``.cpu()``, ``torch.cuda.synchronize()``... of a device tensor as a
``sync`` phase named after its call site, ``sync.item@train.py:212``, usually a
child of the phase it happened in (``dflash_runtime.format.parse_sync_site``).
A child whose category differs from its parent's is carved out of it by the
attribution (section 1), so its seconds are its own here.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from tlog.analyze.findings import Code, Finding, Severity
from tlog.analyze.pipeline import EPS, MODERATE_SHARE
from tlog.analyze.rules.base import Rule, RuleContext
from tlog.analyze.text import ms, pct, phase_label

from dflash_runtime.format import parse_sync_site


@dataclass(frozen=True)
class SyncPolicy:
    """The limits of the ``implicit_sync`` finding."""

    #: An implicit sync call site (``.item()``, ``.cpu()``, ``synchronize``...
    #: caught by the shim) worth naming: it blocks the host this share of its
    #: stage's steady time. Source: tlog's choice: each site is one line to
    #: change, so 1% is worth a line of the report; below it, noise of a
    #: busy machine.
    implicit_share: float = 0.01


class ImplicitSyncRule(Rule):
    """``implicit_sync``: one call site blocks the host on the device for
    ``SyncPolicy.implicit_share`` or more of a stage's steady time.

    Per stage and call site (the phase's full name: the same line under two
    parents is two findings), over the steady iterations of the stage's counted
    workers: ``host_s`` (the time the call blocked the host), ``sync_s`` (the part
    attributed to sync: with device times, the part the device-backlog walk did
    not credit to the stage's own queued work), seconds per steady iteration and
    share of the stage's time. Severity: ``critical`` when the site is the phase
    the verdict names (sync the bottleneck), ``warning`` from ``MODERATE_SHARE``
    (5%), else ``info``. Sites in report order: largest first.
    """

    code = Code.IMPLICIT_SYNC

    def evaluate(self, ctx: RuleContext) -> list[Finding]:
        """One finding per (stage, call site) above the threshold."""
        analysis = ctx.analysis
        names = analysis.data.phase_names
        sites = [pid for pid, name in enumerate(names) if parse_sync_site(name) is not None]
        if not sites or ctx.workers.height == 0:
            return []
        rows = (analysis.all_phases
                .filter(pl.col("part").is_not_null() & pl.col("pid").is_in(sites))
                .join(ctx.workers.select("wid", "stage"), on="wid")
                .group_by("stage", "pid")
                .agg(pl.col("host_s").sum(), pl.col("sync_s").sum(), pl.col("n").sum())
                .sort(["host_s", "pid"], descending=[True, False]))
        stages = {s.stage: s for s in ctx.stages}
        bn = ctx.bottleneck
        out = []
        for r in rows.iter_rows(named=True):
            st = stages.get(r["stage"])
            if st is None or st.seconds <= 0 or not st.iterations:
                continue
            name = names[r["pid"]]
            share = r["host_s"] / st.seconds
            if share < ctx.policies.syncs.implicit_share - EPS:
                continue
            per_iter = r["host_s"] / st.iterations
            is_bn = (bn is not None and bn.category == "sync" and bn.stage == st.stage
                     and bn.phase == name)
            sev = (Severity.CRITICAL if is_bn else
                   Severity.WARNING if share >= MODERATE_SHARE - EPS else Severity.INFO)
            op, file, line = parse_sync_site(name)  # type: ignore[misc]
            every = "" if r["n"] >= st.iterations else f", in {r['n']} of {st.iterations} iterations"
            msg = (f"{phase_label(name)} blocks {st.stage} on the device {ms(per_iter)} per "
                   f"iteration ({pct(share)} of its time{every}): read the value less often, "
                   f"later, or without blocking (non_blocking copy + event)")
            out.append(Finding(self.code, sev, msg, {
                "stage": st.stage, "phase": name, "op": op, "file": file, "line": line,
                "seconds_per_iter": per_iter, "share": share,
                "sync_seconds_per_iter": r["sync_s"] / st.iterations,
                "iterations_with_site": int(r["n"]), "iterations": st.iterations}))
        return out
