"""Writing reports to disk: the HTML page, and each chart as PNG or SVG (vl-convert).

PNG and SVG are rendered by ``vl_convert`` (Vega in a bundled JavaScript
runtime, no browser and no network), with the same Vega-Lite version as the
page (:data:`reports.bundle.VEGALITE_VERSION`). PNGs are drawn at
:data:`PNG_SCALE` times the chart's size, sharp on slides.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import vl_convert as vlc
from tlog.ingest.errors import TlogError, UsageError
from tlog.reports.bundle import VEGALITE_VERSION
from tlog.reports.charts import spec
from tlog.reports.html import Page

if TYPE_CHECKING:
    from tlog.reports.run_report import NamedChart

#: Image formats :func:`export_charts` writes.
IMAGE_FORMATS = ("png", "svg")
#: PNG pixel density (2 = "retina"; a 860-pixel-wide chart becomes 1,720 pixels).
PNG_SCALE = 2.0


class ReportWriteError(TlogError):
    """A report file cannot be written (folder not writable, disk full, path is a folder)."""


def check_format(image_format: str) -> str:
    """Return ``image_format`` lower-cased, or raise :class:`UsageError` if unknown."""
    fmt = image_format.lower()
    if fmt not in IMAGE_FORMATS:
        msg = f"unknown image format {image_format!r}: use one of {', '.join(IMAGE_FORMATS)}"
        raise UsageError(msg)
    return fmt


def _write(path: Path, data: str | bytes) -> Path:
    try:
        if path.exists() and path.is_dir():
            msg = (
                f"cannot write the report to {path}: it is a folder; "
                f"give a file name such as {path / 'index.html'}"
            )
            raise ReportWriteError(msg)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    except OSError as exc:
        msg = f"cannot write {path}: {exc.strerror or exc}"
        raise ReportWriteError(msg) from exc
    return path


def write_page(page: Page, path: str | Path) -> Path:
    """Render ``page`` and write it to ``path``; returns the path.

    Raises:
        ReportWriteError: the file cannot be written.
    """
    return _write(Path(path), page.render())


def chart_image(spec: dict, image_format: str) -> str | bytes:
    """One Vega-Lite spec as SVG text or PNG bytes (vl-convert; no browser, no network)."""
    fmt = check_format(image_format)
    if fmt == "svg":
        return vlc.vegalite_to_svg(spec, vl_version=VEGALITE_VERSION)
    return vlc.vegalite_to_png(spec, vl_version=VEGALITE_VERSION, scale=PNG_SCALE)


def export_charts(
    chart_list: Iterable[NamedChart], folder: str | Path, image_format: str
) -> list[Path]:
    """Write each chart as ``<folder>/<key>.<format>``; returns the paths written.

    Raises:
        UsageError: unknown format.
        ReportWriteError: a file cannot be written.
    """
    fmt = check_format(image_format)
    out = []
    for named in chart_list:
        image = chart_image(spec(named.chart), fmt)
        out.append(_write(Path(folder) / f"{named.key}.{fmt}", image))
    return out
