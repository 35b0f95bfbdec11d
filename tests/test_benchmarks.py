"""The benchmarks still run against the current schema and code, at toy sizes.

Not a timing test (budgets are for ``make bench``): a schema change once broke
``bench_diagnose``'s hand-built database without any test noticing. Each case
builds what its benchmark builds, small, and checks a figure by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.ingest import connect, ingest_run

from benchmarks import bench_diagnose, bench_ingest


def test_bench_diagnose_builds_a_run_that_diagnoses(tmp_path: Path) -> None:
    from tlog.analyze import diagnose

    run_id = bench_diagnose.build(tmp_path / "d.duckdb", 2000)
    con = connect(tmp_path / "d.duckdb", read_only=True)
    try:
        d = diagnose(con, run_id)
        assert d.iterations.total == con.execute(
            "SELECT count(*) FROM iterations").fetchall()[0][0] > 0
        assert d.verdict.startswith("Bottleneck:")
    finally:
        con.close()


def test_bench_ingest_generates_loads_and_measures(tmp_path: Path) -> None:
    size = bench_ingest.generate(tmp_path / "run", ranks=2, iters=50)
    assert size == sum(p.stat().st_size for p in (tmp_path / "run").glob("*.jsonl"))
    con = connect(tmp_path / "t.duckdb")
    try:
        report = ingest_run(con, tmp_path / "run")
        assert report.records_loaded == {"iter": 100, "queue": 0, "event": 0, "meta": 2}
    finally:
        con.close()
    assert bench_ingest.time_store_floor(tmp_path / "t.duckdb") > 0
    assert bench_ingest.time_raw(tmp_path / "run", tmp_path / "raw.duckdb") > 0


def test_bench_ingest_small_run_loads_every_line_and_each_poll_its_ten(tmp_path: Path) -> None:
    """The fixed-cost figure measures real ingests: the 245 lines of
    the small run load in full, each poll loads its 10 appended lines
    (``time_small`` asserts that), and the figures are positive times."""
    r = bench_ingest.time_small(tmp_path, repeat=1)
    assert (r["records"], r["loaded"], r["poll_lines"]) == (245, 245, 10)
    assert r["raw_s"] > 0 and r["ingest_s"] > 0 and r["poll_s"] > 0
    assert r["ratio"] == r["raw_s"] / r["ingest_s"]


def test_bench_sys_compares_a_sampled_loop_with_an_unsampled_one(tmp_path: Path) -> None:
    """The training-thread comparison really samples in one block and not in the other."""
    import json

    from benchmarks import bench_sys

    assert bench_sys._block(tmp_path / "on", bench_sys.FAST_INTERVAL_S, 0.3, 100) > 0
    assert bench_sys._block(tmp_path / "off", 0.0, 0.1, 100) > 0
    kinds = {name: [json.loads(x)["type"] for x in (tmp_path / name / "rank0.main.jsonl")
                    .read_text().splitlines()] for name in ("on", "off")}
    assert kinds["on"].count("sys") >= 2 and "sys" not in kinds["off"]
    res = bench_sys._per_sample(20)
    assert 0 < res["median_us"] <= res["p95_us"]


def test_bench_watch_times_a_window_and_the_whole_run(tmp_path: Path) -> None:
    """bench_watch's run builds and its refresh diagnoses a window. At 16,000
    records the 6 drafter ranks hold 2,133 iterations of about 73.25 ms each
    (the phase means of bench_diagnose plus 1.25 ms unaccounted), 156 s, and
    end last; the 2 target workers (1,600 of 48.25 ms, 77 s) end before the
    30 s window starts. So the window holds the drafters' last 30 s:
    6 x 30 / 0.07325 = 2,457 iterations."""
    from benchmarks import bench_watch

    live, whole, window = bench_watch.measure(tmp_path / "w.duckdb", 16_000, 1)
    assert window == pytest.approx(6 * 30 / 0.07325, rel=0.03)
    assert live > 0 and whole > 0


def test_bench_team_ships_every_line_once_at_a_toy_size(tmp_path: Path) -> None:
    """bench_team at a toy size (2 senders x 2 ranks, 200 lines/s for 2 s, 2
    readers) against a real service: each rank wrote 200 x 2 = 400 iteration
    lines (counted in its file, independently of the bench's own counter), and
    the service holds each run's 800 once; every read answered 200."""
    pytest.importorskip("uvicorn")
    from benchmarks import bench_team

    r = bench_team.measure(tmp_path, senders=2, ranks=2, rate=200, seconds=2.0, readers=2,
                           interval=0.3)
    for run in ("team00", "team01"):
        for rank in (0, 1):
            lines = (tmp_path / "remote" / run / f"rank{rank}.main.jsonl").read_text()
            assert lines.count('"type": "iter"') == 400
    assert r["written"] == {"team00": 800, "team01": 800}
    assert r["stored"] == {"team00": [800, 800], "team01": [800, 800]}
    assert r["ship_errors"] == [] and r["read_errors"] == [] and r["tracebacks"] == 0
    assert r["reads"]["run"]["requests"] > 0 and r["reads"]["diagnosis"]["requests"] > 0
    assert r["drained"]
def test_bench_stragglers_scores_by_hand(tmp_path: Path) -> None:
    """The straggler benchmark's scoring, and one small run of each kind."""
    from benchmarks import bench_stragglers

    runs = [{"slow": 3, "named": [3]}, {"slow": 1, "named": []},
            {"slow": None, "named": [5]}, {"slow": 2, "named": [2, 4]}]
    got = bench_stragglers.score(runs)
    # named right: runs 1 and 4; wrong: rank 5 of the healthy run, rank 4 of run 4
    assert (got["tp"], got["fp"], got["fn"]) == (2, 2, 1)
    assert got["precision"] == 2 / 4 and got["recall"] == 2 / 3
    hit = bench_stragglers.judge(tmp_path / "s.duckdb", 4, 0.30, seed=1)
    assert hit["named"] == [hit["slow"]] and hit["truth"] > 0.1
    assert hit["gain"] == pytest.approx(hit["truth"], abs=0.02)
    healthy = bench_stragglers.judge(tmp_path / "h.duckdb", 4, 0.0, seed=2)
    assert (healthy["slow"], healthy["named"]) == (None, [])


def test_bench_many_runs_ingests_each_small_run_whole(tmp_path: Path) -> None:
    """bench_many_runs' runs load in full (a meta line and 20 iterations each) and
    every step of an ingest is timed."""
    import duckdb

    from benchmarks import bench_many_runs

    runs = bench_many_runs.write_runs(tmp_path / "runs", 2)
    steps = bench_many_runs.time_steps(tmp_path / "s.duckdb", runs)
    assert all(len(v) == 2 and min(v) > 0 for v in steps.values()), steps
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        assert con.execute("SELECT run_id, count(*) FROM iterations GROUP BY ALL ORDER BY 1"
                           ).fetchall() == [("run00000", 20), ("run00001", 20)]
        assert con.execute("SELECT count(*) FROM attribution_runs").fetchone() == (2,)


def test_bench_engines_walks_agree_and_every_hostile_line_is_counted(tmp_path: Path) -> None:
    """The window-SQL walk gives the numpy walk's compute and sync per iteration (an
    independent check of the arithmetic), and the hostile lines are each rejected by
    tlog, while read_json keeps a row for all but the line with trailing text."""
    from benchmarks.bench_engines import hostile_outcomes, time_walk_engines

    walk = time_walk_engines(tmp_path, 2_000)
    assert walk["rows_matched"] == walk["iterations"] == 2_000
    assert walk["max_abs_diff_s"] < 1e-12
    hostile = hostile_outcomes(tmp_path)
    assert hostile["of"] == 10 and hostile["tlog_rejected"] == 10
    rows = {r["fault"]: r["read_json_rows"] for r in hostile["lines"]}
    assert rows.pop("trailing text") == 2 and set(rows.values()) == {3}


def test_bench_accuracy_simulates_as_the_shim_writes_and_scores_by_hand(tmp_path: Path) -> None:
    """A noiseless 4-rank profile (every measured deviation 1): step = 10 ms
    data + 20 forward + 40 backward + 10 optimizer + 5 ms transfer = 85 ms. A
    compute fault of 50% from step 0 adds 42.5 ms to one rank's forward, so
    every step lasts 127.5 ms and removing it gains 42.5 / 85 = 50% (by hand,
    exit jitter aside). The lines are the shim's: one meta line, then iter
    records whose top-level phases fill the step; in measured mode the
    all-reduce wait is backward's child of kind sync."""
    import json

    import numpy as np
    from pytest import approx

    import tlog
    from benchmarks import _accuracy_sim as sim
    from benchmarks import bench_accuracy

    flat = sim.Profile(name="flat", source="by hand", means_s=(0.010, 0.020, 0.040, 0.010, 0.005),
                       series=(np.ones((60, 5)),))
    run = sim.simulate(flat, 4, steps=40, fault="compute", size=0.5, seed=1, onset_share=0.0)
    inj = run.injection
    assert (inj.onset, inj.extra_s) == (0, approx(0.0425))
    assert sim.true_gain(run) == approx(0.5, abs=1e-3)
    sim.write_run(run, tmp_path / "r", run_id="r", measured=True)
    lines = (tmp_path / "r" / f"rank{(inj.rank + 1) % 4}.train.jsonl").read_text().splitlines()
    meta, first = json.loads(lines[0]), json.loads(lines[1])
    assert (meta["type"], meta["world_size"], len(lines)) == ("meta", 4, 41)
    top = sum(v for k, v in first["phases"].items() if "/" not in k)
    assert first["dur"] == approx(top, abs=1e-6)
    assert first["kinds"] == {"backward/ddp_allreduce_wait": "sync"}
    # a peer waits for the straggler's 42.5 ms, plus the 5 ms transfer
    assert first["phases"]["backward/ddp_allreduce_wait"] == approx(0.0475, abs=1e-4)

    db = tlog.open(tmp_path / "a.duckdb")
    out = bench_accuracy.judge(db, tmp_path / "r", "r", bench_accuracy.Outcome(
        suite="sim", profile="flat", world=4, fault="compute", size=0.5, rank=inj.rank,
        onset=0, measured=True, gain_true=sim.true_gain(run)))
    assert (out.tp, out.fp) == (1, 0)
    assert out.speedup_error == approx(0.0, abs=0.02)
    s = bench_accuracy.scores([out])
    assert (s["precision"], s["recall"], s["f1"]) == (1.0, 1.0, 1.0)


def test_bench_verdict_times_the_commands_a_user_types(tmp_path: Path) -> None:
    """bench_verdict at a toy size: its ingest stored the run's diagnosis (the
    diagnose it times prints the stored one), and the ratios are the figures'."""
    import tlog
    from benchmarks import bench_verdict

    bench_ingest.generate(tmp_path / "run", ranks=1, iters=40)
    r = bench_verdict.measure(tmp_path / "run", tmp_path, 1, warm_up=False)
    s = r["seconds"]
    assert all(v > 0 for v in s.values()), s
    assert r["ingest_ratio"] == s["read_json"] / (s["ingest"] - s["help"])
    assert r["diagnose_ratio"] == s["diagnose"] / s["import"]
    stored = tlog.open(tmp_path / "verdict.duckdb").stored_diagnosis("run")
    assert stored is not None and stored["iterations"]["total"] == 40
    assert "time to a verdict" in bench_verdict.render(r, 41)


def test_bench_shim_writer_flushes_every_queued_record(tmp_path: Path) -> None:
    """The writer's throughput figure times real records: each queued 10-lap
    iteration reaches the file (about 300 bytes each, counted by the bench
    from the file's growth)."""
    from benchmarks import bench_shim

    w = bench_shim.measure_writer(records=500, repeats=2)
    assert w["us_per_record"] > 0
    assert w["records_per_s"] * w["us_per_record"] / 1e6 == pytest.approx(1, rel=1e-3)
    assert 250 < w["bytes_per_record"] < 400
