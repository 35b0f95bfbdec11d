"""docs/DESIGN.md "Where a change goes": a new stored query, added as a newcomer
adds one, and used end to end through ``tlog query``.

The query is a ``.sql`` file with the header of docs/QUERIES.md, dropped in a
folder of one's own named by ``TLOG_QUERIES`` (tlog's own live in ``queries/``
beside tlog.queries.runner and go the same way, plus a section in
docs/QUERIES.md and a line in test_one_truth.py). It reads the stored diagnosis
(the ``attribution`` table, docs/DATABASE.md), so its figures must be
``tlog diagnose --json``'s: each stage's share of time spent waiting
(starvation + backpressure + sync) on the one-truth runs (truth_runs.py),
whose device backlog and lockstep waits make the host rules give other figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.db import connect
from truth_runs import ddp_run, pipeline_run, write_runs

from tests.support.cli import invoke

NEW_QUERY = """\
-- Share of each stage's steady time spent waiting: for input, to hand output
-- on, or on the device and other ranks (starvation + backpressure + sync).
--
-- Parameters:
--   $run_id VARCHAR: the run.
--
-- Columns:
--   stage VARCHAR: the pipeline stage.
--   iterations BIGINT: steady iterations, all workers together.
--   wait_share DOUBLE (share): starvation + backpressure + sync over the stage's time.
SELECT stage,
       count(*)::BIGINT AS iterations,
       sum(starvation_s + backpressure_s + sync_s) / nullif(sum(base_s), 0) AS wait_share
FROM attribution
WHERE run_id = $run_id AND steady
GROUP BY stage
ORDER BY stage;
"""


def host_wait_share(db: Path, run: str, stage: str) -> float:
    """The same share by the host rules (view ``iteration_categories``) over the
    same steady iterations."""
    with connect(db, read_only=True) as con:
        ensure_attribution(con)
        return con.execute("""
            SELECT sum(c.starvation_s + c.backpressure_s + c.sync_s) / sum(a.base_s)
            FROM iteration_categories c JOIN attribution a USING (run_id, rank, stage, worker, iter)
            WHERE run_id = $r AND c.stage = $s AND a.steady""", {"r": run, "s": stage}).fetchall()[0][0]


def cli(*args: str) -> object:
    result = invoke(list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def truth_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("tour") / "tour.duckdb"
    return write_runs(db, [pipeline_run(), ddp_run()])


def test_a_new_stored_query_gives_diagnose_figures(truth_db: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "my-queries"
    mine.mkdir()
    (mine / "stage_wait_share.sql").write_text(NEW_QUERY, encoding="utf-8")
    monkeypatch.setenv("TLOG_QUERIES", str(mine))

    listed = {q["name"]: q for q in cli("query", "--list", "--format", "json")}
    assert "stage_wait_share" in listed and "stage_utilization" in listed   # mine and tlog's
    assert [c["unit"] for c in listed["stage_wait_share"]["columns"]] == ["", "", "share"]

    for run in ("pipe", "ddp"):
        d = cli("diagnose", "--run", run, "--json", "--db", str(truth_db))
        rows = cli("query", "stage_wait_share", "-p", f"run_id={run}", "--format", "json",
                   "--db", str(truth_db))
        got = {r["stage"]: r for r in rows}
        assert sorted(got) == sorted(s["stage"] for s in d["stages"]), run
        for st in d["stages"]:
            c = st["categories"]
            want = c["starvation"] + c["backpressure"] + c["sync"]
            assert got[st["stage"]]["iterations"] == st["iterations"], run
            assert got[st["stage"]]["wait_share"] == pytest.approx(want, rel=1e-9), run
            # the stored diagnosis's figures, far from the host rules' (device backlog
            # drained in pipe's sync phases; ddp's lockstep wait inside backward)
            host = host_wait_share(truth_db, run, st["stage"])
            assert abs(got[st["stage"]]["wait_share"] - host) > 0.05, run

def test_tlog_queries_come_first_and_a_missing_folder_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tlog.queries import QUERY_DIR, load_query

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "stage_utilization.sql").write_text(NEW_QUERY, encoding="utf-8")
    monkeypatch.setenv("TLOG_QUERIES", str(mine))
    with pytest.warns(RuntimeWarning, match="stage_utilization.sql is never used"):
        assert load_query("stage_utilization").path == QUERY_DIR / "stage_utilization.sql"

    monkeypatch.setenv("TLOG_QUERIES", str(tmp_path / "nowhere"))
    result = invoke(["query", "--list"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"tlog: error: TLOG_QUERIES names {str(tmp_path / 'nowhere')!r}, which is not a folder"]


def test_a_non_utf8_query_file_is_left_out_of_the_list_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """one Latin-1 file made ``tlog query --list`` an internal error."""
    from tlog.ingest.errors import QueryError
    from tlog.queries import list_queries, load_queries, load_query

    mine = tmp_path / "latin"
    mine.mkdir()
    (mine / "latin1.sql").write_bytes(NEW_QUERY.replace("Share", "Caf\xe9 share")
                                      .encode("latin-1"))
    (mine / "stage_wait_share.sql").write_text(NEW_QUERY, encoding="utf-8")
    monkeypatch.setenv("TLOG_QUERIES", str(mine))
    with pytest.warns(RuntimeWarning, match=r"'latin1' left out: stored query file .*"
                                            r"latin1\.sql is not UTF-8 text \(byte 6: "):
        loaded = [q.name for q in load_queries()]
    assert loaded == [n for n in list_queries() if n != "latin1"]
    assert "stage_wait_share" in loaded and "phase_breakdown" in loaded
    with pytest.raises(QueryError, match=r"latin1\.sql is not UTF-8 text"):
        load_query("latin1")
    with pytest.warns(RuntimeWarning):
        result = invoke(["query", "--list", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [q["name"] for q in json.loads(result.stdout)] == loaded
    bad = invoke(["query", "latin1"])
    assert bad.exit_code == 1 and "internal error" not in bad.output
    assert "latin1.sql is not UTF-8 text" in bad.output


def test_a_query_named_like_tlogs_is_a_warning_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from tlog.queries import QUERY_DIR, list_queries, load_query

    mine = tmp_path / "shadow"
    mine.mkdir()
    (mine / "runs_by_throughput.sql").write_text(NEW_QUERY, encoding="utf-8")
    monkeypatch.setenv("TLOG_QUERIES", str(mine))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list_queries()
        assert load_query("runs_by_throughput").path == QUERY_DIR / "runs_by_throughput.sql"
        list_queries()
    said = [str(w.message) for w in caught]
    assert said == [(f"tlog: stored query {mine / 'runs_by_throughput.sql'} is never used: "
                     f"{QUERY_DIR / 'runs_by_throughput.sql'} has the same name and comes "
                     f"first (tlog's queries, then $TLOG_QUERIES in order); rename it")]


def test_run_query_refuses_a_write_on_a_writable_connection(
        truth_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """a query file's DELETE ran on a connection opened to write."""
    import shutil

    from tlog.queries import WriteRefusedError, run_query

    mine = tmp_path / "del"
    mine.mkdir()
    (mine / "del.sql").write_text("-- Deletes every run.\n--\n-- Columns:\n"
                                  "--   x VARCHAR: a run.\nDELETE FROM runs RETURNING run_id AS x;\n",
                                  encoding="utf-8")
    monkeypatch.setenv("TLOG_QUERIES", str(mine))
    db = Path(shutil.copy(truth_db, tmp_path / "w.duckdb"))
    with connect(db) as con:
        with pytest.raises(WriteRefusedError, match=r"query 'del' .*statement is DELETE"):
            run_query(con, "del")
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(2,)]
        # tlog's own queries pass the guard on the same writable connection
        assert run_query(con, "runs_by_throughput").height == 2
