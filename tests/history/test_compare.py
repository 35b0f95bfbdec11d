"""`tlog compare`: a clear regression names its phase first, noise is not
significant, the baseline is picked by tags, and the statistics are right.

The runs come from ``add_pipeline_run`` (conftest.py): a target worker feeding
two drafter ranks. Noise-free baseline per iteration (ms): drafter hs_get 1,
mask_build 4, draft_forward 12, backward 18, grad_allreduce 3, optimizer 2 =
40; target batch_get 2, target_forward 20, hs_put 18 (waits for the drafters)
= 40. Each drafter iteration carries 4096 tokens, so the run makes
2 x 4096 / 0.040 = 204,800 tokens/s.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from tlog.analyze.baseline import NoBaselineError, pick_baseline
from tlog.analyze.compare import MIN_RELATIVE_CHANGE, compare, compare_to_best
from tlog.analyze.statistics import batch_means, welch_interval
from tlog.ingest.db import connect
from tlog.ingest.errors import RunNotFoundError, UsageError

from tests.support.cli import assert_one_line_error, invoke


def _open(path):
    return connect(path, read_only=True)


def _by_stage(contributors) -> dict[str, list]:
    out: dict[str, list] = {}
    for c in contributors:
        out.setdefault(c.stage, []).append(c)
    return out


def test_clear_regression_names_mask_build_first(pipeline_db) -> None:
    # mask_build 4 -> 22 ms: the drafters take 58 ms per iteration, the target's
    # hs_put waits 36 ms instead of 18. Ratio 40/58; gap 18 ms in both stages.
    db = pipeline_db([{"run_id": "base", "started": 1000.0},
                      {"run_id": "slow", "started": 2000.0, "mask_build": 0.022}])
    with _open(db) as con:
        result = compare(con, "base", "slow")
    assert result.unit == "tokens/s"
    assert result.throughput_ratio == pytest.approx(0.040 / 0.058, rel=1e-12)
    assert result.significant is True
    sig = result.significance
    assert sig.stage == "drafter" and sig.batches == [10, 10]
    assert sig.delta_s_per_iter == pytest.approx(0.018, abs=1e-12)
    assert sig.relative_change == pytest.approx(0.45, abs=1e-9)
    assert [(s.stage, s.bottleneck) for s in result.stages] == [("drafter", True), ("target", False)]
    first = result.contributors[0]
    assert (first.stage, first.phase, first.category) == ("drafter", "mask_build", "compute")
    assert first.baseline_s_per_iter == pytest.approx(0.004, abs=1e-12)
    assert first.candidate_s_per_iter == pytest.approx(0.022, abs=1e-12)
    assert first.delta_s_per_iter == pytest.approx(0.018, abs=1e-12)
    assert first.share_of_gap == pytest.approx(1.0, abs=1e-9)
    stages = _by_stage(result.contributors)
    assert list(stages) == ["drafter", "target"]
    target = stages["target"][0]
    assert (target.phase, target.category) == ("hs_put", "backpressure")
    assert target.delta_s_per_iter == pytest.approx(0.018, abs=1e-12)
    for rows in stages.values():  # contributors add up to each stage's gap
        assert sum(c.share_of_gap for c in rows) == pytest.approx(1.0, abs=1e-9)
    assert result.verdict.startswith("slow is 31% slower than base (tokens/s ratio 0.690)")
    assert "Most of the gap: drafter mask_build +18 ms/iter (100% of the stage's change)" \
        in result.verdict


def test_noisy_regression_is_significant_and_still_mask_build_first(pipeline_db) -> None:
    runs = {"noise": 0.05, "stall_every": 4, "stall_s": 0.030, "n": 120}
    db = pipeline_db([dict(run_id="base", started=1000.0, seed=11, **runs),
                      dict(run_id="slow", started=2000.0, seed=12, mask_build=0.022, **runs)])
    with _open(db) as con:
        result = compare(con, "base", "slow")
    assert result.significant is True
    first = result.contributors[0]
    assert (first.stage, first.phase) == ("drafter", "mask_build")
    assert first.delta_s_per_iter == pytest.approx(0.018, rel=0.05)
    assert first.share_of_gap > 0.9
    assert result.significance.ci_low > 0.015


@pytest.mark.parametrize("seeds", [(1, 2), (3, 4), (5, 6)])
def test_noise_only_runs_are_not_significant(pipeline_db, seeds) -> None:
    # Same configuration, different noise, a loader stall every 4th iteration.
    runs = {"noise": 0.05, "stall_every": 4, "stall_s": 0.030, "n": 120}
    db = pipeline_db([dict(run_id="a", started=1000.0, seed=seeds[0], **runs),
                      dict(run_id="b", started=2000.0, seed=seeds[1], **runs)])
    with _open(db) as con:
        result = compare(con, "a", "b")
    assert result.significant is False
    assert abs(result.throughput_ratio - 1.0) < 0.02
    # The interval alone misses about 1 pair in 20 (seeds 3, 4 here: -0.4%, interval
    # [-0.38, -0.02] ms); the 2% floor keeps such noise from being called a change.
    assert abs(result.significance.relative_change) < MIN_RELATIVE_CHANGE
    # No stage moved by 2%: no share of a gap within noise.
    assert all(c.share_of_gap is None for c in result.contributors)


def test_a_tiny_real_change_is_below_the_threshold(pipeline_db) -> None:
    # mask_build 4 -> 4.4 ms with no noise: exactly +0.4 ms (1%), an interval
    # that excludes 0 but a change under MIN_RELATIVE_CHANGE.
    db = pipeline_db([{"run_id": "a", "started": 1000.0},
                      {"run_id": "b", "started": 2000.0, "mask_build": 0.0044}])
    with _open(db) as con:
        result = compare(con, "a", "b")
    sig = result.significance
    assert sig.ci_low > 0 and sig.relative_change == pytest.approx(0.01, abs=1e-9)
    assert sig.relative_change < MIN_RELATIVE_CHANGE
    assert result.significant is False
    assert sig.reason.startswith("statistically detectable but small")


def test_a_short_run_cannot_be_judged(pipeline_db) -> None:
    # 8 steady iterations per worker: fewer than 4 batches of 3.
    db = pipeline_db([{"run_id": "a", "started": 1000.0, "n": 8},
                      {"run_id": "b", "started": 2000.0, "n": 8, "mask_build": 0.022}])
    with _open(db) as con:
        result = compare(con, "a", "b")
    assert result.significant is False
    assert "too few steady iterations" in result.significance.reason
    assert result.contributors[0].phase == "mask_build"


def test_a_child_phase_is_listed_by_itself_and_its_parent_by_self_time(pipeline_db) -> None:
    # draft_forward holds draft_forward/mask_build: the parent's self time (12 ms)
    # does not move, the child takes the whole 18 ms.
    db = pipeline_db([{"run_id": "a", "started": 1000.0, "nest_mask": True},
                      {"run_id": "b", "started": 2000.0, "nest_mask": True, "mask_build": 0.022}])
    with _open(db) as con:
        result = compare(con, "a", "b")
    first = result.contributors[0]
    assert (first.phase, first.scope) == ("draft_forward/mask_build", "child")
    assert first.delta_s_per_iter == pytest.approx(0.018, abs=1e-12)
    parent = next(c for c in result.contributors if c.phase == "draft_forward")
    assert parent.scope == "self"
    assert parent.baseline_s_per_iter == pytest.approx(0.012, abs=1e-12)
    assert parent.delta_s_per_iter == pytest.approx(0.0, abs=1e-12)
    drafter = _by_stage(result.contributors)["drafter"]
    assert sum(c.share_of_gap for c in drafter) == pytest.approx(1.0, abs=1e-9)


# --- the default baseline: best earlier run with matching tags --------------------

HISTORY = [
    # drafter ms per iteration: 40 + (mask_build - 4)
    {"run_id": "h1", "started": 100.0, "tags": {"gpus": "8", "branch": "main", "sha": "a1"}},
    {"run_id": "h2", "started": 200.0, "tags": {"gpus": "8", "branch": "main", "sha": "a2"},
         "mask_build": 0.008},                                    # 44 ms: slower than h1
    {"run_id": "h3", "started": 300.0, "tags": {"gpus": "4", "branch": "main", "sha": "a3"},
         "mask_build": 0.001},                                    # 37 ms: fastest, 4 GPUs
    {"run_id": "cand", "started": 400.0, "tags": {"gpus": "8", "branch": "main", "sha": "a4"},
         "mask_build": 0.022},
    {"run_id": "later", "started": 500.0, "tags": {"gpus": "8", "branch": "main", "sha": "a5"},
         "mask_build": 0.0},                                      # fastest, but after cand
]


def test_baseline_by_tags(pipeline_db) -> None:
    db = pipeline_db([dict(r, n=20) for r in HISTORY])
    with _open(db) as con:
        # The default looks across identity tags (sha, branch): it matches on gpus.
        assert pick_baseline(con, "cand")[0] == pick_baseline(con, "cand", match=["gpus"])[0]
        # Naming an identity tag still restricts: no earlier run has sha a4.
        with pytest.raises(NoBaselineError) as err:
            pick_baseline(con, "cand", match=["sha"])
        assert str(err.value) == (
            "no earlier run matches 'cand' on sha: earlier runs differ on sha (cand: a4; "
            "earlier: a1, a2, a3); --match gpus admits h1, h2, or name one: "
            "tlog compare BASELINE cand")
        assert pick_baseline(con, "cand", match=["gpus"])[0] == "h1"      # h1 beats h2
        assert pick_baseline(con, "cand", match=["branch"])[0] == "h3"    # 37 ms is best
        assert pick_baseline(con, "cand", match=["gpus", "branch"])[0] == "h1"
        with pytest.raises(UsageError, match=r"run 'cand' has no tag 'nodes'"):
            pick_baseline(con, "cand", match=["nodes"])
        result = compare_to_best(con, "cand", match=["gpus"])
    assert (result.baseline, result.candidate) == ("h1", "cand")
    assert result.baseline_choice["candidates"] == ["h1", "h2"]
    assert result.contributors[0].phase == "mask_build"


def test_default_match_needs_equal_config_tags(pipeline_db) -> None:
    # Only 4-GPU earlier run is h3; a 4-GPU candidate matches it and nothing else.
    runs = [dict(r, n=20) for r in HISTORY[:3]]
    runs.append({"run_id": "cand4", "started": 400.0, "n": 20, "mask_build": 0.022,
                 "tags": {"gpus": "4", "branch": "perf/swa", "sha": "b1"}})
    db = pipeline_db(runs)
    with _open(db) as con:
        baseline, choice = pick_baseline(con, "cand4")
    assert baseline == "h3" and choice["candidates"] == ["h3"]


def test_default_match_uses_the_tags_both_runs_have(pipeline_db) -> None:
    # Earlier runs h1..h3 ran attn=full; the candidate attn=swa. h4 has only 'gpus':
    # the default compares on the keys both have (gpus alone), so only h4 matches.
    runs = [dict(r, n=20, tags=dict(r["tags"], attn="full")) for r in HISTORY if r["run_id"] != "cand"]
    runs.append({"run_id": "cand", "started": 400.0, "n": 20, "mask_build": 0.022,
                 "tags": {"gpus": "8", "branch": "main", "sha": "a4", "attn": "swa"}})
    runs.append({"run_id": "h4", "started": 250.0, "tags": {"gpus": "8"}, "mask_build": 0.006, "n": 20})
    db = pipeline_db(runs)
    with _open(db) as con:
        baseline, choice = pick_baseline(con, "cand")
    assert baseline == "h4" and choice["match"] == "shared" and choice["candidates"] == ["h4"]


def test_no_baseline_names_the_blocking_keys(pipeline_db) -> None:
    # Earlier runs differ from the candidate on scenario only; identity tags (git_sha,
    # host) differ too but are not matched on, so they are not named.
    runs = [{"run_id": "b1", "started": 100.0, "n": 20,
             "tags": {"scenario": "balanced", "pipeline": "dflash", "device": "cpu",
                      "git_sha": "s1", "host": "n1"}},
            {"run_id": "b2", "started": 200.0, "n": 20,
             "tags": {"scenario": "slow-loader", "pipeline": "dflash", "device": "cpu",
                      "git_sha": "s2", "host": "n2"}},
            {"run_id": "new", "started": 300.0, "n": 20,
             "tags": {"scenario": "slow-drafter", "pipeline": "dflash", "device": "cpu",
                      "git_sha": "s3", "host": "n3"}}]
    db = pipeline_db(runs)
    with _open(db) as con:
        with pytest.raises(NoBaselineError) as err:
            pick_baseline(con, "new")
        assert str(err.value) == (
            "no earlier run matches 'new' on the tags they share: earlier runs differ on "
            "scenario (new: slow-drafter; earlier: balanced, slow-loader); --match device "
            "admits b1, b2; --match pipeline admits b1, b2, or name one: "
            "tlog compare BASELINE new")
        assert "\n" not in str(err.value)
        # Following the hint finds the best of the two.
        assert pick_baseline(con, "new", match=["device", "pipeline"])[1]["candidates"] == \
            ["b1", "b2"]
        with pytest.raises(NoBaselineError) as first:
            pick_baseline(con, "b1")
        assert str(first.value) == ("no earlier run matches 'b1': no run started before it; "
                                    "name one: tlog compare BASELINE b1")


def test_another_experiment_or_pipeline_is_no_default_baseline(pipeline_db) -> None:
    """A new user's own loop (tags exp, loader_ms) was compared with a demo run
    it shared no tag with, and a run of other stages was a candidate too: now
    an earlier run must have the same stages and, when the candidate has
    config tags, share one of them."""
    db = pipeline_db([
        {"run_id": "demo", "started": 100.0, "n": 20, "tags": {"scenario": "balanced"}},
        {"run_id": "mine", "started": 200.0, "n": 20,
         "tags": {"exp": "myloop", "loader_ms": "60", "host": "n1"}}])
    with connect(db) as con:
        for run_id, started, stage in (("solo", 150.0, "trainer"), ("solo2", 300.0, "trainer")):
            con.execute("INSERT INTO runs (run_id, started, tags) VALUES (?, ?, ?)",
                        [run_id, started, '{"exp": "myloop", "loader_ms": "60"}'])
            con.executemany("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur) "
                            "VALUES (?, 0, ?, 'w', ?, ?, 0.1)",
                            [(run_id, stage, i, started + 0.1 * i) for i in range(20)])
        with pytest.raises(NoBaselineError) as err:
            pick_baseline(con, "mine")
        assert str(err.value) == (
            "no earlier run matches 'mine' on the tags they share: earlier runs differ on "
            "exp (mine: myloop; earlier: (none)); loader_ms (mine: 60; earlier: (none)); it "
            "is the first run of its kind; name one: tlog compare BASELINE mine")
        # a run of other stages, even with equal tags, is not of its kind either
        assert pick_baseline(con, "solo2")[0] == "solo"
        con.execute("DELETE FROM iterations WHERE run_id = 'solo'")
        with pytest.raises(NoBaselineError,
                           match=r"none has its source and stages \(stages trainer\); name one"):
            pick_baseline(con, "solo2")


def test_bad_runs_are_errors(pipeline_db) -> None:
    db = pipeline_db([{"run_id": "a", "started": 1000.0, "n": 12}])
    with _open(db) as con:
        with pytest.raises(RunNotFoundError, match="no run 'nope'"):
            compare(con, "a", "nope")
        with pytest.raises(UsageError, match="same run"):
            compare(con, "a", "a")
        with pytest.raises(RunNotFoundError, match="no run 'nope'"):
            pick_baseline(con, "nope")
        with pytest.raises(NoBaselineError):
            pick_baseline(con, "a")


# --- statistics, checked by hand -------------------------------------------------

@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.975, 2, 4.302653), (0.975, 6, 2.446912), (0.975, 10, 2.228139),
    (0.975, 30, 2.042272), (0.95, 10, 1.812461), (0.995, 20, 2.845340),
])
def test_t_quantile_matches_the_table(p, df, expected) -> None:
    # Two samples of n values with equal variances v = n (n + 1) / 12 (0..n-1
    # and 1..n): Welch df = 2 (n - 1), half width = t(p, df) * sqrt(2 v / n);
    # t from a printed table of Student's t.
    n = df // 2 + 1
    w = welch_interval(np.arange(n, dtype=float), np.arange(n, dtype=float) + 1,
                       confidence=2 * p - 1)
    assert w.df == pytest.approx(df)
    half = expected * math.sqrt(2 * (n * (n + 1) / 12) / n)
    assert (w.low, w.high) == (pytest.approx(1 - half, abs=2e-6), pytest.approx(1 + half, abs=2e-6))


def test_welch_interval_by_hand() -> None:
    # means 2.5 and 3.5; variances 5/3 each, /4 -> se^2 = 5/6; Welch df =
    # (5/6)^2 / (2 * (5/12)^2 / 3) = 6; half width = t(0.975, 6) * sqrt(5/6).
    w = welch_interval(np.array([1.0, 2, 3, 4]), np.array([2.0, 3, 4, 5]))
    assert (w.mean_a, w.mean_b, w.delta) == (2.5, 3.5, 1.0)
    assert w.df == pytest.approx(6.0)
    half = 2.446912 * math.sqrt(5 / 6)
    assert (w.low, w.high) == (pytest.approx(1 - half, abs=1e-5), pytest.approx(1 + half, abs=1e-5))


def test_batch_means_by_hand() -> None:
    import polars as pl

    # Two workers of 12 iterations: 4 batches of 3 (12 // 3); batch 0 averages
    # 1, 2, 3 and 13, 14, 15 -> 8; batch 1 -> 11; ...
    frame = pl.DataFrame({"rank": [0] * 12 + [1] * 12, "worker": ["a"] * 12 + ["b"] * 12,
                          "iter": list(range(12)) * 2,
                          "base_s": [float(v) for v in range(1, 25)]})
    assert batch_means(frame).tolist() == [8.0, 11.0, 14.0, 17.0]
    assert batch_means(frame.head(11)).tolist() == []  # 11 // 3 = 3 batches: too few


# --- CLI ------------------------------------------------------------------------

def test_compare_cli_json_and_human(pipeline_db) -> None:
    db = pipeline_db([{"run_id": "base", "started": 1000.0, "tags": {"gpus": "8"}},
                      {"run_id": "slow", "started": 2000.0, "tags": {"gpus": "8"}, "mask_build": 0.022}])
    result = invoke(["compare", "base", "slow", "--json", "--db", str(db)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["baseline"], data["candidate"], data["significant"]) == ("base", "slow", True)
    assert data["throughput_ratio"] == pytest.approx(0.689655, abs=1e-6)
    top = data["contributors"][0]
    assert (top["stage"], top["phase"], top["category"]) == ("drafter", "mask_build", "compute")
    assert set(top) >= {"delta_s_per_iter", "share_of_gap"}
    auto = invoke(["compare", "slow", "--db", str(db)])
    assert auto.exit_code == 0, auto.output
    assert "Baseline:  base (best earlier run with matching tags)" in auto.stdout
    assert "drafter │ mask_build │ compute" in auto.stdout


@pytest.mark.parametrize(("args", "code", "message"), [
    (["compare", "base", "nope"], 1, "tlog: error: no run 'nope' in the database"),
    (["compare", "base"], 1, "tlog: error: no earlier run matches 'base'"),
    (["compare", "a", "b", "c"], 2, "tlog: error: give BASELINE CANDIDATE or CANDIDATE alone"),
    (["compare", "base", "slow", "--match", "gpus"], 2, "tlog: error: --match chooses the baseline"),
    (["compare", "slow", "--match", "gpus,"], 2, "tlog: error: bad --match 'gpus,'"),
    (["compare", "slow", "--match", "nodes"], 2, "tlog: error: run 'slow' has no tag 'nodes'"),
])
def test_compare_cli_errors_are_one_line(pipeline_db, args, code, message) -> None:
    db = pipeline_db([{"run_id": "base", "started": 1000.0, "n": 12, "tags": {"gpus": "8"}},
                      {"run_id": "slow", "started": 2000.0, "n": 12, "mask_build": 0.022,
                           "tags": {"gpus": "8"}}])
    result = invoke([*args, "--db", str(db)])
    assert assert_one_line_error(result, code).startswith(message), result.stderr


def test_runs_of_different_pipelines_are_no_change_to_test(pipeline_db) -> None:
    """Named by hand, two runs that share no stage still get their throughput
    ratio, but the sentence says there is no change to test (it said 'not
    significant - the baseline has no steady iterations of stage trainer')."""
    db = pipeline_db([{"run_id": "demo", "started": 100.0, "n": 20}])
    with connect(db) as con:
        con.execute("INSERT INTO runs (run_id, started) VALUES ('loop', 200.0)")
        con.executemany("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, "
                        "tokens) VALUES ('loop', 0, 'trainer', 'w', ?, ?, 0.1, 100)",
                        [(i, 200.0 + 0.1 * i) for i in range(40)])
    with _open(db) as con:
        result = compare(con, "demo", "loop")
    assert not result.significant
    assert result.significance.reason == (
        "not a change to test: the runs share no stage (baseline: drafter, target; "
        "candidate: trainer)")
    assert "; not a change to test: the runs share no stage" in result.verdict


def test_untagged_runs_match_only_the_same_program(pipeline_db) -> None:
    """The shim's bare run.json has identity tags only (and traces none): such a
    candidate is matched on its phase names, so another script of the same
    stages is not its baseline; tag values compare as `tlog runs --tag` reads
    them (true and "true" alike)."""
    db = pipeline_db([
        {"run_id": "a", "started": 100.0, "n": 20, "tags": {"host": "n1"}},
        {"run_id": "other", "started": 150.0, "n": 20, "tags": {"host": "n1"},
         "mask_build": 0.001, "draft_prune": 0.002},      # another program: one more phase
        {"run_id": "b", "started": 200.0, "n": 20, "tags": {"host": "n2"}},
        {"run_id": "c", "started": 300.0, "n": 20, "draft_prune": 0.002},
        {"run_id": "t1", "started": 400.0, "n": 20, "tags": {"bf16": True}},
        {"run_id": "t2", "started": 500.0, "n": 20, "tags": {"bf16": "true"}}])
    with _open(db) as con:
        baseline, choice = pick_baseline(con, "b")
        assert (baseline, choice["match"], choice["candidates"]) == ("a", "phases", ["a"])
        assert pick_baseline(con, "c")[1]["candidates"] == ["other"]
        assert pick_baseline(con, "t2")[1]["candidates"] == ["t1"]
    result = invoke(["compare", "b", "--db", str(db)])
    assert "(best earlier run of the same program: no configuration tags to match)" in \
        " ".join(result.stdout.split())


def test_without_tokens_the_best_run_is_by_samples_then_iterations() -> None:
    """A user's loop reporting samples, no tokens: batch 32 at 108 it/s
    (3,456 samples/s) is the high-water mark, not batch 8 at 110 it/s (880)."""
    from tlog.analyze.history import RunSummary

    def run(rid: str, ips: float, sps: float | None) -> RunSummary:
        return RunSummary(rid, None, "jsonl", 1.0, {}, throughput={
            "iters_per_s": ips, "tokens_per_s": None, "samples_per_s": sps})

    runs = [run("b8", 110.0, 880.0), run("b32", 108.0, 3456.0), run("bare", 500.0, None)]
    assert [r.run_id for r in sorted(runs, key=lambda r: r.rank_key, reverse=True)] == [
        "b32", "b8", "bare"]


def test_an_untestable_change_is_not_tested_rather_than_not_significant(pipeline_db) -> None:
    """Too few steady iterations to judge: the CLI said 'not significant' for a
    12x change; it says 'not tested' and why."""
    db = pipeline_db([{"run_id": "a", "started": 1000.0, "n": 8},
                      {"run_id": "b", "started": 2000.0, "n": 8, "mask_build": 0.030}])
    result = invoke(["compare", "a", "b", "--db", str(db)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "Change: not tested - the baseline has too few steady iterations" in text


def test_a_carved_child_is_taken_out_of_its_parent_once(tmp_path) -> None:
    """DDP's measured wait ``backward/ddp_allreduce_wait`` (sync) is carved out
    of ``backward`` (compute) by the attribution; compare must not take it out
    a second time. By hand, per iteration: backward 300 ms holding a 100 ms
    wait, then 450 ms holding 250 ms: backward's own 200 ms does not move, the
    wait moves +150 ms, the whole gap (seen on a real gloo run:
    backward (self) read -198 ms, the shares summing to 36%)."""
    from tests.support.runbuilder import RunBuilder, loop

    db = tmp_path / "t.duckdb"
    for rid, wait in (("base", 0.100), ("cand", 0.250)):
        b = RunBuilder(rid)
        # forward alternates 99/101 ms so the runs' iteration times have a variance
        loop(b, 60, lambda i, w=wait: [("forward", 0.099 + 0.002 * (i % 2)),
                                       ("backward", 0.200 + w),
                                       ("backward/ddp_allreduce_wait", w)])
        b.write(db).close()
    with _open(db) as con:
        result = compare(con, "base", "cand")
    rows = {c.phase: c for c in result.contributors}
    assert rows["backward/ddp_allreduce_wait"].delta_s_per_iter == pytest.approx(0.150, abs=1e-9)
    assert rows["backward/ddp_allreduce_wait"].share_of_gap == pytest.approx(1.0, abs=1e-9)
    assert rows["backward"].baseline_s_per_iter == pytest.approx(0.200, abs=1e-9)
    assert rows["backward"].candidate_s_per_iter == pytest.approx(0.200, abs=1e-9)
    assert sum(c.share_of_gap for c in result.contributors) == pytest.approx(1.0, abs=1e-9)


def test_top_keeps_the_largest_contributors_and_counts_the_rest() -> None:
    """The bottleneck stage's contributors come first in the list, but ``--top 2``
    must keep the largest change wherever it is and say how many it left out.
    By hand: changes +2, +1, +0.5 ms (drafter) and +9 ms (target); top 2 keeps
    drafter +2 and target +9 in list order, 2 left out (a zero change is not counted)."""
    from types import SimpleNamespace

    from tlog.analyze.compare import Contributor, top_contributors

    def c(stage: str, phase: str, delta: float) -> Contributor:
        return Contributor(stage, phase, "compute", "phase", 0.010, 0.010 + delta, delta, None)

    items = [c("drafter", "backward", 0.002), c("drafter", "forward", 0.001),
             c("drafter", "optimizer", 0.0005), c("drafter", "mask", 0.0),
             c("target", "forward", 0.009)]
    shown, left = top_contributors(SimpleNamespace(contributors=items), 2)
    assert [(x.stage, x.phase) for x in shown] == [("drafter", "backward"), ("target", "forward")]
    assert left == 2
    with pytest.raises(ValueError, match="at least 1"):
        top_contributors(SimpleNamespace(contributors=items), 0)
