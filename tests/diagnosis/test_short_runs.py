"""Short runs carry enough system samples to judge: a 30-step leak and a
contended 3-second loop, each recorded at the shim's default sampling pace
(adaptive: dflash_runtime/sysinfo.py ``next_gap``).

Each loop (short_loop.py, its own process) measures its own truth with bare
reads in the same loop: RSS after every step, thread CPU, wall time and the
thread's run-queue delay. Before the adaptive pace the leak had 4 samples in
its run (no ``memory_growth``) and the crowded loop's contention was a guess
"(no run-queue figures)" under a compute-bound verdict.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.loops import diagnosed, ingest_all, run_loop

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                                reason="the truths are read from Linux's /proc")

LOOP = Path(__file__).with_name("short_loop.py")
MiB = 1 << 20


def _run(tmp_path: Path, mode: str):
    run, db = tmp_path / mode, tmp_path / f"{mode}.duckdb"
    truth = run_loop(LOOP, run, mode, timeout=120)
    ingest_all(db, run)
    return diagnosed(db, mode), truth


def test_a_30_step_leak_is_found(tmp_path: Path) -> None:
    d, truth = _run(tmp_path, "leak")
    rss = np.array([r[0] for r in truth], dtype=float)
    own = np.polyfit(np.arange(10, 30), rss[10:], 1)[0]
    assert own == pytest.approx(8 * MiB, rel=0.10)          # the loop's own truth
    assert d.system.samples >= 16                            # default pace, 30 steps
    [f] = [f for f in d.findings if f.code == "memory_growth"]
    assert f.evidence["memory"] == "rss"
    assert f.evidence["rate_bytes_per_iter"] == pytest.approx(own, rel=0.15)


def test_a_contended_3_second_loop_leads_with_contention(tmp_path: Path) -> None:
    d, truth = _run(tmp_path, "crowded")
    steady = d.analysis.steady["iter"].to_list()
    wall = sum(truth[i][2] for i in steady)
    queue = sum(truth[i][3] for i in steady) / wall
    assert queue > 0.4                                     # truth: it lacked its core
    [f] = [f for f in d.findings if f.code == "cpu_contention"]
    assert f.evidence["guess"] is False                    # run-queue figures, measured
    assert f.evidence["contention_share"] == pytest.approx(queue, abs=0.10)
    assert f.severity == "critical" and d.bottleneck.cause == "cpu_contention"
    assert d.verdict.startswith("Bottleneck: main (rank 0) lacks CPU"), d.verdict
    assert "data loader" not in d.verdict
