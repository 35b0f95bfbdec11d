"""Categories follow run.json ``phase_kinds`` at the next ingest, without
reloading the logs (tlog.ingest.recategorize); a record's own ``kinds`` wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ingest_helpers import rows, write_lines
from tlog.ingest import connect, ingest_run
from tlog.ingest.errors import TlogError

from tests.support.cli import invoke

# By the name rules (dflash_runtime/format.py): decode -> compute, step -> compute,
# backward -> compute. The records say step is sync.
PHASES = {"decode": 0.25, "step": 0.125, "backward": 0.5}
CATS = ("SELECT iter, starvation_s, compute_s, sync_s FROM iteration_categories "
        "ORDER BY iter")
LAYOUT = ("SELECT DISTINCT phase, category, given FROM phase_layouts "
          "ORDER BY phase")


def _line(i: int) -> str:
    return json.dumps({"type": "iter", "iter": i, "ts": 100.0 + i, "dur": 1.0,
                       "phases": PHASES, "kinds": {"step": "sync"}}, separators=(",", ":"))


def _run(tmp_path: Path, n: int = 3) -> Path:
    run = tmp_path / "run"
    write_lines(run / "rank0.main.jsonl", [_line(i) for i in range(n)])
    return run


def _manifest(run: Path, **fields) -> None:
    (run / "run.json").write_text(json.dumps({"v": 1, **fields}))


def test_phase_kinds_edited_after_ingest_take_effect(tmp_path: Path):
    run = _run(tmp_path)
    con = connect(tmp_path / "t.duckdb")
    try:
        first = ingest_run(con, run)
        assert first.recategorized == []
        assert rows(con, LAYOUT) == [
            {"phase": "backward", "category": "compute", "given": None},
            {"phase": "decode", "category": "compute", "given": None},
            {"phase": "step", "category": "sync", "given": "sync"}]
        # by hand: compute = decode 0.25 + backward 0.5; sync = step 0.125
        assert rows(con, CATS)[0] == {"iter": 0, "starvation_s": 0.0, "compute_s": 0.75,
                                      "sync_s": 0.125}

        # The engineer learns decode waits on a loader: says so in run.json (and
        # tries to move step, which its records already classify).
        _manifest(run, phase_kinds={"decode": "starvation", "step": "compute"})
        again = ingest_run(con, run)
        assert again.records_loaded["iter"] == 0           # nothing reloaded
        assert again.recategorized == [{"phase": "decode", "from": "compute",
                                        "to": "starvation"}]
        assert rows(con, CATS) == [
            {"iter": i, "starvation_s": 0.25, "compute_s": 0.5, "sync_s": 0.125}
            for i in range(3)]
        assert rows(con, "SELECT phase_kinds FROM runs") == [
            {"phase_kinds": {"decode": "starvation", "step": "compute"}}]

        # Unchanged run.json: nothing to do. New records share the layout.
        write_lines(run / "rank0.main.jsonl", [_line(i) for i in range(5)])
        more = ingest_run(con, run)
        assert more.recategorized == [] and more.records_loaded["iter"] == 2
        assert rows(con, "SELECT count(DISTINCT layout) AS n FROM iterations") == [{"n": 1}]
        assert rows(con, CATS)[4] == {"iter": 4, "starvation_s": 0.25, "compute_s": 0.5,
                                      "sync_s": 0.125}

        # phase_kinds removed from run.json: back to the name rules.
        _manifest(run, name="no kinds now")
        back = ingest_run(con, run)
        assert back.recategorized == [{"phase": "decode", "from": "starvation",
                                       "to": "compute"}]
        assert rows(con, "SELECT phase_kinds FROM runs") == [{"phase_kinds": None}]

        # run.json deleted: the stored (empty) kinds stand; nothing moves.
        (run / "run.json").unlink()
        assert ingest_run(con, run).recategorized == []
        assert rows(con, LAYOUT)[1] == {"phase": "decode", "category": "compute",
                                        "given": None}
    finally:
        con.close()


def test_run_json_gone_keeps_the_stored_kinds(tmp_path: Path):
    """A later ingest without run.json categorises new layouts with the kinds
    the database kept, not with the bare rules."""
    run = _run(tmp_path, 2)
    _manifest(run, phase_kinds={"decode": "starvation"})
    con = connect(tmp_path / "t.duckdb")
    try:
        ingest_run(con, run)
        (run / "run.json").unlink()
        lines = [_line(i) for i in range(2)] + [json.dumps(
            {"type": "iter", "iter": 2, "ts": 102.0, "dur": 1.0,
             "phases": {"decode": 0.5, "backward": 0.25}}, separators=(",", ":"))]
        write_lines(run / "rank0.main.jsonl", lines)
        report = ingest_run(con, run)
        assert report.recategorized == [] and report.records_loaded["iter"] == 1
        assert rows(con, "SELECT iter, starvation_s, compute_s FROM iteration_categories "
                         "WHERE iter = 2") == [{"iter": 2, "starvation_s": 0.5,
                                                "compute_s": 0.25}]
    finally:
        con.close()


def test_cli_says_what_moved(tmp_path: Path):
    run = _run(tmp_path)
    db = str(tmp_path / "t.duckdb")
    assert invoke(["ingest", str(run), "--db", db]).exit_code == 0
    _manifest(run, phase_kinds={"decode": "starvation"})
    res = invoke(["ingest", str(run), "--db", db])
    assert res.exit_code == 0, res.output
    assert ("categories now as run.json phase_kinds / the name rules say: "
            "decode compute -> starvation") in " ".join(res.stdout.split())
    res = invoke(["ingest", str(run), "--db", db, "--json"])
    assert json.loads(res.stdout)["recategorized"] == []


def test_a_failed_ingest_keeps_kinds_and_categories_together(tmp_path: Path):
    """The categories and runs.phase_kinds change in one transaction, before
    the batches: a batch that fails later leaves them agreeing."""
    run = _run(tmp_path)
    _manifest(run, phase_kinds={"decode": "starvation"})
    con = connect(tmp_path / "t.duckdb")
    try:
        ingest_run(con, run)
        _manifest(run, phase_kinds={"decode": "sync"})
        (run / "bad.pt.trace.json").write_text(
            '{"schemaVersion": 1, "deviceProperties": [], "traceEvents": []}')
        with pytest.raises(TlogError, match="traceEvents"):
            ingest_run(con, run)
        assert rows(con, "SELECT phase_kinds FROM runs") == [
            {"phase_kinds": {"decode": "sync"}}]
        assert rows(con, "SELECT DISTINCT category FROM phase_layouts "
                         "WHERE phase = 'decode'") == [{"category": "sync"}]
    finally:
        con.close()


def test_many_names_move_in_one_statement_and_print_short(tmp_path: Path):
    """4,000 distinct phase names (16 layouts of 250), all moved by one
    phase_kinds edit: every one is listed in --json, ten on the terminal."""
    run = tmp_path / "run"
    lines = [json.dumps({"type": "iter", "iter": i, "ts": 100.0 + i, "dur": 1.0,
                         "phases": {f"shard_{i}_{k}": 0.001 for k in range(250)}},
                        separators=(",", ":")) for i in range(16)]
    write_lines(run / "rank0.main.jsonl", lines)
    db = str(tmp_path / "t.duckdb")
    assert invoke(["ingest", str(run), "--db", db]).exit_code == 0
    _manifest(run, phase_kinds={f"shard_{i}_{k}": "starvation"
                                for i in range(16) for k in range(250)})
    res = invoke(["ingest", str(run), "--db", db, "--json"])
    moved = json.loads(res.stdout)["recategorized"]
    assert len(moved) == 4000
    assert moved[0] == {"phase": "shard_0_0", "from": "compute", "to": "starvation"}
    con = connect(db, read_only=True)
    try:
        assert rows(con, "SELECT category, count(*) AS n FROM phase_layouts GROUP BY ALL") == [
            {"category": "starvation", "n": 4000}]
    finally:
        con.close()
    _manifest(run)
    res = invoke(["ingest", str(run), "--db", db])
    text = " ".join(res.stdout.split())
    assert "shard_0_0 starvation -> compute" in text
    assert "(and 3,990 more; all in --json)" in text


def test_phase_kinds_that_cannot_apply_are_warnings(tmp_path: Path):
    run = _run(tmp_path)
    _manifest(run, phase_kinds={"colate": "starvation", "step": "compute",
                                "backward": "compute"})
    con = connect(tmp_path / "t.duckdb")
    try:
        report = ingest_run(con, run)
        assert report.warnings == [
            "run.json phase_kinds names 'colate', which no record of this run has (a typo?)",
            ("run.json phase_kinds for 'step' does not apply: the records give their own "
             "kinds, which come first")]
    finally:
        con.close()


def test_run_json_is_the_source_of_the_runs_fields_while_present(tmp_path: Path):
    """A field removed from run.json is removed from the run (tags no longer
    matched by tlog runs --tag, the manifest as it is now)."""
    run = _run(tmp_path)
    _manifest(run, name="first", tags={"gpus": 8}, phase_kinds={"decode": "sync"})
    con = connect(tmp_path / "t.duckdb")
    try:
        ingest_run(con, run)
        _manifest(run, tags={"gpus": 4})
        ingest_run(con, run)
        assert rows(con, "SELECT name, tags, phase_kinds, manifest FROM runs") == [
            {"name": None, "tags": {"gpus": 4}, "phase_kinds": None,
             "manifest": '{"v": 1, "tags": {"gpus": 4}}'}]
        (run / "run.json").unlink()                   # absent: the run keeps what it had
        ingest_run(con, run)
        assert rows(con, "SELECT tags FROM runs") == [{"tags": {"gpus": 4}}]
    finally:
        con.close()


def test_reload_loads_a_run_again_from_its_logs(tmp_path: Path):
    """--reload forgets the run's rows (say, categories a migration inferred
    wrongly) and loads its logs as a first ingest would; from another
    directory under the same id it is refused before anything is deleted."""
    run = _run(tmp_path)
    con = connect(tmp_path / "t.duckdb")
    try:
        first = ingest_run(con, run)
        before = rows(con, "SELECT * FROM iterations ORDER BY iter")
        con.execute("UPDATE phase_layouts SET category = 'sync', given = 'sync' "
                    "WHERE phase = 'decode'")      # as a bad inference would leave it
        con.execute("UPDATE runs SET started = 1.0, tags = '{\"gpus\": 8}'")   # stale
        again = ingest_run(con, run, reload=True)
        # the runs row too is as a first ingest makes it: started = first ts, no tags
        assert rows(con, "SELECT started, tags FROM runs") == [{"started": 100.0, "tags": None}]
        assert again.records_loaded == first.records_loaded and again.duplicates == 0
        assert rows(con, "SELECT * FROM iterations ORDER BY iter") == before
        assert rows(con, LAYOUT) == [
            {"phase": "backward", "category": "compute", "given": None},
            {"phase": "decode", "category": "compute", "given": None},
            {"phase": "step", "category": "sync", "given": "sync"}]
        other = tmp_path / "other"
        write_lines(other / "rank0.main.jsonl", [_line(7)])
        with pytest.raises(TlogError, match="already in the database"):
            ingest_run(con, other, run_id="run", reload=True)
        assert rows(con, "SELECT count(*) AS n FROM iterations") == [{"n": 3}]
    finally:
        con.close()
