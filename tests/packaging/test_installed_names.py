"""One namespace: the distribution installs only ``tlog`` and the shim
``dflash_runtime`` as top-level import names, so tlog never shadows (or is shadowed
by) a user's ``reports.py`` or PyPI's ``queries``/``analyze`` packages."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"tlog", "dflash_runtime"}
#: The design card's folders, which install as tlog.<name> (pyproject.toml package-dir).
FOLDERS = ("ingest", "analyze", "queries", "reports")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def test_wheel_installs_only_tlog_and_the_shim(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in _tracked():
        if rel.startswith(("tests/", "benchmarks/", "docs/")):
            continue
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((ROOT / rel).read_bytes())
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
                   check=True, capture_output=True, text=True)
    (wheel,) = out.glob("tlog-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    top = {t.removesuffix(".py") for t in top}
    assert top == ALLOWED, f"top-level names installed: {sorted(top)}"
    # The folders land under tlog/, with the stored SQL beside their runner.
    for folder in FOLDERS:
        assert f"tlog/{folder}/__init__.py" in names
    assert "tlog/queries/rank_skew.sql" in names
    assert "tlog/analyze/lockstep.py" in names
    # every package of the source tree is in the wheel (a subpackage left out of
    # pyproject's list installs a CLI without its commands)
    packages = sorted(rel.removesuffix("/__init__.py") for rel in _tracked()
                      if rel.endswith("/__init__.py")
                      and not rel.startswith(("tests/", "benchmarks/", "docs/")))
    assert packages, "no packages copied"
    for pkg in packages:
        inside = pkg if pkg.startswith(("tlog", "dflash_runtime")) else f"tlog/{pkg}"
        assert f"{inside}/__init__.py" in names, f"{pkg} is not in the wheel"


def test_no_source_imports_the_folders_as_top_level_packages() -> None:
    """``pytest``'s rootdir on sys.path would let ``from ingest import x`` work in tests
    while a user's install fails; every import goes through ``tlog.``."""
    folders = "|".join(FOLDERS)
    pattern = re.compile(rf"^\s*(from|import) ({folders})\b", re.MULTILINE)
    bad = [rel for rel in _tracked() if rel.endswith(".py")
           and pattern.search((ROOT / rel).read_text(encoding="utf-8"))]
    assert not bad, f"top-level imports of the folders in: {bad}"
