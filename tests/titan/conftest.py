"""Fixtures of the torchtitan structured-log tests: the writer (``titan_writer``,
torchtitan's own code copied) and the job (``titan_job``) sit beside them."""

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
