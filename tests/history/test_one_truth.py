"""One truth: every stored query, ``tlog runs`` and ``tlog diagnose --json`` give
the same figures for the same runs, and the stored diagnosis follows the data.

The runs (truth_runs.py) are built so that the host rules and a fixed 10-iteration
warm-up would give other figures: device backlog drained in sync phases (``pipe``),
a collective wait carved from a compute phase (``ddp``), a restarted stage judged
on one attempt (``restart``), a detected warm-up of 4 iterations and an event.
The reference is ``tlog diagnose --json`` through the CLI; the queries run through
``tlog query`` on read-only connections, as a user runs them. Figures are sums of
the same float seconds in another order, so they are compared to 1e-9 relative.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tlog.analyze import persist
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.db import connect
from truth_runs import KINDS, ddp_run, pipeline_run, restart_run, write_runs

from tests.support.cli import invoke

RUNS = ("pipe", "ddp", "restart")
CATS = ("starvation", "backpressure", "compute", "sync", "unaccounted")


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a == pytest.approx(b, rel=1e-9, abs=1e-12)


def cli(*args: str):
    result = invoke(list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def query(db: Path, name: str, **params) -> list[dict]:
    args = ["query", name, "--format", "json", "--db", str(db)]
    for k, v in params.items():
        args += ["-p", f"{k}={v}"]
    return cli(*args)


@pytest.fixture(scope="module")
def truth_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("truth") / "truth.duckdb"
    return write_runs(db, [pipeline_run(), ddp_run(), restart_run()])


@pytest.fixture(scope="module")
def diagnoses(truth_db: Path) -> dict[str, dict]:
    return {r: cli("diagnose", "--run", r, "--json", "--db", str(truth_db)) for r in RUNS}


def test_the_runs_exercise_what_the_host_rules_miss(truth_db: Path, diagnoses) -> None:
    """Without these, the equalities below would hold for the old SQL too."""
    pipe, ddp, restart = (diagnoses[r] for r in RUNS)
    # pipe: 4 warm-up iterations per worker detected (not 10), 2 hit by the event; the
    # stages start up together (docs/DIAGNOSIS.md section 2): the drafter's first
    # steady iteration starts after its 4 slow ones, 4 x ~0.059 s = ~0.236 s; the
    # target's 4 slow ones take 4 x ~0.044 s = ~0.174 s and its next ones ~0.017 s,
    # so its iterations 0..7 start before then: 4 + 8.
    assert (pipe["iterations"]["warmup"], pipe["iterations"]["event"]) == (12, 2)
    # restart: the first attempt (2 x 30 iterations) left out.
    assert restart["iterations"]["attempt"] == 60
    # ddp: no sync phase, yet diagnose finds the ranks' wait in backward.
    train = ddp["stages"][0]
    assert train["categories"]["sync"] > 0.05 and train["lockstep"] is not None
    with connect(truth_db, read_only=True) as con:
        ensure_attribution(con)
        # host rules over the same steady iterations: the target's cuda_sync is all sync
        host = con.execute("""
            SELECT sum(c.sync_s) / sum(a.base_s) FROM iteration_categories c
            JOIN attribution a USING (run_id, rank, stage, worker, iter)
            WHERE run_id = 'pipe' AND c.stage = 'target' AND a.steady""").fetchall()
    target = next(s for s in pipe["stages"] if s["stage"] == "target")
    assert host[0][0] > 3 * target["categories"]["sync"]


def test_stage_utilization_equals_diagnose(truth_db: Path, diagnoses) -> None:
    for run, d in diagnoses.items():
        rows = {r["stage"]: r for r in query(truth_db, "stage_utilization", run_id=run)}
        assert sorted(rows) == sorted(s["stage"] for s in d["stages"]), run
        for st in d["stages"]:
            row = rows[st["stage"]]
            assert (row["workers"], row["iterations"]) == (st["workers"], st["iterations"])
            assert same(row["iters_per_s"], st["throughput"]["iters_per_s"]), run
            assert same(row["tokens_per_s"], st["throughput"]["tokens_per_s"]), run
            for c in CATS:
                assert same(row[c], st["categories"][c]), (run, st["stage"], c)


def test_phase_breakdown_equals_diagnose(truth_db: Path, diagnoses) -> None:
    for run, d in diagnoses.items():
        rows = {(r["stage"], r["phase"]): r for r in query(truth_db, "phase_breakdown",
                                                           run_id=run)}
        for st in d["stages"]:
            assert st["top_phases"], run
            for p in st["top_phases"]:
                row = rows[(st["stage"], p["phase"])]
                assert row["category"] == p["category"], (run, p["phase"])
                assert same(row["seconds_per_iter"], p["seconds_per_iter"]), (run, p["phase"])
                assert same(row["share"], p["share"]), (run, p["phase"])


def test_rank_skew_equals_diagnose_stragglers(truth_db: Path, diagnoses) -> None:
    stragglers = [(run, s) for run, d in diagnoses.items() for s in d["stragglers"]]
    assert [(run, s["rank"], s["kind"]) for run, s in stragglers] == [("ddp", 1, "compute")]
    for run, s in stragglers:
        rows = {(r["stage"], r["rank"]): r for r in query(truth_db, "rank_skew", run_id=run)}
        row = rows[(s["stage"], s["rank"])]
        assert row["iterations"] == s["iterations"]
        assert same(row["compute_median_s"], s["own_s"])
        assert same(row["peers_compute_median_s"], s["peers_s"])
        assert same(row["skew"], 1 + s["slowdown"])
    for run, d in diagnoses.items():
        rows = query(truth_db, "rank_skew", run_id=run)
        for st in d["stages"]:
            mine = [r for r in rows if r["stage"] == st["stage"]]
            assert len(mine) == st["workers"]
            assert sum(r["iterations"] for r in mine) == st["iterations"]


def test_runs_by_throughput_and_regressions_equal_diagnose(truth_db: Path, diagnoses) -> None:
    rows = query(truth_db, "runs_by_throughput")
    assert {r["run_id"] for r in rows} == set(RUNS)
    for row in rows:
        d = diagnoses[row["run_id"]]
        last = d["stages"][-1]
        assert (row["stage"], row["iterations"]) == (last["stage"], last["iterations"])
        assert same(row["tokens_per_s"], d["throughput"]["tokens_per_s"])
        assert same(row["iters_per_s"], d["throughput"]["iters_per_s"])
    # fastest first: tokens/s, then the run without tokens
    tps = [diagnoses[r]["throughput"]["tokens_per_s"] for r in RUNS]
    assert [r["run_id"] for r in rows] == [r for _, r in sorted(
        ((-(t or 0), r) for t, r in zip(tps, RUNS, strict=True)), key=lambda x: x[0])]

    reg = query(truth_db, "regressions_vs_best")
    assert [r["run_id"] for r in reg] == list(RUNS)      # oldest first (truth_runs.STARTED)
    best: dict[str, float] = {}
    for row in reg:
        d = diagnoses[row["run_id"]]
        unit = "tokens/s" if d["throughput"]["tokens_per_s"] is not None else "iterations/s"
        value = d["throughput"]["tokens_per_s" if unit == "tokens/s" else "iters_per_s"]
        assert row["unit"] == unit and same(row["throughput"], value)
        assert same(row["best_before"], best.get(unit))
        best[unit] = max(best.get(unit, value), value)


def test_throughput_over_time_counts_diagnose_iterations(truth_db: Path, diagnoses) -> None:
    for run, d in diagnoses.items():
        rows = query(truth_db, "throughput_over_time", run_id=run, bucket_s=1e6)
        assert sum(r["iterations"] for r in rows) == d["iterations"]["total"]


def test_queue_occupancy_equals_diagnose_inside_the_steady_window(truth_db, diagnoses) -> None:
    # pipe's samples all fall inside its steady window, which diagnose's queues read
    # (its waits are hs_get/hs_put, not hs_queue_get/_put: judged by its samples).
    (q,) = diagnoses["pipe"]["queues"]
    (row,) = query(truth_db, "queue_occupancy", run_id="pipe")
    assert (row["name"], row["samples"], row["capacity"]) == (q["name"], q["samples"],
                                                              q["capacity"])
    assert q["weighted"] is False
    for k in ("mean_depth", "empty_share", "full_share"):
        assert same(row[k], q[k]), k


def test_chronic_stragglers_counts_diagnose_stragglers(truth_db: Path, diagnoses) -> None:
    # ddp's ranks ran on node-0 (lockstep_sim's default host); pipe and restart recorded none
    rows = {r["host"]: r for r in query(truth_db, "chronic_stragglers")}
    named = [(run, s) for run, d in diagnoses.items() for s in d["stragglers"]]
    assert [(run, s["rank"]) for run, s in named] == [("ddp", 1)]
    assert (rows["node-0"]["runs"], rows["node-0"]["straggler_runs"]) == (1, 1)
    assert same(rows["node-0"]["max_slowdown"], named[0][1]["slowdown"])
    # every run took part through rank 0: pipe, restart as 'rank 0'; ddp as node-0
    assert (rows["rank 0"]["runs"], rows["rank 0"]["straggler_runs"]) == (2, 0)
    assert sum(r["straggler_runs"] for r in rows.values()) == len(named)


def test_throughput_regressions_equal_diagnose(truth_db: Path, diagnoses) -> None:
    rows = query(truth_db, "throughput_regressions", tag_key="config")
    assert [r["run_id"] for r in rows] == list(RUNS)            # all config a, oldest first
    before: dict[str, tuple[str, float]] = {}
    for row in rows:
        tp = diagnoses[row["run_id"]]["throughput"]
        unit = "tokens/s" if tp["tokens_per_s"] is not None else "iterations/s"
        value = tp["tokens_per_s"] if unit == "tokens/s" else tp["iters_per_s"]
        assert (row["config"], row["unit"]) == ("a", unit) and same(row["throughput"], value)
        prev = before.get(unit)
        assert row["previous_run_id"] == (prev[0] if prev else None)
        assert same(row["change"], value / prev[1] - 1 if prev else None)
        before[unit] = (row["run_id"], value)


def test_stage_shares_by_month_equal_diagnose(truth_db: Path, diagnoses) -> None:
    # the three runs started within hours of each other (one month); each stage is one run's
    rows = {r["stage"]: r for r in query(truth_db, "stage_shares_by_month", tag_key="config")}
    stages = {s["stage"]: s for d in diagnoses.values() for s in d["stages"]}
    assert sorted(rows) == sorted(stages)
    for name, st in stages.items():
        row = rows[name]
        assert (row["month"], row["tag_value"], row["runs"]) == ("2023-11-01", "a", 1)
        assert row["iterations"] == st["iterations"]
        for c in CATS:
            assert same(row[c], st["categories"][c]), (name, c)


def test_tlog_runs_equals_diagnose(truth_db: Path, diagnoses) -> None:
    listed = {r["run_id"]: r for r in cli("runs", "--json", "--db", str(truth_db))}
    assert sorted(listed) == sorted(RUNS)
    for run, d in diagnoses.items():
        r = listed[run]
        assert r["iterations"] == {"total": d["iterations"]["total"],
                                   "steady": d["iterations"]["steady"]}
        for k in ("iters_per_s", "tokens_per_s", "samples_per_s"):
            assert same(r["throughput"][k], d["throughput"][k]), (run, k)
        for k in ("stage", "category", "phase", "share", "straggler", "cause"):
            assert r["bottleneck"][k] == d["bottleneck"][k], (run, k)
        assert (r["verdict"], r["confidence"]) == (d["verdict"], d["confidence"])


def test_every_stored_query_is_checked_here() -> None:
    from tlog.queries import list_queries

    text = Path(__file__).read_text(encoding="utf-8")
    for name in list_queries():
        assert f'"{name}"' in text, name


# ---------------------------------------------------------------- staleness

def _write_jsonl(run_dir: Path, builder, *, append: bool = False) -> None:
    """The builder's iterations as the shim's JSONL (docs/FORMAT.md), one file per worker."""
    phases: dict[tuple, list] = {}
    for (_run, rank, stage, worker, it, _seq, name, _parent, host, gpu, _cat) in builder.phases:
        phases.setdefault((rank, stage, worker, it), []).append((name, host, gpu))
    lines: dict[Path, list[str]] = {}
    for (_run, rank, stage, worker, it, ts, dur, _cpu, tokens, *_rest) in builder.iterations:
        path = run_dir / f"rank{rank}.{stage}.jsonl"
        out = lines.setdefault(path, [] if append else [json.dumps(
            {"type": "meta", "v": 1, "rank": rank, "stage": stage, "worker": worker})])
        ph = phases[(rank, stage, worker, it)]
        rec = {"type": "iter", "rank": rank, "stage": stage, "worker": worker, "iter": it,
               "ts": ts, "dur": dur, "phases": {n: h for n, h, _ in ph},
               "gpu": {n: g for n, _, g in ph if g is not None},
               "kinds": {n: KINDS[n] for n, _, _ in ph}}
        if tokens is not None:
            rec["tokens"] = tokens
        out.append(json.dumps(rec))
    for path, text in lines.items():
        with path.open("a" if append else "w", encoding="utf-8") as f:
            f.write("\n".join(text) + "\n")


def _figures(db: Path) -> tuple[dict, dict, dict]:
    d = cli("diagnose", "--run", "pipe", "--json", "--db", str(db))
    (by_tp,) = query(db, "runs_by_throughput")
    util = {r["stage"]: r for r in query(db, "stage_utilization", run_id="pipe")}
    return d, by_tp, util


def test_stored_figures_follow_appended_iterations(tmp_path: Path) -> None:
    from tlog.ingest.run import ingest_run

    run_dir = tmp_path / "pipe"
    run_dir.mkdir()
    db = tmp_path / "t.duckdb"
    first = pipeline_run(60)
    _write_jsonl(run_dir, first)
    assert invoke(["ingest", str(run_dir), "--db", str(db)]).exit_code == 0
    with connect(db, read_only=True) as con:
        state = ensure_attribution(con)     # tlog ingest stored it: nothing to compute
        assert (state.runs, state.computed) == (["pipe"], [])
    d1, tp1, _ = _figures(db)
    assert same(tp1["tokens_per_s"], d1["throughput"]["tokens_per_s"])

    # 60 more iterations per worker, with a drafter twice as slow in forward
    more = pipeline_run(120, seed=1, warm=4)
    more.iterations = [r for r in more.iterations if r[4] >= 60]
    more.phases = [p if p[6] != "forward" else (*p[:8], p[8] * 2, *p[9:])
                   for p in more.phases if p[4] >= 60]
    shift = {}
    for r in first.iterations:
        shift[(r[1], r[3])] = max(shift.get((r[1], r[3]), 0.0), r[5] + r[6])
    t0 = {(r[1], r[3]): r[5] for r in more.iterations if r[4] == 60}
    more.iterations = [(*r[:5], r[5] - t0[(r[1], r[3])] + shift[(r[1], r[3])], *r[6:])
                       for r in more.iterations]
    _write_jsonl(run_dir, more, append=True)
    with connect(db) as con:              # the library's ingest: nothing stored yet
        ingest_run(con, run_dir)
    with connect(db, read_only=True) as con:
        state = ensure_attribution(con)
        assert (state.computed, state.stored) == (["pipe"], False)
    d2, tp2, util2 = _figures(db)
    assert d2["iterations"]["total"] == 240
    assert not same(tp2["tokens_per_s"], tp1["tokens_per_s"])
    assert same(tp2["tokens_per_s"], d2["throughput"]["tokens_per_s"])
    for st in d2["stages"]:
        row = util2[st["stage"]]
        assert row["iterations"] == st["iterations"]
        for c in CATS:
            assert same(row[c], st["categories"][c]), (st["stage"], c)

    # tlog ingest (nothing new) stores it; forgetting the run drops it
    assert invoke(["ingest", str(run_dir), "--db", str(db)]).exit_code == 0
    with connect(db, read_only=True) as con:
        assert ensure_attribution(con).computed == []
        stored = con.execute("SELECT tokens_per_s FROM attribution_runs").fetchall()
    assert same(stored[0][0], d2["throughput"]["tokens_per_s"])
    assert invoke(["forget", "pipe", "--yes", "--db", str(db)]).exit_code == 0
    with connect(db, read_only=True) as con:
        for table in persist.TABLES:
            assert con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] == 0, table


def test_a_change_to_the_analysis_recomputes(truth_db: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored rows carry the digest of the analysis code they were computed by
    (``persist.analysis_key``); another digest (a rule or a policy changed) makes
    every run stale, on a writable connection and on a read-only one alike."""
    import shutil

    db = Path(shutil.copy(truth_db, tmp_path / "copy.duckdb"))
    with connect(db) as con:
        ensure_attribution(con)
        assert ensure_attribution(con).computed == []
        assert con.execute("SELECT DISTINCT analysis_version FROM attribution_runs"
                           ).fetchall() == [(persist.analysis_key(),)]
    monkeypatch.setattr(persist, "analysis_key", lambda: "0123456789abcdef")
    with connect(db, read_only=True) as con:
        assert ensure_attribution(con).computed == sorted(RUNS)
    with connect(db) as con:
        assert ensure_attribution(con).computed == sorted(RUNS)
        assert con.execute("SELECT DISTINCT analysis_version FROM attribution_runs"
                           ).fetchall() == [("0123456789abcdef",)]
        assert ensure_attribution(con).computed == []


def test_tlog_sql_reads_the_stored_diagnosis(truth_db: Path, diagnoses) -> None:
    """Ad-hoc SQL over ``attribution`` (read-only, locked-down connection) gets
    diagnose's figures: the stored rows are made fresh before the statement runs."""
    target = next(s for s in diagnoses["pipe"]["stages"] if s["stage"] == "target")
    (row,) = cli("sql", "SELECT count(*) AS n, sum(sync_s) / sum(base_s) AS sync FROM attribution "
                 "WHERE run_id = 'pipe' AND stage = 'target' AND steady",
                 "--format", "json", "--db", str(truth_db))
    assert row["n"] == target["iterations"]
    assert same(row["sync"], target["categories"]["sync"])


def _install_plugin(root: Path, version: str) -> None:
    """A rule plugin distribution on ``root`` (a folder for sys.path): entry point
    ``t14 = t14plug:R`` in group tlog.rules, reporting finding ``t14_rule``."""
    (root / "t14plug.py").write_text(
        "from tlog.analyze.rules import Rule\n"
        "from tlog.analyze.findings import Finding\n"
        "class R(Rule):\n"
        "    code = 't14_rule'\n"
        "    def evaluate(self, ctx):\n"
        "        return [Finding('t14_rule', 'info', 'plugin')]\n")
    for old in root.glob("t14plug-*.dist-info"):
        shutil.rmtree(old)
    info = root / f"t14plug-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: t14plug\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[tlog.rules]\nt14 = t14plug:R\n")


def _stored_codes(con, run: str) -> list[str]:
    text = con.execute("SELECT diagnosis FROM attribution_runs WHERE run_id = ?",
                       [run]).fetchall()[0][0]
    return sorted(f["code"] for f in json.loads(text)["findings"])


def test_installing_or_removing_a_rule_plugin_recomputes(truth_db: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """the stored findings followed the data only, not the rules: a
    plugin installed after the ingest never showed in ``attribution_runs.diagnosis``."""
    from tlog.analyze.plugins import rule_set_key
    from tlog.analyze.rules import plugin_rules

    db = Path(shutil.copy(truth_db, tmp_path / "copy.duckdb"))
    site = tmp_path / "site"
    site.mkdir()

    def rules_changed() -> None:
        plugin_rules.cache_clear()
        rule_set_key.cache_clear()

    monkeypatch.syspath_prepend(str(site))
    rules_changed()
    try:
        with connect(db) as con:
            ensure_attribution(con)
            before = _stored_codes(con, "pipe")
            assert "t14_rule" not in before
            _install_plugin(site, "1.0")
            rules_changed()
            assert ensure_attribution(con).computed == sorted(RUNS)
            assert _stored_codes(con, "pipe") == sorted([*before, "t14_rule"])
            assert ensure_attribution(con).computed == []
            _install_plugin(site, "1.1")            # an upgrade may change its findings
            rules_changed()
            assert ensure_attribution(con).computed == sorted(RUNS)
            shutil.rmtree(next(site.glob("t14plug-*.dist-info")))
            rules_changed()
            assert ensure_attribution(con).computed == sorted(RUNS)
            assert _stored_codes(con, "pipe") == before
    finally:
        monkeypatch.undo()
        rules_changed()
