"""A measured DDP wait is never called inferred (tests/data/ddp_measured_tail: a
new user's real 2-rank gloo run, instrumented with ``rec.instrument``, rank 1 an
input straggler; the same script's bare timers in ``truth/``).

tlog measured the all-reduce wait in backward and also found a second, inferred
collective of about a millisecond after the last phase; the verdict and the
straggler finding then called the measured wait "inferred from rank alignment".
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import tlog

DATA = Path(__file__).resolve().parents[1] / "data" / "ddp_measured_tail"


@pytest.fixture(scope="module")
def diagnosis(tmp_path_factory):
    db = tlog.open(tmp_path_factory.mktemp("tail") / "t.duckdb")
    return db.diagnose(db.ingest(DATA / "run").run_id)


def _timers(rank: int) -> list[dict]:
    return json.loads((DATA / "truth" / f"truth-rank{rank}.json").read_text())["steps"]


def test_the_measured_wait_is_called_measured_beside_an_inferred_tail(diagnosis) -> None:
    d = diagnosis.to_dict()
    lock = d["stages"][0]["lockstep"]
    methods = {c["phase"]: c["method"] for c in lock["collectives"]}
    # the case: backward measured, a small inferred collective after the last phase
    assert methods == {"backward": "measured", None: "inferred"}
    [s] = d["stragglers"]
    assert (s["rank"], s["kind"], s["phase"]) == (1, "input", "data_fetch")
    assert (s["wait_phase"], s["wait_method"]) == ("backward", "measured")
    assert "inferred" not in d["verdict"]
    [f] = [f for f in d["findings"] if f["code"] == "straggler"]
    assert "at the collective in backward;" in f["message"]
    assert "inferred" not in f["message"]
    assert not any("is inferred from rank alignment" in n for n in d["notes"])
    # the wait is measured: no finding suggests measuring it
    assert not any("may also wait for a peer" in f["message"] for f in d["findings"])


def test_the_measured_wait_is_the_timers(diagnosis) -> None:
    # rank 0's exposed all-reduce wait per step by the script's own timers (backward's
    # return - the last DDP bucket ready), over the steps tlog judged steady
    steady = set(diagnosis.analysis.steady.filter(
        diagnosis.analysis.steady["wid"] == 0)["iter"].to_list())
    want = statistics.mean(st["ar_wait"] for i, st in enumerate(_timers(0)) if i in steady)
    got = diagnosis.to_dict()["stages"][0]["lockstep"]["collectives"][0]["wait_s_per_iter"]["0"]
    assert got == pytest.approx(want, rel=0.05)


UNWATCHED = DATA.parent / "ddp_backward_straggler_unwatched"


def test_a_rank_blocked_in_an_unwatched_backward_is_told_it_may_wait_for_a_peer(
        tmp_path) -> None:
    """tests/data/ddp_backward_straggler_unwatched: rank 1's extra work inside backward,
    the DDP wait not measured. By the script's timers rank 0 spends most of its step
    waiting in the all-reduce (more than its thread's CPU time); tlog sees it only
    as rank 0 off the CPU in compute, and must name the peer as a possible cause and
    how to measure it."""
    steps = json.loads((UNWATCHED / "truth" / "truth-rank0.json").read_text())["steps"][5:]
    wait = statistics.mean(s["ar_wait"] for s in steps)
    assert wait > 0.4 * statistics.mean(s["step"] for s in steps)     # the truth of the case
    db = tlog.open(tmp_path / "t.duckdb")
    d = db.diagnose(db.ingest(UNWATCHED / "run").run_id).to_dict()
    assert d["stragglers"] == []                  # the documented limit: durations are equal
    [f] = [f for f in d["findings"] if f["code"] == "blocked_in_compute"
           and f["evidence"]["rank"] == 0]
    assert ("with 2 ranks in main it may also wait for a peer at a collective inside a "
            "compute phase" in f["message"])
    assert "rec.watch_ddp(model) measures that wait" in f["message"]
    # and the blocked time it reports is of the order of that wait (183 vs 241 ms)
    assert 0.5 * wait <= f["evidence"]["blocked_s_per_iter"] <= wait
