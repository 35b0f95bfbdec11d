"""docs/DESIGN.md is a tour for a newcomer: it must stay true to the tree.

Every repository path it names in backticks (``analyze/rules/base.py``,
``queries/*.sql`` patterns left out) must exist, and every package folder of
the layers it draws must be named, so a module moved or a package added
shows up here rather than misleading the next reader.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "DESIGN.md"
#: The folders a path in DESIGN.md may start with (the layers, tests, docs, benchmarks).
TOP = ("dflash_runtime", "ingest", "analyze", "queries", "reports", "tlog", "tests", "docs",
       "benchmarks")
_PATH = re.compile(rf"^(?:(?:{'|'.join(TOP)})/[\w./-]*|pyproject\.toml|Makefile|README\.md)$")


def named_paths(text: str) -> list[str]:
    """Backticked tokens of ``text`` that are repository paths (no patterns)."""
    return [t for t in re.findall(r"`([^`\n]+)`", text) if _PATH.match(t)]


def test_named_paths_are_recognised() -> None:
    text = "`analyze/rules/base.py` `queries/<name>.sql` `queries/*.sql` `tlog.open(path)` `pyproject.toml`"
    assert named_paths(text) == ["analyze/rules/base.py", "pyproject.toml"]


def test_every_path_design_md_names_exists() -> None:
    paths = named_paths(DOC.read_text(encoding="utf-8"))
    assert len(paths) > 60        # the file map is there
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == [], f"docs/DESIGN.md names paths that do not exist: {missing}"


def test_every_package_folder_is_on_the_map() -> None:
    named = {p.rstrip("/") for p in named_paths(DOC.read_text(encoding="utf-8"))}
    folders = {p.parent.relative_to(ROOT).as_posix()
               for top in TOP[:6] for p in (ROOT / top).rglob("__init__.py")}
    assert {"analyze/rules", "tlog/commands", "dflash_runtime/pipeline"} <= folders
    unnamed = sorted(f for f in folders
                     if f not in named and not any(n.startswith(f + "/") for n in named))
    assert unnamed == [], f"package folders docs/DESIGN.md does not name: {unnamed}"
