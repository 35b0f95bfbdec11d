"""The HTML writer: escaping of everything from logs, JSON inside <script>, the page shell."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from tlog.reports.bundle import javascript_bundle, script_safe_js
from tlog.reports.html import ChartBlock, Markup, Page, el, escape, join, json_for_script, table

XSS = "<script>alert(1)</script>"


def test_escape_text_and_attributes() -> None:
    assert escape(XSS) == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert escape("a\"b'c&") == "a&quot;b&#x27;c&amp;"
    assert escape(None) == ""
    assert escape(Markup("<b>ok</b>")) == "<b>ok</b>"


def test_el_escapes_children_and_attribute_values_but_not_markup() -> None:
    out = el("td", XSS, el("b", "x"), 3, None, class_='n" onmouseover="alert(1)', data_chart="k")
    assert out == (
        '<td class="n&quot; onmouseover=&quot;alert(1)" data-chart="k">'
        "&lt;script&gt;alert(1)&lt;/script&gt;<b>x</b>3</td>"
    )
    assert el("input", disabled=True, hidden=False) == "<input disabled>"
    assert join(["a<", el("i", "b")], sep=" & ") == "a&lt; &amp; <i>b</i>"


def test_markup_plus_text_escapes_the_text() -> None:
    assert Markup("<p>") + "<x>" == "<p>&lt;x&gt;"


def test_table_escapes_cells() -> None:
    out = table(["phase", "ms"], [[XSS, "1.0"]], numeric=[1])
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert '<td class="num">1.0</td>' in out
    assert "<script>" not in out


@pytest.mark.parametrize(
    "value",
    [
        XSS,
        "</SCRIPT >",
        "<!-- x",
        "-->",
        "a&b",
        "\u2028\u2029",
        "</scr" + "ipt>",
        "]]>",
    ],
)
def test_json_for_script_cannot_close_the_element(value: str) -> None:
    text = json_for_script({"k": value, value: [value]})
    lowered = text.lower()
    assert "</" not in lowered and "<!--" not in lowered and "<" not in text and ">" not in text
    assert "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == {"k": value, value: [value]}


def test_json_for_script_writes_non_finite_numbers_as_null() -> None:
    assert json.loads(json_for_script({"a": float("nan"), "b": [float("inf"), 1.5]})) == {
        "a": None,
        "b": [None, 1.5],
    }


def test_script_safe_js_neutralises_closing_tags_and_comments() -> None:
    code = 'var a = "</script><script>"; var b = /<!--/; // </SCRIPT'
    safe = script_safe_js(code)
    assert re.search(r"</script|<script|<!--", safe, re.IGNORECASE) is None
    assert safe == 'var a = "<\\/script>\\x3Cscript>"; var b = /\\x3C!--/; // <\\/SCRIPT'


def test_inlined_bundle_is_safe_and_defines_vega_embed() -> None:
    bundle = javascript_bundle()
    assert re.search(r"</script|<script|<!--", bundle, re.IGNORECASE) is None
    assert "window.vegaEmbed=" in bundle.replace(" ", "")
    assert "https://cdn" not in bundle and "unpkg.com" not in bundle


def _page() -> Page:
    page = Page(title=f"tlog report: {XSS}", subtitle=XSS)
    page.add(el("p", XSS, class_="verdict"))
    spec = {
        "data": {"values": [{"phase": XSS, "note": "</script><!--"}]},
        "mark": "bar",
        "encoding": {"y": {"field": "phase", "type": "nominal"}},
    }
    page.add_chart(ChartBlock("top-phases", XSS, XSS, spec))
    return page


def test_page_escapes_everything_from_logs() -> None:
    html = _page().render()
    # The only <script elements are the writer's own three.
    assert len(re.findall(r"<script", html, re.IGNORECASE)) == 3
    assert html.count("</script>") == 3
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<title>tlog report: &lt;script&gt;alert(1)&lt;/script&gt;</title>" in html
    specs = re.search(
        r'<script type="application/json" id="tlog-specs">(.*?)</script>', html, re.DOTALL
    )
    assert specs is not None
    assert json.loads(specs.group(1))["top-phases"]["data"]["values"][0]["phase"] == XSS


def test_page_policy_allows_only_its_own_scripts_and_no_network() -> None:
    html = _page().render()
    attr = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    csp = htmllib.unescape(attr)
    nonce = re.search(r"'nonce-([A-Za-z0-9_-]+)'", csp).group(1)
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    assert "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
    assert html.count(f'<script nonce="{nonce}">') == 2
    assert not re.search(r'(src|href)="https?:', html)


def test_chart_keys_come_from_code() -> None:
    page = Page(title="t")
    with pytest.raises(ValueError, match="letters, digits"):
        page.add_chart(ChartBlock('x" onload="', "t", "c", {}))
    page.add_chart(ChartBlock("a", "t", "c", {}))
    with pytest.raises(ValueError, match="used twice"):
        page.add_chart(ChartBlock("a", "t", "c", {}))
