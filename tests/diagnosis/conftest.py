"""Fixtures for the analysis tests: small runs written straight into a fresh database."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runbuilder import RunBuilder


@pytest.fixture
def build(tmp_path: Path):
    """``build(builder) -> connection``: write a :class:`RunBuilder` to a fresh database."""
    cons = []

    def _build(builder: RunBuilder):
        con = builder.write(tmp_path / f"{builder.run_id}.duckdb")
        cons.append(con)
        return con

    yield _build
    for con in cons:
        con.close()
