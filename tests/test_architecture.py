"""The one direction of imports (DESIGN.md): runtime <- ingest <- analyze <- queries
<- reports <- tlog, and what each layer may pull in at import time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Layer order, lowest first. A module may import its own layer or lower ones.
LAYERS = ["dflash_runtime", "ingest", "analyze", "queries", "reports", "tlog"]
#: Third-party packages each layer must never import (at any point).
FORBIDDEN = {
    "dflash_runtime": {"polars", "duckdb", "altair", "vl_convert", "typer", "rich", "pyarrow"},
    "ingest": {"altair", "vl_convert", "torch", "typer"},
    "analyze": {"altair", "vl_convert", "torch", "typer", "rich"},
    "queries": {"altair", "vl_convert", "torch", "typer"},
    "reports": {"torch", "typer"},
}


def _layer_of(module: str) -> str:
    """``tlog.ingest.load`` -> ``ingest``; ``tlog.cli`` -> ``tlog``; ``polars.x`` -> ``polars``."""
    parts = module.split(".")
    if parts[0] == "tlog" and len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return parts[0]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(_layer_of(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tlog":
                names.update(_layer_of(f"tlog.{alias.name}") for alias in node.names)
            else:
                names.add(_layer_of(node.module))
    return names


def _modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_flow_one_way(layer: str) -> None:
    higher = set(LAYERS[LAYERS.index(layer) + 1:])
    bad = []
    for path in _modules(layer):
        wrong = (_imports(path) & higher) | (_imports(path) & FORBIDDEN.get(layer, set()))
        if wrong:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(wrong)}")
    assert not bad, "\n".join(bad)


#: Inside ``tlog/``: which of its parts each part may import (the top of the
#: layers). The commands render what the facade returns; the facade reaches a
#: live service through its client (``tlog.web.endpoint``) only; the service
#: runs the facade; nothing but the CLI's registry imports a command; the job
#: reads its watchdog's (a script it starts) protocol constants.
TLOG_PARTS = {
    "tlog.api": {"tlog.web.endpoint"},
    "tlog.app": {"tlog.api"},
    "tlog.render": {"tlog.app"},
    "tlog.job": {"tlog._watchdog"},
    "tlog._watchdog": set(),
    "tlog.web": {"tlog.api", "tlog.app", "tlog.render", "tlog.web"},
    "tlog.commands": {"tlog.api", "tlog.app", "tlog.render", "tlog.job", "tlog.commands",
                      "tlog.web"},
}


def _tlog_part(path: Path) -> str:
    rel = path.relative_to(ROOT / "tlog").with_suffix("")
    first = rel.parts[0]
    return f"tlog.{first}"


def _tlog_imports(path: Path) -> set[str]:
    """The ``tlog.<part>`` modules ``path`` imports (``tlog.web.endpoint`` whole)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            if parts[0] != "tlog" or len(parts) < 2 or parts[1] in LAYERS:
                continue
            found.add("tlog.web.endpoint" if parts[1:3] == ["web", "endpoint"]
                      else f"tlog.{parts[1]}")
    return found


def test_imports_inside_tlog_follow_the_parts() -> None:
    bad = []
    for path in sorted((ROOT / "tlog").rglob("*.py")):
        part = _tlog_part(path)
        if part not in TLOG_PARTS:      # tlog/__init__, cli, __main__: the entry points
            continue
        allowed = TLOG_PARTS[part] | {part}
        wrong = {m for m in _tlog_imports(path) if m not in allowed
                 and not (m == "tlog.web.endpoint" and "tlog.web" in allowed)}
        if wrong:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(wrong)}")
    assert not bad, "\n".join(bad)


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(','.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return set(out.stdout.strip().split(","))


def test_shim_imports_without_heavy_packages() -> None:
    loaded = _loaded_after("import dflash_runtime")
    assert not loaded & {"torch", "polars", "duckdb", "altair", "numpy"}


def test_analysis_side_does_not_need_torch() -> None:
    loaded = _loaded_after("import tlog.ingest, tlog.analyze")
    assert "torch" not in loaded
