"""``reports.bundle``: JavaScript that cannot end the ``<script>`` it sits in, and
the offline Vega bundle built once and cached."""

from __future__ import annotations

import re

import pytest
from tlog.reports import bundle
from tlog.reports.bundle import VEGALITE_VERSION, javascript_bundle, script_safe_js


@pytest.mark.parametrize(("code", "safe"), [
    ('s = "</script>";', 's = "<\\/script>";'),
    ("x = '</SCRIPT ';", "x = '<\\/SCRIPT ';"),
    ("t = `<script>`;", "t = `\\x3Cscript>`;"),
    ("/* <!-- */", "/* \\x3C!-- */"),
    ("a < b && c > d", "a < b && c > d"),
])
def test_script_safe_js(code: str, safe: str) -> None:
    assert script_safe_js(code) == safe


def test_the_bundle_is_one_safe_script_cached_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    javascript_bundle.cache_clear()
    try:
        js = javascript_bundle()
        assert js.startswith("/* tlog vega bundle */")
        assert not re.search(r"</script|<script|<!--", js, re.IGNORECASE)
        assert "vegaEmbed" in js
        cached = list(tmp_path.rglob("vega-bundle-*.js"))
        assert len(cached) == 1 and f"-vl{VEGALITE_VERSION}-" in cached[0].name
        # a damaged cache file is not trusted: built again, the same text
        cached[0].write_text("0\n/* tlog vega bundle */\nalert(1)", encoding="utf-8")
        javascript_bundle.cache_clear()
        assert bundle._read_cache(cached[0]) is None
        assert javascript_bundle() == js
    finally:
        javascript_bundle.cache_clear()
