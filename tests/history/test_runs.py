"""`tlog runs`: oldest first, filtered by tags and start time, with steady
throughput and bottleneck (figures from tlog diagnose; see test_compare.py for
the runs' per-iteration times)."""

from __future__ import annotations

import json

import pytest
from tlog.analyze.history import list_runs, parse_since, parse_tag_filters
from tlog.ingest.db import connect
from tlog.ingest.errors import UsageError

from tests.support.cli import assert_one_line_error, invoke

RUNS = [
    {"run_id": "slow", "started": 2000.0, "tags": {"gpus": 8, "branch": "dev"},
     "mask_build": 0.022, "name": "mask in python"},
    {"run_id": "base", "started": 1000.0, "tags": {"gpus": 8, "branch": "main"}},
]


@pytest.fixture
def runs_db(pipeline_db, tmp_path):
    db = pipeline_db(RUNS)
    con = connect(db)
    con.execute("INSERT INTO runs (run_id, started) VALUES ('empty', 3000.0)")
    con.close()
    return db


def test_runs_oldest_first_with_throughput_and_bottleneck(runs_db) -> None:
    with connect(runs_db, read_only=True) as con:
        runs = list_runs(con)
    assert [r.run_id for r in runs] == ["base", "slow", "empty"]
    base, slow, empty = runs
    # base: 40 ms per drafter iteration, 2 ranks x 4096 tokens -> 204,800 tokens/s,
    # 25 it/s; compute is 36 of the drafter's 40 ms (hs_get 1 starvation,
    # grad_allreduce 3 sync), its largest phase backward (18 ms).
    assert base.throughput["tokens_per_s"] == pytest.approx(204800.0)
    assert base.throughput["iters_per_s"] == pytest.approx(25.0)
    assert base.iterations == {"total": 180, "steady": 180}
    assert base.bottleneck == {"stage": "drafter", "category": "compute", "phase": "backward",
                               "share": pytest.approx(0.9), "straggler": None,
                               "cause": None}
    # slow: 58 ms -> 8192 / 0.058 tokens/s; mask_build (22 ms) is now the largest phase.
    assert slow.throughput["tokens_per_s"] == pytest.approx(8192 / 0.058)
    assert slow.bottleneck["phase"] == "mask_build" and slow.name == "mask in python"
    assert slow.tags == {"gpus": 8, "branch": "dev"}
    assert empty.iterations == {"total": 0, "steady": 0} and empty.verdict == "no iterations"


def test_runs_filters(runs_db) -> None:
    with connect(runs_db, read_only=True) as con:
        assert [r.run_id for r in list_runs(con, tags={"branch": "main"})] == ["base"]
        assert [r.run_id for r in list_runs(con, tags={"gpus": "8", "branch": "dev"})] == ["slow"]
        assert [r.run_id for r in list_runs(con, tags={"gpus": "4"})] == []
        assert [r.run_id for r in list_runs(con, since=1500.0)] == ["slow", "empty"]


def test_filter_parsing() -> None:
    assert parse_tag_filters(["gpus=8", "note=a=b"]) == {"gpus": "8", "note": "a=b"}
    assert parse_since("1970-01-01T00:25:00+00:00") == 1500.0
    for bad in (["gpus"], ["=8"], ["a=1", "a=2"]):
        with pytest.raises(UsageError):
            parse_tag_filters(bad)
    with pytest.raises(UsageError, match=r"bad date 'last week': use an ISO date"):
        parse_since("last week")


def test_runs_cli_json(runs_db) -> None:
    result = invoke(["runs", "--json", "--db", str(runs_db), "--tag", "branch=main"])
    assert result.exit_code == 0, result.output
    (base,) = json.loads(result.stdout)
    assert base["run_id"] == "base" and base["started"] == 1000.0
    assert base["started_utc"] == "1970-01-01T00:16:40+00:00"
    assert base["throughput"]["tokens_per_s"] == pytest.approx(204800.0)
    assert base["bottleneck"]["stage"] == "drafter"
    assert base["verdict"].startswith("Bottleneck:")


def test_runs_cli_table(runs_db) -> None:
    result = invoke(["runs", "--db", str(runs_db),
                     "--since", "1970-01-01T00:20:00+00:00"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert [r.split("│")[1].strip() for r in rows] == ["slow", "empty"]
    assert "drafter: compute (mask_build)" in rows[0] and "141,241" in rows[0]


@pytest.mark.parametrize(("value", "text"), [
    (1048980.0, "1,048,980"),      # not 1.04898e+06
    (1764403200.25, "1,764,403,200.25"),   # a timestamp keeps its fraction
    (1795949693.507916, "1,795,949,693.50792"),   # 15 digits: no last-digit noise
    (100000.00000000032, "100,000"),
    (-1795949693.5, "-1,795,949,693.5"),
    (9999.9999, "9,999.9999"),       # rounds to 10000 at six digits: separators too
    (-0.0, "0"),
    (100000.4, "100,000.4"),
    (99999.99, "99,999.99"),
    (9999.5, "9999.5"),
    (16.0123456, "16.0123"),
    (16.0, "16"),
    (0.000125, "0.000125"),
    (-250000.0, "-250,000"),
    (9.223372036854776e27, "9.22337e+27"),  # no false digits
    (1e300, "1e+300"),
    (float("nan"), ""),
])
def test_table_cells_read_without_exponents(value, text) -> None:
    from tlog.render import _cell

    assert _cell(value) == text


def test_integer_sums_stay_exact_in_json_and_csv() -> None:
    """sum() of BIGINT is a HUGEINT/DECIMAL; 2**53 + 1 must not become a float."""
    from decimal import Decimal

    from tlog.render import _cell, plain

    assert plain(Decimal(9007199254740993)) == 9007199254740993
    assert _cell(Decimal(9007199254740993)) == "9007199254740993"
    assert plain(Decimal("1.5")) == 1.5


@pytest.mark.parametrize(("args", "code", "message"), [
    (["runs", "--tag", "gpus"], 2, "tlog: error: bad tag filter 'gpus': write key=value"),
    (["runs", "--since", "tuesday"], 2, "tlog: error: bad date 'tuesday'"),
])
def test_runs_cli_errors(runs_db, args, code, message) -> None:
    result = invoke([*args, "--db", str(runs_db)])
    assert assert_one_line_error(result, code).startswith(message), result.stderr


def test_runs_without_a_database_is_one_line(tmp_path) -> None:
    result = invoke(["runs", "--db", str(tmp_path / "none.duckdb")])
    assert assert_one_line_error(result, 1).startswith("tlog: error: no database at ")


def test_runs_names_the_straggler_the_verdict_leads_with(tmp_path) -> None:
    """The scenario straggler_compute: rank 2's backward takes 100 ms against its
    peers' 60 (expected.json works it out: gain 1.38x, critical). The verdict leads
    with the straggler, so `tlog runs` shows it, not only the peers' sync (its symptom)."""
    from pathlib import Path

    run = Path(__file__).parents[1] / "scenarios" / "straggler_compute" / "run"
    db = str(tmp_path / "t.duckdb")
    assert invoke(["ingest", str(run), "--db", db]).exit_code == 0
    result = invoke(["runs", "--db", db])
    assert result.exit_code == 0, result.output
    assert "train: rank 2 straggler (compute, backward)" in result.stdout
    data = json.loads(invoke(["runs", "--db", db, "--json"]).stdout)
    lead = data[0]["bottleneck"]["straggler"]
    assert (lead["rank"], lead["kind"], lead["phase"]) == (2, "compute", "backward")
    assert lead["speedup_if_fixed"] == pytest.approx(145 / 105)
    assert data[0]["bottleneck"]["category"] == "sync"    # the symptom stays in the JSON
