"""The Vega, Vega-Lite and vega-embed JavaScript, inlined into every report.

A report must open on a machine with no internet, so nothing is fetched from a
CDN: :func:`javascript_bundle` returns one self-contained script built by
``vl_convert.javascript_bundle`` (the libraries vl-convert itself ships), for
the Vega-Lite version that Altair writes (:data:`VEGALITE_VERSION`, from
``altair.SCHEMA_VERSION``), so the charts and the renderer always agree.

Building the bundle takes about 3 s, so it is cached in memory and on disk
(``tlog/vega-bundle-*.js`` in the user cache directory, keyed by the
vl-convert and Vega-Lite versions); a damaged cache file is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from functools import lru_cache
from pathlib import Path

import altair as alt
import vl_convert as vlc

#: Vega-Lite ``major.minor`` that Altair's specs use (``altair.SCHEMA_VERSION``, e.g. ``v6.4.1``).
VEGALITE_VERSION: str = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])

#: Sequences that would end or confuse an inline ``<script>`` element (HTML
#: spec, "Restrictions for contents of script elements"): ``</script``,
#: ``<script`` and ``<!--``, matched case-insensitively.
_SCRIPT_BREAKERS = re.compile(r"</(script)|<(script)|<!--", re.IGNORECASE)

_MARKER = "/* tlog vega bundle */\n"


def script_safe_js(code: str) -> str:
    """Return JavaScript ``code`` made safe to place inside ``<script>...</script>``.

    ``</script`` becomes ``<\\/script``, ``<script`` becomes ``\\x3Cscript`` and
    ``<!--`` becomes ``\\x3C!--``. Both escapes mean the same characters inside
    JavaScript string, template and regular-expression literals and comments,
    the only places such text occurs in library code.
    """

    def fix(m: re.Match[str]) -> str:
        if m.group(1):
            return "<\\/" + m.group(1)
        if m.group(2):
            return "\\x3C" + m.group(2)
        return "\\x3C!--"

    return _SCRIPT_BREAKERS.sub(fix, code)


def _cache_file() -> Path | None:
    try:
        from platformdirs import user_cache_dir
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        return None
    versions = f"{vlc.__version__}-vl{VEGALITE_VERSION}-vega{vlc.get_vega_version()}"
    return Path(user_cache_dir("tlog", appauthor=False)) / f"vega-bundle-{versions}.js"


def _build() -> str:
    return _MARKER + script_safe_js(vlc.javascript_bundle(vl_version=VEGALITE_VERSION))


def _read_cache(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
        digest_line, _, body = text.partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    if not body.startswith(_MARKER) or hashlib.sha256(body.encode()).hexdigest() != digest_line:
        return None
    return body


def _write_cache(path: Path, body: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(body.encode()).hexdigest()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".vega-bundle-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(digest + "\n" + body)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home directory: build it every time, still correct


@lru_cache(maxsize=1)
def javascript_bundle() -> str:
    """The inlined script that defines ``vegaEmbed``, ``vega`` and ``vegaLite`` on ``window``.

    About 0.9 MB of minified JavaScript, already passed through
    :func:`script_safe_js`. Cached in memory and in the user cache directory.
    """
    path = _cache_file()
    if path is not None:
        cached = _read_cache(path)
        if cached is not None:
            return cached
    body = _build()
    if path is not None:
        _write_cache(path, body)
    return body
