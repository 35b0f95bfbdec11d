"""``tlog export --perfetto``: a run's timeline in the Trace Event Format.

A hand-made 2-rank run whose every figure is known: 5 iterations per rank,
each ``dur`` 0.1 s from ``ts`` 0.1 s apart; phases ``load`` 0.02 s,
``backward`` 0.05 s with a child ``backward/allreduce_wait`` 0.03 s (sync),
so 0.03 s in no phase; two queue samples and three ``sys`` samples on rank
0; one checkpoint event. Checked against the format's published
definition (Google's Trace Event Format: JSON object form; ``X``
complete, ``C`` counter, ``M`` metadata events, ``ts``/``dur`` in
microseconds) and read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tlog.ingest.db import connect
from tlog.ingest.run import ingest_run
from tlog.reports.perfetto import perfetto_trace

from tests.support.cli import invoke

T0 = 1_764_403_200.0


def _write_run(root: Path) -> Path:
    run = root / "pp"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"v": 1, "run_id": "pp", "started": T0,
                                              "world_size": 2}))
    for rank in (0, 1):
        lines = [{"type": "meta", "v": 1, "rank": rank, "stage": "main",
                  "worker": f"main-{rank}", "host": "node-a", "pid": 10 + rank}]
        for i in range(5):
            lines.append({"type": "iter", "iter": i, "ts": T0 + 0.1 * i, "dur": 0.1,
                          "tokens": 64,
                          "phases": {"load": 0.02, "backward": 0.05,
                                     "backward/allreduce_wait": 0.03},
                          "kinds": {"backward/allreduce_wait": "sync"}})
        if rank == 0:
            lines += [{"type": "queue", "name": "hs", "ts": T0 + 0.15, "depth": 2,
                       "capacity": 4},
                      {"type": "queue", "name": "hs", "ts": T0 + 0.35, "depth": 0,
                       "capacity": 4},
                      {"type": "event", "name": "checkpoint", "ts": T0 + 0.2, "dur": 0.05}]
            for k, (cpu, wait, rss) in enumerate(((1.0, 0.0, 100 * 2**20),
                                                  (1.1, 0.05, 110 * 2**20),
                                                  (1.3, 0.05, 120 * 2**20))):
                lines.append({"type": "sys", "v": 1, "ts": T0 + 0.2 * k, "cpu": cpu,
                              "cpu_wait": wait, "rss": rss})
        (run / f"rank{rank}.main.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines))
    return run


@pytest.fixture
def con(tmp_path: Path):
    c = connect(tmp_path / "t.duckdb")
    ingest_run(c, _write_run(tmp_path / "logs"))
    yield c
    c.close()


def _check_format(trace: dict) -> None:
    """What the Trace Event Format requires of each event kind used here."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] in ("ms", "ns")
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "C", "M"), e
        assert isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["ts"] >= 0 and e["dur"] >= 0
        elif e["ph"] == "C":
            assert e["ts"] >= 0 and all(isinstance(v, int | float) for v in e["args"].values())
        else:
            assert e["name"] in ("process_name", "process_sort_index", "thread_name")


def test_slices_counters_and_nesting_by_hand(con, tmp_path: Path) -> None:
    t = perfetto_trace(con, "pp")
    assert (t.iterations, t.phases) == (10, 30)
    # counters: 2 queue depths, 3 RSS, 2 CPU rises and 2 run-queue rises (rank 0)
    assert t.counters == 2 + 3 + 2 + 2
    path = t.write(tmp_path / "out" / "pp.json")
    back = json.loads(path.read_text())
    _check_format(back)
    ev = back["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names == {"main rank 0 (main-0 on node-a)", "main rank 1 (main-1 on node-a)"}
    iters = [e for e in ev if e.get("cat") == "iteration"]
    assert len(iters) == 10 and {e["dur"] for e in iters} == {100_000.0}
    first = [e for e in ev if e["ph"] == "X" and e["pid"] == 1 and e["ts"] < 90_000
             and e.get("cat") != "event"]
    got = {e["name"]: (e["ts"], e["dur"], e.get("cat")) for e in first}
    # phases back to back from the iteration's start; the child at its parent's start
    assert got == {"iter 0": (0.0, 100_000.0, "iteration"),
                   "load": (0.0, 20_000.0, "starvation"),
                   "backward": (pytest.approx(20_000.0, abs=0.01), 50_000.0, "compute"),
                   "backward/allreduce_wait": (pytest.approx(20_000.0, abs=0.01), 30_000.0,
                                               "sync")}
    rss = [e["args"]["MiB"] for e in ev if e["name"] == "RSS (MiB)"]
    assert rss == [100.0, 110.0, 120.0]
    cores = [e["args"]["cores"] for e in ev if e["name"] == "process CPU (cores)"]
    assert cores == pytest.approx([0.5, 1.0])             # 0.1 s and 0.2 s of CPU in 0.2 s
    waits = [e["args"]["share"] for e in ev if e["name"] == "waiting for a core (share)"]
    assert waits == pytest.approx([0.25, 0.0])
    depth = [(e["ts"], e["args"]["depth"]) for e in ev if e["name"] == "queue hs"]
    assert depth == [(pytest.approx(150_000.0, abs=0.1), 2),
                     (pytest.approx(350_000.0, abs=0.1), 0)]
    (ck,) = [e for e in ev if e["name"] == "checkpoint"]
    assert (ck["ts"], ck["dur"], ck["tid"]) == (pytest.approx(200_000.0, abs=0.1),
                                                50_000.0, 2)


def test_a_window_of_iterations(con) -> None:
    t = perfetto_trace(con, "pp", iters=(1, 2))
    assert (t.iterations, t.phases) == (4, 12)
    ev = t.trace["traceEvents"]
    assert sorted({e["name"] for e in ev if e.get("cat") == "iteration"}) == ["iter 1", "iter 2"]
    assert [e["args"]["depth"] for e in ev if e["name"] == "queue hs"] == [2]
    assert t.trace["otherData"]["t0_epoch_s"] == pytest.approx(T0 + 0.1)


def test_the_cli_writes_it_and_bad_windows_are_one_line(tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    c = connect(db)
    ingest_run(c, _write_run(tmp_path / "logs"))
    c.close()
    out = tmp_path / "t.json"
    r = invoke(["export", "--perfetto", "pp", "-o", str(out), "--iters", "0:1",
                "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iterations"] == 4
    assert len([e for e in json.loads(out.read_text())["traceEvents"]
                if e.get("cat") == "iteration"]) == 4
    for bad in (["--iters", "3:1"], ["--iters", "x"], ["--parquet", str(tmp_path / "p")]):
        r = invoke(["export", "--perfetto", "pp", *bad, "--db", str(db)])
        assert r.exit_code != 0 and len(r.stderr.strip().splitlines()) == 1, r.output
    r = invoke(["export", "--perfetto", "nope", "--db", str(db)])
    assert r.exit_code != 0 and "no iterations of run 'nope'" in r.stderr
