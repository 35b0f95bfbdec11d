"""dflash_runtime.p2p: point-to-point waits timed as ``recv_wait``/``send_wait`` (sync).

The wrappers are checked here in one process (a fake ``Work`` whose ``wait()``
sleeps, timed against bare ``perf_counter`` readings around the same call);
real gloo transfers between two ranks are tests/pp/ (torchrun)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from torch.distributed import distributed_c10d as c10d

from dflash_runtime import Recorder
from dflash_runtime.p2p import PATCHED, TimedWork, watch_p2p


class SlowWork:
    """A stand-in for a backend ``Work``: ``wait()`` sleeps ``s`` seconds."""

    def __init__(self, s: float) -> None:
        self.s = s
        self.waited = 0

    def wait(self, timeout=None):
        time.sleep(self.s)
        self.waited += 1
        return True

    def is_completed(self) -> bool:
        return self.waited > 0


def _records(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in next(run.glob("rank0.*.jsonl")).read_text().splitlines()]
    return [r for r in lines if r["type"] == "iter"]


def test_remove_puts_back_the_very_functions(tmp_path: Path) -> None:
    before = {(m.__name__, n): getattr(m, n) for m in (dist, c10d) for n in PATCHED}
    rec = Recorder(tmp_path, sys_interval=0)
    watch = watch_p2p(rec)
    assert all(getattr(m, n) is not before[(m.__name__, n)] for m in (dist, c10d)
               for n in PATCHED)
    # P2POp checks its op against distributed_c10d's globals: the two modules agree
    assert dist.isend is c10d.isend and dist.irecv is c10d.irecv
    with pytest.raises(RuntimeError, match="already watched"):
        watch_p2p(rec)
    watch.remove()
    watch.remove()
    assert all(getattr(m, n) is before[(m.__name__, n)] for m in (dist, c10d) for n in PATCHED)
    rec.close()


def test_a_wait_is_a_sync_phase_as_long_as_the_bare_timers_say(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, sys_interval=0)
    watch = watch_p2p(rec)
    truth = []
    try:
        for _ in range(3):
            with rec.iteration() as it:
                with it.phase("forward"):
                    time.sleep(0.002)
                w = TimedWork(SlowWork(0.03), "recv_wait", watch._where)
                t0 = time.perf_counter()
                assert w.wait() is True
                truth.append(time.perf_counter() - t0)
                assert w.is_completed()                     # other attributes are the work's
                with it.phase("backward"):
                    TimedWork(SlowWork(0.01), "send_wait", watch._where).wait()
        TimedWork(SlowWork(0.001), "recv_wait", watch._where).wait()   # no iteration: untimed
    finally:
        watch.remove()
        rec.close()
    recs = _records(tmp_path)
    assert len(recs) == 3
    for r, t in zip(recs, truth, strict=True):
        assert list(r["phases"]) == ["forward", "recv_wait", "backward", "backward/send_wait"]
        assert r["kinds"] == {"recv_wait": "sync", "backward/send_wait": "sync"}
        # within the bare timer around the wait, and at least the work's own 30 ms
        # (a loaded machine may deschedule the test between the two clock reads)
        assert 0.03 <= r["phases"]["recv_wait"] <= t + 1e-6
        assert r["phases"]["backward/send_wait"] >= 0.01


def test_a_blocking_call_is_timed_once(tmp_path: Path) -> None:
    """A blocking ``send`` made of ``isend(...).wait()`` inside is one wait, not two."""
    rec = Recorder(tmp_path, sys_interval=0)
    watch = watch_p2p(rec)
    try:
        inner = TimedWork(SlowWork(0.01), "send_wait", watch._where)
        from dflash_runtime.p2p import _timed_call

        send = _timed_call(lambda: inner.wait(), "send_wait", watch._where)
        with rec.iteration():
            send()
    finally:
        watch.remove()
        rec.close()
    (r,) = _records(tmp_path)
    assert list(r["phases"]) == ["send_wait"]
    assert r["phases"]["send_wait"] >= 0.01


def test_disabled_recorder_watches_nothing(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, enabled=False)
    assert watch_p2p(rec) is None
    assert rec.watch_p2p() is None
