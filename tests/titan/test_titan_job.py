"""A real 2-rank gloo DDP job logged as torchtitan logs it, and by the shim, against bare timers.

``titan_job.py`` (its docstring says what runs) is one job of 32 steps whose rank 1
has a slow loader (an input straggler), recorded three ways at once: torchtitan's
structured logs (written by torchtitan's own writer code, ``titan_writer.py``),
the shim's plain phases, and bare ``perf_counter`` timers (the truth, never read
by tlog). ``tlog ingest`` of the torchtitan dump folder goes through the
``tlog.sources`` entry point ``torchtitan``, as a plugin's source would.

Asserted: the verdict on the torchtitan logs is the one the fault calls for (rank
1, and only rank 1, an input straggler in ``fetching_batch``); the attribution
and verdict match those of the shim's logs of the same job (shares within 5
points, the same straggler, gains within 20% of each other); and against the
truth: the starvation share within 10 points of the timers' data share, sync
between the timers' peer wait and whole exposed wait (10 points either way: a
wait inferred from rank alignment sees the peer wait, not the transfer every
rank waits alike, tests/ddp/README.md), the straggler's gain within 25% of the
lockstep gain on the timers and under 1.05x removing the whole fault (the bars
of tests/ddp).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tlog import analyze, ingest

HERE = Path(__file__).resolve().parent
JOB = HERE / "titan_job.py"
SLOW_RANK = 1
WORLD = 2
#: Seconds the job may take: several times what it takes on a loaded 2-core machine
#: (docs/TIMER_LOGS.md has its times).
JOB_TIMEOUT_S = 240
SHARE_TOLERANCE = 0.10      # against the truth (tests/ddp's bar)
GAIN_TOLERANCE = 0.25       # against the truth (tests/ddp's bar)
SAME_SHARE = 0.05           # torchtitan's logs against the shim's, same job: tlog's choice
#: ... for the straggler's gain: tlog's choice. torchtitan's one ``fwd_bwd`` span
#: around forward and backward carves the ranks' forward-time differences into the
#: inferred wait too, where the shim's ``backward`` holds only the all-reduce, so
#: its gain reads higher (docs/TIMER_LOGS.md has the measured figures).
SAME_GAIN = 0.20


def _missing() -> str | None:
    try:
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - any import failure means no gloo here
        return f"torch.distributed does not import: {e}"
    if not dist.is_available() or not dist.is_gloo_available():
        return "torch.distributed with gloo is not available in this torch build"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Truth:
    """The bare timers of both ranks (``truth-rank{R}.json``), over their steady steps."""

    ranks: list[dict]

    def steps(self) -> list[list[dict]]:
        """Per steady step (the same on every rank), each rank's figures."""
        first = self.ranks[0]["steady_steps"]
        by_step = [{s["step"]: s for s in r["per_step"]} for r in self.ranks]
        return [[b[i] for b in by_step] for i in first]

    @staticmethod
    def wait(p: dict) -> float:
        """The step's exposed collective wait: DDP's gradient all-reduce after the
        last bucket was ready, plus the metrics collectives."""
        return p["ddp_wait_s"] + p["metrics_s"]

    def share(self, key: str) -> float:
        """Time-weighted share of the step in ``key``, all ranks."""
        steps = [p for per in self.steps() for p in per]
        return sum(p[key] for p in steps) / sum(p["step_s"] for p in steps)

    def exposed_share(self) -> float:
        steps = [p for per in self.steps() for p in per]
        return sum(self.wait(p) for p in steps) / sum(p["step_s"] for p in steps)

    def peer_wait_share(self) -> float:
        """The part of the exposed wait that is waiting for a slower peer: per step,
        each rank's wait less the smallest wait of the step (what rank alignment sees)."""
        total = peer = 0.0
        for per in self.steps():
            low = min(self.wait(p) for p in per)
            peer += sum(self.wait(p) - low for p in per)
            total += sum(p["step_s"] for p in per)
        return peer / total

    def lockstep_gain(self, rank: int = SLOW_RANK) -> float:
        """Speedup with ``rank``'s fault gone, by the lockstep model (tests/ddp
        ``ddp_runs.Truth.lockstep_gain``): per step the slowest rank's own work
        (step - wait, less the fault on ``rank``) plus the smallest wait."""
        total = fixed = 0.0
        for per in self.steps():
            total += sum(p["step_s"] for p in per) / len(per)
            fixed += (max(p["step_s"] - self.wait(p) - (p["fault_s"] if r == rank else 0.0)
                          for r, p in enumerate(per)) + min(self.wait(p) for p in per))
        return total / fixed

    def gain_from_fault(self, rank: int = SLOW_RANK) -> float:
        """sum(step) / (sum(step) - sum(fault)) on ``rank``: the most removing it can give."""
        steps = [per[rank] for per in self.steps()]
        step = sum(p["step_s"] for p in steps)
        return step / (step - sum(p["fault_s"] for p in steps))


@dataclass
class Job:
    out: Path
    truth: Truth
    titan: dict          # tlog diagnose of the torchtitan logs (to_dict)
    shim: dict           # ... of the shim's logs
    titan_report: ingest.IngestReport
    con_titan: object


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Job:
    missing = _missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path_factory.mktemp("titan_job")
    port = _free_port()
    env = {**os.environ, "TLOG_SYS_INTERVAL": "0"}
    procs = [subprocess.Popen([sys.executable, str(JOB), "--rank", str(r), "--world", str(WORLD),
                               "--port", str(port), "--out", str(out),
                               "--slow-rank", str(SLOW_RANK)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(WORLD)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=JOB_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the job ran past {JOB_TIMEOUT_S} s")
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r][-3000:]}"
    truth = Truth([json.loads((out / "truth" / f"truth-rank{r}.json").read_text())
                   for r in range(WORLD)])
    con_t = ingest.connect(out / "titan.duckdb")
    rep = ingest.ingest_run(con_t, out / "titan", run_id="titan")
    con_s = ingest.connect(out / "shim.duckdb")
    ingest.ingest_run(con_s, out / "shim", run_id="shim")
    shim = analyze.diagnose(con_s, "shim").to_dict()
    con_s.close()
    yield Job(out, truth, analyze.diagnose(con_t, "titan").to_dict(), shim, rep, con_t)
    con_t.close()


#: Bound on the median gap between a bare timer and torchtitan's span around it
#: (seconds): a few lines of Python and one log line each side take tens of us on
#: a quiet machine; beside a full test run on 2 cores the median reached 2.0 ms.
#: tlog's choice: the gaps' bound, not the spans' (each span is also bounded exactly).
MEDIAN_GAP_S = 0.005


def _named(d: dict) -> set[int]:
    return {s["rank"] for s in d["stragglers"]}


def _entry(d: dict, rank: int, kind: str) -> dict:
    found = [s for s in d["stragglers"] if s["rank"] == rank and s["kind"] == kind]
    assert len(found) == 1, f"want one {kind} straggler entry for rank {rank}: {d['stragglers']}"
    return found[0]


def test_the_logs_load_through_the_torchtitan_source(job: Job) -> None:
    rep = job.titan_report
    assert rep.source == "torchtitan"
    assert rep.records_rejected == 0 and rep.warnings == []
    con = job.con_titan
    # every step of both ranks, numbered as torchtitan numbers them (from 1)
    rows = con.execute("SELECT worker, min(iter), max(iter), count(*), min(tokens), "
                       "max(tokens) FROM iterations GROUP BY worker ORDER BY worker").fetchall()
    assert rows == [("training-0", 1, 32, 32, 512, 512), ("training-1", 1, 32, 32, 512, 512)]
    # torchtitan's spans against the bare timers, per step: the timers of the fetch
    # run inside fetching_batch, the step span inside the timers' step. Each bound
    # holds exactly; the gaps are the few lines between a timer and a span's edge,
    # where a loaded machine may deschedule one step for tens of ms: the median
    # of the gaps is what is bounded, by MEDIAN_GAP_S
    for rank in range(WORLD):
        got = dict(con.execute("SELECT iter, host_s FROM phases WHERE rank = ? AND "
                               "phase = 'fetching_batch'", [rank]).fetchall())
        dur = dict(con.execute("SELECT iter, dur FROM iterations WHERE rank = ?",
                               [rank]).fetchall())
        per = job.truth.ranks[rank]["per_step"]
        for st in per:
            assert got[st["step"]] >= st["data_s"] - 1e-6, st
            assert dur[st["step"]] <= st["step_s"] + 1e-6, st
        assert statistics.median(got[st["step"]] - st["data_s"] for st in per) < MEDIAN_GAP_S
        assert statistics.median(st["step_s"] - dur[st["step"]] for st in per) < MEDIAN_GAP_S


def test_the_verdict_is_the_injected_input_straggler(job: Job) -> None:
    d = job.titan
    assert d["iterations"]["steady"] >= 2 * 20, d["iterations"]   # the straggler check ran
    assert _named(d) == {SLOW_RANK}, d["verdict"]
    entry = _entry(d, SLOW_RANK, "input")
    assert entry["phase"] == "fetching_batch"
    assert d["stragglers"][0] is not None and d["stragglers"][0]["kind"] == "input"
    assert d["bottleneck"]["straggler"]["rank"] == SLOW_RANK, d["verdict"]
    assert f"rank {SLOW_RANK} of training is an input straggler" in d["verdict"], d["verdict"]


def test_the_same_attribution_and_verdict_as_the_shims_logs(job: Job) -> None:
    t, s = job.titan, job.shim
    for cat in ("starvation", "compute", "sync", "unaccounted"):
        assert abs(t["categories"][cat] - s["categories"][cat]) <= SAME_SHARE, (
            cat, t["categories"], s["categories"])
    assert _named(s) == _named(t) == {SLOW_RANK}, (t["verdict"], s["verdict"])
    for d in (t, s):
        assert {k: d["bottleneck"]["straggler"][k] for k in ("rank", "kind")} == {
            "rank": SLOW_RANK, "kind": "input"}, d["verdict"]
    # In a 2-rank input straggler the slow rank's starvation and its peer's wait for
    # it are the same seconds: the bottleneck's category is whichever is larger, the
    # same in both unless the two are within SAME_SHARE of each other in either.
    tied = any(abs(d["categories"]["starvation"] - d["categories"]["sync"]) <= SAME_SHARE
               for d in (t, s))
    if tied:
        assert {t["bottleneck"]["category"], s["bottleneck"]["category"]} <= {
            "starvation", "sync"}, (t["verdict"], s["verdict"])
    else:
        assert t["bottleneck"]["category"] == s["bottleneck"]["category"], (
            t["verdict"], s["verdict"])
    assert _entry(s, SLOW_RANK, "input")["phase"] == "data_wait"
    gt = _entry(t, SLOW_RANK, "input")["speedup_if_fixed"]
    gs = _entry(s, SLOW_RANK, "input")["speedup_if_fixed"]
    assert abs(gt / gs - 1) <= SAME_GAIN, (gt, gs)


def test_the_attribution_matches_the_bare_timers(job: Job) -> None:
    d, truth = job.titan, job.truth
    data = truth.share("data_s")
    assert abs(d["categories"]["starvation"] - data) <= SHARE_TOLERANCE, (d["categories"], data)
    lo, hi = truth.peer_wait_share(), truth.exposed_share()
    assert lo - SHARE_TOLERANCE <= d["categories"]["sync"] <= hi + SHARE_TOLERANCE, (
        d["categories"], lo, hi)
    gain = _entry(d, SLOW_RANK, "input")["speedup_if_fixed"]
    lock = truth.lockstep_gain()
    assert lock >= 1.3, f"the fault was too small to judge: lockstep gain {lock:.2f}x"
    assert lock * (1 - GAIN_TOLERANCE) <= gain <= lock * (1 + GAIN_TOLERANCE), (gain, lock)
    assert gain <= 1.05 * truth.gain_from_fault(), (gain, truth.gain_from_fault())
