"""The comparison report: what changed between a baseline and a candidate run.

It shows the compare engine's answer (:mod:`analyze.compare`): the throughput
ratio, whether the change is beyond run-to-run noise, each phase's
contribution to the gap as a diverging bar chart and a table, and both runs'
time per iteration by category side by side, with each run's verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from ingest.categories import CATEGORIES
from reports import charts
from reports import format as fmt
from reports.html import Page, el, table
from reports.run_report import NamedChart, ReportFiles, default_report_path, stage_table


@dataclass
class CompareReportData:
    """Everything a comparison report shows.

    Attributes:
        comparison: the compare engine's result as a dict: ``baseline``,
            ``candidate`` (run ids), ``throughput_ratio`` (candidate/baseline),
            ``significant`` (bool), ``contributors`` [{``stage``, ``phase``,
            ``category``, ``delta_s_per_iter``, ``share_of_gap``}], in its order.
        baseline, candidate: each run's diagnosis dict (``tlog diagnose --json``).
        breakdown: ``run`` ("baseline"/"candidate"), ``run_id``, ``stage``,
            ``category``, ``seconds_per_iter`` (mean attributed seconds per
            steady iteration).
    """

    comparison: dict[str, Any]
    baseline: dict[str, Any]
    candidate: dict[str, Any]
    breakdown: pl.DataFrame


def breakdown_frame(label: str, run_id: str, iterations: pl.DataFrame) -> pl.DataFrame:
    """Mean attributed seconds per steady iteration by stage and category of one run.

    Args:
        label: ``"baseline"`` or ``"candidate"``.
        run_id: the run.
        iterations: analyze's attributed iteration frame (``stage``, ``steady``,
            ``<category>_s``).
    """
    cols = [f"{c}_s" for c in CATEGORIES]
    means = (
        iterations.filter(pl.col("steady"))
        .group_by("stage", maintain_order=True)
        .agg(*[pl.col(c).mean() for c in cols])
    )
    return (
        means.unpivot(
            index="stage", on=cols, variable_name="category", value_name="seconds_per_iter"
        )
        .with_columns(
            pl.col("category").str.strip_suffix("_s"), run=pl.lit(label), run_id=pl.lit(run_id)
        )
        .select("run", "run_id", "stage", "category", "seconds_per_iter")
    )


def load_compare_data(
    con: duckdb.DuckDBPyConnection, baseline: str, candidate: str
) -> CompareReportData:
    """Run the compare engine and both diagnoses.

    Raises:
        RunNotFoundError: either run is missing.
    """
    from analyze import attribute, diagnose_analysis, iteration_frame
    from analyze.compare import compare

    comparison = compare(con, baseline, candidate).to_dict()
    diags = {}
    frames = []
    for label, run_id in (("baseline", baseline), ("candidate", candidate)):
        analysis = attribute(con, run_id)
        diags[label] = diagnose_analysis(analysis).to_dict()
        frames.append(breakdown_frame(label, run_id, iteration_frame(analysis)))
    return CompareReportData(
        comparison=comparison,
        baseline=diags["baseline"],
        candidate=diags["candidate"],
        breakdown=pl.concat(frames),
    )


def compare_charts(data: CompareReportData) -> list[NamedChart]:
    """The comparison's charts, in page order (charts without data left out)."""
    out = []
    contributors = pl.DataFrame(
        data.comparison.get("contributors") or [],
        schema={
            "stage": pl.String,
            "phase": pl.String,
            "category": pl.String,
            "delta_s_per_iter": pl.Float64,
            "share_of_gap": pl.Float64,
        },
        strict=False,
    )
    if contributors.height:
        out.append(
            NamedChart(
                "contributions",
                "What moved",
                "Change in milliseconds per iteration of each phase, candidate minus baseline, in "
                "the "
                "compare engine's order (most of the gap first): right = slower, left = faster. "
                "The "
                "label is the phase's share of the gap.",
                charts.contribution_chart(contributors),
            )
        )
    if data.breakdown.height:
        out.append(
            NamedChart(
                "breakdown",
                "Both runs side by side",
                "Mean milliseconds per steady iteration in each category, per stage, baseline "
                "above "
                "candidate.",
                charts.breakdown_comparison_chart(data.breakdown),
            )
        )
    return out


def compare_page(data: CompareReportData, chart_list: list[NamedChart] | None = None) -> Page:
    """The comparison page: summary, both verdicts, contributors, charts, stage tables."""
    cmp = data.comparison
    base, cand = cmp.get("baseline"), cmp.get("candidate")
    page = Page(
        title=f"tlog comparison: {cand} vs {base}",
        subtitle="What changed between a baseline and a candidate run, phase by phase.",
    )
    ratio = cmp.get("throughput_ratio")
    if isinstance(ratio, int | float):
        direction = "faster" if ratio > 1 else "slower" if ratio < 1 else "as fast"
        change = f"{abs(ratio - 1):.1%} {direction}" if ratio != 1 else "no change"
    else:
        change = "throughput not comparable"
    sig = cmp.get("significant")
    sig_text = (
        "beyond run-to-run noise"
        if sig
        else "within run-to-run noise: not a real change"
        if sig is False
        else "significance unknown"
    )
    page.add(
        el(
            "dl",
            [
                [el("dt", "baseline"), el("dd", base)],
                [el("dt", "candidate"), el("dd", cand)],
                [
                    el("dt", "throughput"),
                    el("dd", f"{fmt.ratio(ratio)} of the baseline ({change}), {sig_text}"),
                ],
            ],
            class_="meta",
        )
    )
    page.add(
        el("h2", "Verdicts"),
        el("p", el("strong", "Baseline: "), data.baseline.get("verdict") or "–", class_="verdict"),
        el(
            "p", el("strong", "Candidate: "), data.candidate.get("verdict") or "–", class_="verdict"
        ),
    )
    contributors = cmp.get("contributors") or []
    page.add(el("h2", "Contributors"))
    if contributors:
        page.add(
            table(
                ["stage", "phase", "category", "change per iteration", "share of gap"],
                [
                    [
                        c.get("stage"),
                        c.get("phase"),
                        c.get("category"),
                        fmt.signed_ms(c.get("delta_s_per_iter")),
                        fmt.pct(c.get("share_of_gap")),
                    ]
                    for c in contributors[: charts.MAX_CONTRIBUTORS]
                ],
                numeric=(3, 4),
            )
        )
    else:
        page.add(el("p", "No phase changed."))
    page.add(el("h2", "Charts"))
    for named in chart_list if chart_list is not None else compare_charts(data):
        page.add_chart(named.block())
    page.add(
        el("h2", "Stages"),
        el("h3", f"Baseline {base}"),
        stage_table(data.baseline),
        el("h3", f"Candidate {cand}"),
        stage_table(data.candidate),
    )
    return page


def write_compare_report(
    con: duckdb.DuckDBPyConnection,
    baseline: str,
    candidate: str,
    path: str | Path | None = None,
    *,
    image_formats: Iterable[str] = (),
) -> ReportFiles:
    """Write the comparison report to ``path`` (default
    ``./tlog-reports/<candidate>-vs-<baseline>/index.html``).

    Raises:
        RunNotFoundError: either run is missing.
        UsageError: an unknown image format.
        ReportWriteError: the file cannot be written.
    """
    from reports.export import check_format, export_charts, write_page

    formats = [check_format(f) for f in image_formats]
    data = load_compare_data(con, baseline, candidate)
    chart_list = compare_charts(data)
    out = Path(path) if path is not None else default_report_path(f"{candidate}-vs-{baseline}")
    html_path = write_page(compare_page(data, chart_list), out)
    images = [p for f in formats for p in export_charts(chart_list, html_path.parent, f)]
    return ReportFiles(html=html_path, images=tuple(images))
