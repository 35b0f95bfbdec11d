"""``tlog serve --publish LAKE``: the service publishes each watched run once its files
are quiet, publishes it again when it grew, and ``tlog publish`` works beside it.

Truth: the figures by construction of ``runs.write_small_run`` (n iterations of
load 10 ms + forward 30 ms) and the lines appended to the run's file, read back
from the lake's Parquet files by DuckDB; never tlog's own report.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.serve.runs import write_small_run
from tests.serve.served import start_service, tlog_env

pytest.importorskip("uvicorn")


def lake_figures(lake: Path, run_id: str) -> tuple[int, float, int]:
    """(iterations, sum of dur in s, manifests) of ``run_id`` in ``lake``, read from the
    files its current manifest names; read again when a publish replaced them
    meanwhile, as tlog's own readers do (queries.lake.READ_RETRIES)."""
    from tlog.queries.lake import READ_RETRIES

    folder = lake / "_tlog" / "runs" / run_id
    for attempt in range(READ_RETRIES + 1):
        manifests = sorted(folder.glob("*.json")) if folder.is_dir() else []
        if not manifests:
            return 0, 0.0, 0
        try:
            m = json.loads(manifests[-1].read_text())
            path = lake / m["tables"]["iterations"]["file"]
            n, dur = duckdb.connect().execute(
                "SELECT count(*), sum(dur) FROM read_parquet($p)", {"p": str(path)}).fetchall()[0]
        except (FileNotFoundError, duckdb.IOException):
            if attempt == READ_RETRIES:
                raise
            continue
        return int(n), float(dur or 0.0), len(manifests)
    raise AssertionError("not reached")


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_serve_publishes_finished_runs_and_republishes_grown_ones(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    served = start_service(tmp_path, extra=["--publish", str(lake), "--publish-after", "1"])
    try:
        run_dir = write_small_run(served.runs, "quiet", n=20)
        t0 = time.monotonic()
        wait_for(lambda: lake_figures(lake, "quiet")[0] == 20, 60, "the first publish")
        n, dur, manifests = lake_figures(lake, "quiet")
        assert (n, manifests) == (20, 1)
        assert dur == pytest.approx(20 * 0.040, rel=1e-9)
        # published only after the files were quiet for --publish-after (1 s)
        assert time.monotonic() - t0 >= 1.0
        # the run grows: 10 more iterations appended; published again, replacing
        with (run_dir / "rank0.main.jsonl").open("a", encoding="utf-8") as fh:
            for i in range(20, 30):
                fh.write(json.dumps({"type": "iter", "iter": i, "ts": 1_764_403_300.0 + i,
                                     "dur": 0.04, "tokens": 100,
                                     "phases": {"load": 0.01, "forward": 0.03}}) + "\n")
        wait_for(lambda: lake_figures(lake, "quiet")[0] == 30, 60, "the second publish")
        n, dur, manifests = lake_figures(lake, "quiet")
        assert (n, manifests) == (30, 1)          # the earlier version removed
        assert dur == pytest.approx(30 * 0.040, rel=1e-9)
        # tlog publish beside the live service: the service publishes, exit 0
        other = tmp_path / "lake2"
        r = subprocess.run([sys.executable, "-m", "tlog", "publish", str(other), "--db",
                            str(served.db), "--run", "quiet", "--json"], check=False, capture_output=True,
                           text=True, cwd=tmp_path, env=tlog_env(), timeout=120)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)[0]["rows"]["iterations"] == 30
        assert lake_figures(other, "quiet")[0] == 30
        # a run id that does not exist: one line, exit 1, nothing written
        r = subprocess.run([sys.executable, "-m", "tlog", "publish", str(tmp_path / "lake3"),
                            "--db", str(served.db), "--run", "nope"], check=False, capture_output=True,
                           text=True, cwd=tmp_path, env=tlog_env(), timeout=120)
        assert r.returncode == 1
        assert len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr
        assert not (tmp_path / "lake3" / "_tlog" / "runs").exists()
    finally:
        err = served.stop()
    assert "published run quiet" in err
