"""A healthy FSDP2 job on gloo, instrumented as README.md says, against its own
bare timers (tests/fsdp/fsdp_train.py): FSDP's all-gathers and reduce-scatters
are timed phases, not time in no phase."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ddp"))

from ddp_runs import run_torchrun, torchrun_cmd

from tests.support.cli import ingest_and_diagnose

#: Steps of the job; 3-6 are warm-up.
STEPS = 30
TIMEOUT_S = 300
#: tlog's unaccounted share against the timers' untimed share: within 2 points
#: (before FSDP's hooks were timed: 5-7% against ~1%).
UNACCOUNTED_POINTS = 0.02


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The job's output dir, its database, its diagnosis and tlog's attributed frames."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip("this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)")
    out = tmp_path_factory.mktemp("fsdp")
    run_torchrun([*torchrun_cmd(2), str(HERE / "fsdp_train.py"), "--out", str(out),
                  "--steps", str(STEPS)], "fsdp_train", TIMEOUT_S)
    db = out / "t.duckdb"
    diagnosis = ingest_and_diagnose(out / "run", "fsdp", db)
    import duckdb
    from tlog.analyze.frames import attribute

    con = duckdb.connect(str(db), read_only=True)
    try:
        analysis = attribute(con, "fsdp")
        steady = analysis.steady.select("rank", "iter", "dur", "unaccounted_s")
        phases = analysis.phase_frame()
    finally:
        con.close()
    truth = {r: json.loads((out / "truth" / f"truth-rank{r}.json").read_text())["steps"]
             for r in (0, 1)}
    return {"diagnosis": diagnosis, "steady": steady, "phases": phases, "truth": truth}


def test_unaccounted_is_what_the_timers_leave(job) -> None:
    for rank in (0, 1):
        st = job["steady"].filter(job["steady"]["rank"] == rank)
        steps = job["truth"][rank]
        iters = [i for i in st["iter"].to_list() if i < len(steps)]
        cycle = sum(steps[i]["cycle_s"] for i in iters)
        timed = sum(steps[i][k] for i in iters
                    for k in ("fetch_s", "forward_s", "backward_s", "optimizer_s"))
        truth = 1 - timed / cycle
        got = float(st["unaccounted_s"].sum() / st["dur"].sum())
        assert abs(got - truth) <= UNACCOUNTED_POINTS, (
            f"rank {rank}: {got:.3f} in no phase by tlog, {truth:.3f} untimed by the timers")


def test_fsdp_hooks_are_timed_as_the_timers_say(job) -> None:
    ph = job["phases"]
    for rank in (0, 1):
        mine = ph.filter((ph["rank"] == rank) & ph["phase"].str.contains("fsdp_")
                         & ~ph["phase"].str.contains("fsdp_.*/fsdp_"))
        names = set(mine["phase"].to_list())
        assert {"fsdp_allgather", "forward/fsdp_allgather", "backward/fsdp_allgather",
                "backward/fsdp_reduce_scatter"} <= names
        assert set(mine["category"].to_list()) == {"sync"}
        per_iter = float(mine["seconds_per_iter"].sum())
        st = job["steady"].filter(job["steady"]["rank"] == rank)
        steps = job["truth"][rank]
        iters = [i for i in st["iter"].to_list() if i < len(steps)]
        truth = sum(steps[i]["fsdp_s"] for i in iters) / len(iters)
        assert per_iter == pytest.approx(truth, rel=0.10), (
            f"rank {rank}: FSDP's hooks {per_iter * 1e3:.1f} ms/iter by tlog, "
            f"{truth * 1e3:.1f} by the timers")


def test_verdict_does_not_blame_time_in_no_phase(job) -> None:
    d = job["diagnosis"]
    assert "in no phase" not in d["verdict"]
    assert not [f for f in d["findings"] if f["code"] == "unaccounted"
                and f["severity"] != "info"]
