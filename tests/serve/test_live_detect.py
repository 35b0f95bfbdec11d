"""A straggler that starts mid-run is flagged live, within 30 s of its onset.

Two real jobs (``benchmarks/live_job.py``: 3 processes each writing with the
shim's recorder, in lockstep through a ``multiprocessing.Barrier`` that
stands for the gradient all-reduce) run beside a real ``tlog serve`` on
loopback (its default 2 s ingest interval) and a real ``tlog watch`` of the
straggler's run. In one job rank 1 starts sleeping 40 ms more in
``forward`` at step :data:`ONSET_STEP` (about 8 s in: steps of 55 ms by
their sleeps) and writes the wall time it did so (``onset.json``: its own
clock, the truth); the other job stays healthy.

Asserted: ``GET /api/runs/slow/live`` names rank 1 (and only it) within
30 s of the onset; the run page shows it under "Now"; the watch's summary
line names it within the same 30 s; the healthy job is never flagged from
its start until 30 s after the other's onset, and the straggler's run is not
flagged before its onset.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import live_job
from tests.serve.served import ROOT, start_service, tlog_env

ONSET_STEP = 150
#: The issue's bar: flagged within this many seconds of the onset.
DETECT_WITHIN_S = 30.0
SLOW_RANK = 1


def _watch_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError:
        return []


def test_a_straggler_starting_mid_run_is_flagged_within_30_s(tmp_path: Path) -> None:
    served = start_service(tmp_path, interval=2.0)
    seconds = 50.0
    slow = live_job.start(served.runs / "slow", onset_step=ONSET_STEP, seconds=seconds,
                          log=tmp_path / "slow.log")
    healthy = live_job.start(served.runs / "healthy", seconds=seconds,
                             log=tmp_path / "healthy.log")
    watch_out = tmp_path / "watch.out"
    watch = subprocess.Popen(
        [sys.executable, "-m", "tlog", "watch", str(served.runs / "slow"), "--db",
         str(served.db), "--interval", "2"], cwd=ROOT, env=tlog_env(),
        stdout=watch_out.open("w"), stderr=(tmp_path / "watch.err").open("w"))
    api_at = page_at = watch_at = None
    before_onset: list[int] = []
    healthy_flags: list[int] = []
    onset = None
    try:
        while True:
            now = time.time()
            onset = onset or live_job.onset_of(served.runs / "slow")
            named = live_job.flagged(served, "slow")
            if onset is None:
                before_onset += named
            elif api_at is None and named:
                assert named == [SLOW_RANK], f"wrong ranks flagged: {named}"
                api_at = now
            healthy_flags += live_job.flagged(served, "healthy")
            if onset is not None and page_at is None and api_at is not None:
                status, _, body = served.get("/run/slow")
                assert status == 200
                now_list = body.decode().split('id="now-stragglers"')[1].split("</ul>")[0]
                if f"rank {SLOW_RANK} of train" in now_list:
                    page_at = time.time()
            if onset is not None and watch_at is None and any(
                    f"straggler: rank {SLOW_RANK} of train" in line
                    for line in _watch_lines(watch_out)):
                watch_at = time.time()
            if onset is not None and now - onset["wall"] > DETECT_WITHIN_S:
                break
            assert slow.poll() is None and healthy.poll() is None, (
                (tmp_path / "slow.log").read_text() + (tmp_path / "healthy.log").read_text())
            time.sleep(0.25)
    finally:
        for name in ("slow", "healthy"):
            (served.runs / f"{name}.stop").touch()
        watch.terminate()
        for p in (slow, healthy, watch):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        served.stop()
    assert onset is not None and onset["step"] == ONSET_STEP
    assert before_onset == [], "the straggler's run was flagged before its onset"
    assert healthy_flags == [], f"the healthy run was flagged: ranks {sorted(set(healthy_flags))}"
    assert api_at is not None, f"/api/runs/slow/live named no straggler within {DETECT_WITHIN_S} s"
    assert api_at - onset["wall"] <= DETECT_WITHIN_S
    assert page_at is not None and page_at - onset["wall"] <= DETECT_WITHIN_S, \
        "the run page's Now list did not name the straggler in time"
    assert watch_at is not None and watch_at - onset["wall"] <= DETECT_WITHIN_S, \
        "tlog watch did not name the straggler in time: " + "\n".join(_watch_lines(watch_out)[-3:])
    print(json.dumps({"api_s": api_at - onset["wall"], "page_s": page_at - onset["wall"],
                      "watch_s": watch_at - onset["wall"]}))


def test_live_answers_the_window_by_hand_and_refuses_bad_windows(tmp_path: Path) -> None:
    """``small`` (tests/serve/runs.py): 20 iterations of 40 ms, 100 tokens each,
    so a 30 s window holds the whole run: 2,500 tokens/s, no straggler (one rank)."""
    from tests.serve.runs import write_pair

    (tmp_path / "runs").mkdir()
    write_pair(tmp_path / "runs")
    served = start_service(tmp_path)
    try:
        served.wait_for_runs({"small"})
        v = served.json("/api/runs/small/live")
        assert (v["run_id"], v["iterations"], v["unit"]) == ("small", 20, "tokens/s")
        assert v["window"]["whole_run"] is True and v["window"]["iterations"] == 20
        assert v["now"] == pytest.approx(2500.0)
        assert v["stragglers"] == [] and v["verdict"] == v["diagnosis"]["verdict"]
        short = served.json("/api/runs/small/live?window=0.1")
        assert short["window"]["whole_run"] is False and short["window"]["iterations"] < 20
        for window in ("abc", "-1", "nan", "inf"):
            status, _, body = served.get(f"/api/runs/small/live?window={window}")
            assert status == 400, window
            assert "window" in json.loads(body)["error"]
        assert served.get("/api/runs/nosuch/live")[0] == 404
    finally:
        served.stop()
