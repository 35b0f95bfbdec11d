"""The torchtitan structured-log tests: the writer (``titan_writer``, torchtitan's
own code copied) and the job (``titan_job``) beside them, importable (the ``db``
fixture is the suite's, tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
