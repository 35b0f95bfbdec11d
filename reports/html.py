"""The HTML writer: one self-contained, offline page with text and Vega-Lite charts.

Everything that comes from logs (run ids, phase names, stage names, tags,
finding messages) is escaped. The page is built from :class:`Markup` values:
plain ``str`` is always escaped by :func:`el` and :func:`escape`, and only
markup this module built itself is trusted, so a phase named
``<script>alert(1)</script>`` shows as that text.

Chart specifications travel as JSON inside one
``<script type="application/json">`` element; :func:`json_for_script` escapes
``<``, ``>`` and ``&`` (as ``\\u003c`` ...) so no value can close the element
or open a comment. The Vega libraries are inlined (:mod:`reports.bundle`).
A Content-Security-Policy ``<meta>`` allows only this page's own scripts
(by nonce), ``data:``/``blob:`` images and no network at all, so even a
successful injection could neither run nor fetch anything.

The page's own script embeds each chart with ``vegaEmbed`` (SVG renderer),
shows any failure as text in place of the chart, and publishes the outcome on
``window.tlogStatus`` (``done``, ``errors``, per-chart ``width``/``height``/
``marks``, ``renderMs``) for the browser tests (tests/support/browser.py) and
for anyone curious.
"""

from __future__ import annotations

import html
import json
import math
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tlog.reports.bundle import javascript_bundle


class Markup(str):
    """A string of trusted HTML (built by this module); never escaped again."""

    __slots__ = ()

    def __add__(self, other: str) -> Markup:
        return Markup(str.__add__(self, escape(other)))


Child = str | Markup | int | float | None | Iterable["Child"]


def escape(value: Any) -> Markup:
    """Escape ``value`` for HTML text or a quoted attribute (``& < > " '``).

    :class:`Markup` passes through unchanged; ``None`` becomes empty.
    """
    if isinstance(value, Markup):
        return value
    if value is None:
        return Markup("")
    return Markup(html.escape(str(value), quote=True))


def _children(children: Iterable[Child]) -> str:
    out: list[str] = []
    for child in children:
        if child is None:
            continue
        if isinstance(child, str | int | float):
            out.append(escape(child))
        else:
            out.append(_children(child))
    return "".join(out)


_VOID = frozenset({"br", "hr", "meta", "img", "input", "link", "col", "wbr"})


def el(tag: str, *children: Child, **attrs: Any) -> Markup:
    """One element: ``el("td", name, class_="num")`` -> ``<td class="num">...</td>``.

    Text children and attribute values are escaped; a trailing ``_`` is taken
    off attribute names (``class_``) and ``_`` inside them becomes ``-``
    (``data_chart`` -> ``data-chart``). ``None``/``False`` attributes are left
    out, ``True`` ones written bare. ``tag`` and attribute names come from code,
    never from data.
    """
    parts = [tag]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        parts.append(name if value is True else f'{name}="{escape(value)}"')
    open_tag = "<" + " ".join(parts) + ">"
    if tag in _VOID:
        return Markup(open_tag)
    return Markup(f"{open_tag}{_children(children)}</{tag}>")


def join(parts: Iterable[Child], sep: str = "") -> Markup:
    """Concatenate children (escaping text) with an escaped separator."""
    return Markup(escape(sep).join(_children([p]) for p in parts))


_JSON_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def _finite(obj: Any) -> Any:
    """Replace NaN/inf (not JSON) by ``None`` throughout ``obj``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def json_for_script(obj: Any) -> str:
    """JSON text safe inside a ``<script>`` element.

    ``<``, ``>``, ``&`` and the JavaScript line separators U+2028/U+2029 are
    written as ``\\uXXXX`` escapes (the same string once parsed), so the text
    can hold neither ``</script>`` nor ``<!--`` whatever the data holds.
    Non-finite floats become ``null``; other non-JSON values their ``str``.
    """
    text = json.dumps(
        _finite(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
    )
    return text.translate(_JSON_ESCAPES)


@dataclass(frozen=True)
class ChartBlock:
    """One chart in a report: its heading, a one-line reading guide, and its spec.

    Attributes:
        key: a short identifier made of ``[a-z0-9_-]`` (from code, e.g. ``"timeline"``);
            also the PNG/SVG export file name.
        title: heading shown above the chart (escaped).
        caption: how to read the chart (escaped).
        spec: the Vega-Lite specification (``altair.Chart.to_dict()``).
    """

    key: str
    title: str
    caption: str
    spec: dict[str, Any]


@dataclass
class Page:
    """A report page: title, body sections of :class:`Markup`, and charts.

    Build it with :meth:`add` (text) and :meth:`add_chart`; :meth:`render`
    gives the HTML text, :meth:`write` writes it.
    """

    title: str
    subtitle: str = ""
    parts: list[Markup] = field(default_factory=list)
    charts: list[ChartBlock] = field(default_factory=list)

    def add(self, *children: Child) -> None:
        """Append body content (text is escaped)."""
        self.parts.append(Markup(_children(children)))

    def add_chart(self, block: ChartBlock) -> None:
        """Append a chart (heading, caption, container) at this point of the body."""
        if not block.key or not all(c.isalnum() or c in "_-" for c in block.key):
            msg = f"chart key {block.key!r} must be made of letters, digits, '_' and '-'"
            raise ValueError(msg)
        if any(c.key == block.key for c in self.charts):
            msg = f"chart key {block.key!r} is used twice"
            raise ValueError(msg)
        self.charts.append(block)
        self.parts.append(
            el(
                "section",
                el("h3", block.title),
                el("p", block.caption, class_="caption"),
                el(
                    "div",
                    el("noscript", "Charts need JavaScript."),
                    class_="tlog-chart",
                    id=f"chart-{block.key}",
                    data_chart=block.key,
                ),
                class_="chart",
            )
        )

    def render(self, *, generated: datetime | None = None) -> str:
        """The whole page as HTML text (UTF-8; the Vega bundle inlined)."""
        nonce = secrets.token_urlsafe(18)
        when = (generated or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
        specs = {c.key: c.spec for c in self.charts}
        csp = (
            f"default-src 'none'; script-src 'nonce-{nonce}' 'unsafe-eval'; "
            "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; "
            "connect-src 'none'; base-uri 'none'; form-action 'none'"
        )
        head = Markup("").join(
            [
                Markup('<meta charset="utf-8">'),
                el("meta", http_equiv="Content-Security-Policy", content=csp),
                el("meta", name="viewport", content="width=device-width, initial-scale=1"),
                el("meta", name="generator", content="tlog"),
                el("title", self.title),
                Markup(f"<style>{_CSS}</style>"),
            ]
        )
        body = Markup("").join(
            [
                el(
                    "header",
                    el("h1", self.title),
                    el("p", self.subtitle, class_="subtitle") if self.subtitle else None,
                ),
                el("main", *self.parts),
                el(
                    "footer",
                    f"Generated by tlog on {when}. This page is self-contained and works offline.",
                ),
            ]
        )
        scripts = (
            f'<script type="application/json" id="tlog-specs">{json_for_script(specs)}</script>\n'
            f'<script nonce="{nonce}">{javascript_bundle()}</script>\n'
            f'<script nonce="{nonce}">{_EMBED_JS}</script>\n'
        )
        return (
            f'<!DOCTYPE html>\n<html lang="en">\n<head>{head}</head>\n'
            f"<body>{body}\n{scripts}</body>\n</html>\n"
        )

    def write(self, path: str | Path) -> Path:
        """Write the page to ``path`` (parent folders created); returns the path."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.render(), encoding="utf-8")
        return out


def table(
    header: list[Child],
    rows: Iterable[list[Child]],
    *,
    numeric: Iterable[int] = (),
    caption: str | None = None,
) -> Markup:
    """An HTML table; columns whose index is in ``numeric`` are right-aligned."""
    num = set(numeric)
    head = el("tr", [el("th", h, class_="num" if i in num else None) for i, h in enumerate(header)])
    body = [
        el("tr", [el("td", c, class_="num" if i in num else None) for i, c in enumerate(row)])
        for row in rows
    ]
    return el(
        "table", el("caption", caption) if caption else None, el("thead", head), el("tbody", body)
    )


_CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#fff;--soft:#f6f8fa;
--starvation:#e45756;--backpressure:#f58518;--compute:#4c78a8;--sync:#b279a2;--unaccounted:#9d9d9d}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header,main,footer{max-width:1200px;margin:0 auto;padding:0 24px}
header{padding-top:20px}
h1{font-size:22px;margin:0 0 4px;overflow-wrap:anywhere}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
h3{font-size:15px;margin:20px 0 2px}
.subtitle,.caption,footer{color:var(--muted)}
.caption{margin:0 0 8px}
footer{font-size:12px;padding:24px;border-top:1px solid var(--line);margin-top:32px}
.verdict{font-size:17px;font-weight:600;background:var(--soft);border-left:4px solid var(--compute);
padding:10px 14px;margin:12px 0;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:8px 0 16px;font-variant-numeric:tabular-nums}
caption{text-align:left;color:var(--muted);padding-bottom:4px}
th,td{border-bottom:1px solid var(--line);padding:4px 10px;text-align:left;vertical-align:top}
td{overflow-wrap:break-word}
th{background:var(--soft);font-weight:600;white-space:nowrap}
.num{text-align:right}
ul.findings{list-style:none;padding:0}
ul.findings li{margin:6px 0;padding:6px 10px;border-left:4px solid var(--line);background:var(--soft)}
.sev{display:inline-block;min-width:64px;font-size:12px;font-weight:600;text-transform:uppercase}
.sev-critical,.sev-error{color:#b42318}.sev-warning{color:#9a6700}.sev-info{color:var(--muted)}
.evidence{color:var(--muted);font-size:12px;overflow-wrap:anywhere}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:8px 0}
dl.meta dt{color:var(--muted)}dl.meta dd{margin:0;overflow-wrap:anywhere}
.tlog-chart{min-height:40px;overflow-x:auto}
.chart-error{color:#b42318;font-weight:600}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
"""

# The page's own script: embeds every chart and records what happened in
# window.tlogStatus (read by tests/support/browser.py and shown as text on failure).
_EMBED_JS = r"""
(function () {
  "use strict";
  var t0 = performance.now();
  var status = {done: false, errors: [], charts: {}, renderMs: null};
  window.tlogStatus = status;
  window.addEventListener("error", function (e) { status.errors.push(String(e.message || e)); });
  window.addEventListener("unhandledrejection", function (e) { status.errors.push(String(e.reason)); });
  function fail(box, key, err) {
    var msg = "Chart '" + key + "' could not be drawn: " + (err && err.message ? err.message : String(err));
    status.errors.push(msg);
    var p = document.createElement("p");
    p.className = "chart-error";
    p.textContent = msg;
    box.replaceChildren(p);
  }
  function measure(box, key) {
    var svg = box.querySelector("svg");
    var r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    var marks = box.querySelectorAll("g.role-mark > *:not(g)").length;
    status.charts[key] = {width: r.width, height: r.height, marks: marks};
  }
  var specs;
  try {
    specs = JSON.parse(document.getElementById("tlog-specs").textContent);
  } catch (err) {
    status.errors.push("chart specifications unreadable: " + err);
    status.done = true;
    return;
  }
  if (typeof vegaEmbed !== "function") {
    status.errors.push("the inlined Vega libraries did not load");
    status.done = true;
    return;
  }
  var boxes = Array.prototype.slice.call(document.querySelectorAll("div.tlog-chart"));
  var jobs = boxes.map(function (box) {
    var key = box.getAttribute("data-chart");
    var spec = specs[key];
    if (!spec) { fail(box, key, "no specification"); return Promise.resolve(); }
    var opts = {renderer: "svg", mode: "vega-lite",
                actions: {export: true, source: false, compiled: false, editor: false},
                downloadFileName: key};
    return vegaEmbed(box, spec, opts)
      .then(function () { measure(box, key); })
      .catch(function (err) { fail(box, key, err); });
  });
  Promise.all(jobs).then(function () {
    status.renderMs = performance.now() - t0;
    status.done = true;
    document.documentElement.setAttribute("data-tlog-rendered", status.errors.length ? "error" : "ok");
  });
})();
"""
