"""``analyze.history``: the runs of a database, filtered by tag and start, each
with its steady figures (hand-made runs: 1/dur iterations per second)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tlog.analyze.history import (
    RunSummary,
    bottleneck_label,
    fill_from_diagnosis,
    list_runs,
    parse_since,
    parse_tag_filters,
    run_rows,
)
from tlog.ingest.db import connect
from tlog.ingest.errors import UsageError

from tests.support.runbuilder import RunBuilder, loop


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory):
    """Three runs: ``old`` (10 it/s, gpus 8), ``new`` (20 it/s, gpus 8, 512 tokens an
    iteration), ``other`` (4 it/s, gpus 4, no start: its first iteration's)."""
    path = tmp_path_factory.mktemp("db") / "h.duckdb"
    for run_id, started, tags, dur, tokens in (
            ("old", 1000.0, {"gpus": 8, "branch": "main"}, 0.1, None),
            ("new", 2000.0, {"gpus": 8, "branch": "dev"}, 0.05, 512),
            ("other", None, {"gpus": 4}, 0.25, None)):
        b = RunBuilder(run_id, started=started, tags=tags)
        loop(b, 12, [("forward", dur)], t0=500.0 if started is None else started,
             tokens=tokens)
        b.write(path).close()
    c = connect(path)
    yield c
    c.close()


def test_run_rows_oldest_first_filtered_by_tag_text_and_start(con) -> None:
    # "other" has no start of its own: its first iteration's ts (500) is not used by
    # the runs row, which has started NULL: it sorts last
    assert [r.run_id for r in run_rows(con)] == ["old", "new", "other"]
    assert [r.run_id for r in run_rows(con, tags={"gpus": "8"})] == ["old", "new"]
    assert [r.run_id for r in run_rows(con, tags={"gpus": "8", "branch": "dev"})] == ["new"]
    assert [r.run_id for r in run_rows(con, since=1500.0)] == ["new"]
    assert [r.run_id for r in run_rows(con, since=1000.0, before=2000.0)] == ["old"]
    old = run_rows(con)[0]
    assert (old.started, old.tags, old.source) == (1000.0, {"gpus": 8, "branch": "main"},
                                                   "jsonl")


def test_list_runs_gives_each_run_its_steady_throughput(con) -> None:
    runs = {r.run_id: r for r in list_runs(con)}
    assert runs["old"].throughput["iters_per_s"] == pytest.approx(10.0)
    assert runs["new"].throughput["iters_per_s"] == pytest.approx(20.0)
    assert runs["new"].throughput["tokens_per_s"] == pytest.approx(20.0 * 512)
    assert runs["old"].throughput["tokens_per_s"] is None
    assert runs["other"].throughput["iters_per_s"] == pytest.approx(4.0)
    assert runs["old"].iterations["total"] == 12
    assert runs["old"].bottleneck["stage"] == "main"
    assert runs["old"].verdict.startswith("Bottleneck:")
    # the best run by rank_key: tokens/s first
    assert max(runs.values(), key=lambda r: r.rank_key).run_id == "new"


def test_rank_key_prefers_tokens_then_samples_then_iterations() -> None:
    def run(**tp: float) -> RunSummary:
        r = RunSummary("r", None, None, None, {})
        r.throughput.update(tp)
        return r

    fast_iters = run(iters_per_s=100.0)
    some_samples = run(iters_per_s=1.0, samples_per_s=5.0)
    some_tokens = run(iters_per_s=1.0, tokens_per_s=10.0)
    ranked = sorted([fast_iters, some_tokens, some_samples], key=lambda r: r.rank_key)
    assert ranked == [fast_iters, some_samples, some_tokens]


def test_to_dict_adds_the_start_in_utc() -> None:
    r = RunSummary("r", "n", "jsonl", 0.0, {"a": 1})
    d = r.to_dict()
    assert d["started_utc"] == datetime(1970, 1, 1, tzinfo=UTC).isoformat()
    assert (d["run_id"], d["name"], d["tags"], d["bottleneck"]) == ("r", "n", {"a": 1}, None)
    assert RunSummary("r", None, None, None, {}).to_dict()["started_utc"] is None


def test_fill_from_a_diagnosis_dict() -> None:
    d = {"iterations": {"total": 40, "steady": 36, "excluded": {}},
         "throughput": {"iters_per_s": 9.5, "tokens_per_s": None, "samples_per_s": 3.0,
                        "other": 1.0},
         "bottleneck": {"stage": "s", "category": "compute", "phase": "fwd", "share": 0.6,
                        "straggler": None, "cause": None, "extra": 1},
         "verdict": "Bottleneck: s", "confidence": "high"}
    r = fill_from_diagnosis(RunSummary("r", None, None, None, {}), d)
    assert r.iterations == {"total": 40, "steady": 36}
    assert r.throughput == {"iters_per_s": 9.5, "tokens_per_s": None, "samples_per_s": 3.0}
    assert r.bottleneck == {"stage": "s", "category": "compute", "phase": "fwd", "share": 0.6,
                            "straggler": None, "cause": None}
    assert (r.verdict, r.confidence) == ("Bottleneck: s", "high")


@pytest.mark.parametrize(("b", "label"), [
    (None, ""),
    ({"stage": "main", "category": "starvation", "phase": "load"}, "main: starvation (load)"),
    ({"stage": "main", "category": "compute", "phase": None}, "main: compute"),
    ({"stage": "main", "category": "compute", "phase": "forward", "cause": "cpu_contention"},
     "main: lacks CPU (compute, forward)"),
    ({"stage": "main", "category": "sync", "phase": "x", "cause": "new_cause"},
     "main: new_cause (sync, x)"),
    ({"stage": "train", "category": "sync", "phase": "allreduce",
      "straggler": {"rank": 2, "kind": "compute", "phase": "backward"}},
     "train: rank 2 straggler (compute, backward)"),
    ({"stage": "train", "straggler": {"rank": 1, "kind": "input"}},
     "train: rank 1 straggler (input)"),
])
def test_bottleneck_label(b, label: str) -> None:
    assert bottleneck_label(b) == label


def test_tag_filters_and_dates() -> None:
    assert parse_tag_filters(["gpus=8", " branch =main", "empty="]) == {
        "gpus": "8", "branch": "main", "empty": ""}
    assert parse_tag_filters(None) == {}
    with pytest.raises(UsageError, match="bad tag filter 'gpus': write key=value"):
        parse_tag_filters(["gpus"])
    with pytest.raises(UsageError, match="bad tag '=8'"):
        parse_tag_filters(["=8"], what="tag")
    with pytest.raises(UsageError, match="tag 'a' given twice"):
        parse_tag_filters(["a=1", "a=2"])
    assert parse_since("1970-01-02T00:00+00:00") == 86400.0
    assert parse_since(" 2026-11-29T08:00+01:00 ") == datetime(
        2026, 11, 29, 7, 0, tzinfo=UTC).timestamp()
    with pytest.raises(UsageError, match="bad date 'tuesday'"):
        parse_since("tuesday")
