"""``ingest.parse_sql``: every rejection reason, each from one bad line beside good
ones (loaded through ``ingest_run``: the statements this module builds), and its
small helpers."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from tlog.ingest import connect, ingest_run
from tlog.ingest.parse_sql import (
    MAX_DEPTH,
    REASON_CODES,
    nesting_depth,
    sql_ident,
    sql_str,
)

from tests.support.runs import iter_line, write_lines

#: One line per reason code, each breaking exactly that rule.
BAD = {
    "not_json": '{"iter": 1, "ts": 1001.0,',
    "not_object": "[1, 2, 3]",
    "unknown_version": '{"v": 9, "iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {}}',
    "unknown_type": '{"type": "epoch", "ts": 1001.0}',
    "missing_field": '{"iter": 1, "ts": 1001.0, "phases": {}}',
    "wrong_type": '{"iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {}, "stage": 7}',
    "bad_duration": '{"iter": 1, "ts": 1001.0, "dur": -1.0, "phases": {}}',
    "bad_value": '{"iter": 1, "ts": 1001000.5e6, "dur": 1.0, "phases": {}}',
    "bad_phase_value": '{"iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {"fwd": "fast"}}',
    "bad_phase_name": '{"iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {"": 0.5}}',
    "duplicate_key": '{"iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {"a": 0.1, "a": 0.2}}',
    "too_large": ('{"iter": 1, "ts": 1001.0, "dur": 1.0, "phases": {}, "x": '
                  + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}"),
}


@pytest.mark.parametrize("code", sorted(REASON_CODES))
def test_each_reason_from_its_line(tmp_path: Path, code: str) -> None:
    bad = BAD[code]
    run = write_lines(tmp_path / "r" / "rank0.jsonl",
                      [iter_line(0), bad, iter_line(2)]).parent
    with connect(tmp_path / "t.duckdb") as con:
        report = ingest_run(con, run)
        assert report.records_loaded["iter"] == 2
        assert report.rejected_by_reason == {code: 1}
        assert con.execute("SELECT line, code, raw FROM rejects").fetchall() == [(2, code, bad)]


def test_every_code_has_its_line_here() -> None:
    assert set(BAD) == set(REASON_CODES)
    assert all(REASON_CODES[c] and "\n" not in REASON_CODES[c] for c in REASON_CODES)


@pytest.mark.parametrize(("text", "depth"), [
    ("3", 0), ("{}", 1), ('{"a": [1, {"b": []}]}', 4), ('{"s": "[[[{{{"}', 1),
    ('{"s": "a\\"[["}', 1),
])
def test_nesting_depth_ignores_brackets_in_strings(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth
    if text.startswith("{"):
        assert json.loads(text) is not None


def test_sql_quoting() -> None:
    with duckdb.connect() as con:
        assert con.execute(f"SELECT {sql_str(chr(39) + 'x' + chr(39))} AS "
                           f"{sql_ident('we' + chr(34) + 'ird')}").fetchall() == [("'x'",)]
        assert con.execute(f"SELECT 1 AS {sql_ident('a b')}").description[0][0] == "a b"
