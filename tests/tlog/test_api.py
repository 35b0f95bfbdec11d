"""The Python facade: ``tlog.open(path)`` -> ``Database``.

A hand-made run whose figures are worked out by hand: one worker, 40
iterations of 100 ms, each ``next_batch`` 25 ms (starvation by the name
rules), ``forward`` 30 ms and ``backward`` 45 ms (compute), 2048 tokens.

- shares: starvation 25/100 = 0.25, compute 75/100 = 0.75, nothing else;
- 0.25 >= 0.20 (the high share) -> bottleneck ``starvation`` in ``next_batch``;
- throughput: 1 / 0.1 s = 10 it/s, 2048 / 0.1 s = 20,480 tokens/s;
- removing next_batch: 100 / 75 = 1.333x (gain 1/3); halving it: 100 / 87.5 = 1.143x;
- the largest phase is backward: 45 ms per iteration, share 0.45.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from tlog.ingest.run import IngestReport

import tlog
import tlog.cli
from dflash_runtime.sysinfo import usable_cores
from tests.support.cli import invoke
from tlog.app import json_ready

N = 40


def _write_run(root: Path, *, largest: str = "backward", run_id: str = "hand",
               iters: range = range(N)) -> Path:
    run = root / run_id
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    if iters.start == 0:
        lines.append(json.dumps({"type": "meta", "v": 1, "rank": 0, "stage": "main",
                                 "worker": "main-0", "host": "node-0", "pid": 1000}))
    for i in iters:
        lines.append(json.dumps({"iter": i, "ts": 1764403200.0 + 0.1 * i, "dur": 0.1,
                                 "phases": {"next_batch": 0.025, "forward": 0.030, largest: 0.045},
                                 "tokens": 2048}))
    with (run / "rank0.main.jsonl").open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return run


@pytest.fixture
def db(tmp_path: Path) -> tlog.Database:
    database = tlog.open(tmp_path / "t.duckdb")
    database.ingest(_write_run(tmp_path / "logs"))
    return database


def test_diagnose_gives_the_hand_figures(db: tlog.Database) -> None:
    d = db.diagnose("hand")
    assert (d.iterations.total, d.iterations.steady) == (N, N)
    assert d.categories.starvation == pytest.approx(0.25)
    assert d.categories.compute == pytest.approx(0.75)
    assert d.categories.sync == d.categories.backpressure == 0.0
    assert d.categories.unaccounted == pytest.approx(0.0, abs=1e-12)
    assert d.throughput.iters_per_s == pytest.approx(10.0)
    assert d.throughput.tokens_per_s == pytest.approx(20480.0)
    bn = d.bottleneck
    assert (bn.stage, bn.category, bn.phase) == ("main", "starvation", "next_batch")
    assert bn.share == pytest.approx(0.25)
    [stage] = d.stages
    assert stage.ranks == (0,) and stage.seconds == pytest.approx(N * 0.1)
    top = stage.top_phases[0]
    assert (top.phase, top.category) == ("backward", "compute")
    assert top.seconds_per_iter == pytest.approx(0.045) and top.share == pytest.approx(0.45)
    w = next(w for w in d.what_if if w.phase == "next_batch")
    assert w.speedup == pytest.approx(100 / 75)
    assert w.throughput_gain == pytest.approx(1 / 3)
    assert w.speedup_halved == pytest.approx(100 / 87.5)


def test_facade_json_is_the_cli_json(db: tlog.Database) -> None:
    """``db.diagnose(run).to_dict()`` is what ``tlog diagnose --json`` prints."""
    result = invoke(["diagnose", "--run", "hand", "--db", str(db.path),
                     "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json_ready(db.diagnose("hand").to_dict())


def test_stage_table_is_a_frame_of_the_stages(db: tlog.Database) -> None:
    row = db.diagnose("hand").stage_table().row(0, named=True)
    assert (row["stage"], row["workers"], row["iterations"], row["bottleneck"]) == (
        "main", 1, N, True)
    assert row["starvation"] == pytest.approx(0.25) and row["compute"] == pytest.approx(0.75)
    assert row["tokens_per_s"] == pytest.approx(20480.0)


def test_runs_is_a_frame_with_the_diagnose_figures(db: tlog.Database) -> None:
    runs = db.runs()
    assert runs["run_id"].to_list() == ["hand"]
    row = runs.row(0, named=True)
    assert (row["iterations"], row["steady"]) == (N, N)
    assert row["tokens_per_s"] == pytest.approx(20480.0)
    assert (row["bottleneck_category"], row["bottleneck_phase"]) == ("starvation", "next_batch")


def test_attribute_frames_sum_per_iteration(db: tlog.Database) -> None:
    it = db.attribute("hand").iteration_frame()
    assert it.height == N
    assert it["starvation_s"].to_list() == pytest.approx([0.025] * N)
    assert it["compute_s"].to_list() == pytest.approx([0.075] * N)


def test_sql_is_read_only_like_tlog_sql(db: tlog.Database) -> None:
    from tlog.queries import WriteRefusedError

    assert db.sql("SELECT count(*) AS n FROM iterations")["n"].to_list() == [N]
    with pytest.raises(WriteRefusedError):
        db.sql("DELETE FROM iterations")
    assert db.sql("SELECT count(*) AS n FROM iterations")["n"].to_list() == [N]


def test_compare_with_itself_is_refused_and_two_runs_compare(db: tlog.Database,
                                                             tmp_path: Path) -> None:
    from tlog.ingest.errors import UsageError

    with pytest.raises(UsageError):
        db.compare("hand", "hand")
    db.ingest(_write_run(tmp_path / "logs", run_id="hand2"))
    c = db.compare("hand", "hand2")
    assert c.throughput_ratio == pytest.approx(1.0)


def test_follow_ingests_what_a_live_run_appends(tmp_path: Path) -> None:
    """Three rounds: the run grows by 10 iterations between rounds (written
    where follow would sleep); each round loads exactly the new ones."""
    run = _write_run(tmp_path / "logs", iters=range(20))
    db = tlog.open(tmp_path / "f.duckdb")
    loaded = []
    for report in db.follow(run, interval_s=0.01, rounds=3):
        loaded.append(report.records_loaded["iter"])
        start = 20 + 10 * (len(loaded) - 1)
        _write_run(tmp_path / "logs", iters=range(start, start + 10))
    assert loaded == [20, 10, 10]
    assert db.diagnose("hand").iterations.total == 40


def test_closed_database_refuses_and_read_only_refuses_writes(tmp_path: Path) -> None:
    from tlog.ingest.errors import UsageError

    with tlog.open(tmp_path / "c.duckdb") as db:
        db.ingest(_write_run(tmp_path / "logs"))
    with pytest.raises(UsageError, match="closed"):
        db.runs()
    ro = tlog.open(tmp_path / "c.duckdb", read_only=True)
    with pytest.raises(UsageError, match="read-only"):
        ro.ingest(tmp_path / "logs" / "hand")
    assert ro.runs().height == 1


def test_html_repr_escapes_names_from_logs(tmp_path: Path) -> None:
    """A phase named like markup (the largest phase: shown in the stage row and
    the what-if list) is shown as text, never as markup. No '/' in it: that
    would make it a child phase."""
    evil = "<script>alert(1)<\\script><img src=x onerror=\"alert('&')\">"
    db = tlog.open(tmp_path / "e.duckdb")
    db.ingest(_write_run(tmp_path / "logs", largest=evil, run_id="evil"))
    d = db.diagnose("evil")
    assert d.stages[0].top_phases[0].phase == evil   # the name survived ingest as logged
    page = d._repr_html_()
    assert "<script>" not in page and "<img" not in page and evil not in page
    escaped = ("&lt;script&gt;alert(1)&lt;\\script&gt;&lt;img src=x "
               "onerror=&#34;alert(&#39;&amp;&#39;)&#34;&gt;")
    assert page.count(escaped) == 2        # the stage's top phase and its what-if line
    assert "Bottleneck: input - main waits for data 25% of its time" in page
    assert "<script>" not in db.runs()._repr_html_()


def test_import_tlog_loads_no_heavy_library() -> None:
    code = ("import sys, tlog; db = tlog.open; "
            "print(sorted(m for m in ('polars', 'duckdb', 'pyarrow', 'altair', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"


def _stored_iterations(path: Path) -> int | None:
    """``attribution_runs.iterations`` of run ``hand`` as stored in the file
    (plain duckdb, no tlog: what a reader finds without recomputing)."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = con.execute("SELECT iterations FROM attribution_runs WHERE run_id = 'hand'"
                           ).fetchall()
    finally:
        con.close()
    return rows[0][0] if rows else None


@pytest.mark.parametrize(("store_interval_s", "between", "at_end"), [
    (3600.0, [20, 20, 20], 50),     # first round only, then once at the end
    (0.0, [20, 30, 40], 50),        # every round that loaded something
])
def test_follow_stores_the_diagnosis_at_most_every_interval_and_at_the_end(
        tmp_path: Path, store_interval_s: float, between: list[int], at_end: int) -> None:
    """each round re-diagnosed and stored the whole run under the
    write lock. 20 iterations, then 10 more before each of rounds 2..4: what the
    file holds after each of the first three rounds, and after the loop."""
    run = _write_run(tmp_path / "logs", iters=range(20))
    db = tlog.open(tmp_path / "s.duckdb")
    seen = []
    for report in db.follow(run, interval_s=0.01, rounds=4, store_interval_s=store_interval_s):
        if len(seen) < 3:
            seen.append(_stored_iterations(db.path))
            start = 20 + 10 * (len(seen) - 1)
            _write_run(tmp_path / "logs", iters=range(start, start + 10))
    assert seen == between
    assert _stored_iterations(db.path) == at_end
    assert db.runs()["iterations"].to_list() == [at_end]


def test_leaving_follow_early_stores_what_was_loaded(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "logs", iters=range(20))
    db = tlog.open(tmp_path / "b.duckdb")
    for n, _ in enumerate(db.follow(run, interval_s=0.01, store_interval_s=3600.0)):
        if n == 1:
            break                                   # round 2 loaded 10 more, not stored yet
        _write_run(tmp_path / "logs", iters=range(20, 30))
    assert _stored_iterations(db.path) == 30


def test_follow_refuses_at_the_call_and_ends_when_the_run_vanishes(tmp_path: Path) -> None:
    """a read-only or closed database refused only at the first
    iteration; a run directory gone after round 1 made rounds=3 retry forever."""
    import shutil

    from tlog.ingest.errors import RunDirError, UsageError

    run = _write_run(tmp_path / "logs", iters=range(20))
    with pytest.raises(UsageError, match="read-only"):
        tlog.open(tmp_path / "v.duckdb", read_only=True).follow(run)
    closed = tlog.open(tmp_path / "v.duckdb")
    closed.close()
    with pytest.raises(UsageError, match="closed"):
        closed.follow(run)
    db = tlog.open(tmp_path / "v.duckdb")
    retries = []
    reports = []
    with pytest.raises(RunDirError):
        for report in db.follow(run, interval_s=0.01, rounds=3,
                                on_retry=lambda e, s: retries.append(str(e))):
            reports.append(report.records_loaded["iter"])
            shutil.rmtree(run)
    assert reports == [20] and len(retries) == 1     # round 2 retried, round 3 raised


@pytest.mark.parametrize("call", [
    lambda db: db.runs(since="2020-01-01"),
    lambda db: db.runs(since=float("nan")),
    lambda db: db.runs(tags={"k": 1}),
    lambda db: db.diagnose(5),
    lambda db: db.attribute(5),
    lambda db: db.compare("hand", 5),
])
def test_wrong_argument_types_are_usage_errors(db: tlog.Database, call) -> None:
    from tlog.ingest.errors import UsageError

    with pytest.raises(UsageError) as info:
        call(db)
    assert "\n" not in str(info.value)


def test_compare_match_takes_one_tag_key_as_a_string(db: tlog.Database) -> None:
    """``match="model"`` is the key ``model``, not the letters m, o, d, e, l (a
    first-time user's call failed with "no tag 'm'")."""
    from tlog.ingest.errors import TlogError

    with pytest.raises(TlogError) as as_str:
        db.compare("hand", match="model")
    with pytest.raises(TlogError) as as_list:
        db.compare("hand", match=["model"])
    assert str(as_str.value) == str(as_list.value)
    assert "'model'" in str(as_str.value)


def test_follow_waits_for_a_run_directory_that_does_not_exist_yet(tmp_path: Path) -> None:
    """The usual flow: start following, then launch the job, which creates its run
    directory only once it has imported torch. Live follow waits (told once), then
    loads everything."""
    import duckdb
    from tlog.ingest.db import connect
    from tlog.ingest.follow import follow

    logs, told, sleeps = tmp_path / "logs", [], []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 3:          # the job starts after three rounds of waiting
            _write_run(logs)

    def opener() -> duckdb.DuckDBPyConnection:
        return connect(tmp_path / "w.duckdb")

    reports = follow(opener, logs / "hand", interval_s=0.5, sleep=sleep,
                     on_retry=lambda exc, s: told.append(str(exc)))
    first = next(reports)
    reports.close()
    assert first.records_loaded["iter"] == N
    assert len(told) == 1 and "does not exist" in told[0]
    assert sleeps == [0.5, 0.5, 0.5]


# --- several runs in one call ---------------------------------------------------------

DATA = Path(__file__).resolve().parents[1] / "data"
#: Runs of tests/data loaded by both paths: stragglers, stages, every record
#: kind, machine samples, duplicates, a torch.profiler trace, timer logs.
MANY_SCENARIOS = ("ddp_backward_straggler_unwatched/run", "ddp_measured_tail/run",
                  "report_slow_loader", "ingest_every_kind", "ingest_sys", "ingest_duplicates",
                  "kineto_loader_1", "timer_logs/deepspeed_2024")
#: Columns that say when a row was written, not what it holds.
WHEN_COLUMNS = {"first_ingested", "last_ingested", "ingested_at", "computed_at", "applied_at"}


def _table_rows(path: Path) -> dict[str, list[tuple]]:
    """Every row of every table of the database at ``path``, write times left
    out, sorted (each table's rows as text, so floats compare exactly)."""
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        out = {}
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary "
                                    "AND table_name <> 'tlog_schema' ORDER BY 1").fetchall():
            cols = [c for (c,) in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                "ORDER BY ordinal_position", [table]).fetchall() if c not in WHEN_COLUMNS]
            listed = ", ".join(f'"{c}"::VARCHAR' for c in cols)
            out[table] = sorted(con.execute(f'SELECT {listed} FROM "{table}"').fetchall(),
                                key=repr)
        return out


def _report(report: IngestReport) -> dict:
    """What ``report`` says, less how long its ingest took."""
    return {k: v for k, v in asdict(report).items() if k != "seconds"}


def _assert_same_tables(one: Path, many: Path) -> None:
    a, b = _table_rows(one), _table_rows(many)
    assert a.keys() == b.keys()
    for table in a:
        assert a[table] == b[table], table


@pytest.mark.parametrize("group", [64, 2])
def test_ingest_many_stores_the_rows_and_diagnoses_of_one_ingest_per_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: int) -> None:
    """Scenario runs (stragglers, pipeline stages, traces, timer logs) and hand runs,
    loaded in one call, leave every table (the stored diagnoses too) as one
    ``ingest`` per run in its own open and close does; the hand run's verdict is
    its hand figures (module docstring). Without ``$TLOG_THREADS`` (as a user
    runs it): the one call runs these small runs on one DuckDB thread, one by
    one runs on DuckDB's default. Groups of 2 runs: the full groups of small runs
    are stored on the background thread while the next group loads."""
    import threading

    from tlog.analyze import persist

    monkeypatch.delenv("TLOG_THREADS", raising=False)
    monkeypatch.setattr(tlog.api, "STORE_GROUP_RUNS", group)
    stored_on: list[str] = []
    real = persist.ensure_attribution

    def spy(con, run_ids=None, **kw):
        stored_on.append(threading.current_thread().name)
        return real(con, run_ids, **kw)

    monkeypatch.setattr(persist, "ensure_attribution", spy)
    hands = [_write_run(tmp_path / "logs", run_id=f"hand{k}") for k in range(3)]
    dirs = [DATA / s for s in MANY_SCENARIOS] + hands
    one = tlog.open(tmp_path / "one.duckdb")
    single = [one.ingest(d) for d in dirs]
    many = tlog.open(tmp_path / "many.duckdb")
    said: list[str] = []
    reports = many.ingest_many(dirs, on_report=lambda r: said.append(r.run_id))
    assert [r.run_id for r in reports] == said == [r.run_id for r in single]
    assert [_report(r) for r in reports] == [_report(r) for r in single]
    _assert_same_tables(tmp_path / "one.duckdb", tmp_path / "many.duckdb")
    assert len(_table_rows(tmp_path / "many.duckdb")["attribution_runs"]) == len(dirs)
    for r in single:
        assert many.stored_diagnosis(r.run_id) == one.stored_diagnosis(r.run_id) is not None
    in_background = any(name.startswith("tlog-store") for name in stored_on)
    assert in_background == (group == 2 and (usable_cores() or 1) > 1), stored_on
    # again, runs the database holds (one grown, one unchanged) among new ones
    _write_run(tmp_path / "logs", run_id="hand0", iters=range(N, N + 8))
    again = [hands[0], hands[1], _write_run(tmp_path / "logs", run_id="hand9"),
             DATA / MANY_SCENARIOS[0]]
    single = [one.ingest(d) for d in again]
    reports = many.ingest_many(again)
    assert [_report(r) for r in reports] == [_report(r) for r in single]
    assert reports[0].records_loaded["iter"] == 8 and reports[1].files_unchanged == 1
    _assert_same_tables(tmp_path / "one.duckdb", tmp_path / "many.duckdb")
    d = many.diagnose("hand1")
    assert (d.bottleneck.category, d.bottleneck.phase) == ("starvation", "next_batch")
    assert d.categories.starvation == pytest.approx(0.25)


def test_ingest_runs_gives_small_runs_one_duckdb_thread_and_puts_the_setting_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of a few KB go in on one DuckDB thread (read between runs), a group
    holding a larger one on the connection's own; either way the setting is
    the caller's again after the call."""
    from tlog.ingest import connect

    from tlog.api import ingest_runs

    monkeypatch.delenv("TLOG_THREADS", raising=False)
    dirs = [_write_run(tmp_path / "logs", run_id=f"hand{k}") for k in range(3)]
    con = connect(tmp_path / "t.duckdb")
    con.execute("SET threads = 2")

    def threads() -> int:
        return int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])

    seen: list[int] = []
    ingest_runs(con, dirs[:2], on_report=lambda r: seen.append(threads()))
    assert seen == [1, 1] and threads() == 2
    monkeypatch.setattr(tlog.api, "ONE_THREAD_RUN_BYTES", (dirs[2] / "rank0.main.jsonl"
                                                          ).stat().st_size - 1)
    seen.clear()
    ingest_runs(con, dirs[2:], on_report=lambda r: seen.append(threads()))
    assert seen == [2] and threads() == 2
    monkeypatch.setenv("TLOG_THREADS", "2")     # the user's count: left alone
    _write_run(tmp_path / "logs", run_id="hand0", iters=range(N, N + 4))
    monkeypatch.setattr(tlog.api, "ONE_THREAD_RUN_BYTES", 1 << 30)
    seen.clear()
    ingest_runs(con, dirs[:1], on_report=lambda r: seen.append(threads()))
    assert seen == [2]
    con.close()


def test_ingest_many_each_loads_every_run_directory_of_a_folder(tmp_path: Path) -> None:
    """``each``: the subdirectories holding logs are the runs, by name; one
    without logs (plots/) is left out; a run given twice is loaded once; the
    same call again loads nothing new."""
    for k in (2, 0, 1):
        _write_run(tmp_path / "sweep", run_id=f"lr{k}")
    (tmp_path / "sweep" / "plots").mkdir()
    (tmp_path / "sweep" / "plots" / "loss.png").write_bytes(b"\x89PNG")
    db = tlog.open(tmp_path / "t.duckdb")
    reports = db.ingest_many([tmp_path / "sweep", tmp_path / "sweep"], each=True)
    assert [r.run_id for r in reports] == ["lr0", "lr1", "lr2"]
    assert [r.records_loaded["iter"] for r in reports] == [N, N, N]
    assert db.runs()["run_id"].to_list() == ["lr0", "lr1", "lr2"]
    again = db.ingest_many([tmp_path / "sweep"], each=True)
    assert [r.records_total for r in again] == [0, 0, 0]


def test_ingest_many_refuses_bad_input_before_loading_anything(tmp_path: Path) -> None:
    from tlog.ingest.errors import RunDirError, UsageError

    good = _write_run(tmp_path / "logs", run_id="good")
    (tmp_path / "empty").mkdir()
    db = tlog.open(tmp_path / "t.duckdb")
    with pytest.raises(RunDirError, match=r"missing does not exist \(and 1 more\); "
                                          r"nothing was loaded"):
        db.ingest_many([good, tmp_path / "missing", tmp_path / "empty"])
    with pytest.raises(RunDirError, match="holds no run directory"):
        db.ingest_many([tmp_path / "empty"], each=True)
    twin = _write_run(tmp_path / "other", run_id="good")
    with pytest.raises(RunDirError, match="both hold run 'good'"):
        db.ingest_many([good, twin])
    with pytest.raises(UsageError, match="a list of run directories"):
        db.ingest_many(good)         # type: ignore[arg-type]
    assert not (tmp_path / "t.duckdb").exists()     # nothing was even opened



def test_ingest_many_names_a_symlinked_trace_file_as_one_ingest_does(tmp_path: Path) -> None:
    """Links a.pt.trace.json.gz and b.pt.trace.json.gz to two traces both named
    trace.pt.trace.json.gz: each run is the link's name, as one ``ingest`` of
    it names it, with the steps of its own trace (the truth files' step counts)."""
    gloo = DATA / "kineto_ddp_gloo"
    for link, (trace, truth) in {"a": ("rank0", "truth-rank0"),
                                 "b": ("rank1-input_straggler",
                                       "truth-rank1-input_straggler")}.items():
        (tmp_path / link).mkdir()
        (tmp_path / link / "trace.pt.trace.json.gz").write_bytes(
            (gloo / f"{trace}.pt.trace.json.gz").read_bytes())
        (tmp_path / f"{link}.pt.trace.json.gz").symlink_to(
            tmp_path / link / "trace.pt.trace.json.gz")
    steps = {k: len(json.loads((gloo / f"{t}.json").read_text())["per_step"])
             for k, t in (("a", "truth-rank0"), ("b", "truth-rank1-input_straggler"))}
    links = [tmp_path / "a.pt.trace.json.gz", tmp_path / "b.pt.trace.json.gz"]
    one = tlog.open(tmp_path / "one.duckdb")
    assert [one.ingest(p).run_id for p in links] == ["a", "b"]
    many = tlog.open(tmp_path / "many.duckdb")
    reports = many.ingest_many(links)
    assert [(r.run_id, r.records_loaded["iter"]) for r in reports] == [
        ("a", steps["a"]), ("b", steps["b"])]


def test_empty_text_is_no_run_directory(tmp_path: Path, monkeypatch) -> None:
    """``""`` (an unset shell variable) is refused, not taken for the current
    directory, whose every folder ``each`` would load."""
    from tlog.ingest.errors import UsageError

    monkeypatch.chdir(tmp_path)
    _write_run(tmp_path / "sweep", run_id="lr0")
    db = tlog.open(tmp_path / "t.duckdb")
    for call in (lambda: db.ingest_many([""], each=True),
                 lambda: db.ingest_many(["sweep/lr0", ""]),
                 lambda: db.ingest("")):
        with pytest.raises(UsageError, match="empty text"):
            call()
    assert not (tmp_path / "t.duckdb").exists()

def test_ingest_many_keeps_the_runs_loaded_before_one_that_fails(tmp_path: Path) -> None:
    """A run the database holds for another directory fails while loading: the
    runs before it stay loaded with their diagnoses stored, those after it are
    not loaded, and the message counts both."""
    from tlog.ingest.errors import RunDirError

    db = tlog.open(tmp_path / "t.duckdb")
    db.ingest(_write_run(tmp_path / "old", run_id="taken"))
    # another run under the same id: other logs (the same logs would be the run, moved)
    dirs = [_write_run(tmp_path / "new", run_id=r, largest="optimizer")
            for r in ("a", "taken", "c")]
    with pytest.raises(RunDirError, match=r"already in the database .*1 of 3 runs were loaded "
                                          r"before it .*1 after it were not"):
        db.ingest_many(dirs)
    assert sorted(db.runs()["run_id"].to_list()) == ["a", "taken"]
    assert db.stored_diagnosis("a") is not None


@pytest.mark.parametrize("group", [64, 2])
def test_a_store_interrupted_by_a_stopping_ctrl_c_is_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: int) -> None:
    """DuckDB interrupts the statements running when SIGINT comes (KeyboardInterrupt,
    on any thread). A store it interrupts while the Ctrl-C only asked to stop is
    made again: every run loaded keeps its diagnosis. Here the first store raises as
    DuckDB would, once the stop was asked; with groups of 2 it is on the second
    thread."""
    from tlog.analyze import persist
    from tlog.ingest import connect

    from tlog.api import ingest_runs

    monkeypatch.delenv("TLOG_THREADS", raising=False)
    monkeypatch.setattr(tlog.api, "STORE_GROUP_RUNS", group)
    dirs = [_write_run(tmp_path / "logs", run_id=f"hand{k}") for k in range(5)]
    loaded: list[str] = []
    interrupted: list[list[str]] = []
    real = persist.ensure_attribution

    def interrupting(con, run_ids=None, **kw):
        if not interrupted and len(loaded) >= 3:
            interrupted.append(list(run_ids or []))
            raise KeyboardInterrupt
        return real(con, run_ids, **kw)

    monkeypatch.setattr(persist, "ensure_attribution", interrupting)
    con = connect(tmp_path / "t.duckdb")
    with pytest.raises(KeyboardInterrupt):
        ingest_runs(con, dirs, on_report=lambda r: loaded.append(r.run_id),
                    stop=lambda: len(loaded) >= 3)
    assert loaded == ["hand0", "hand1", "hand2"] and interrupted
    stored = [r[0] for r in con.execute("SELECT run_id FROM attribution_runs ORDER BY run_id"
                                        ).fetchall()]
    con.close()
    assert stored == loaded
