"""The memory budget: a 1 GB trace is read within 2 GB (slow: writes
a 1 GB synthetic trace; run with ``pytest -m slow``). ``make bench`` runs the
same measurement at 64 MB and extrapolates; this checks the real size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_gigabyte_trace_within_two_gigabytes() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_kineto", "--mb", "1024",
                          "--json"], check=False, cwd=ROOT, capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    for shape in ("gpu", "cpu_ops"):
        assert result[shape]["trace_mb"] >= 1024
        assert result[shape]["convert_peak_mb"] <= 2048, result
