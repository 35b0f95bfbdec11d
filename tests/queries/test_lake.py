"""``queries.lake``: runs published into a lake folder, replaced by a later
publish, read back by their manifests (a database of two runs written by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tlog.ingest.db import connect
from tlog.queries.lake import LakeError, encode_run_id, publish_run, publish_runs, read_lake

from tests.support.runbuilder import RunBuilder, loop


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.duckdb"
    for run_id, n in (("a/b", 4), ("c", 6)):
        b = RunBuilder(run_id, started=1000.0)
        loop(b, n, [("forward", 0.1)])
        b.write(path).close()
    return path


def test_encode_run_id() -> None:
    assert encode_run_id("a/b") == "a%2Fb"
    assert encode_run_id("run 1") == "run%201"
    assert encode_run_id("ok_1.2-x~") == "ok_1.2-x~"


def test_publish_and_read_back(db: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with connect(db) as con:
        reports = publish_runs(con, lake)
    assert [r.run_id for r in reports] == ["a/b", "c"]
    assert reports[0].rows["iterations"] == 4 and reports[1].rows["iterations"] == 6
    snap = read_lake(lake)
    assert snap.runs == ["a/b", "c"]
    (it_ab, it_c) = snap.files("iterations")
    assert "run_id=a%2Fb" in it_ab and pq.read_table(it_ab).num_rows == 4
    assert pq.read_table(it_c).num_rows == 6
    assert json.loads((lake / "_tlog" / "lake.json").read_text())["schema_version"] == \
        snap.schema_version


def test_a_second_publish_replaces_the_first(db: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with connect(db) as con:
        first = publish_run(con, "c", lake)
        second = publish_run(con, "c", lake)
    assert second.publish_id > first.publish_id and second.replaced == [first.publish_id]
    snap = read_lake(lake)
    assert snap.manifests["c"]["publish_id"] == second.publish_id
    assert len(list((lake / "iterations" / "run_id=c").glob("*.parquet"))) == 1


def test_what_is_not_a_lake(tmp_path: Path) -> None:
    with pytest.raises(LakeError, match="no run lake at"):
        read_lake(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LakeError):
        read_lake(tmp_path / "empty")
