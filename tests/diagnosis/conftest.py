"""The analysis suites' folder: its simulators (``lockstep_sim``, the ``*_loop.py``
children) are imported by name. The ``build`` fixture is the whole suite's
(tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
