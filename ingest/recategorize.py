"""Bring stored phase categories up to date with run.json ``phase_kinds`` and
the name rules (:mod:`dflash_runtime.format`), without reloading the logs."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from dflash_runtime.format import resolve_category


def recategorize(con: duckdb.DuckDBPyConnection, run_id: str,
                 phase_kinds: dict[str, str]) -> list[dict[str, str]]:
    """Bring the categories of run ``run_id``'s phases up to date: each phase
    whose record gave no ``kinds`` gets ``phase_kinds`` (run.json) else the
    name rules (:func:`dflash_runtime.format.categorize`), as a new ingest would.
    So editing ``phase_kinds`` in run.json (or a newer tlog's rules) takes
    effect at the next ``tlog ingest``, without reloading the logs. Categories
    a record's ``kinds`` gave are kept (they come first, FORMAT.md).

    Returns:
        ``[{"phase", "from", "to"}]``, one per changed (phase, old category),
        sorted by phase. One set-based UPDATE (20,000 changed names: well under
        a second); runs inside the caller's transaction.
    """
    rows = con.execute("SELECT DISTINCT phase, category FROM phase_layouts "
                       "WHERE run_id = ? AND given IS NULL", [run_id]).fetchall()
    changes = sorted((phase, old, new) for phase, old in rows
                     if (new := resolve_category(phase, None, phase_kinds)) != old)
    if changes:
        cols = list(zip(*changes, strict=True))
        con.register("_tlog_recat", pa.table({"phase": pa.array(cols[0], pa.string()),
                                              "old": pa.array(cols[1], pa.string()),
                                              "new": pa.array(cols[2], pa.string())}))
        try:
            con.execute("""UPDATE phase_layouts SET category = c.new FROM _tlog_recat c
                           WHERE phase_layouts.run_id = ? AND phase_layouts.phase = c.phase
                             AND phase_layouts.category = c.old
                             AND phase_layouts.given IS NULL""", [run_id])
        finally:
            con.unregister("_tlog_recat")
    return [{"phase": phase, "from": old, "to": new} for phase, old, new in changes]


def phase_kinds_warnings(con: duckdb.DuckDBPyConnection, run_id: str,
                         phase_kinds: dict[str, str]) -> list[str]:
    """What in ``phase_kinds`` cannot apply to run ``run_id``: a name no record
    of the run has (a typo?), or a phase every record of which gives its own
    ``kinds`` (they come first). Empty when the run has no phases yet."""
    if not phase_kinds:
        return []
    rows = con.execute("SELECT phase, bool_and(given IS NOT NULL) FROM phase_layouts "
                       "WHERE run_id = ? GROUP BY phase", [run_id]).fetchall()
    if not rows:
        return []
    seen = dict(rows)

    def listed(names: list[str]) -> str:
        return ", ".join(repr(n) for n in names[:10]) + (
            f" and {len(names) - 10} more" if len(names) > 10 else "")

    out = []
    if missing := sorted(n for n in phase_kinds if n not in seen):
        out.append(f"run.json phase_kinds names {listed(missing)}, which no record of this "
                   f"run has (a typo?)")
    if ruled := sorted(n for n in phase_kinds if seen.get(n)):
        out.append(f"run.json phase_kinds for {listed(ruled)} does not apply: the records "
                   f"give their own kinds, which come first")
    return out
