"""Each scenario, run for real (3 ranks, small step counts), diagnosed as injected.

These are end-to-end checks: the pipeline writes a run, ingest loads it, the
analysis judges it. The injected slowdowns are 3x-4x (docs/PIPELINE.md) so the
verdicts hold on a busy 2-core machine. About 60-80 s in all on 2 busy cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tlog.analyze import diagnose
from tlog.ingest import ingest_run
from tlog.ingest.db import connect

from dflash_runtime.pipeline import run_pipeline
from dflash_runtime.pipeline.train import PHASE_KINDS
from tests.support.cli import assert_one_line_error, invoke

#: Steps per scenario: enough steady iterations per worker for the analysis
#: (20, analyze.rules.CoveragePolicy.min_steady_iters) after warm-up; the straggler check
#: needs 20 steady iterations on every drafter rank (STRAGGLER_MIN_ITERS).
STEPS = 30
STRAGGLER_STEPS = 40

TARGET_PHASES = {"batch_get", "target_forward", "hs_extract", "hs_put"}
DRAFTER_PHASES = {"hs_get", "doc_ids", "mask_build", "draft_forward", "backward",
                  "grad_allreduce", "grad_norm_item", "optimizer"}


def _judge(tmp_path: Path, scenario: str, steps: int = STEPS) -> dict:
    run_dir = run_pipeline(tmp_path / "runs", scenario=scenario, steps=steps)
    con = connect(tmp_path / "tlog.duckdb")
    try:
        report = ingest_run(con, run_dir)
        assert report.to_dict()["records_rejected"] == 0
        return diagnose(con, report.run_id).to_dict()
    finally:
        con.close()


@pytest.fixture(scope="module")
def heavy_target_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """``tlog demo --scenario heavy-target --json``, end to end through the CLI."""
    out = tmp_path_factory.mktemp("demo")
    db = out / "tlog.duckdb"
    result = invoke(["demo", "--scenario", "heavy-target",
                     "--steps", str(STEPS), "--out", str(out / "runs"),
                     "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), db


def test_heavy_target_is_target_compute(heavy_target_demo) -> None:
    bottleneck = heavy_target_demo[0]["diagnosis"]["bottleneck"]
    assert (bottleneck["stage"], bottleneck["category"], bottleneck["phase"]) == \
        ("target", "compute", "target_forward")


def test_demo_run_records_every_rank_and_phase(heavy_target_demo) -> None:
    result, db = heavy_target_demo
    run_dir = Path(result["run_dir"])
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "rank0.target.jsonl", "rank1.drafter.jsonl", "rank2.drafter.jsonl", "run.json"]
    loaded = result["ingest"]["records_loaded"]
    # One target rank: STEPS iterations (each serves both drafter ranks); two drafter
    # ranks: STEPS each. One warm-up event per worker, one meta line per file.
    assert (loaded["iter"], loaded["event"], loaded["meta"]) == (3 * STEPS, 3, 3)
    assert loaded["queue"] >= 3
    assert result["ingest"]["records_rejected"] == 0
    con = connect(db, read_only=True)
    try:
        rows = con.sql("SELECT stage, phase, min(category), max(category) FROM phases "
                       "WHERE run_id = ? GROUP BY ALL", params=[result["run_id"]]).fetchall()
        tokens = dict(con.sql("SELECT stage, max(tokens) FROM iterations WHERE run_id = ? "
                              "AND tokens = (SELECT min(tokens) FROM iterations i2 WHERE "
                              "i2.run_id = iterations.run_id AND i2.stage = iterations.stage) "
                              "GROUP BY stage", params=[result["run_id"]]).fetchall())
        tags = json.loads(con.sql("SELECT tags FROM runs WHERE run_id = ?",
                                  params=[result["run_id"]]).fetchall()[0][0])
    finally:
        con.close()
    phases = {(stage, phase) for stage, phase, _, _ in rows}
    assert phases == ({("target", p) for p in TARGET_PHASES}
                      | {("drafter", p) for p in DRAFTER_PHASES})
    assert all(lo == hi == PHASE_KINDS[phase] for _, phase, lo, hi in rows)
    # Every iteration of a stage carries the same tokens: 2 sequences x 128 tokens per
    # drafter rank; a target iteration serves both drafter ranks.
    assert tokens == {"target": 2 * 2 * 128, "drafter": 2 * 128}
    assert tags["scenario"] == "heavy-target" and tags["drafter_ranks"] == 2


@pytest.mark.cores_alone    # the loader against compute: beside other workers compute grew
def test_slow_loader_is_starvation(tmp_path: Path) -> None:
    d = _judge(tmp_path, "slow-loader")
    assert d["bottleneck"]["category"] == "starvation"
    target = next(s for s in d["stages"] if s["stage"] == "target")
    assert target["categories"]["starvation"] >= 0.2  # the stall shows where it is injected
    assert target["top_phases"][0]["phase"] == "batch_get"


def test_heavy_drafter_is_drafter_compute(tmp_path: Path) -> None:
    d = _judge(tmp_path, "heavy-drafter")
    assert (d["bottleneck"]["stage"], d["bottleneck"]["category"]) == ("drafter", "compute")


@pytest.mark.cores_alone    # the ranks' noise decides the straggler: beside other workers it grew
def test_straggler_rank_is_named(tmp_path: Path) -> None:
    d = _judge(tmp_path, "straggler", steps=STRAGGLER_STEPS)
    named = {(s["stage"], s["rank"]) for s in d["stragglers"]}
    assert ("drafter", 2) in named      # the slowed rank (the last one)
    assert ("drafter", 1) not in named  # its healthy peer


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "fast"], "tlog: error: unknown scenario 'fast'; choose one of: balanced"),
        (["--steps", "0"], "tlog: error: steps must be a whole number from 1 to"),
    ],
)
def test_demo_bad_arguments_are_one_line_usage_errors(args: list[str], message: str) -> None:
    result = invoke(["demo", *args])
    assert assert_one_line_error(result, 2).startswith(message)


def test_demo_out_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke(["demo", "--steps", "5", "--out", str(blocker / "runs"),
                     "--db", str(tmp_path / "db.duckdb")])
    assert result.exit_code == 2, result.output
    assert "cannot create the run directory" in result.output


# -- the launcher ---------------------------------------------------------------------


def test_run_pipeline_refuses_an_existing_run_directory(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="run directory .*taken already exists"):
        run_pipeline(tmp_path, run_id="taken", steps=2)


def test_run_pipeline_stops_a_run_past_its_time_limit(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="ran past 1 s and was stopped; its partial logs are in"):
        run_pipeline(tmp_path, scenario="slow-loader", steps=100, timeout_s=1.0)


def test_run_pipeline_works_from_a_script_without_a_main_guard(tmp_path: Path) -> None:
    # multiprocessing re-runs the caller's main script in each child unless told not to;
    # an unguarded script would then start the pipeline again inside every rank.
    script = tmp_path / "unguarded.py"
    script.write_text("from dflash_runtime.pipeline import run_pipeline\n"
                      f"print(run_pipeline({str(tmp_path / 'runs')!r}, steps=2, run_id='r'))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(tmp_path / "runs" / "r")
    assert (tmp_path / "runs" / "r" / "rank2.drafter.jsonl").stat().st_size > 0


def test_module_cli_rejects_a_bad_scenario() -> None:
    done = subprocess.run([sys.executable, "-m", "dflash_runtime.pipeline", "--scenario", "x"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "invalid choice: 'x'" in done.stderr


def test_checkpoint_is_an_event_and_a_loadable_file(tmp_path: Path) -> None:
    import torch

    run_dir = run_pipeline(tmp_path, steps=6, checkpoint_every=4, warmup_iters=2, run_id="c")
    events = {}
    for path in run_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["type"] == "event":
                events.setdefault(path.name, []).append((record["name"], record.get("step"),
                                                         record.get("iterations")))
    # Every worker marks its warm-up; drafter rank 1 (the first drafter) checkpoints at
    # step 4 (not at 6: the last step is not checkpointed).
    assert events == {"rank0.target.jsonl": [("warmup", None, 2)],
                      "rank1.drafter.jsonl": [("warmup", None, 2), ("checkpoint", 4, None)],
                      "rank2.drafter.jsonl": [("warmup", None, 2)]}
    state = torch.load(run_dir / "checkpoints" / "drafter.pt", weights_only=True)
    assert "fc.weight" in state["model"] and state["optimizer"]["state"]
