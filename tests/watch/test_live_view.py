"""The live view's figures (tlog.analyze.live) on hand-made runs, checked
against values computed by hand: a run that turns from compute-bound to
input-bound, watched over a window holding only its recent part."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tlog.ingest.errors import UsageError

import tlog
from tests.support.cli import invoke

FAST, SLOW = 0.02, 0.04          # seconds per iteration before and after the change
N_FAST, N_SLOW = 300, 300
T_BASE, T_LIVE = 1000.0, 2000.0  # start times (epoch s)


def _write_run(root: Path, run_id: str, started: float, iters: list[dict],
               queues: list[dict] = (), sys_samples: list[dict] = ()) -> Path:
    d = root / run_id
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"v": 1, "run_id": run_id, "started": started,
                                            "tags": {"model": "m1"}}))
    lines = [{"type": "meta", "v": 1, "rank": 0, "stage": "main", "worker": "main-0",
              "host": "h", "pid": 1, "clock": {"wall": started, "mono": 0.0}}]
    lines += [{"type": "iter", **i} for i in iters] + [{"type": "queue", **q} for q in queues]
    lines += [{"type": "sys", "v": 1, **x} for x in sys_samples]
    (d / "rank0.main.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def _fast(k: int, t0: float) -> dict:
    return {"iter": k, "ts": t0 + FAST * k, "dur": FAST, "phases": {"forward": 0.018},
            "mem": {"allocated": 500_000, "reserved": 1_000_000}}


def _slow(k: int) -> dict:
    # after the change: 30 ms waiting for data (load_batch: starvation), 9 ms
    # forward, 1 ms unaccounted; allocated memory grows 1000 bytes an iteration
    return {"iter": N_FAST + k, "ts": T_LIVE + FAST * N_FAST + SLOW * k, "dur": SLOW,
            "phases": {"load_batch": 0.030, "forward": 0.009},
            "gpu": {"forward": 0.008},
            "mem": {"allocated": 1_000_000 + 1000 * k, "reserved": 4_000_000}}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> tlog.Database:
    root = tmp_path_factory.mktemp("live")
    base = _write_run(root, "base", T_BASE, [_fast(k, T_BASE) for k in range(200)])
    t_slow = T_LIVE + FAST * N_FAST
    queues = [{"name": "hs_queue", "ts": t_slow + SLOW * k + 0.001, "depth": k % 3,
               "capacity": 8} for k in range(N_SLOW)]
    # the process's RSS: 100 MB through the fast part, then 2048 bytes more per
    # iteration; a sample every 10 iterations, taken 1 ms into it
    sys_samples = [{"ts": T_LIVE + FAST * k + 0.001, "iter": k, "rss": 100_000_000}
                   for k in range(0, N_FAST, 10)]
    sys_samples += [{"ts": t_slow + SLOW * k + 0.001, "iter": N_FAST + k,
                     "rss": 100_000_000 + 2048 * k} for k in range(0, N_SLOW, 10)]
    live = _write_run(root, "live", T_LIVE,
                      [_fast(k, T_LIVE) for k in range(N_FAST)]
                      + [_slow(k) for k in range(N_SLOW)], queues, sys_samples)
    database = tlog.open(root / "db.duckdb")
    database.ingest(base)
    database.ingest(live)
    return database


def test_window_shows_the_recent_state(db: tlog.Database) -> None:
    # last end: 2000 + 6 + 12 = 2018 s; a 9.98 s window starts at 2008.02: the
    # slow iterations k = 51..299 (k = 50 starts at 2008.00), 249 of them
    v = db.live_view("live", window_s=9.98)
    assert v.iterations == N_FAST + N_SLOW
    assert v.last_end == pytest.approx(T_LIVE + FAST * N_FAST + SLOW * N_SLOW)
    assert v.window.since == pytest.approx(v.last_end - 9.98)
    assert v.window.first == pytest.approx(T_LIVE + FAST * N_FAST + SLOW * 51)
    assert v.window.seconds == pytest.approx(SLOW * (N_SLOW - 51))
    assert v.window.iterations == 249
    assert not v.window.whole_run
    d = v.diagnosis
    assert v.unit == "it/s"
    assert v.now == pytest.approx(1 / SLOW, rel=1e-6)            # 25 it/s, not the run's 33.3
    assert d.bottleneck.category == "starvation"
    assert d.bottleneck.phase == "load_batch"
    assert d.bottleneck.share == pytest.approx(0.030 / SLOW, rel=1e-6)   # 75%
    shares = d.stages[0].categories
    assert shares.compute == pytest.approx(0.009 / SLOW, rel=1e-6)
    assert shares.unaccounted == pytest.approx(0.001 / SLOW, rel=1e-4)
    assert any("window" in n for n in d.notes)
    assert d.device_times          # the window's device lists line up with its rows


def test_whole_run_when_the_window_is_longer(db: tlog.Database) -> None:
    v = db.live_view("live", window_s=60.0)
    assert v.window.whole_run and v.window.iterations == N_FAST + N_SLOW
    assert v.window.seconds == pytest.approx(FAST * N_FAST + SLOW * N_SLOW)
    # the window's figures are then diagnose's of the whole run
    whole = db.diagnose("live")
    assert v.now == pytest.approx(whole.throughput.iters_per_s)
    assert v.diagnosis.bottleneck.share == pytest.approx(whole.bottleneck.share)


def test_high_water_mark_is_the_best_earlier_run(db: tlog.Database) -> None:
    hw = db.high_water_mark("live")
    assert hw.run_id == "base" and hw.reason is None
    assert hw.value("iters_per_s") == pytest.approx(1 / FAST, rel=1e-6)     # 50 it/s
    v = db.live_view("live", window_s=9.98, high_water=hw)
    assert v.high_water_value == pytest.approx(50.0, rel=1e-6)
    assert v.vs_high_water == pytest.approx(25.0 / 50.0, rel=1e-6)
    first = db.high_water_mark("base")          # nothing started before it
    assert first.run_id is None and "no run started before it" in first.reason


def test_latest_queue_depth_and_memory_trend(db: tlog.Database) -> None:
    v = db.live_view("live", window_s=9.98)
    (q,) = v.queues
    assert (q.name, q.worker, q.depth, q.capacity) == ("hs_queue", "main-0", (N_SLOW - 1) % 3, 8)
    assert q.ts == pytest.approx(T_LIVE + FAST * N_FAST + SLOW * (N_SLOW - 1) + 0.001)
    rss, device = v.memory                      # the faster growing first (2048 > 1000 B/iter)
    assert (device.kind, device.source) == ("device memory", "iterations' mem")
    assert device.first_bytes == 500_000                # the run's first reading
    assert device.latest_bytes == 1_000_000 + 1000 * (N_SLOW - 1)
    assert device.peak_bytes == device.latest_bytes
    assert device.samples == 249                        # k = 51..299
    assert device.rate_bytes_per_iter == pytest.approx(1000, rel=1e-6)
    assert (rss.kind, rss.source, rss.worker) == ("RSS", "sys samples", "main-0")
    assert rss.first_bytes == 100_000_000
    assert rss.latest_bytes == rss.peak_bytes == 100_000_000 + 2048 * 290
    assert rss.samples == len(range(60, N_SLOW, 10))    # samples in the window: k = 60..290
    assert rss.rate_bytes_per_iter == pytest.approx(2048, rel=1e-6)


def test_whole_run_trends_come_from_the_stored_diagnosis(db: tlog.Database) -> None:
    """The trends a window cannot see are read as the whole run's diagnosis
    was stored by the ingest (not recomputed)."""
    from tlog.analyze.live import WHOLE_RUN_CODES

    v = db.live_view("live", window_s=9.98)
    whole = v.whole_run
    assert whole is not None and whole.iterations == N_FAST + N_SLOW
    assert time.time() - 600 < whole.computed_at <= time.time()
    stored = [f for f in db.diagnose("live").findings if f.code in WHOLE_RUN_CODES]
    assert [(f.code, f.message) for f in whole.findings] == [(f.code, f.message)
                                                             for f in stored]


def test_bad_window_is_a_usage_error(db: tlog.Database) -> None:
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="window_s"):
            db.live_view("live", window_s=bad)


def test_names_from_the_logs_cannot_act_on_the_terminal(tmp_path: Path) -> None:
    """A stage, worker, phase and queue name holding terminal controls (clear
    screen, OSC 52 clipboard write) are shown escaped in the view."""
    from io import StringIO

    from rich.console import Console

    from tlog.commands.watch import _view, summary_line

    stage, phase = "st\x1b[2Jx", "load\x1b]52;c;QUFB\x07_batch"
    d = tmp_path / "evil"
    d.mkdir()
    lines = [{"type": "meta", "v": 1, "rank": 0, "stage": stage, "worker": "w\x1b[1A",
              "host": "h", "pid": 1, "clock": {"wall": T_LIVE, "mono": 0.0}}]
    lines += [{"type": "iter", "iter": k, "ts": T_LIVE + SLOW * k, "dur": SLOW,
               "phases": {phase: 0.030, "forward": 0.009}} for k in range(100)]
    lines += [{"type": "queue", "name": "q\x1b[31m", "ts": T_LIVE + 1.0, "depth": 1}]
    (d / "rank0.x.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    db = tlog.open(tmp_path / "db.duckdb")
    db.ingest(d)
    v = db.live_view("evil")
    assert v.diagnosis.bottleneck.phase == phase         # the name itself is kept
    out = StringIO()
    Console(file=out, width=200, color_system=None).print(_view(v, 2.0, True))
    text = out.getvalue() + summary_line(v)
    assert "\x1b" not in text and "\x07" not in text
    assert "load\\x1b]52;c;QUFB\\x07_batch" in text and "st\\x1b[2Jx" in text


def test_a_database_held_by_a_service_that_does_not_answer_is_one_line(
        tmp_path: Path) -> None:
    """tlog watch goes through a live 'tlog serve' (docs/SERVE.md); one that holds
    the database but does not answer: one line saying so, exit 1, nothing written."""
    import os

    from tlog.web.endpoint import Announcement, ServiceInfo

    served, run_dir = tmp_path / "runs", tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    db = tmp_path / "served.duckdb"
    ann = Announcement(ServiceInfo(url="http://127.0.0.1:9", pid=os.getpid(), db=str(db),
                                   watch=[str(served)], token="t" * 24))
    try:
        result = invoke(["watch", str(run_dir), "--db", str(db)])
    finally:
        ann.close()
    assert result.exit_code == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("tlog: error: tlog serve (pid") and "does not answer" in line
    assert not db.exists()
