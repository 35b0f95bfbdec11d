"""Fast where users wait: ``tlog --help`` and ``import tlog`` load no
heavy library; commands import them when they run.

Each case runs a fresh interpreter with ``-X importtime`` (Python writes one
line per module it imports on stderr) and reads the module names from it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Libraries a help text or a bare ``import tlog`` must not load.
HEAVY = {"polars", "pyarrow", "altair", "duckdb", "numpy", "torch", "vl_convert", "jinja2"}


def _imported(code: str, *args: str) -> tuple[set[str], str]:
    """Top-level names of the modules a fresh ``python -X importtime -c code args``
    imports, and its stdout."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args],
                          check=True, capture_output=True, text=True, cwd=ROOT, timeout=120)
    names = {line.split("|")[-1].strip().split(".")[0]
             for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "typer" in names or "tlog" in names, proc.stderr[-2000:]
    return names, proc.stdout


_CLI = "import sys; from tlog.cli import main; sys.argv[0] = 'tlog'; main()"


@pytest.mark.parametrize("args", [("--help",), ("runs", "--help"), ("diagnose", "--help"),
                                  ("sql", "--help"), ("ingest", "--help")])
def test_help_loads_no_heavy_library(args: tuple[str, ...]) -> None:
    names, out = _imported(_CLI, *args)
    assert "Usage: tlog" in out               # the help was printed
    assert not names & HEAVY, sorted(names & HEAVY)
    assert "rich" not in names                # consoles are built on first print


def test_import_tlog_is_light() -> None:
    names, _ = _imported("import tlog")
    assert not names & (HEAVY | {"typer", "rich"}), sorted(names & (HEAVY | {"typer", "rich"}))


def test_the_check_sees_a_heavy_import() -> None:
    """The method itself: a module that imports polars is seen doing so."""
    names, _ = _imported("import tlog.analyze.frames")
    assert {"polars", "numpy"} <= names


def test_runs_over_stored_figures_loads_no_polars(tmp_path: Path) -> None:
    """``tlog runs`` reads the stored diagnosis (fresh after ingest) with DuckDB
    alone: no polars, pyarrow or altair, and the table still shows the run."""
    import tlog

    tlog.open(tmp_path / "t.duckdb").ingest(ROOT / "tests" / "scenarios" / "drift" / "run")
    names, out = _imported(_CLI, "runs", "--db", str(tmp_path / "t.duckdb"))
    assert "drift" in out and "main: compute (forward)" in out
    assert "duckdb" in names
    assert not names & {"polars", "pyarrow", "altair"}, sorted(names & HEAVY)


def test_diagnose_of_a_stored_run_loads_no_analysis(tmp_path: Path) -> None:
    """``tlog diagnose`` of a run whose stored diagnosis is fresh prints it
    with DuckDB alone: no polars, pyarrow, numpy or scipy (the analysis is
    not imported), and the verdict is there."""
    import tlog

    tlog.open(tmp_path / "t.duckdb").ingest(ROOT / "tests" / "scenarios" / "drift" / "run")
    names, out = _imported(_CLI, "diagnose", "--db", str(tmp_path / "t.duckdb"))
    assert out.startswith("Bottleneck:") and "drift" in out
    assert "duckdb" in names
    assert not names & {"polars", "pyarrow", "numpy", "scipy"}, sorted(names & HEAVY)


def test_ingest_of_a_run_that_needs_no_test_loads_no_scipy(tmp_path: Path) -> None:
    """scipy.stats (most of the analysis' import time) is imported by the
    statistical tests that use it, not by the analysis itself: ingesting (and
    diagnosing, to store it) a short run without drift loads no scipy."""
    names, _ = _imported(_CLI, "ingest", str(ROOT / "tests" / "scenarios" / "short_run" / "run"),
                         "--db", str(tmp_path / "t.duckdb"))
    assert "polars" in names                  # the diagnosis was computed and stored
    assert "scipy" not in names
