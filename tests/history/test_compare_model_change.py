"""``tlog compare`` of a model change made under load names the model change.

Two runs of model_loop.py (each its own process, pinned to one core): the
baseline with 2 hash layers in ``forward`` beside no busy process, the
candidate with 8 layers beside one busy process on its core. The candidate
is slower for both reasons; the loops' own timers (thread CPU time, wall
time and run-queue delay per iteration, bare reads in the same loops) say how
much of the change is more work. Where more work is a real part of it, the
verdict must name the model change (the ``config`` that differs, the phase
that grew) and never call the change "contention from a busier machine, not
the change under test", which it did on its own run-queue figures before.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tlog.analyze.compare import compare, top_contributors
from tlog.analyze.environment import WORK_SHARE_OF_CHANGE
from tlog.ingest.db import connect

from tests.support.loops import ingest_all, run_loop

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="pins the loops to one core (Linux)")

LOOP = Path(__file__).with_name("model_loop.py")


def test_a_model_change_under_load_names_the_model_change(tmp_path: Path) -> None:
    truth = {"small": run_loop(LOOP, tmp_path / "small", "2", "0"),
             "big": run_loop(LOOP, tmp_path / "big", "8", "1")}
    db = tmp_path / "t.duckdb"
    ingest_all(db, tmp_path / "small", tmp_path / "big")
    with connect(db, read_only=True) as con:
        c = compare(con, "small", "big")
    own = {}
    for name, d in c.diagnoses.items():
        rows = truth["small" if name == "baseline" else "big"]
        steady = d.analysis.steady["iter"].to_list()
        own[name] = [sum(rows[i][k] for i in steady) / len(steady) for k in range(3)]
    (cpu_a, wall_a, _), (cpu_b, wall_b, _) = own["baseline"], own["candidate"]
    assert cpu_b > 1.5 * cpu_a and wall_b > wall_a               # the loops' own truth
    stretch = wall_a / cpu_a          # the baseline's wall per CPU second, all of it
    work = (cpu_b - cpu_a) * stretch
    print({"truth": own, "work_s": work, "env": c.environment.to_dict(), "verdict": c.verdict})
    if work < WORK_SHARE_OF_CHANGE * (wall_b - wall_a):
        pytest.skip(f"the shared machine's own load made the change mostly a wait for a core "
                    f"(work {work * 1e3:.1f} ms of {(wall_b - wall_a) * 1e3:.1f} ms by the "
                    f"loops' timers): not the case under test")
    env = c.environment
    assert env.contention is False
    assert "not the change under test" not in c.verdict
    assert "config.layers 2 -> 8" in c.verdict and c.settings == ["config.layers 2 -> 8"]
    assert env.work_s == pytest.approx(work, rel=0.35)
    shown, left = top_contributors(c, 1)
    assert [x.phase for x in shown] == ["forward"] and left >= 1
