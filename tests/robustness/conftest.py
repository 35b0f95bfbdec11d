"""The robustness tests share the ingest tests' helpers (``ingest_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ingest"))
