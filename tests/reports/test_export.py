"""``reports.export``: the page and chart images written, and the write errors
said in one line."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import polars as pl
import pytest
from tlog.ingest.errors import UsageError
from tlog.reports.export import (
    ReportWriteError,
    chart_image,
    check_format,
    export_charts,
    write_page,
)
from tlog.reports.html import Page
from tlog.reports.run_report import NamedChart


def _chart() -> alt.Chart:
    return alt.Chart(pl.DataFrame({"x": [1, 2], "y": [3, 4]})).mark_bar().encode(x="x:Q",
                                                                                 y="y:Q")


def test_check_format() -> None:
    assert check_format("SVG") == "svg" and check_format("png") == "png"
    with pytest.raises(UsageError, match="unknown image format 'gif': use one of png, svg"):
        check_format("gif")


def test_chart_images(tmp_path: Path) -> None:
    spec = _chart().to_dict()
    svg = chart_image(spec, "svg")
    assert svg.startswith("<svg") and "</svg>" in svg
    png = chart_image(spec, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    paths = export_charts([NamedChart("bars", "Bars", "two bars", _chart())], tmp_path / "img",
                          "svg")
    assert paths == [tmp_path / "img" / "bars.svg"]
    assert paths[0].read_text().startswith("<svg")


def test_write_page_and_its_errors(tmp_path: Path) -> None:
    page = Page(title="t <1>")
    out = write_page(page, tmp_path / "a" / "b" / "index.html")      # folders made
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<title>t &lt;1&gt;</title>" in text
    (tmp_path / "dir").mkdir()
    with pytest.raises(ReportWriteError, match="it is a folder; give a file name such as"):
        write_page(page, tmp_path / "dir")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ReportWriteError, match="cannot write .*file/sub/x.html: Not a directory"):
        write_page(page, tmp_path / "file" / "sub" / "x.html")
