"""Reader cases: hand-written run folders under tests/data/ingest_*/ with the
expected report and table rows beside them (``expected.json``, checked by hand
against each folder's README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ingest_helpers import DATA, snapshot
from tlog.ingest import connect, ingest_run

CASES = sorted(p.name for p in DATA.glob("ingest_*") if (p / "expected.json").exists())
REPORT_KEYS = ("run_id", "files", "records_loaded", "records_rejected", "rejected_by_reason",
               "duplicates", "partial_lines", "warnings")


def _load(case: str, tmp_path: Path, **kw) -> tuple[dict, dict]:
    con = connect(tmp_path / f"{case}.duckdb")
    try:
        report = ingest_run(con, DATA / case, **kw).to_dict()
        got = {"report": {k: report[k] for k in REPORT_KEYS}, **snapshot(con, report["run_id"])}
        return got, report
    finally:
        con.close()


def test_cases_exist():
    assert {"ingest_every_kind", "ingest_meta_defaults", "ingest_bad_lines",
            "ingest_duplicates", "ingest_truncated_tail"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["default", "check_all", "small_batches"])
def test_case(case: str, mode: str, tmp_path: Path):
    """The same rows whether lines take the template path, every line goes
    through the exact checks, or the run is cut into many tiny batches."""
    kw = {"check_all": mode == "check_all"}
    if mode == "small_batches":
        kw["chunk_bytes"] = 64
    got, _ = _load(case, tmp_path, **kw)
    expected = json.loads((DATA / case / "expected.json").read_text())
    for table in expected:
        assert got[table] == expected[table], f"{case}: {table} differs"


@pytest.mark.parametrize("case", CASES)
def test_reingest_adds_nothing(case: str, tmp_path: Path):
    con = connect(tmp_path / "again.duckdb")
    try:
        first = ingest_run(con, DATA / case)
        before = snapshot(con, first.run_id)
        again = ingest_run(con, DATA / case)
        assert again.records_loaded == {"iter": 0, "queue": 0, "event": 0, "meta": 0}
        assert again.records_rejected == 0 and again.duplicates == 0
        assert again.files_unchanged == again.files == first.files
        assert snapshot(con, first.run_id) == before
    finally:
        con.close()


def test_every_reason_code_is_exercised():
    """Each reason code of ingest.parse_sql.REASON_CODES appears in the bad-lines case."""
    from tlog.ingest.parse_sql import REASON_CODES

    expected = json.loads((DATA / "ingest_bad_lines" / "expected.json").read_text())
    assert set(expected["report"]["rejected_by_reason"]) == set(REASON_CODES)
