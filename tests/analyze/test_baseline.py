"""``analyze.baseline``: the best earlier run of the same kind (tlog compare's
default baseline) and a run against its high-water mark."""

from __future__ import annotations

from pathlib import Path

import pytest
from tlog.analyze.baseline import (
    HighWaterMark,
    NoBaselineError,
    first_rate,
    high_water_mark,
    high_water_marks,
    machine_kinds,
    pick_baseline,
)
from tlog.ingest.db import connect
from tlog.ingest.errors import RunNotFoundError, UsageError

from tests.support.runbuilder import RunBuilder, loop


def _write(path: Path, run_id: str, started: float, tags: dict, dur: float, *,
           stage: str = "main", machine: dict | None = None) -> None:
    b = RunBuilder(run_id, started=started, tags=tags)
    loop(b, 12, [("forward", dur)], t0=started, stage=stage,
         worker=f"{stage}-0")
    if machine:
        b.machine(worker=f"{stage}-0", **machine)
    b.write(path).close()


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    """``slow`` (10 it/s) and ``fast`` (20 it/s) before the candidate ``cand``, all of
    model m1; ``fastest`` (50 it/s) of model m2; ``other`` another pipeline's stage."""
    path = tmp_path_factory.mktemp("db") / "b.duckdb"
    _write(path, "slow", 1000.0, {"model": "m1", "git_sha": "a"}, 0.1)
    _write(path, "fast", 2000.0, {"model": "m1", "git_sha": "b"}, 0.05)
    _write(path, "fastest", 2500.0, {"model": "m2"}, 0.02)
    _write(path, "other", 2600.0, {"model": "m1"}, 0.01, stage="drafter")
    _write(path, "cand", 3000.0, {"model": "m1", "git_sha": "c"}, 0.08)
    c = connect(path)
    yield c
    c.close()


def test_the_best_earlier_run_with_the_shared_tags(con) -> None:
    # git_sha is an identity tag (the change under test), model must match, the
    # stages must be the same: of slow (10 it/s) and fast (20 it/s), fast
    best, choice = pick_baseline(con, "cand")
    assert best == "fast"
    assert choice["match"] == "shared" and choice["machine"] == "any"
    assert sorted(choice["candidates"]) == ["fast", "slow"]
    assert choice["throughput"]["iters_per_s"] == pytest.approx(20.0)


def test_match_keys_and_their_errors(con) -> None:
    assert pick_baseline(con, "cand", match=["model"])[1]["match"] == ["model"]
    with pytest.raises(UsageError, match="run 'cand' has no tag 'gpus' to match on "
                                         r"\(its tags: git_sha, model\)"):
        pick_baseline(con, "cand", match=["gpus"])
    with pytest.raises(RunNotFoundError, match="no run 'nope' in the database"):
        pick_baseline(con, "nope")
    # on git_sha no earlier run agrees
    with pytest.raises(NoBaselineError, match="earlier runs differ on git_sha"):
        pick_baseline(con, "cand", match=["git_sha"])


def test_no_earlier_run_says_so(con) -> None:
    with pytest.raises(NoBaselineError, match="no run started before it"):
        pick_baseline(con, "slow")


def test_the_same_kind_of_machine_wins_when_there_is_one(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    a100 = {"cpu_model": "EPYC", "ncpu": 64, "gpu_name": "A100"}
    h100 = {"cpu_model": "EPYC", "ncpu": 64, "gpu_name": "H100"}
    _write(path, "on_h100", 1000.0, {"model": "m"}, 0.01, machine=h100)   # faster, other GPU
    _write(path, "on_a100", 2000.0, {"model": "m"}, 0.05, machine=a100)
    _write(path, "cand", 3000.0, {"model": "m"}, 0.05, machine=a100)
    with connect(path) as c:
        assert machine_kinds(c) == {r: frozenset({(m["cpu_model"], 64, m["gpu_name"])})
                                    for r, m in (("on_h100", h100), ("on_a100", a100),
                                                 ("cand", a100))}
        best, choice = pick_baseline(c, "cand")
        assert (best, choice["machine"], choice["candidates"]) == ("on_a100", "same",
                                                                    ["on_a100"])


def test_high_water_marks_of_every_run(con) -> None:
    marks = high_water_marks(con)
    assert marks["cand"].run_id == "fast"
    assert marks["cand"].value("iters_per_s") == pytest.approx(20.0)
    assert marks["fast"].run_id == "slow"
    assert marks["slow"].run_id is None and "no run started before it" in marks["slow"].reason
    assert high_water_mark(con, "cand") == marks["cand"]


def test_first_rate_in_the_order_runs_are_ranked() -> None:
    assert first_rate({"iters_per_s": 2.0, "tokens_per_s": None, "samples_per_s": 64.0}) == (
        "samples_per_s", "samples/s", 64.0)
    assert first_rate({"iters_per_s": 2.0, "tokens_per_s": 512.0}) == (
        "tokens_per_s", "tokens/s", 512.0)
    assert first_rate({"iters_per_s": 2.0}) == ("iters_per_s", "it/s", 2.0)
    assert first_rate({}) == (None, None, None)


def test_a_run_against_its_mark() -> None:
    mark = HighWaterMark("best", {"tokens_per_s": 1000.0, "iters_per_s": 2.0}, match="shared")
    assert mark.versus("r", {"tokens_per_s": 800.0}) == {
        "unit": "tokens/s", "value": 800.0, "mark_value": 1000.0, "ratio": 0.8,
        "mark_run": "best", "best": 1000.0}
    assert mark.versus("r", {"tokens_per_s": 1200.0})["mark_run"] == "r"
    assert mark.versus("r", {"tokens_per_s": 1200.0})["best"] == 1200.0
    # the run reports only iterations: compared in it/s
    assert mark.versus("r", {"iters_per_s": 1.0})["ratio"] == 0.5
    none = HighWaterMark(None, {}, reason="first of its kind")
    assert none.versus("r", {"iters_per_s": 3.0}) == {
        "unit": "it/s", "value": 3.0, "mark_value": None, "ratio": None, "mark_run": "r",
        "best": 3.0}
    assert none.to_dict() == {"run_id": None, "throughput": {}, "match": None,
                              "reason": "first of its kind"}
