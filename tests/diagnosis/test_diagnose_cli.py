"""``tlog diagnose``: verdict first, the JSON contract, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, invoke
from tests.support.runbuilder import RunBuilder, loop


@pytest.fixture
def db(tmp_path: Path) -> Path:
    b = RunBuilder("cli-run")
    loop(b, 30, [("next_batch", 0.040), ("forward", 0.030), ("backward", 0.030)], tokens=512)
    path = tmp_path / "t.duckdb"
    b.write(path).close()
    return path


def test_human_output_starts_with_the_verdict(db: Path) -> None:
    result = invoke(["diagnose", "--run", "cli-run", "--db", str(db)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("Bottleneck: input - main waits for data 40%")
    assert "next_batch" in lines[0]
    text = result.output
    # Then the stage table, the findings, the what-if list, in that order.
    assert text.index("Stages") < text.index("Findings") < text.index("What if")
    assert "critical starvation" in " ".join(text.split())
    assert "remove main/next_batch (40 ms/iter): 1.67x" in text


def test_json(db: Path) -> None:
    result = invoke(["diagnose", "--run", "cli-run", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert d["run_id"] == "cli-run"
    assert d["bottleneck"]["category"] == "starvation"
    assert d["bottleneck"]["phase"] == "next_batch"
    assert d["throughput"]["tokens_per_s"] == pytest.approx(5120.0)
    assert d["verdict"].startswith("Bottleneck:")


def test_default_run_is_the_last_ingested(db: Path) -> None:
    result = invoke(["diagnose", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["run_id"] == "cli-run"


@pytest.mark.parametrize(("args", "code", "text"), [
    (["--run", "nope"], 1, "no run 'nope'"),
    (["--run", " "], 2, "--run needs a run id"),
])
def test_bad_input_is_one_line(db: Path, args: list[str], code: int, text: str) -> None:
    result = invoke(["diagnose", "--db", str(db), *args])
    assert text in assert_one_line_error(result, code)


def test_missing_database(tmp_path: Path) -> None:
    result = invoke(["diagnose", "--run", "x", "--db", str(tmp_path / "none.duckdb")])
    assert "no database at" in assert_one_line_error(result, 1)


def test_what_if_says_which_stage_limits_after_the_change(tmp_path: Path) -> None:
    # tests/scenarios/pipeline_target_bound: removing target_forward (85 ms) gives 1.50x,
    # capped by the drafter (68267 tokens/s); without batch_get the target still limits.
    from tlog.ingest import connect, ingest_run

    path = tmp_path / "p.duckdb"
    con = connect(path)
    run_id = ingest_run(con, Path(__file__).resolve().parents[1] / "scenarios"
                        / "pipeline_target_bound" / "run").run_id
    con.close()
    result = invoke(["diagnose", "--run", run_id, "--db", str(path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert ("remove target/target_forward (85 ms/iter): 1.50x throughput, then drafter limits; "
            "halve it: 1.50x, then drafter limits") in text
    assert ("remove target/batch_get (5.0 ms/iter): 1.06x throughput, target still limits; "
            "halve it: 1.03x, target still limits") in text


SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


@pytest.mark.parametrize("scenario", ["drift", "pipeline_drafter_bound", "straggler_compute",
                                      "sync_with_device_times", "allocator_thrash"])
def test_a_stored_run_prints_what_diagnose_computes(
        scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tlog diagnose`` of an ingested run prints the diagnosis the ingest
    stored (no analysis run): the same text and JSON, to the character, as
    diagnosing the run anew."""
    import tlog
    from tlog.api import Database

    path = tmp_path / "t.duckdb"
    run_id = tlog.open(path).ingest(SCENARIOS / scenario / "run").run_id
    assert tlog.open(path).stored_diagnosis(run_id) is not None
    args = ["diagnose", "--run", run_id, "--db", str(path)]
    stored = [invoke(args), invoke([*args, "--json"])]
    monkeypatch.setattr(Database, "stored_diagnosis", lambda self, run: None)
    computed = [invoke(args), invoke([*args, "--json"])]
    for a, b in zip(stored, computed, strict=True):
        assert a.exit_code == b.exit_code == 0, a.output + b.output
        assert a.output == b.output


def test_a_run_changed_since_its_diagnosis_was_stored_is_diagnosed_anew(db: Path) -> None:
    """The stored diagnosis serves only while the run's data are what it was
    computed from: iterations changed behind tlog's back (here every forward
    made 0.2 s longer) make ``tlog diagnose`` compute it again."""
    import duckdb
    from tlog.analyze.persist import ensure_attribution

    import tlog

    con = duckdb.connect(str(db))
    ensure_attribution(con, ["cli-run"])
    con.close()
    assert tlog.open(db).stored_diagnosis("cli-run") is not None
    con = duckdb.connect(str(db))
    # forward is phase 1 of the layout: the lists hold host seconds in layout order
    con.execute("UPDATE iterations SET dur = dur + 0.2, phase_host_s = list_transform("
                "phase_host_s, lambda x, i: x + CASE WHEN i = 2 THEN 0.2 ELSE 0 END)")
    con.close()
    assert tlog.open(db).stored_diagnosis("cli-run") is None
    result = invoke(["diagnose", "--run", "cli-run", "--db", str(db), "--json"])
    d = json.loads(result.output)
    assert d["bottleneck"]["phase"] == "forward"
    assert d["throughput"]["tokens_per_s"] == pytest.approx(512 / 0.3, rel=1e-3)
