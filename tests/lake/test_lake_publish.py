"""Publishing runs of two databases into one lake, and the stored queries over it on
DuckDB: the database's rows, re-publishing replaces, a reader never sees half a run."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import polars as pl
import pytest
from compare import QUERY_PARAMS, same_rows
from lake_runs import JOBS, copy_lake
from tlog.ingest.db import connect
from tlog.ingest.errors import RunNotFoundError
from tlog.queries import lake as lake_mod
from tlog.queries import list_queries, run_query
from tlog.queries.lake import LakeError, publish_run, read_lake
from tlog.queries.lake_sql import duckdb_lake, run_lake_query, run_lake_sql

from tests.support.cli import invoke

RUNS = ["ddp", "job1", "job2", "job3", "job4", "pipe", "restart"]


def test_two_hosts_publish_into_one_lake(lake: Path, hosts: dict[str, Path]) -> None:
    snap = read_lake(lake)
    assert snap.runs == RUNS
    # one file per table per run, each named by its run's manifest and present
    for table in lake_mod.LAKE_TABLES:
        files = snap.files(table)
        assert len(files) == len(RUNS) and all(Path(f).is_file() for f in files), table
    # row counts per table and run: the databases'
    con = duckdb_lake(snap)
    try:
        for host in ("a", "b"):
            with connect(hosts[host], read_only=True) as db:
                for table in ("iterations", "phases", "attribution", "events", "workers"):
                    want = db.execute(f"SELECT run_id, count(*) FROM {table} GROUP BY 1 "
                                      "ORDER BY 1").fetchall()
                    runs = [r for r, _ in want]
                    got = con.execute(f"SELECT run_id, count(*) FROM {table} WHERE run_id IN "
                                      f"(SELECT unnest($r::VARCHAR[])) GROUP BY 1 ORDER BY 1",
                                      {"r": runs}).fetchall()
                    assert got == want, (host, table)
    finally:
        con.close()


def test_every_stored_query_is_run_here() -> None:
    assert sorted(QUERY_PARAMS) == list_queries()


@pytest.mark.parametrize("name", sorted(QUERY_PARAMS))
def test_stored_query_on_the_lake_equals_the_database(name: str, lake: Path,
                                                      hosts: dict[str, Path]) -> None:
    with connect(hosts["all"], read_only=True) as con:
        for params in QUERY_PARAMS[name]:
            want = run_query(con, name, params)
            got = run_lake_query(lake, name, params, engine="duckdb")
            assert want.height > 0, (name, params)
            assert same_rows(want, got) is None, (name, params, same_rows(want, got))


def test_chronic_stragglers_names_the_host_slow_in_three_of_four_jobs(lake: Path) -> None:
    slow = {h: sum(1 for _, s in JOBS.values() if s == h) for h in ("h0", "h1", "h2", "h3")}
    assert slow == {"h0": 1, "h1": 0, "h2": 3, "h3": 0}     # the truth, by construction
    rows = {r["host"]: r for r in run_lake_query(lake, "chronic_stragglers").to_dicts()}
    for host, n in slow.items():
        assert (rows[host]["runs"], rows[host]["straggler_runs"]) == (4, n), host
    assert rows["h2"]["share"] == 0.75
    chronic = run_lake_query(lake, "chronic_stragglers", {"min_runs": 3, "min_share": 0.5})
    assert chronic["host"].to_list() == ["h2"]


def _figures(lake: Path) -> tuple:
    """What a reader sees of run ``pipe``: its rows per table (one statement, so one
    reading of the manifests) and its stage figures (a stored query)."""
    counts = run_lake_sql(lake, "SELECT " + ", ".join(
        f"(SELECT count(*) FROM {t} WHERE run_id = 'pipe')"
        for t in ("iterations", "phases", "attribution", "attribution_runs"))).rows()[0]
    util = run_lake_query(lake, "stage_utilization", {"run_id": "pipe"})
    return counts, tuple(util.sort("stage").rows())


@pytest.fixture(scope="module")
def longer_pipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database whose run ``pipe`` has 90 iterations per worker, not 60."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "history"))
    from truth_runs import pipeline_run, write_runs

    db = write_runs(tmp_path_factory.mktemp("longer") / "p.duckdb", [pipeline_run(90)])
    with connect(db) as con:
        from tlog.analyze.persist import ensure_attribution

        ensure_attribution(con)
    return db


def test_republishing_a_run_replaces_it(lake: Path, longer_pipe: Path, tmp_path: Path) -> None:
    mine = copy_lake(lake, tmp_path / "lake")
    before = _figures(mine)
    assert before[0][0] == 120
    with connect(longer_pipe, read_only=True) as con:
        report = publish_run(con, "pipe", mine)
    assert len(report.replaced) == 1 and not report.superseded
    after = _figures(mine)
    assert after[0][0] == 180 and after != before
    # the old version's manifest and files are gone; the other runs untouched
    assert [p.name for p in (mine / "_tlog" / "runs" / "pipe").iterdir()] == [
        f"{report.publish_id}.json"]
    for table in lake_mod.LAKE_TABLES:
        assert [p.name for p in (mine / table / "run_id=pipe").iterdir()] == [
            f"part-{report.publish_id}.parquet"]
    assert read_lake(mine).runs == RUNS
    # the database's figures for the longer run
    with connect(longer_pipe, read_only=True) as con:
        want = run_query(con, "stage_utilization", {"run_id": "pipe"})
    assert same_rows(want, run_lake_query(mine, "stage_utilization", {"run_id": "pipe"})) is None


def test_a_reader_during_a_publish_sees_old_or_new_never_half(
        lake: Path, longer_pipe: Path, hosts: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    mine = copy_lake(lake, tmp_path / "lake")
    old = _figures(mine)
    # 1. Deterministic: read at every rename of the publish (each table's file, the
    #    manifest) and at every deletion of the old version after the commit.
    seen: list[tuple] = []
    real_replace, real_unlink = os.replace, Path.unlink

    def replace(src, dst):
        seen.append(("before rename of " + Path(dst).name, _figures(mine)))
        real_replace(src, dst)

    def unlink(self, missing_ok=False):
        real_unlink(self, missing_ok=missing_ok)
        if "_tlog" not in str(self) or self.suffix == ".json":
            seen.append(("after removing " + self.name, _figures(mine)))

    monkeypatch.setattr(lake_mod.os, "replace", replace)
    monkeypatch.setattr(lake_mod.Path, "unlink", unlink)
    with connect(longer_pipe, read_only=True) as con:
        publish_run(con, "pipe", mine)
    monkeypatch.undo()
    new = _figures(mine)
    assert new != old
    assert len(seen) >= 2 * len(lake_mod.LAKE_TABLES)
    for where, figures in seen:
        assert figures in (old, new), where
    # before the manifest's rename the old run, after it the new one
    commit = next(i for i, (w, _) in enumerate(seen) if w.endswith(".json"))
    assert all(f == old for _, f in seen[:commit + 1])
    assert all(f == new for _, f in seen[commit + 1:])

    # 2. Concurrent: a reader thread while the run is published back and forth.
    results: list[tuple] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                results.append(_figures(mine))
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for db in (hosts["a"], longer_pipe):
            with connect(db, read_only=True) as con:
                publish_run(con, "pipe", mine)
    finally:
        stop.set()
        reader.join()
    assert not errors, errors[0]
    assert results
    for counts, util in results:          # each reading whole: the old run or the new
        assert counts in (old[0], new[0]) and util in (old[1], new[1])


def test_a_later_publish_of_the_same_run_wins(lake: Path, longer_pipe: Path,
                                              tmp_path: Path) -> None:
    """Two hosts publish one run at once: the greater publish id is the run's version,
    and the other removes itself."""
    mine = copy_lake(lake, tmp_path / "lake")
    with connect(longer_pipe, read_only=True) as con:
        first = publish_run(con, "pipe", mine)
    # a publish whose id is older than the committed one (its host's clock behind)
    pid = lake_mod._publish_id
    try:
        lake_mod._publish_id = lambda: "00000000000000000001-deadbeef"
        with connect(longer_pipe, read_only=True) as con:
            late = publish_run(con, "pipe", mine)
    finally:
        lake_mod._publish_id = pid
    assert late.superseded and not first.superseded
    assert read_lake(mine).manifests["pipe"]["publish_id"] == first.publish_id
    assert not list(mine.glob("*/run_id=pipe/part-00000000000000000001-*"))


def test_a_lake_of_another_schema_version_is_refused(lake: Path, hosts: dict[str, Path],
                                                     tmp_path: Path) -> None:
    mine = copy_lake(lake, tmp_path / "lake")
    meta = mine / "_tlog" / "lake.json"
    doc = json.loads(meta.read_text())
    doc["schema_version"] -= 1
    meta.write_text(json.dumps(doc))
    with connect(hosts["a"], read_only=True) as con, pytest.raises(LakeError,
                                                                   match="schema version"):
        publish_run(con, "pipe", mine)


def test_odd_run_ids_round_trip(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "history"))
    from truth_runs import ddp_run, write_runs

    run_id = "exp/7 it's=50%"
    db = write_runs(tmp_path / "o.duckdb", [ddp_run(30, run_id=run_id)])
    with connect(db, read_only=True) as con:
        publish_run(con, run_id, tmp_path / "lake")
        want = run_query(con, "rank_skew", {"run_id": run_id})
    assert read_lake(tmp_path / "lake").runs == [run_id]
    got = run_lake_query(tmp_path / "lake", "rank_skew", {"run_id": run_id})
    assert same_rows(want, got) is None
    with pytest.raises(RunNotFoundError):
        run_lake_query(tmp_path / "lake", "rank_skew", {"run_id": "nope"})


def test_cli_publish_and_query_over_the_lake(hosts: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "lake"
    res = invoke(["publish", str(out), "--run", "ddp", "--db", str(hosts["a"]),
                  "--json"])
    assert res.exit_code == 0, res.output
    (report,) = json.loads(res.stdout)
    assert report["run_id"] == "ddp" and report["rows"]["iterations"] == 120
    res = invoke(["query", "rank_skew", "-p", "run_id=ddp", "--lake", str(out),
                  "--format", "json"])
    assert res.exit_code == 0, res.output
    with connect(hosts["a"], read_only=True) as con:
        want = run_query(con, "rank_skew", {"run_id": "ddp"})
    assert same_rows(want, pl.DataFrame(json.loads(res.stdout))) is None
    # one clear line, no traceback
    for args, says in (
            (["query", "rank_skew", "-p", "run_id=ddp", "--lake", str(tmp_path / "none")],
             "no run lake"),
            (["query", "rank_skew", "-p", "run_id=ddp", "--engine", "spark"], "--lake"),
            (["query", "rank_skew", "-p", "run_id=zz", "--lake", str(out)], "no run 'zz'")):
        res = invoke(args)
        assert res.exit_code != 0 and says in res.output and "Traceback" not in res.output, \
            res.output

