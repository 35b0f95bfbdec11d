"""Reports: Altair chart builders and a self-contained, offline HTML report.

Library API (the CLI's ``tlog report`` is a thin face over it):

- chart builders (:mod:`reports.charts`), polars frames in, Altair charts out,
  usable in Jupyter: :func:`timeline_chart`, :func:`category_share_chart`,
  :func:`rank_phase_heatmap`, :func:`queue_chart`, :func:`top_phases_chart`,
  :func:`contribution_chart`, :func:`breakdown_comparison_chart`;
- run and comparison reports: :func:`write_run_report`,
  :func:`write_compare_report` (HTML, optionally PNG/SVG per chart), and the
  pieces they are made of (:func:`load_report_data`, :func:`run_charts`,
  :func:`run_page`, ...);
- the HTML writer (:mod:`reports.html`), which escapes everything from logs.

Reports read analyze's results; they never attribute time themselves.
See docs/REPORTS.md.
"""

from tlog.reports.charts import (
    breakdown_comparison_chart,
    category_share_chart,
    contribution_chart,
    queue_chart,
    rank_phase_heatmap,
    timeline_chart,
    top_phases_chart,
)
from tlog.reports.compare_report import (
    CompareReportData,
    compare_charts,
    compare_page,
    load_compare_data,
    write_compare_report,
)
from tlog.reports.data import RunReportData, load_report_data
from tlog.reports.export import ReportWriteError, export_charts
from tlog.reports.run_report import (
    NamedChart,
    ReportFiles,
    default_report_path,
    run_charts,
    run_page,
    write_run_report,
)

__all__ = [
    "CompareReportData",
    "NamedChart",
    "ReportFiles",
    "ReportWriteError",
    "RunReportData",
    "breakdown_comparison_chart",
    "category_share_chart",
    "compare_charts",
    "compare_page",
    "contribution_chart",
    "default_report_path",
    "export_charts",
    "load_compare_data",
    "load_report_data",
    "queue_chart",
    "rank_phase_heatmap",
    "run_charts",
    "run_page",
    "timeline_chart",
    "top_phases_chart",
    "write_compare_report",
    "write_run_report",
]
