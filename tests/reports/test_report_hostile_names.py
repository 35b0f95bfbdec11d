"""Charts survive any string: hostile stage, phase, queue and event names.

A name from a log reaches a chart as data, as an axis label, in a tooltip and
in a title. Vega-Lite compiles a sort given as a list of names into a Vega
expression, whose parser rejects U+2028 and U+2029 inside string literals
(JSON leaves them unescaped); a name used as a field name would need ``.``,
``[``, ``]`` and ``\\`` escaped. The builders therefore order axes by an
integer position column and never use a name as a field. Each chart is
rendered by vl-convert (the same Vega as ``--svg``/``--png``), and the whole
report goes through the CLI with ``--svg --png``.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from tlog.reports import charts
from tlog.reports.export import chart_image

from dflash_runtime.format import CATEGORIES
from tests.support.cli import invoke

#: One hazard each: JavaScript line terminators, quotes, backslash, a closing
#: script tag, a field path's dot and brackets, a template literal, a newline.
HOSTILE = [
    "line\u2028sep",
    "para\u2029sep",
    "q'uo\"te",
    "back\\slash",
    "</script><script>alert(1)</script>",
    "dot.ted",
    "brack[0]et",
    "${alert(1)}",
    "new\nline",
]
#: All of them in one name, for the end-to-end report.
ALL_IN_ONE = "x.y[0]\\'\"</script>${1}\u2028\u2029"


def _sorts(node: object) -> list:
    """Every ``sort`` value in a spec."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "sort"] + [
            s for v in node.values() for s in _sorts(v)
        ]
    if isinstance(node, list):
        return [s for v in node for s in _sorts(v)]
    return []


def _svg_ok(spec: dict) -> str:
    """Render ``spec`` to SVG (raises on a Vega parse error) and check it is XML;
    no axis is sorted by a list of names from the log (only the fixed categories)."""
    for sort in _sorts(spec):
        assert isinstance(sort, dict) or set(sort) <= set(CATEGORIES), sort
    svg = chart_image(spec, "svg")
    ET.fromstring(svg)  # well-formed: every name was escaped
    return svg


def _phases_frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "stage": [HOSTILE[0]] * (2 * len(HOSTILE)),
            "rank": [r for r in (0, 1) for _ in HOSTILE],
            "phase": HOSTILE * 2,
            "seconds_per_iter": [0.001 * (i + 1) for _ in (0, 1) for i in range(len(HOSTILE))],
        }
    )


def test_heatmap_and_top_phases_with_hostile_names_render() -> None:
    heat = charts.spec(charts.rank_phase_heatmap(_phases_frame(), max_phases=len(HOSTILE)))
    _svg_ok(heat)
    # Largest first: the last name has the most time.
    axis = heat["vconcat"][0]["layer"][0]["encoding"]["x"]
    assert axis["sort"]["field"] == charts.POSITION
    rows = [r for values in heat["datasets"].values() for r in values]
    order = sorted({(r[charts.POSITION], r["phase"]) for r in rows})
    assert [p for _, p in order] == HOSTILE[::-1]
    top = pl.DataFrame(
        {
            "stage": ["s.t[1]"] * len(HOSTILE),
            "phase": HOSTILE,
            "category": ["compute"] * len(HOSTILE),
            "mean_s": [0.01] * len(HOSTILE),
            "p50_s": [0.01] * len(HOSTILE),
            "p95_s": [0.02] * len(HOSTILE),
        }
    )
    _svg_ok(charts.spec(charts.top_phases_chart(top)))


def test_timeline_share_and_queue_charts_with_hostile_names_render() -> None:
    n = 6
    iters = pl.DataFrame(
        {
            "stage": [HOSTILE[i % 3] for i in range(3 * n)],
            "rank": [i % 3 for i in range(3 * n)],
            "iter": [i // 3 for i in range(3 * n)],
            "dur": [0.1] * (3 * n),
            "steady": [True] * (3 * n),
        }
    ).with_columns(
        compute_s=pl.lit(0.06),
        starvation_s=pl.lit(0.04),
        backpressure_s=pl.lit(0.0),
        sync_s=pl.lit(0.0),
        unaccounted_s=pl.lit(0.0),
    )
    _svg_ok(charts.spec(charts.timeline_chart(iters, bins=3)))
    shares = pl.DataFrame(
        {
            "stage": [s for s in HOSTILE for _ in (0, 1)],
            "rank": [None, 1] * len(HOSTILE),
            "category": ["compute"] * (2 * len(HOSTILE)),
            "share": [1.0] * (2 * len(HOSTILE)),
        }
    )
    _svg_ok(charts.spec(charts.category_share_chart(shares)))
    queue = pl.DataFrame(
        {
            "name": [q for q in HOSTILE for _ in range(3)],
            "ts": [100.0 + t for _ in HOSTILE for t in range(3)],
            "depth": [1, 2, 3] * len(HOSTILE),
            "capacity": [8] * (3 * len(HOSTILE)),
        }
    )
    events = pl.DataFrame(
        {"name": HOSTILE, "ts": [100.5] * len(HOSTILE), "dur": [0.5] * len(HOSTILE)}
    )
    _svg_ok(charts.spec(charts.queue_chart(queue, events, t0=100.0)))


def test_comparison_charts_with_hostile_names_render() -> None:
    contributors = pl.DataFrame(
        {
            "stage": HOSTILE,
            "phase": HOSTILE[::-1],
            "category": ["compute"] * len(HOSTILE),
            "delta_s_per_iter": [0.001 * (i - 4) for i in range(len(HOSTILE))],
            "share_of_gap": [0.1] * len(HOSTILE),
        }
    )
    _svg_ok(charts.spec(charts.contribution_chart(contributors)))
    breakdown = pl.DataFrame(
        {
            "run": [r for r in ("base\u2028line", "cand.[x]") for _ in HOSTILE],
            "stage": HOSTILE * 2,
            "category": ["compute"] * (2 * len(HOSTILE)),
            "seconds_per_iter": [0.05] * (2 * len(HOSTILE)),
        }
    )
    _svg_ok(charts.spec(charts.breakdown_comparison_chart(breakdown)))


class _Scripts(HTMLParser):
    """Collects the page's elements and the text of each <script> element."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict, str]] = []
        self._in: dict | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "script":
            self._in = dict(attrs)
            self.scripts.append((self._in, ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)


@pytest.mark.parametrize("name", [ALL_IN_ONE, "line\u2028sep"])
def test_report_with_a_hostile_phase_name_writes_page_svg_and_png(
    scenario_db, tmp_path: Path, name: str
) -> None:
    con, _ = scenario_db(drafter_phase=name)
    db = Path(
        con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchall()[0][0]
    )
    con.close()
    out = tmp_path / "out" / "r.html"
    result = invoke(
        ["report", "--run", "two-stage", "--db", str(db), "-o", str(out), "--svg", "--png",
         "--json"],
    )
    assert result.exit_code == 0, result.output
    images = sorted(Path(p).name for p in json.loads(result.output)["images"])
    keys = ["queues", "rank-phase", "shares", "timeline", "top-phases"]
    assert images == sorted([f"{k}.png" for k in keys] + [f"{k}.svg" for k in keys])
    for key in keys:
        assert (out.parent / f"{key}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        ET.fromstring((out.parent / f"{key}.svg").read_text(encoding="utf-8"))
    html = out.read_text(encoding="utf-8")
    # The writer's three script elements and no other; the name never closes one.
    parser = _Scripts()
    parser.feed(html)
    assert len(parser.scripts) == 3
    assert len(re.findall(r"<script", html, re.IGNORECASE)) == 3
    specs = next(json.loads(t) for a, t in parser.scripts if a.get("id") == "tlog-specs")
    values = json.dumps(specs, ensure_ascii=False)
    assert json.dumps(name, ensure_ascii=False)[1:-1] in values
    # The phase is in the heatmap's data, 30 ms per iteration, and in the top
    # phases' unless its "/" makes it a child phase (docs/FORMAT.md: "a/b").
    for key in ("rank-phase", "top-phases") if "/" not in name else ("rank-phase",):
        rows = [r for vs in specs[key]["datasets"].values() for r in vs if r.get("phase") == name]
        assert rows, key
        assert all(abs(r.get("ms", r.get("mean_ms")) - 30.0) < 1e-6 for r in rows), rows
