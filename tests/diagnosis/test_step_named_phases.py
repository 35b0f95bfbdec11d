"""Phase names that carry a step number (``step_123_fwd``): a new layout every
iteration must not multiply the work (1.25 ms per iteration, and the
lockstep test grew with names x iterations), and the figures stay exact.

Two ranks of 5,000 iterations; iteration ``i`` has ``step_{i}_fwd`` 30 ms
(compute by name) and ``step_{i}_get`` 10 ms (starvation by name) in a 50 ms
iteration, so each iteration is 30 ms compute, 10 ms starvation and 10 ms in
no phase (20%, the largest non-compute share).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tlog.analyze import diagnose
from tlog.ingest.db import connect

N = 5000


def test_unique_phase_names_per_iteration_exact_and_linear(tmp_path: Path) -> None:
    # Written with SQL (as ingest stores it: one layout per distinct name
    # sequence, phase times as lists in layout order); RunBuilder's row-by-row
    # insert takes longer than the analysis.
    con = connect(tmp_path / "t.duckdb")
    con.execute("INSERT INTO runs (run_id) VALUES ('steps')")
    con.execute(f"""INSERT INTO phase_layouts (run_id, layout, seq, phase, parent, category)
        SELECT 'steps', i, s, 'step_' || i || (CASE s WHEN 0 THEN '_fwd' ELSE '_get' END),
               NULL, CASE s WHEN 0 THEN 'compute' ELSE 'starvation' END
        FROM range({N}) a(i), range(2) b(s)""")
    con.execute(f"""INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, layout,
                                          phase_host_s)
        SELECT 'steps', r, 'main', 'main-' || r, i, 1000.0 + 0.050 * i, 0.050, i,
               [0.030, 0.010]
        FROM range(2) a(r), range({N}) b(i) ORDER BY r, i""")
    try:
        t0 = time.perf_counter()
        diagnosis = diagnose(con, "steps")
        analysis, d = diagnosis.analysis, diagnosis.to_dict()
        elapsed = time.perf_counter() - t0
    finally:
        con.close()
    # Was 400 s with two ranks (names x iterations in the lockstep test); a
    # generous bound for a shared 2-core machine.
    assert elapsed < 20.0, elapsed
    assert len(analysis.data.layouts) == N
    assert len(analysis.data.phase_names) == 2 * N
    its = analysis.iteration_frame()
    assert its.height == 2 * N
    assert its["compute_s"].to_list() == pytest.approx([0.030] * 2 * N)
    assert its["starvation_s"].to_list() == pytest.approx([0.010] * 2 * N)
    assert its["unaccounted_s"].to_list() == pytest.approx([0.010] * 2 * N)
    ph = analysis.phase_frame(steady_only=False)
    assert ph.height == 2 * 2 * N   # every (rank, phase) once
    assert set(ph["iterations"].to_list()) == {1}
    fwd = ph.filter(ph["phase"] == "step_4321_fwd").sort("rank")
    assert fwd["rank"].to_list() == [0, 1]
    assert fwd["category"].to_list() == ["compute", "compute"]
    assert fwd["host_s"].to_list() == pytest.approx([0.030, 0.030])
    get = ph.filter(ph["phase"] == "step_17_get")
    assert get["category"].to_list() == ["starvation", "starvation"]
    assert get["starvation_s"].to_list() == pytest.approx([0.010, 0.010])
    shares = d["stages"][0]["categories"]
    assert shares["compute"] == pytest.approx(0.6)
    assert shares["starvation"] == pytest.approx(0.2)
    assert shares["unaccounted"] == pytest.approx(0.2)
    assert d["iterations"]["total"] == 2 * N
