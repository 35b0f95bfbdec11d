"""``cpu_contention`` against the truth: a thread off the CPU because it sleeps
is blocked, not contended; a thread that waits for a core it shares with
spinning processes is contended, by the share it waited.

Each loop (contention_loop.py, its own process) measures its own truth
around its phases, independently of tlog: its thread's CPU time
(``time.thread_time``), wall time and the scheduler's run-queue delay
(``/proc/self/task/<tid>/schedstat``). The run is then ingested and
diagnosed, and tlog's figures are set against that truth over the
iterations tlog judged (its steady ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tlog.analyze import diagnose
from tlog.analyze.compare import compare
from tlog.analyze.rules.machine import MachinePolicy
from tlog.ingest import ingest_run
from tlog.ingest.db import connect

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"),
                                reason="the run-queue delay is read from Linux's /proc")

LOOP = Path(__file__).with_name("contention_loop.py")
MARGIN = MachinePolicy().contention_margin


def _diagnosed(db: Path, mode: str, n: int = 40):
    """Run the loop, ingest it into ``db``, diagnose it; the loop's truth over
    the steady iterations: ``on_cpu`` (thread CPU / wall), ``run_queue``
    (run-queue delay / wall), ``blocked`` (the rest of the time off the CPU /
    wall), ``wall`` and ``queue`` (seconds per iteration)."""
    run = db.parent / mode
    out = subprocess.run([sys.executable, str(LOOP), str(run), str(n), mode],
                         capture_output=True, text=True, timeout=120, check=True)
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    con = connect(db)
    try:
        ingest_run(con, run)
    finally:
        con.close()
    with connect(db, read_only=True) as con:
        d = diagnose(con, mode)
    steady = d.analysis.steady["iter"].to_list()
    cpu, wall, queue = (sum(rows[i][k] for i in steady) for k in range(3))
    truth = {"on_cpu": cpu / wall, "run_queue": queue / wall,
             "blocked": max(1 - cpu / wall - queue / wall, 0.0),
             "wall": wall / len(steady), "queue": queue / len(steady)}
    return d, truth


@pytest.fixture(scope="module")
def sleeping(tmp_path_factory):
    """``plain`` and ``sleep`` runs in one database, with their truths."""
    db = tmp_path_factory.mktemp("sleep") / "t.duckdb"
    # plain: ~1 ms iterations, 300 of them for the sampler's 20 ms to see its steady state
    return db, _diagnosed(db, "plain", 300), _diagnosed(db, "sleep")


def test_a_sleeping_forward_is_blocking_not_contention(sleeping) -> None:
    # forward sleeps 30 ms and computes a few: off the CPU ~90% of the time, most
    # of it asleep, whatever the load of the shared machine.
    _, _, (d, truth) = sleeping
    assert truth["on_cpu"] < 0.3 and truth["blocked"] > 0.4        # the loop's own truth
    found = [f for f in d.findings if f.code == "cpu_contention"]
    if truth["run_queue"] < MARGIN - 0.05:
        assert found == [], (truth, found)
    for f in found:       # a busy machine can make it wait for a core too: that share only
        assert f.evidence["guess"] is False
        assert f.evidence["contention_share"] == pytest.approx(truth["run_queue"], abs=0.10)
    if truth["run_queue"] < truth["blocked"]:
        assert d.bottleneck.cause is None
        assert "lacks CPU" not in d.verdict
        assert all(f.severity != "critical" for f in found)
    [b] = [f for f in d.findings if f.code == "blocked_in_compute"]
    assert b.evidence["excess_share"] == pytest.approx(truth["blocked"], abs=0.10)
    assert "not CPU contention" in b.message


def test_compare_does_not_call_a_sleep_contention(sleeping) -> None:
    # plain -> sleep: forward's wall time grows ~30 ms per iteration with the same
    # CPU time (the thread off the CPU more: once read as more load); its run-queue
    # wait did not grow by half of that (the loops' own truth): not contention.
    db, (_, plain), (_, slept) = sleeping
    assert slept["wall"] - plain["wall"] > 0.02
    if slept["queue"] - plain["queue"] >= 0.5 * (slept["wall"] - plain["wall"]):
        pytest.skip("the shared machine's load made the thread wait for a core that long")
    with connect(db, read_only=True) as con:
        c = compare(con, "plain", "sleep")
    assert c.throughput_ratio < 0.5
    assert c.environment.contention is False, c.verdict
    assert "contention" not in c.verdict
    assert "Most of the gap: main forward" in c.verdict


def test_spinning_processes_on_the_loops_core_are_contention_by_its_run_queue_share(
        tmp_path) -> None:
    # pinned to one core beside three spinning processes: off the CPU mostly waiting
    # for the core.
    # 120 iterations (~1.5 s): the run-queue wait comes in chunks of a few spinner
    # time slices, and the sampled window (20 ms samples) and the truth's iterations
    # differ by up to a chunk at each end: ~7 points over 40 iterations
    d, truth = _diagnosed(tmp_path / "t.duckdb", "crowded", 120)
    assert truth["run_queue"] > 0.5                                 # the loop's own truth
    f = d.findings[0]
    assert f.code == "cpu_contention" and f.severity == "critical", d.findings
    assert f.evidence["guess"] is False
    assert f.evidence["contention_share"] == pytest.approx(truth["run_queue"], abs=0.10)
    assert d.bottleneck.cause == "cpu_contention"
    assert d.verdict.startswith("Bottleneck: main (rank 0) lacks CPU - its thread waited "
                                "runnable for a core")
    assert f"{round(100 * f.evidence['contention_share'])}% of its time" in d.verdict
