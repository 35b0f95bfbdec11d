"""The run history: which runs the database holds, filtered by tags and start time,
each with its steady throughput and its verdict's bottleneck (``tlog runs``).

Every figure comes from :func:`analyze.diagnose` (steady state, pipeline order,
throughput of the output stage), so ``tlog runs``, ``tlog diagnose`` and
``tlog compare`` always agree on a run's throughput. :func:`list_runs` reads
the stored diagnosis (``attribution_runs``, :mod:`tlog.analyze.persist`) and
diagnoses only the runs whose stored figures are missing or stale (reading
fresh ones loads neither polars nor the analysis).

Tag filters compare the text of a tag (``runs.tags ->> key``), so a manifest
tag ``"gpus": 8`` matches ``gpus=8``. Start times are epoch seconds
(``runs.started``: the manifest's ``started``, else the first iteration's ``ts``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import duckdb
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.errors import UsageError

if TYPE_CHECKING:
    from tlog.analyze.verdict import Diagnosis


@dataclass
class RunSummary:
    """One run of the history with its steady figures.

    Attributes:
        run_id: the run's id.
        name: the manifest's name (or None).
        source: ``jsonl`` or ``kineto``.
        started: epoch seconds (or None when unknown).
        tags: the manifest's tags (``{}`` without).
        iterations: ``{"total": n, "steady": n}``.
        throughput: ``iters_per_s``, ``tokens_per_s``, ``samples_per_s`` of the
            run (its output stage; None when not reported), as in ``tlog diagnose``.
        bottleneck: ``{"stage", "category", "phase", "share", "straggler", "cause"}``
            of the verdict (``cause``: the finding code the verdict leads with,
            ``"cpu_contention"``, else None), or None (no steady iterations).
        verdict: the one-line verdict (``Bottleneck: ...``).
        confidence: ``high``, ``medium`` or ``low``.
    """

    run_id: str
    name: str | None
    source: str | None
    started: float | None
    tags: dict[str, Any]
    iterations: dict[str, int] = field(default_factory=lambda: {"total": 0, "steady": 0})
    throughput: dict[str, float | None] = field(default_factory=lambda: {
        "iters_per_s": None, "tokens_per_s": None, "samples_per_s": None})
    bottleneck: dict[str, Any] | None = None
    verdict: str | None = None
    confidence: str | None = None

    @property
    def rank_key(self) -> tuple[bool, float, bool, float, float]:
        """Sort key for "best run": steady tokens/s first, else samples/s, else
        iterations/s (the units ``tlog compare`` reports in, in its order: a
        run with a larger batch does fewer iterations per second, not less work)."""
        tps = self.throughput.get("tokens_per_s")
        sps = self.throughput.get("samples_per_s")
        ips = self.throughput.get("iters_per_s")
        return (tps is not None, tps or 0.0, sps is not None, sps or 0.0, ips or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``tlog runs --json``): the fields above plus ``started_utc`` (ISO 8601)."""
        started_utc = (datetime.fromtimestamp(self.started, UTC).isoformat()
                       if self.started is not None else None)
        return {"run_id": self.run_id, "name": self.name, "source": self.source,
                "started": self.started, "started_utc": started_utc, "tags": dict(self.tags),
                "iterations": dict(self.iterations), "throughput": dict(self.throughput),
                "bottleneck": dict(self.bottleneck) if self.bottleneck else None,
                "verdict": self.verdict, "confidence": self.confidence}


def parse_tag_filters(items: list[str] | None, *, what: str = "tag filter") -> dict[str, str]:
    """``["gpus=8", "branch=main"]`` -> ``{"gpus": "8", "branch": "main"}``
    (``--tag`` of ``tlog runs``, and of ``tlog run`` with ``what="tag"``: the
    word the error names).

    Raises:
        UsageError: an item is not ``key=value`` with a non-empty key, or a key repeats.
    """
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            msg = f"bad {what} {item!r}: write key=value, e.g. --tag gpus=8"
            raise UsageError(msg)
        if key in out:
            msg = f"tag {key!r} given twice"
            raise UsageError(msg)
        out[key] = value
    return out


def parse_since(text: str) -> float:
    """A ``--since`` value (ISO date or date-time; local time unless it has an
    offset) as epoch seconds.

    Raises:
        UsageError: not an ISO 8601 date or date-time.
    """
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        msg = (f"bad date {text!r}: use an ISO date such as 2026-11-29 or a date-time such as "
               "2026-11-29T08:00")
        raise UsageError(msg) from None
    return when.timestamp()


def _decode(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


def run_rows(con: duckdb.DuckDBPyConnection, *, tags: Mapping[str, str] | None = None,
             since: float | None = None, before: float | None = None) -> list[RunSummary]:
    """The runs of the database, oldest first, without their figures.

    Args:
        con: an open tlog database.
        tags: keep runs whose tag ``key`` has the text ``value``, for every pair.
        since: keep runs that started at or after this epoch second.
        before: keep runs that started strictly before this epoch second.

    Runs with no ``started`` sort last and are dropped by ``since``/``before``.
    Values are bound as parameters.
    """
    where = ["TRUE"]
    params: dict[str, Any] = {}
    for k, (key, value) in enumerate(sorted((tags or {}).items())):
        where.append(f"(tags ->> $key{k}) = $value{k}")
        params[f"key{k}"] = key
        params[f"value{k}"] = value
    if since is not None:
        where.append("started >= $since")
        params["since"] = since
    if before is not None:
        where.append("started < $before")
        params["before"] = before
    sql = f"""
        WITH all_runs AS (
            SELECT run_id, name, source, started, tags FROM runs
            UNION ALL
            SELECT DISTINCT run_id, NULL, NULL, min(ts) OVER (PARTITION BY run_id), NULL
            FROM iterations WHERE run_id NOT IN (SELECT run_id FROM runs))
        SELECT DISTINCT run_id, name, source, started, tags::VARCHAR FROM all_runs
        WHERE {" AND ".join(where)}
        ORDER BY started NULLS LAST, run_id"""
    rows = con.execute(sql, params).fetchall()
    return [RunSummary(run_id=r[0], name=r[1], source=r[2], started=r[3], tags=_decode(r[4]))
            for r in rows]


def summarize(con: duckdb.DuckDBPyConnection, row: RunSummary) -> RunSummary:
    """Fill ``row`` with its diagnosis figures (in place) and return it.

    The figures are ``tlog diagnose``'s, read from the stored diagnosis
    (``attribution_runs``), which is made fresh for this run first
    (:func:`tlog.analyze.persist.ensure_attribution`). A run without
    iterations keeps empty figures (``verdict`` says so).
    """
    ensure_attribution(con, [row.run_id])
    return _fill_stored(con, [row])[0]


def _fill_stored(con: duckdb.DuckDBPyConnection, rows: list[RunSummary]) -> list[RunSummary]:
    """Fill ``rows`` from ``attribution_runs.diagnosis`` (fresh: the caller ensured it)."""
    ids = [r.run_id for r in rows]
    stored = dict(con.execute("SELECT run_id, diagnosis::VARCHAR FROM attribution_runs "
                              "WHERE run_id IN (SELECT unnest($ids::VARCHAR[]))",
                              {"ids": ids}).fetchall())
    for row in rows:
        text = stored.get(row.run_id)
        if text is None:
            row.verdict = "no iterations"
            continue
        fill_from_diagnosis(row, json.loads(text))
    return rows


def fill_from_diagnosis(row: RunSummary, diag: Diagnosis | Mapping[str, Any]) -> RunSummary:
    """Fill ``row`` (in place) from a :class:`Diagnosis` or its ``to_dict()``
    (``tlog diagnose --json``) and return it."""
    d = diag if isinstance(diag, Mapping) else diag.to_dict()
    row.iterations = {"total": d["iterations"]["total"], "steady": d["iterations"]["steady"]}
    row.throughput = {k: d["throughput"].get(k) for k in ("iters_per_s", "tokens_per_s",
                                                          "samples_per_s")}
    if d.get("bottleneck"):
        row.bottleneck = {k: d["bottleneck"].get(k) for k in ("stage", "category", "phase",
                                                              "share", "straggler", "cause")}
    row.verdict = d["verdict"]
    row.confidence = d["confidence"]
    return row


CAUSE_LABELS = {"cpu_contention": "lacks CPU"}
"""The runs list's words for a verdict's ``cause`` (the verdict's own: "main (rank 0)
lacks CPU", docs/DIAGNOSIS.md section 8)."""


def bottleneck_label(b: Mapping[str, Any] | None) -> str:
    """One run's bottleneck as the runs list writes it (``tlog runs``, ``tlog
    serve``'s runs page), saying what the verdict leads with: a straggler
    (``"train: rank 2 straggler (compute, backward)"``), a cause such as CPU
    contention (``"main: lacks CPU (compute, forward)"``: the category and phase
    are its symptom), else ``"stage: category (phase)"``; ``""`` without one.

    Args:
        b: :attr:`RunSummary.bottleneck` (or its JSON form), or None.
    """
    if not b:
        return ""
    lead = b.get("straggler")
    if lead:    # the verdict's cause: a straggler (the category is its symptom)
        what = lead["kind"] + (f", {lead['phase']}" if lead.get("phase") else "")
        return f"{b.get('stage')}: rank {lead['rank']} straggler ({what})"
    cause = b.get("cause")
    if cause:
        what = f"{b.get('category')}" + (f", {b['phase']}" if b.get("phase") else "")
        return f"{b.get('stage')}: {CAUSE_LABELS.get(cause, cause)} ({what})"
    text = f"{b.get('stage')}: {b.get('category')}"
    return text + (f" ({b['phase']})" if b.get("phase") else "")


def list_runs(con: duckdb.DuckDBPyConnection, *, tags: Mapping[str, str] | None = None,
              since: float | None = None) -> list[RunSummary]:
    """The runs, oldest first, each with steady throughput and bottleneck.

    The figures are ``tlog diagnose``'s, read from the stored diagnosis
    (``attribution_runs.diagnosis``); runs whose stored figures are missing
    or stale are diagnosed first (:func:`tlog.analyze.persist.ensure_attribution`:
    stored on a writable connection, kept in memory on a read-only one).

    Raises:
        UsageError: bad filters (see :func:`parse_tag_filters`, :func:`parse_since`).
    """
    rows = run_rows(con, tags=tags, since=since)
    if not rows:
        return rows
    ensure_attribution(con, [r.run_id for r in rows])
    return _fill_stored(con, rows)
