"""``reports.compare_report``: the comparison page of two runs written by hand (the
candidate's forward 40 ms longer), and its per-category breakdown."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from tlog.ingest.db import connect
from tlog.reports.compare_report import (
    breakdown_frame,
    load_compare_data,
    write_compare_report,
)

from tests.support.runbuilder import RunBuilder, loop


def test_breakdown_is_the_mean_of_the_steady_iterations() -> None:
    it = pl.DataFrame({"stage": ["s"] * 3, "steady": [False, True, True],
                       "starvation_s": [9.0, 0.1, 0.3], "backpressure_s": [0.0] * 3,
                       "compute_s": [9.0, 0.5, 0.7], "sync_s": [0.0] * 3,
                       "unaccounted_s": [0.0] * 3})
    got = breakdown_frame("baseline", "r1", it)
    assert got.columns == ["run", "run_id", "stage", "category", "seconds_per_iter"]
    by = dict(zip(got["category"], got["seconds_per_iter"], strict=True))
    assert by == {"starvation": pytest.approx(0.2), "backpressure": 0.0,
                  "compute": pytest.approx(0.6), "sync": 0.0, "unaccounted": 0.0}
    assert set(got["run"]) == {"baseline"} and set(got["run_id"]) == {"r1"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.duckdb"
    for run_id, fwd, started in (("base", 0.06, 1000.0), ("cand", 0.10, 2000.0)):
        b = RunBuilder(run_id, started=started)
        loop(b, 40, [("next_batch", 0.02), ("forward", fwd)])
        b.write(path).close()
    return path


def test_the_comparison_page(db: Path, tmp_path: Path) -> None:
    with connect(db, read_only=True) as con:
        data = load_compare_data(con, "base", "cand")
        cand = data.breakdown.filter((pl.col("run") == "candidate")
                                     & (pl.col("category") == "compute"))
        assert cand["seconds_per_iter"].to_list() == pytest.approx([0.10])
        files = write_compare_report(con, "base", "cand", tmp_path / "cmp" / "index.html",
                                     image_formats=["svg"])
    page = files.html.read_text(encoding="utf-8")
    # 80 ms against 120 ms iterations: throughput ratio 0.667, 33% slower
    assert "0.67x of the baseline" in page and "33% slower" in page
    assert files.images and all(p.suffix == ".svg" and p.is_file() for p in files.images)
