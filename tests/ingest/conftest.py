"""The ingest tests: their helpers (ingest_helpers) importable (the `db` fixture is
the suite's, tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
