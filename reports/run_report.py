"""The run report: verdict, findings and per-stage table as text, then the charts.

:func:`run_charts` gives the charts of a run as Altair objects (for Jupyter or
export); :func:`run_page` lays them out with the text on a :class:`reports.html.Page`;
:func:`write_run_report` does it all from the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import duckdb
import polars as pl
from tlog.analyze import text as fmt
from tlog.reports import charts
from tlog.reports.data import RunReportData, load_report_data
from tlog.reports.html import ChartBlock, Markup, Page, el, table

from dflash_runtime.format import CATEGORIES


@dataclass(frozen=True)
class NamedChart:
    """A chart with its export name, heading and reading guide."""

    key: str
    title: str
    caption: str
    chart: alt.TopLevelMixin

    def block(self) -> ChartBlock:
        """The chart as a :class:`ChartBlock` (its Vega-Lite spec) for the page."""
        return ChartBlock(self.key, self.title, self.caption, charts.spec(self.chart))


def rank_shares(data: RunReportData) -> pl.DataFrame:
    """Share of wall time by category for each stage (from the diagnosis) and
    each rank (steady attributed seconds summed over the rank's iterations).

    Returns ``stage, rank`` (null for the stage's own row), ``category, share``.
    """
    rows: list[dict[str, Any]] = []
    it = data.iterations.filter(pl.col("steady"))
    cols = [f"{c}_s" for c in CATEGORIES]
    per_rank = (
        it.group_by("stage", "rank")
        .agg(*[pl.col(c).sum() for c in cols])
        .with_columns(pl.sum_horizontal(cols).alias("_total"))
        .sort("stage", "rank")
    )
    stages = [s.get("stage") for s in data.diagnosis.get("stages") or []]
    for stage in stages or per_rank["stage"].unique(maintain_order=True).to_list():
        diag_stage = next(
            (s for s in data.diagnosis.get("stages") or [] if s.get("stage") == stage), {}
        )
        shares = diag_stage.get("categories") or {}
        for c in CATEGORIES:
            if c in shares:
                rows.append(
                    {"stage": stage, "rank": None, "category": c, "share": float(shares[c])}
                )
        for rec in per_rank.filter(pl.col("stage") == stage).iter_rows(named=True):
            total = rec["_total"] or 0.0
            for c in CATEGORIES:
                rows.append(
                    {
                        "stage": stage,
                        "rank": rec["rank"],
                        "category": c,
                        "share": rec[f"{c}_s"] / total if total > 0 else 0.0,
                    }
                )
    return pl.DataFrame(
        rows,
        schema={"stage": pl.String, "rank": pl.Int64, "category": pl.String, "share": pl.Float64},
    )


def rank_phase_seconds(data: RunReportData) -> pl.DataFrame:
    """Steady seconds per iteration of each phase per stage and rank (mean over a
    rank's workers), from analyze's phase frame. Returns ``stage, rank, phase,
    seconds_per_iter``."""
    return (
        data.phases.group_by("stage", "rank", "worker", "phase")
        .agg(pl.col("seconds_per_iter").sum())
        .group_by("stage", "rank", "phase")
        .agg(pl.col("seconds_per_iter").mean())
        .sort("stage", "rank", "phase")
    )


def run_charts(data: RunReportData, *, bins: int = charts.DEFAULT_BINS) -> list[NamedChart]:
    """The charts of a run report, in page order (charts without data are left out)."""
    out: list[NamedChart] = []
    if data.iterations.height:
        out.append(
            NamedChart(
                "timeline",
                "Time per iteration over the run",
                "Stacked: mean milliseconds per iteration in each category, per bin of iterations. "
                "Dashed: the 95th percentile, dotted: the slowest iteration in the bin, so "
                "stalls stay visible. Grey bands: iterations left out of the verdict (warm-up, "
                "events).",
                charts.timeline_chart(data.iterations, bins=bins),
            )
        )
    if data.iterations.height and data.system.filter(pl.col("iter").is_not_null()).height:
        out.append(
            NamedChart(
                "system",
                "The machine over the run",
                "Against the iterations of the chart above (same axis): the process's CPU use "
                "(percent of one core; dashed: the cores it may use), its resident memory, and "
                "where measured the GPU's utilisation and the device memory torch's allocator "
                "holds (else NVML's memory used). Line: mean of the stage's workers per bin; "
                "band: least to largest. From the shim's sys samples (every 2 s) or a trace's "
                "[memory] events.",
                charts.system_chart(data.system, data.iterations, bins=bins),
            )
        )
    shares = rank_shares(data)
    if shares.height:
        out.append(
            NamedChart(
                "shares",
                "Where the wall time goes, per stage and rank",
                "Share of steady-state wall time in each category: the stage as a whole, then "
                "each rank.",
                charts.category_share_chart(shares),
            )
        )
    heat = rank_phase_seconds(data)
    if heat.height:
        out.append(
            NamedChart(
                "rank-phase",
                "Phases by rank",
                "Mean milliseconds per steady iteration of each phase on each rank. Colour: the "
                "ratio to the stage's median rank for that phase. A straggler runs orange in "
                "its compute phases, and its peers run orange in the collectives where they "
                "wait for it.",
                charts.rank_phase_heatmap(heat),
            )
        )
    if data.queues.height:
        out.append(
            NamedChart(
                "queues",
                "Queue depth over time",
                "Line: mean depth per time bin; band: its minimum to maximum; dashed: capacity. "
                "Always empty: the consumer starves; always full: the producer is held back. "
                "Grey bands with a label: events (checkpoints, warm-up end, evaluation).",
                charts.queue_chart(data.queues, data.events, t0=data.t0, bins=bins),
            )
        )
    if data.phase_stats.height:
        out.append(
            NamedChart(
                "top-phases",
                "Top phases",
                "Bar: mean host milliseconds per steady iteration in which the phase ran; "
                "dot: median (p50); line to the tick: up to the 95th percentile (p95).",
                charts.top_phases_chart(data.phase_stats),
            )
        )
    return out


def _findings(findings: Iterable[dict[str, Any]]) -> Markup:
    items = []
    for f in findings:
        sev = str(f.get("severity") or "info").lower()
        evidence = f.get("evidence") or {}
        ev_text = (
            ", ".join(f"{k} = {fmt.value(v)}" for k, v in evidence.items())
            if isinstance(evidence, dict)
            else fmt.value(evidence)
        )
        items.append(
            el(
                "li",
                el("span", sev, class_=f"sev sev-{''.join(c for c in sev if c.isalpha())}"),
                " ",
                el("strong", f.get("code") or ""),
                " ",
                f.get("message") or "",
                el("div", ev_text, class_="evidence") if ev_text else None,
            )
        )
    return el("ul", items, class_="findings") if items else el("p", "No findings.")


def _throughput_text(tp: Any) -> str:
    if isinstance(tp, dict):
        parts = []
        for key, unit in (
            ("tokens_per_s", "tokens/s"),
            ("samples_per_s", "samples/s"),
            ("iters_per_s", "iterations/s"),
        ):
            if tp.get(key) is not None:
                parts.append(fmt.rate(tp[key], unit))
        return ", ".join(parts) or "–"
    return fmt.num(tp)


def stage_table(diagnosis: dict[str, Any]) -> Markup:
    """Per-stage table: workers, steady iterations, throughput, category shares, top phase."""
    header = ["stage", "workers", "iterations", "throughput", *CATEGORIES, "top phase"]
    rows = []
    for s in diagnosis.get("stages") or []:
        cats = s.get("categories") or {}
        tops = s.get("top_phases") or []
        top = tops[0] if tops else {}
        top_text = (
            (
                f"{top.get('phase')} ({fmt.ms(top.get('seconds_per_iter'))}/iter, "
                f"{fmt.pct(top.get('share'))})"
            )
            if top
            else "–"
        )
        rows.append(
            [
                s.get("stage"),
                fmt.num(s.get("workers")),
                fmt.num(s.get("iterations")),
                _throughput_text(s.get("throughput")),
                *[fmt.pct(cats.get(c)) for c in CATEGORIES],
                top_text,
            ]
        )
    return table(header, rows, numeric=range(1, 4 + len(CATEGORIES)))


def _tags_text(run: dict[str, Any]) -> str | None:
    """The manifest's tags as ``key: value · key: value`` (None without tags)."""
    tags = run.get("tags")
    if not isinstance(tags, dict) or not tags:
        return None
    return " · ".join(f"{k}: {fmt.value(v)}" for k, v in tags.items())


def _run_meta(data: RunReportData) -> Markup:
    run = data.run
    diag = data.diagnosis
    iters = diag.get("iterations") or {}
    facts = [
        ("run", data.run_id),
        ("name", run.get("name")),
        ("started", fmt.when(run.get("started")) if run.get("started") is not None else None),
        ("world size", run.get("world_size")),
        ("source", run.get("root") or run.get("source")),
        (
            "iterations",
            f"{fmt.num(iters.get('total'))} in total, {fmt.num(iters.get('steady'))} steady, "
            f"{fmt.num(iters.get('excluded'))} left out (warm-up, events, other attempts)"
            if iters
            else None,
        ),
        (
            "throughput",
            _throughput_text(diag.get("throughput")) if diag.get("throughput") else None,
        ),
        ("tags", _tags_text(run)),
    ]
    return el("dl", [[el("dt", k), el("dd", v)] for k, v in facts if v is not None], class_="meta")


def _list_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, Any]]) -> Markup:
    return table(
        [title for _, title, _ in columns], [[f(r.get(key)) for key, _, f in columns] for r in rows]
    )


def run_page(data: RunReportData, chart_list: list[NamedChart] | None = None) -> Page:
    """The run report page: run facts, verdict, findings, stage table, stragglers,
    what-if, then the charts."""
    diag = data.diagnosis
    page = Page(
        title=f"tlog report: {data.run_id}",
        subtitle="Where this run's time goes, per stage, rank and phase.",
    )
    page.add(_run_meta(data))
    page.add(el("h2", "Verdict"), el("p", diag.get("verdict") or "No verdict.", class_="verdict"))
    if diag.get("confidence"):
        reasons = "; ".join(str(r) for r in diag.get("confidence_reasons") or [])
        page.add(
            el(
                "p",
                f"Confidence: {diag['confidence']}" + (f" ({reasons})" if reasons else "") + ".",
                class_="caption",
            )
        )
    if (diag.get("device_times") is False and not diag.get("host_only")
            and not diag.get("timers_synced")):
        page.add(
            el(
                "p",
                "No device times were recorded: sync shares are an upper bound that can "
                "hide queued device compute.",
                class_="caption",
            )
        )
    page.add(el("h2", "Findings"), _findings(diag.get("findings") or []))
    page.add(el("h2", "Stages"), stage_table(diag))
    if diag.get("stragglers"):
        page.add(
            el("h3", "Stragglers"),
            _list_table(
                diag["stragglers"],
                [
                    ("stage", "stage", str),
                    ("rank", "rank", fmt.num),
                    ("kind", "kind", fmt.value),
                    ("phase", "phase differing most", fmt.value),
                    ("own_over_peers", "its time over its peers'", fmt.times),
                    ("own_s", "its time per iteration", fmt.ms),
                    ("peers_s", "peers'", fmt.ms),
                    ("speedup_if_fixed", "throughput if fixed", fmt.multiplier),
                ],
            ),
        )
    if diag.get("what_if"):
        page.add(
            el("h3", "What if"),
            _list_table(
                diag["what_if"],
                [
                    ("stage", "stage", str),
                    ("phase", "phase", str),
                    ("speedup", "throughput if removed", fmt.multiplier),
                    ("speedup_halved", "if halved", fmt.multiplier),
                    ("limited_by", "then limited by", fmt.value),
                ],
            ),
        )
    page.add(el("h2", "Charts"))
    for named in chart_list if chart_list is not None else run_charts(data):
        page.add_chart(named.block())
    if data.notes:
        page.add(el("h2", "Notes"), el("ul", [el("li", n) for n in data.notes]))
    return page


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_run_report` / :func:`reports.compare_report.write_compare_report` wrote."""

    html: Path
    images: tuple[Path, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary: ``{"html": path, "images": [paths]}``."""
        return {"html": str(self.html), "images": [str(p) for p in self.images]}


def default_report_path(name: str, base: Path | None = None) -> Path:
    """``./tlog-reports/<name>/index.html``, with ``name`` made safe as one folder name."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).strip(".") or "run"
    return (base if base is not None else Path.cwd()) / "tlog-reports" / safe / "index.html"


def write_run_report(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    path: str | Path | None = None,
    *,
    image_formats: Iterable[str] = (),
    bins: int = charts.DEFAULT_BINS,
    diagnosis: Any | None = None,
) -> ReportFiles:
    """Write the run report of ``run_id`` to ``path`` (default :func:`default_report_path`).

    Args:
        con: the tlog database.
        run_id: the run.
        path: the HTML file to write (parent folders are created).
        image_formats: also write each chart as ``"png"`` and/or ``"svg"`` beside the HTML.
        bins: most bins per stage in the timeline.
        diagnosis: an ``analyze.Diagnosis`` of the run already made, reused
            (with its ``analysis``) instead of analysing the run again.

    Raises:
        RunNotFoundError: no such run.
        UsageError: an unknown image format.
        ReportWriteError: the file cannot be written.
    """
    from tlog.reports.export import check_format

    formats = [check_format(f) for f in image_formats]
    data = load_report_data(con, run_id, diagnosis=diagnosis)
    return write_report_of(data, path, image_formats=formats, bins=bins)


def write_report_of(data: RunReportData, path: str | Path | None = None, *,
                    image_formats: Iterable[str] = (),
                    bins: int = charts.DEFAULT_BINS) -> ReportFiles:
    """Write the run report of ``data`` (:func:`tlog.reports.data.load_report_data`)
    to ``path`` (default :func:`default_report_path` of its run); as
    :func:`write_run_report` without the database.

    Raises:
        UsageError: an unknown image format. ReportWriteError: the file cannot be written.
    """
    from tlog.reports.export import check_format, export_charts, write_page

    formats = [check_format(f) for f in image_formats]
    chart_list = run_charts(data, bins=bins)
    out = Path(path) if path is not None else default_report_path(data.run_id)
    html_path = write_page(run_page(data, chart_list), out)
    images = [p for f in formats for p in export_charts(chart_list, html_path.parent, f)]
    return ReportFiles(html=html_path, images=tuple(images))
