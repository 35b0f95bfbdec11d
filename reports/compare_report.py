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
from tlog.analyze import text as fmt
from tlog.reports import charts
from tlog.reports.html import Page, el, table
from tlog.reports.run_report import NamedChart, ReportFiles, default_report_path, stage_table

from dflash_runtime.format import CATEGORIES


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
    con: duckdb.DuckDBPyConnection, baseline: str, candidate: str, *, comparison: Any | None = None
) -> CompareReportData:
    """Run the compare engine (which diagnoses both runs) and gather what the page shows.

    Args:
        con: the tlog database (read-only is enough).
        baseline, candidate: run ids.
        comparison: an ``analyze.compare.Comparison`` of these two runs already
            made (e.g. by ``tlog compare --report``): reused, not recomputed.

    Raises:
        RunNotFoundError: either run is missing.
        UsageError: both ids name the same run.
    """
    from tlog.analyze import diagnose
    from tlog.analyze.compare import compare

    cmp = comparison if comparison is not None else compare(con, baseline, candidate)
    diags = {}
    frames = []
    for label, run_id in (("baseline", cmp.baseline), ("candidate", cmp.candidate)):
        diag = (cmp.diagnoses or {}).get(label)
        if diag is None or diag.analysis is None:
            diag = diagnose(con, run_id)
        diags[label] = diag.to_dict()
        frames.append(breakdown_frame(label, run_id, diag.analysis.iteration_frame()))
    return CompareReportData(
        comparison=cmp.to_dict(),
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
                "Change in milliseconds per iteration of each phase, candidate minus baseline, "
                "in the compare engine's order (most of the gap first): right = slower, left = "
                "faster. Each label ends with the phase's share of its stage's gap.",
                charts.contribution_chart(contributors),
            )
        )
    if data.breakdown.height:
        out.append(
            NamedChart(
                "breakdown",
                "Both runs side by side",
                "Mean milliseconds per steady iteration in each category, per stage, baseline "
                "above candidate.",
                charts.breakdown_comparison_chart(data.breakdown),
            )
        )
    return out


def _change_text(cmp: dict[str, Any]) -> str:
    ratio = cmp.get("throughput_ratio")
    unit = cmp.get("unit") or "throughput"
    if not isinstance(ratio, int | float):
        return "throughput not comparable (the runs report no common unit)"
    if ratio == 1:
        return f"{fmt.times(ratio)} of the baseline in {unit} (no change)"
    direction = "faster" if ratio > 1 else "slower"
    return f"{fmt.times(ratio)} of the baseline in {unit} ({fmt.pct(abs(ratio - 1))} {direction})"


def compare_page(data: CompareReportData, chart_list: list[NamedChart] | None = None) -> Page:
    """The comparison page: the engine's sentence and figures, both verdicts, stage
    changes, contributors, charts, and both runs' stage tables."""
    cmp = data.comparison
    base, cand = cmp.get("baseline"), cmp.get("candidate")
    page = Page(
        title=f"tlog comparison: {cand} vs {base}",
        subtitle="What changed between a baseline and a candidate run, phase by phase.",
    )
    sig = cmp.get("significance") or {}
    significant = cmp.get("significant")
    sig_text = (
        "beyond run-to-run noise"
        if significant
        else "within run-to-run noise"
        if significant is False
        else "significance unknown"
    )
    facts = [
        ("baseline", base),
        ("candidate", cand),
        ("throughput", _change_text(cmp)),
        ("significance", f"{sig_text}" + (f": {sig['reason']}" if sig.get("reason") else "")),
    ]
    choice = cmp.get("baseline_choice")
    if choice:
        facts.append(("baseline chosen", fmt.value(choice)))
    page.add(el("dl", [[el("dt", k), el("dd", v)] for k, v in facts], class_="meta"))
    page.add(el("h2", "Verdict"), el("p", cmp.get("verdict") or "–", class_="verdict"))
    page.add(
        el("h3", "Each run's own verdict"),
        el("p", el("strong", "Baseline: "), data.baseline.get("verdict") or "–"),
        el("p", el("strong", "Candidate: "), data.candidate.get("verdict") or "–"),
    )
    stages = cmp.get("stages") or []
    if stages:
        page.add(
            el("h2", "Stages"),
            table(
                ["stage", "baseline per iteration", "candidate per iteration", "change"],
                [
                    [
                        s.get("stage") + (" (bottleneck)" if s.get("bottleneck") else ""),
                        fmt.ms(s.get("baseline_s_per_iter")),
                        fmt.ms(s.get("candidate_s_per_iter")),
                        fmt.signed_ms(s.get("delta_s_per_iter")),
                    ]
                    for s in stages
                ],
                numeric=(1, 2, 3),
            ),
        )
    contributors = cmp.get("contributors") or []
    page.add(el("h2", "Contributors"))
    if contributors:
        shown = contributors[: charts.MAX_CONTRIBUTORS]
        page.add(
            table(
                [
                    "stage",
                    "phase",
                    "category",
                    "baseline",
                    "candidate",
                    "change per iteration",
                    "share of the stage's gap",
                ],
                [
                    [
                        c.get("stage"),
                        c.get("phase"),
                        c.get("category"),
                        fmt.ms(c.get("baseline_s_per_iter")),
                        fmt.ms(c.get("candidate_s_per_iter")),
                        fmt.signed_ms(c.get("delta_s_per_iter")),
                        fmt.pct(c.get("share_of_gap")),
                    ]
                    for c in shown
                ],
                numeric=(3, 4, 5, 6),
                caption=(
                    f"The first {len(shown)} of {len(contributors)}, in the compare engine's order."
                    if len(contributors) > len(shown)
                    else None
                ),
            )
        )
    else:
        page.add(el("p", "No phase changed."))
    page.add(el("h2", "Charts"))
    for named in chart_list if chart_list is not None else compare_charts(data):
        page.add_chart(named.block())
    page.add(
        el("h2", "Each run's stages"),
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
    comparison: Any | None = None,
) -> ReportFiles:
    """Write the comparison report to ``path`` (default
    ``./tlog-reports/<candidate>-vs-<baseline>/index.html``).

    Args:
        con: the tlog database (read-only is enough).
        baseline, candidate: run ids.
        path: the HTML file to write (parent folders are created).
        image_formats: also write each chart as ``"png"`` and/or ``"svg"`` beside the HTML.
        comparison: an ``analyze.compare.Comparison`` of these runs already made
            (``tlog compare --report``), reused instead of comparing again.

    Raises:
        RunNotFoundError: either run is missing.
        UsageError: an unknown image format, or both ids name the same run.
        ReportWriteError: the file cannot be written.
    """
    from tlog.reports.export import check_format

    formats = [check_format(f) for f in image_formats]
    data = load_compare_data(con, baseline, candidate, comparison=comparison)
    return write_compare_report_of(data, path, image_formats=formats)


def write_compare_report_of(data: CompareReportData, path: str | Path | None = None, *,
                            image_formats: Iterable[str] = ()) -> ReportFiles:
    """Write the comparison report of ``data`` (:func:`load_compare_data`) to
    ``path``; as :func:`write_compare_report` without the database.

    Raises:
        UsageError: an unknown image format. ReportWriteError: the file cannot be written.
    """
    from tlog.reports.export import check_format, export_charts, write_page

    formats = [check_format(f) for f in image_formats]
    chart_list = compare_charts(data)
    c = data.comparison
    out = Path(path) if path is not None else default_report_path(
        f"{c['candidate']}-vs-{c['baseline']}")
    html_path = write_page(compare_page(data, chart_list), out)
    images = [p for f in formats for p in export_charts(chart_list, html_path.parent, f)]
    return ReportFiles(html=html_path, images=tuple(images))
