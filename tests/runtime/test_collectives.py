"""Measured collective waits: the DDP hook's bookkeeping and a real gloo job.

Unit tests drive the per-recorder slot the hook feeds (``ready``/``done`` readings
in ``perf_counter`` seconds) under a frozen clock and check the written records
against waits computed by hand. The integration test runs two real DDP ranks on
gloo where rank 1 is slow by a known delay, and compares rank 0's recorded
``backward/ddp_allreduce_wait`` with the ranks' arrival difference at backward
measured by bare ``time.time()`` readings in the same script.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import records

from dflash_runtime import Recorder
from dflash_runtime.collectives import CollectiveSlot, exposed_wait, watch_ddp

HERE = Path(__file__).parent


def _rec(tmp_path: Path) -> Recorder:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    rec._coll = CollectiveSlot()  # what watch_ddp installs (it needs a DDP model)
    return rec


def test_exposed_wait_is_last_done_minus_last_ready_clipped(tmp_path, clock) -> None:
    assert exposed_wait(10.0, 10.75) == 0.75
    assert exposed_wait(10.0, 9.5) == 0.0          # done before the last bucket: nothing exposed
    assert exposed_wait(10.0, 10.75, begin=10.5) == 0.25   # counted inside the parent only


def test_round_becomes_backward_child_with_kind_sync(tmp_path, clock) -> None:
    rec = _rec(tmp_path)
    slot = rec._coll
    clock.t = 100.0
    with rec.iteration() as it:
        with it.phase("forward"):
            clock.t = 101.0
        with it.phase("backward"):                  # 101.0 .. 103.0
            slot.ready(101.5, False)                # bucket 1 ready
            slot.ready(102.0, True)                 # last bucket ready at 102.0
            slot.done(101.8)                        # bucket 1 reduced
            slot.done(102.625)                      # last bucket reduced: wait 0.625
            clock.t = 103.0
        with it.phase("optimizer"):
            clock.t = 103.5
    rec.close()
    (r,) = records(rec.path)
    assert list(r["phases"]) == ["forward", "backward", "backward/ddp_allreduce_wait",
                                 "optimizer"]
    assert r["phases"]["backward/ddp_allreduce_wait"] == 0.625
    assert r["phases"]["backward"] == 2.0           # the parent is unchanged (child inside)
    assert r["kinds"] == {"backward/ddp_allreduce_wait": "sync"}
    assert rec.stats()["ddp_rounds_lost"] == 0


def test_out_of_order_completion_and_two_rounds_sum(tmp_path, clock) -> None:
    rec = _rec(tmp_path)
    slot = rec._coll
    clock.t = 10.0
    with rec.iteration() as it, it.phase("backward"):                  # 10.0 .. 14.0
        with it.phase("inner"):                 # a child of the user's own
            clock.t = 10.5
        slot.ready(11.0, False)
        slot.ready(11.5, True)
        slot.done(12.25)                        # last bucket first (gloo threads)
        slot.done(12.0)                         # round 1: 12.25 - 11.5 = 0.75
        slot.ready(13.0, True)
        slot.done(13.125)                       # round 2: 0.125
        clock.t = 14.0
    rec.close()
    (r,) = records(rec.path)
    assert list(r["phases"]) == ["backward", "backward/inner", "backward/ddp_allreduce_wait"]
    assert r["phases"]["backward/ddp_allreduce_wait"] == 0.875


def test_unfinished_round_waits_and_stale_round_is_lost(tmp_path, clock) -> None:
    rec = _rec(tmp_path)
    slot = rec._coll
    slot.ready(1.0, True)
    slot.done(2.0)                                  # finished before any iteration
    clock.t = 10.0
    with rec.iteration() as it, it.phase("backward"):
        slot.ready(10.5, False)                     # no is_last yet: round still open
        slot.done(10.75)
        clock.t = 11.0
    clock.t = 20.0
    with rec.iteration() as it:
        it.lap("forward")                           # 20.0 .. 20.0
        with it.phase("backward"):                  # the open round ends here
            slot.ready(20.5, True)
            slot.done(21.0)                         # wait 21.0 - 20.5 = 0.5
            clock.t = 21.25
    rec.close()
    first, second = records(rec.path)
    assert first["phases"] == {"backward": 1.0} and "kinds" not in first
    assert second["phases"]["backward/ddp_allreduce_wait"] == 0.5
    assert rec.stats()["ddp_rounds_lost"] == 1      # the one finished at 2.0


def test_round_in_unaccounted_gap_is_top_level_and_clipped(tmp_path, clock) -> None:
    rec = _rec(tmp_path)
    slot = rec._coll
    clock.t = 0.0
    with rec.iteration() as it:
        with it.phase("forward"):                   # 0.0 .. 1.0
            clock.t = 1.0
        slot.ready(0.5, True)                       # ready inside forward,
        slot.done(1.5)                              # done in the gap 1.0 .. 2.0
        clock.t = 2.0
        with it.phase("optimizer"):
            clock.t = 3.0
    rec.close()
    (r,) = records(rec.path)
    assert list(r["phases"]) == ["forward", "ddp_allreduce_wait", "optimizer"]
    assert r["phases"]["ddp_allreduce_wait"] == 0.5   # 1.5 - max(0.5, 1.0)
    assert r["kinds"] == {"ddp_allreduce_wait": "sync"}


def test_disabled_watch_is_a_noop_and_stays_torch_free(tmp_path) -> None:
    code = (
        "import sys\n"
        "from dflash_runtime import Recorder\n"
        "class Model:\n"
        "    def register_comm_hook(self, *a):\n"
        "        raise AssertionError('registered')\n"
        f"rec = Recorder({str(tmp_path)!r}, enabled=False)\n"
        "assert rec.watch_ddp(Model()) is False\n"
        "import dflash_runtime.collectives as c\n"
        "assert c.watch_ddp(Model(), rec) is False\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert list(tmp_path.iterdir()) == []


def test_watch_rejects_a_module_without_comm_hooks(tmp_path) -> None:
    rec = Recorder(tmp_path, install_handlers=False)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        watch_ddp(object(), rec)
    rec.close()


DELAY_S = 0.06
STEPS = 20


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    """Run the two-rank gloo job once; return (truth, rank 0 records, rank 1 records)."""
    pytest.importorskip("torch.distributed")
    out = tmp_path_factory.mktemp("ddp")
    subprocess.run([sys.executable, str(HERE / "ddp_wait_worker.py"), str(out),
                    str(DELAY_S), str(STEPS)], check=True, timeout=120)
    truth = json.loads((out / "truth.json").read_text())
    return truth, records(out / "run" / "rank0.main.jsonl"), records(out / "run" / "rank1.main.jsonl")


def test_ddp_measured_wait_matches_arrival_difference(ddp_job) -> None:
    truth, recs0, recs1 = ddp_job
    r0, r1 = truth["ranks"]
    # steps 0-1 carry DDP's bucket rebuild (a broadcast in forward): steady steps from 2
    steady = range(2, STEPS)
    arrival = [r1["bw_start"][i] - r0["bw_start"][i] for i in steady]   # bare timers
    got0 = [recs0[i]["phases"]["backward/ddp_allreduce_wait"] for i in steady]
    got1 = [recs1[i]["phases"]["backward/ddp_allreduce_wait"] for i in steady]
    true_wait = statistics.mean(arrival)
    assert true_wait > 0.8 * DELAY_S                # the injected delay is really there
    assert abs(statistics.mean(got0) - true_wait) <= 0.3 * true_wait + 0.005
    close = sum(abs(g - a) <= 0.3 * a + 0.005 for g, a in zip(got0, arrival, strict=True))
    assert close >= 0.8 * len(arrival)
    assert statistics.mean(got1) < 0.2 * true_wait   # the slow rank hardly waits
    for i in steady:                                  # inside rank 0's own backward timer
        assert got0[i - 2] <= r0["bw_dur"][i] + 1e-6
        assert recs0[i]["kinds"]["backward/ddp_allreduce_wait"] == "sync"
        assert recs0[i]["phases"]["backward/ddp_allreduce_wait"] <= recs0[i]["phases"]["backward"]
    assert truth["stats0"]["ddp_rounds_lost"] == 0


def test_ddp_no_sync_micro_step_has_no_wait(ddp_job) -> None:
    _, recs0, recs1 = ddp_job
    for recs in (recs0, recs1):
        tail = recs[STEPS:]
        assert len(tail) == 6
        for micro, synced in zip(tail[::2], tail[1::2], strict=True):
            assert list(micro["phases"]) == ["backward"] and "kinds" not in micro
            assert list(synced["phases"]) == ["backward", "backward/ddp_allreduce_wait"]


def test_ddp_training_identical_to_unhooked_default(ddp_job) -> None:
    truth, _, _ = ddp_job
    assert truth["moved"]                  # the comparison is not of untrained models
    assert truth["same_watched"]           # measuring hook == DDP's built-in all-reduce
    assert truth["same_wrapped"]           # hook=allreduce_hook wrapped == built-in
    assert truth["again"] is True          # watched already: nothing registered twice
    assert "call rec.watch_ddp(model, hook=...) before rec.instrument" in truth["second_error"]
    assert "already has a communication hook" in truth["own_error"]
