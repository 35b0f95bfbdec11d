"""Stored queries: each one's exact rows on the tiny database (conftest.py), its
header against its body, and parameter errors raised before DuckDB sees the SQL.

Every expected row below is derived by hand from the tables in conftest.py with
warmup_iters=1 (first iteration of each worker left out) and the r1 checkpoint
event at 1002.25..1002.5 s (it knocks out target-0 iter 3 and drafter-2 iter 2).
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from tlog.ingest.errors import QueryArgumentError, QueryError, RunNotFoundError
from tlog.queries import (
    QUERY_DIR,
    find_parameters,
    list_queries,
    load_query,
    parse_query,
    run_query,
)

STEADY = {"warmup_iters": 1}


def rows(frame) -> list[tuple]:
    return [tuple(r) for r in frame.iter_rows()]


def test_every_stored_query_is_listed() -> None:
    assert list_queries() == [
        "chronic_stragglers", "phase_breakdown", "queue_occupancy", "rank_skew",
        "regressions_vs_best", "runs_by_throughput", "stage_shares_by_month",
        "stage_utilization", "throughput_over_time", "throughput_regressions",
    ]


@pytest.mark.parametrize("name", list_queries())
def test_header_parameters_match_the_body(name: str) -> None:
    path = QUERY_DIR / f"{name}.sql"
    text = path.read_text(encoding="utf-8")
    header = [line for line in text.splitlines() if line.startswith("--")]
    declared = sorted(re.findall(r"^--\s+\$(\w+)\s+[A-Z]+", "\n".join(header), re.MULTILINE))
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    assert declared == sorted(find_parameters(body)), name
    query = load_query(name)
    assert sorted(p.name for p in query.parameters) == declared
    assert query.summary and query.summary.endswith(".")


@pytest.mark.parametrize("name", list_queries())
def test_header_columns_match_the_result(name: str, ro_con) -> None:
    query = load_query(name)
    given = {"run_id": "r1", "warmup_iters": 1, "bucket_s": 1.0, "tag_key": "config"}
    rel = ro_con.sql(query.sql, params=query.bind({k: v for k, v in given.items()
                                                   if k in query.used}))
    assert rel.columns == [c.name for c in query.columns]
    assert [str(t) for t in rel.types] == [c.type for c in query.columns]


def test_steady_iterations_come_from_one_place() -> None:
    """Steady iterations are tlog diagnose's (the stored ``attribution.steady``
    flag); an explicit $warmup_iters count is applied by one expression, the same
    in every steady query and in the _run_throughput macro; no stored query
    repeats the window or the event-overlap test."""
    from tlog.ingest import db as tlog_db

    steady = ("CASE WHEN $warmup_iters IS NULL THEN steady "
              "ELSE pos > $warmup_iters AND NOT in_event AND NOT attempt END")
    macro = " ".join(tlog_db._VIEWS.split())
    assert steady.replace("$warmup_iters", "warmup_iters") in macro
    users = []
    for name in list_queries():
        text = (QUERY_DIR / f"{name}.sql").read_text(encoding="utf-8")
        flat = " ".join(text.split())
        assert "row_number() OVER (PARTITION BY" not in text, name
        assert "FROM events" not in text and "iteration_positions" not in text, name
        if steady in flat:
            users.append(name)
        elif "$warmup_iters" in text:
            assert "_run_throughput($warmup_iters)" in text, name
    assert users == ["phase_breakdown", "rank_skew", "stage_utilization"]


def test_stage_utilization(ro_con) -> None:
    # drafter: d1 iters 1-3 (3 x 0.5 s, 1500 tokens), d2 iter 1 (1.0 s, 500 tokens).
    #   iters/s = mean(3/1.5, 1/1.0) = 1.5; tokens/s = 1000 + 500 = 1500; wall 2.5 s.
    #   starvation hs_get 0.125+0.125+0+0.125 = 0.375 -> 0.15; compute forward
    #   0.75+0.5 -> 0.5; sync grad_allreduce 0.0625+0.125+0.25+0.25 = 0.6875 -> 0.275;
    #   unaccounted 0.0625 (d1 iter1) + 0.125 (d2 iter1) -> 0.075.
    # target: iters 1-2 (2 x 0.5 s, 2000 tokens): batch_get 0.25 -> 0.25, hs_put
    #   0.1875, target_forward 0.5 -> 0.5, unaccounted 0.0625.
    frame = run_query(ro_con, "stage_utilization", {"run_id": "r1", **STEADY})
    assert rows(frame) == [
        ("drafter", 2, 4, 2.5, 1.5, 1500.0, 0.15, 0.0, 0.5, 0.275, 0.075),
        ("target", 1, 2, 1.0, 2.0, 2000.0, 0.25, 0.1875, 0.5, 0.0, 0.0625),
    ]


def test_stage_utilization_default_warmup_leaves_nothing_in_a_tiny_run(ro_con) -> None:
    # A warm-up of 10 iterations per worker is longer than every worker here.
    assert run_query(ro_con, "stage_utilization", {"run_id": "r1", "warmup_iters": 10}).height == 0


def test_phase_breakdown(ro_con) -> None:
    # drafter: 4 steady iterations, 2.5 s. forward 0.25*3 + 0.5 = 1.25 (0.3125/iter,
    # share 0.5); its child mask_build 0.0625*3 + 0.25 = 0.4375; grad_allreduce
    # 0.6875; hs_get 0.375. target: 2 iterations, 1.0 s; target_forward gpu
    # 0.375 + 0.375 over 2 iterations = 0.375/iter.
    frame = run_query(ro_con, "phase_breakdown", {"run_id": "r1", **STEADY})
    assert rows(frame) == [
        ("drafter", "forward", None, "compute", 4, 0.3125, None, 1.25, 0.5),
        ("drafter", "forward/mask_build", "forward", "compute", 4, 0.109375, None, 0.4375, 0.175),
        ("drafter", "grad_allreduce", None, "sync", 4, 0.171875, None, 0.6875, 0.275),
        ("drafter", "hs_get", None, "starvation", 4, 0.09375, None, 0.375, 0.15),
        ("target", "target_forward", None, "compute", 2, 0.25, 0.375, 0.5, 0.5),
        ("target", "batch_get", None, "starvation", 2, 0.125, None, 0.25, 0.25),
        ("target", "hs_put", None, "backpressure", 2, 0.09375, None, 0.1875, 0.1875),
    ]


def test_rank_skew(ro_con) -> None:
    # Own work = compute + time in no phase (as diagnose's stragglers judge it).
    # drafter-2 iter 1: forward 0.5 + unaccounted 1.0 - (0.125 + 0.5 + 0.25) = 0.625.
    # drafter-1 iters 1-3: 0.25 + 0.0625, 0.25 + 0, 0.25 + 0 -> median 0.25.
    # Skews 0.625 / 0.25 = 2.5 and 0.25 / 0.625 = 0.4.
    # drafter-1 sync per iteration 0.0625, 0.125, 0.25 -> median 0.125.
    # target-0 iters 1-2: 0.25 + 0.0625 and 0.25 + 0 -> median 0.28125.
    frame = run_query(ro_con, "rank_skew", {"run_id": "r1", **STEADY})
    assert rows(frame) == [
        ("drafter", 2, "drafter-2", 1, 1.0, 0.625, 0.125, 0.25, 0.25, 2.5),
        ("drafter", 1, "drafter-1", 3, 0.5, 0.25, 0.125, 0.125, 0.625, 0.4),
        ("target", 0, "target-0", 2, 0.5, 0.28125, 0.125, 0.0, None, None),
    ]


def test_queue_occupancy(ro_con) -> None:
    # hs_queue depths 0, 0, 2, 4 of 4; batch_queue 1, 3 without capacity; r2's queue excluded.
    frame = run_query(ro_con, "queue_occupancy", {"run_id": "r1"})
    assert rows(frame) == [
        ("batch_queue", 2, None, 2.0, 3, 0.0, None),
        ("hs_queue", 4, 4, 1.5, 4, 0.5, 0.25),
    ]


def test_throughput_over_time(ro_con) -> None:
    # 1 s buckets from 1000.0. drafter bucket 1: d1 iters 1, 2 (1.0 s, 1000 tokens)
    # and d2 iter 1 (1.0 s, 500 tokens): 3 iterations, mean 2/3 s, it/s mean(2, 1),
    # tokens/s 1000 + 500. Bucket 2: d1 iter 3 (0.5 s), d2 iter 2 (1.0 s).
    frame = run_query(ro_con, "throughput_over_time", {"run_id": "r1", "bucket_s": "1"})
    assert rows(frame) == [
        ("drafter", 0, 0.0, 2, 1.0, 1.0, 1000.0),
        ("drafter", 1, 1.0, 3, 2.0 / 3.0, 1.5, 1500.0),
        ("drafter", 2, 2.0, 2, 0.75, 1.5, 1500.0),
        ("target", 0, 0.0, 1, 1.0, 1.0, 1000.0),
        ("target", 1, 1.0, 2, 0.5, 2.0, 2000.0),
        ("target", 2, 2.0, 1, 0.5, 2.0, 2000.0),
    ]


def test_throughput_over_time_refuses_an_empty_bucket(ro_con) -> None:
    with pytest.raises(QueryArgumentError, match=r"bucket_s must be at least 0.001"):
        run_query(ro_con, "throughput_over_time", {"run_id": "r1", "bucket_s": "0"})


def test_runs_by_throughput(ro_con) -> None:
    # r2 4000 tokens/s (0.25 s, 1000 tokens); r4 2000; r1's output stage is the
    # drafter (1500 tokens/s, mean of 2 and 1 it/s): the target comes first in
    # pipeline order because it has a backpressure phase (hs_put), although both
    # start at 1001.0 and 'drafter' < 'target' by name. r3 has no tokens: last.
    frame = run_query(ro_con, "runs_by_throughput", STEADY)
    assert rows(frame) == [
        ("r2", "fast", datetime(1970, 1, 1, 0, 33, 20), '{"config": "a", "gpus": "4"}',
         "main", 2, 4.0, 4000.0),
        ("r4", None, datetime(1970, 1, 1, 0, 50), '{"config": "a"}', "main", 2, 2.0, 2000.0),
        ("r1", "first", datetime(1970, 1, 1, 0, 16, 40), '{"config": "a", "gpus": "2"}',
         "drafter", 4, 1.5, 1500.0),
        ("r3", None, datetime(1970, 1, 1, 0, 25), '{"config": "b"}', "main", 2, 2.0, None),
    ]


def test_runs_by_throughput_tag_filter_and_limit(ro_con) -> None:
    frame = run_query(ro_con, "runs_by_throughput",
                      {**STEADY, "tag_key": "config", "tag_value": "a", "limit": "2"})
    assert frame["run_id"].to_list() == ["r2", "r4"]
    frame = run_query(ro_con, "runs_by_throughput", {**STEADY, "tag_key": "gpus", "tag_value": "2"})
    assert frame["run_id"].to_list() == ["r1"]


def test_runs_by_throughput_needs_both_tag_parameters(ro_con) -> None:
    with pytest.raises(QueryError, match=r"give both \$tag_key and \$tag_value"):
        run_query(ro_con, "runs_by_throughput", {"tag_key": "config"})


def test_regressions_vs_best(ro_con) -> None:
    # In start order: r1 1500 tokens/s (first); r3 counts iterations only (its own
    # series); r2 4000 = 2.667x r1, a new best; r4 2000 = 0.5x r2, a regression.
    frame = run_query(ro_con, "regressions_vs_best", STEADY)
    got = rows(frame)
    assert [r[0] for r in got] == ["r1", "r3", "r2", "r4"]
    assert [r[2:] for r in got] == [
        ("tokens/s", 1500.0, None, None, None, True),
        ("iterations/s", 2.0, None, None, None, True),
        ("tokens/s", 4000.0, "r1", 1500.0, 4000.0 / 1500.0, True),
        ("tokens/s", 2000.0, "r2", 4000.0, 0.5, False),
    ]


def test_regressions_vs_best_within_one_configuration(ro_con) -> None:
    frame = run_query(ro_con, "regressions_vs_best",
                      {**STEADY, "tag_key": "config", "tag_value": "b"})
    assert rows(frame)[0][0] == "r3" and frame.height == 1


# --- parameters: checked before DuckDB sees the query ------------------------

class _NoDuckDB:
    """A connection stand-in that fails the test if the query reaches it."""

    def sql(self, *args, **kwargs):  # pragma: no cover - must not be called
        raise AssertionError("the query reached DuckDB")


def test_missing_parameter_is_named_before_duckdb() -> None:
    with pytest.raises(QueryError, match=r"needs parameter \$run_id .*-p run_id=VALUE"):
        run_query(_NoDuckDB(), "phase_breakdown", {})


def test_unknown_parameter_is_named_before_duckdb() -> None:
    with pytest.raises(QueryError, match=r"has no parameter \$runid; it takes: \$run_id, "
                                         r"\$warmup_iters"):
        run_query(_NoDuckDB(), "phase_breakdown", {"runid": "r1"})


@pytest.mark.parametrize(("params", "message"), [
    ({"run_id": "r1", "warmup_iters": "ten"}, r"\$warmup_iters must be an INTEGER, got 'ten'"),
    ({"run_id": "r1", "bucket_s": "nan"}, r"\$bucket_s must be a DOUBLE, got 'nan'"),
])
def test_bad_values_are_refused_before_duckdb(params, message) -> None:
    name = "throughput_over_time" if "bucket_s" in params else "phase_breakdown"
    with pytest.raises(QueryError, match=message):
        run_query(_NoDuckDB(), name, params)


def test_unknown_query_lists_the_known_ones() -> None:
    with pytest.raises(QueryError, match=r"unknown query 'nope'; known queries: chronic_stragglers, phase_breakdown, "):
        load_query("nope")
    with pytest.raises(QueryError, match="unknown query"):
        load_query("../ingest/db")


def test_values_are_bound_never_formatted(ro_con) -> None:
    # A quote-laden value is just a tag value that no run has.
    frame = run_query(ro_con, "runs_by_throughput",
                      {"tag_key": "config", "tag_value": "a' OR '1'='1"})
    assert frame.height == 0


def test_an_unknown_run_is_a_clear_error(ro_con) -> None:
    with pytest.raises(RunNotFoundError, match=r"^no run 'r9' in the database: 'tlog runs' lists"):
        run_query(ro_con, "phase_breakdown", {"run_id": "r9"})


def test_header_errors_are_reported_with_file_and_line() -> None:
    text = "-- Something.\n--\n-- Parameters:\n--   $a: no type\n--\n-- Columns:\n--   x INTEGER: x.\nSELECT $a AS x\n"
    with pytest.raises(QueryError, match=r"q:4: parameter line must read"):
        parse_query("q", text)
    undeclared = "-- Something.\n--\n-- Columns:\n--   x INTEGER: x.\nSELECT $a AS x -- $b\n"
    with pytest.raises(QueryError, match=r"header and body disagree: uses undeclared \$a$"):
        parse_query("q", undeclared)
    unused = ("-- Something.\n-- Parameters:\n--   $a INTEGER = 1: a.\n--   $b INTEGER = 2: b.\n"
              "-- Columns:\n--   x INTEGER: x.\nSELECT $a AS x, '$b' AS y\n")
    with pytest.raises(QueryError, match=r"declares unused \$b$"):
        parse_query("q", unused)


def test_parameter_defaults_and_types_parse() -> None:
    text = ("-- Typed.\n-- Parameters:\n--   $s VARCHAR = 'it''s': s.\n--   $n INTEGER = NULL: n.\n"
            "--   $b BOOLEAN = true: b.\n--   $d DATE = '2026-11-29': d.\n--   $r DOUBLE: r.\n"
            "-- Columns:\n--   x VARCHAR: x.\nSELECT $s, $n, $b, $d, $r AS x\n")
    query = parse_query("typed", text)
    from datetime import date

    assert query.bind({"r": "2.5", "b": "no"}) == {"s": "it's", "n": None, "b": False,
                                                  "d": date(2026, 11, 29), "r": 2.5}
    assert query.parameter("r").required and not query.parameter("s").required


@pytest.mark.parametrize("name", list_queries())
def test_docs_describe_every_query_its_parameters_and_columns(name: str) -> None:
    docs = (QUERY_DIR.parent / "docs" / "QUERIES.md").read_text(encoding="utf-8")
    heading = f"### `{name}`"
    assert heading in docs, f"docs/QUERIES.md has no section {heading}"
    section = docs.split(heading, 1)[1].split("\n### ", 1)[0]
    query = load_query(name)
    for p in query.parameters:
        assert f"`${p.name}`" in section, f"{name}: parameter ${p.name} not documented"
    for c in query.columns:
        assert f"`{c.name}`" in section, f"{name}: column {c.name} not documented"
