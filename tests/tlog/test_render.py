"""``tlog.render``: rows turned into a table, CSV or JSON on stdout (polars frames
made by hand; stdout captured)."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import polars as pl
import pytest

from tlog.render import (
    TABLE_MAX_ROWS,
    OutputFormat,
    frame_rows,
    plain,
    render_frame,
    render_table,
)


@pytest.mark.parametrize(("value", "out"), [
    (1.5, 1.5), (math.nan, None), (math.inf, None),
    (datetime(2025, 11, 29, 8, 0, tzinfo=UTC), "2025-11-29T08:00:00+00:00"),
    (date(2025, 11, 29), "2025-11-29"), (timedelta(minutes=1, seconds=1.5), 61.5),
    (Decimal(9007199254740993), 9007199254740993), (Decimal("1.5"), 1.5),
    (b"\x01\xff", "01ff"), ({1: [math.nan, 2]}, {"1": [None, 2]}), ("x", "x"),
])
def test_plain_cells(value, out) -> None:
    assert plain(value) == out


FRAME = pl.DataFrame({"run_id": ["a", "b"], "tokens_per_s": [1048980.0, 9.41234],
                      "n": [3, None], "tags": [{"k": "v"}, None]})


def test_json_rows(capsys) -> None:
    render_frame(FRAME, OutputFormat.json)
    assert json.loads(capsys.readouterr().out) == frame_rows(FRAME) == [
        {"run_id": "a", "tokens_per_s": 1048980.0, "n": 3, "tags": {"k": "v"}},
        {"run_id": "b", "tokens_per_s": 9.41234, "n": None, "tags": None}]


def test_csv_rows(capsys) -> None:
    render_frame(FRAME, OutputFormat.csv)
    assert capsys.readouterr().out == ('run_id,tokens_per_s,n,tags\n'
                                       'a,1048980.0,3,"{""k"":""v""}"\n'
                                       'b,9.41234,,\n')


def test_table_cells(capsys) -> None:
    render_frame(FRAME, OutputFormat.table, title="runs")
    out = capsys.readouterr().out
    # thousands separators from 1e4 on, six significant digits below, NULL blank
    assert "1,048,980" in out and "9.41234" in out and "runs" in out
    assert '{"k":"v"}' in out


def test_a_long_table_is_cut_and_says_so(capsys) -> None:
    n = TABLE_MAX_ROWS + 5
    render_table([("i", True)], [(k,) for k in range(TABLE_MAX_ROWS)], n)
    out = capsys.readouterr().out
    assert f"(5 more rows not shown of {n:,}: use --format csv or json" in " ".join(out.split())
    render_table([("i", True)], [], 0)
    assert "(no rows)" in capsys.readouterr().out


def test_names_from_logs_print_escaped(capsys) -> None:
    render_table([("phase\x1b[2J", False)], [("a\x1b]52;c;x\x07",)], 1)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b" in out
