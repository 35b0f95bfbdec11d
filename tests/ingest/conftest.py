"""Fixtures of the ingest tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tlog.ingest import connect


@pytest.fixture
def db(tmp_path: Path):
    """A fresh database (closed after the test)."""
    con = connect(tmp_path / "tlog.duckdb")
    yield con
    con.close()
