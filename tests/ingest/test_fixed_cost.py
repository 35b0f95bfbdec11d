"""The per-batch fixed cost: the lines of a batch that pass a
template are parsed by the short template-only statement
(``parse_sql.fast_only_sql``), the full statement runs only over the lines
that pass none, statements with nothing to read are skipped, and the temp
macros are made once per connection. None of it may change what is loaded:
each case checks the rows against the lines written."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from tlog.ingest import connect, ingest_run
from tlog.ingest.batch import _REST_LINES, BatchLoader

PHASES = {"hs_get": 0.002, "forward": 0.005, "loss_item": 0.001}


def _iter(i: int) -> str:
    return json.dumps({"type": "iter", "v": 1, "iter": i, "ts": 1764403200.0 + i,
                       "dur": 0.01 + i / 1000, "phases": PHASES, "tokens": 100 + i},
                      separators=(",", ":"))


def _append(path: Path, lines: list[str]) -> None:
    with path.open("a") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _iters(db: duckdb.DuckDBPyConnection) -> list[tuple]:
    return db.execute("SELECT iter, dur, tokens, line FROM iterations ORDER BY iter").fetchall()


def _spy_parse(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """``(which lines, how many)`` for each run of the full stage A:
    ``"rest"`` (the lines no template took) or ``"all"``."""
    used: list[tuple[str, int]] = []
    full_pass = BatchLoader._full_pass

    def spy(self: BatchLoader, templates, source: str, target: str) -> None:
        full_pass(self, templates, source, target)
        n = self.con.execute(f"SELECT count(*) FROM {target}").fetchall()[0][0]
        used.append(("rest" if source == _REST_LINES else "all", n))

    monkeypatch.setattr(BatchLoader, "_full_pass", spy)
    return used


def test_polls_take_the_template_path_and_load_exactly_the_new_lines(
        tmp_path: Path, db: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch) -> None:
    used = _spy_parse(monkeypatch)
    log = tmp_path / "run" / "rank0.jsonl"
    log.parent.mkdir()
    _append(log, [json.dumps({"type": "meta", "v": 1, "rank": 0, "stage": "s"})]
            + [_iter(i) for i in range(5)])
    first = ingest_run(db, log.parent)
    _append(log, [_iter(i) for i in range(5, 8)])
    poll = ingest_run(db, log.parent)
    assert used == []          # every line of both batches passed a template
    assert first.records_loaded == {"iter": 5, "queue": 0, "event": 0, "meta": 1}
    assert poll.records_loaded == {"iter": 3, "queue": 0, "event": 0, "meta": 0}
    # iter i is on line i + 2 (the meta line is line 1), dur 0.01 + i/1000, tokens 100 + i
    assert _iters(db) == [(i, pytest.approx(0.01 + i / 1000), 100 + i, i + 2) for i in range(8)]
    assert db.execute("SELECT worker FROM workers").fetchall() == [("s-0",)]


def test_only_the_lines_no_template_takes_go_through_the_full_parse(
        tmp_path: Path, db: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch) -> None:
    """Events never have a template; a negative duration fails its template's
    checks: just these two lines go through the full statement, which loads
    the event and rejects the bad line with its reason."""
    used = _spy_parse(monkeypatch)
    log = tmp_path / "run" / "rank0.jsonl"
    log.parent.mkdir()
    _append(log, [_iter(i) for i in range(4)])
    ingest_run(db, log.parent)
    bad = json.loads(_iter(5))
    bad["dur"] = -1.0
    _append(log, [_iter(4), json.dumps({"type": "event", "name": "checkpoint",
                                        "ts": 1764403300.0, "dur": 4.5}),
                  json.dumps(bad, separators=(",", ":"))])
    poll = ingest_run(db, log.parent)
    assert used == [("rest", 2)]
    assert poll.records_loaded == {"iter": 1, "queue": 0, "event": 1, "meta": 0}
    assert poll.errors == [{"file": "rank0.jsonl", "line": 7,
                            "reason": "negative duration for 'dur': -1.0"}]
    assert db.execute("SELECT name, ts, dur, line FROM events").fetchall() == [
        ("checkpoint", 1764403300.0, 4.5, 6)]
    assert [r[0] for r in _iters(db)] == [0, 1, 2, 3, 4]


def test_a_large_batch_parses_its_odd_lines_once(
        tmp_path: Path, db: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 template lines with an event in the middle: the full statement
    reads the one event line, not the batch again; every line is loaded once."""
    used = _spy_parse(monkeypatch)
    log = tmp_path / "run" / "rank0.jsonl"
    log.parent.mkdir()
    n = 20_000
    event = json.dumps({"type": "event", "name": "eval", "ts": 1764403250.0, "dur": 2.0})
    _append(log, [_iter(i) for i in range(n // 2)] + [event]
            + [_iter(i) for i in range(n // 2, n)])
    report = ingest_run(db, log.parent)
    assert used == [("rest", 1)]
    assert report.records_loaded == {"iter": n, "queue": 0, "event": 1, "meta": 0}
    assert db.execute("SELECT count(DISTINCT iter), min(iter), max(iter), max(line) "
                      "FROM iterations").fetchall() == [(n, 0, n - 1, n + 1)]
    assert db.execute("SELECT name, line FROM events").fetchall() == [("eval", n // 2 + 1)]


def test_check_all_parses_every_line_fully(tmp_path: Path, db: duckdb.DuckDBPyConnection,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    used = _spy_parse(monkeypatch)
    log = tmp_path / "run" / "rank0.jsonl"
    log.parent.mkdir()
    _append(log, [_iter(i) for i in range(3)])
    report = ingest_run(db, log.parent, check_all=True)
    assert used == [("all", 3)]
    assert _iters(db) == [(i, pytest.approx(0.01 + i / 1000), 100 + i, i + 1) for i in range(3)]
    assert report.records_loaded["iter"] == 3


def test_macros_lost_behind_the_loaders_back_are_made_again(
        tmp_path: Path, db: duckdb.DuckDBPyConnection) -> None:
    """The temp macros are made once per connection, by the first full parse; if
    they are gone (a rolled-back transaction of the caller's), the full parse
    makes them again."""
    log = tmp_path / "run" / "rank0.jsonl"
    log.parent.mkdir()
    _append(log, [_iter(0), "not json"])    # a flagged line: the full parse, which makes them
    ingest_run(db, log.parent)
    db.execute("DROP MACRO _tlog_colons")
    _append(log, [_iter(1), "not json"])
    report = ingest_run(db, log.parent)
    assert report.records_loaded["iter"] == 1
    assert report.errors == [{"file": "rank0.jsonl", "line": 4, "reason": "not JSON"}]
    assert [r[0] for r in _iters(db)] == [0, 1]


def test_template_lines_alone_make_no_macros(tmp_path: Path,
                                            db: duckdb.DuckDBPyConnection) -> None:
    """A batch that every template takes (a small run, a --follow poll) runs
    no statement that uses the temp macros, so it does not make them."""
    def macros() -> int:
        return db.execute("SELECT count(*) FROM duckdb_functions() "
                          "WHERE function_name LIKE '\\_tlog\\_%' ESCAPE '\\'").fetchall()[0][0]

    log = tmp_path / "run" / "rank0.jsonl"
    log.parent.mkdir()
    _append(log, [_iter(i) for i in range(20)])
    report = ingest_run(db, log.parent)
    assert report.records_loaded["iter"] == 20
    assert macros() == 0
    _append(log, ["not json"])
    ingest_run(db, log.parent)
    assert macros() > 0


def test_batches_switching_between_the_template_view_and_the_full_table(
        tmp_path: Path, db: duckdb.DuckDBPyConnection) -> None:
    """One ingest whose batches alternate: template lines only (``_tlog_p`` is
    the template pass's view, the inserts read segment and path by ``fid``),
    event lines only (no template: the full pass's table), a mid-file meta
    line (segments by line range: the joined statements), and a failed
    ingest's left-over view on the same connection. Every line is counted
    against what was written."""
    run = tmp_path / "run"
    run.mkdir()
    ev = [json.dumps({"type": "event", "v": 1, "name": f"ckpt{i}", "ts": 1764403300.0 + i,
                      "dur": 0.5}) for i in range(40)]
    a = [json.dumps({"type": "meta", "v": 1, "rank": 1, "stage": "s"})] + [_iter(i)
                                                                          for i in range(60)]
    b = ev + [json.dumps({"type": "meta", "v": 1, "rank": 2, "stage": "t"})] + [
        _iter(i) for i in range(30)]
    _append(run / "a.jsonl", a)
    _append(run / "b.jsonl", b)
    # a left-over view and table from an ingest that failed before its load
    db.execute("CREATE TEMP TABLE _tlog_pf AS SELECT 1 AS x")
    db.execute("CREATE TEMP VIEW _tlog_p AS SELECT * FROM _tlog_pf")
    ingest_run(db, run, chunk_bytes=2_000)
    rows = db.execute("SELECT file, rank, stage, worker, count(*), min(iter), max(iter), "
                      "min(line), max(line) FROM iterations GROUP BY ALL ORDER BY file").fetchall()
    assert rows == [("a.jsonl", 1, "s", "s-1", 60, 0, 59, 2, 61),
                    ("b.jsonl", 2, "t", "t-2", 30, 0, 29, 42, 71)]
    events = db.execute("SELECT file, rank, stage, count(*), min(line), max(line) FROM events "
                        "GROUP BY ALL").fetchall()
    assert events == [("b.jsonl", 0, "main", 40, 1, 40)]
    assert db.execute("SELECT count(*) FROM rejects").fetchall() == [(0,)]
    workers = db.execute("SELECT rank, stage, worker, file FROM workers ORDER BY ALL").fetchall()
    assert workers == [(0, "main", "main-0", "b.jsonl"), (1, "s", "s-1", "a.jsonl"),
                       (2, "t", "t-2", "b.jsonl")]
    # nothing of the batches is left behind
    left = db.execute("SELECT table_name FROM information_schema.tables "
                      "WHERE table_name LIKE '\\_tlog\\_%' ESCAPE '\\'").fetchall()
    assert left == []
    # a left-over view, then a batch with no template (the full pass's table)
    db.execute("CREATE TEMP TABLE _tlog_pf AS SELECT 1 AS x")
    db.execute("CREATE TEMP VIEW _tlog_p AS SELECT * FROM _tlog_pf")
    _append(run / "b.jsonl", [json.dumps({"type": "event", "v": 1, "name": "late",
                                          "ts": 1764403400.0})])
    ingest_run(db, run)
    assert db.execute("SELECT name, line FROM events WHERE name = 'late'").fetchall() == [
        ("late", 72)]



@pytest.mark.parametrize(("tail_lines", "batches"), [
    (0, [2000]), (4, [2800]), (5, [3000]), (6, [2000, 3200])])
def test_a_small_tail_joins_the_batch_before_it(tmp_path: Path, tail_lines: int,
                                                batches: list[int]) -> None:
    """Batches of about ``chunk_bytes``; a tail after the last full batch joins it
    when the batch stays within 1.5 chunks (TAIL_FOLD: a tail of fewer rows than
    DuckDB's row group went through the write-ahead log). Lines of 200 bytes,
    chunk 2,000 bytes: ``rank0.jsonl`` fills a batch (10 lines), ``rank1.jsonl``
    holds the tail; ``batches`` is the bytes done after each batch (one progress
    call per batch), worked out by hand. Every row loads once."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [_iter(i) for i in range(10 + tail_lines)]
    rows = [r + " " * (199 - len(r)) + "\n" for r in rows]      # 200 bytes each
    assert {len(r) for r in rows} == {200}
    (run / "rank0.jsonl").write_text("".join(rows[:10]))
    (run / "rank1.jsonl").write_text("".join(rows[10:]))
    seen: list[int] = []
    con = connect(tmp_path / "t.duckdb")
    try:
        ingest_run(con, run, chunk_bytes=2000, progress=lambda p: seen.append(p.bytes_done))
        got = con.execute("SELECT count(*), count(DISTINCT iter) FROM iterations").fetchall()[0]
    finally:
        con.close()
    assert got == (10 + tail_lines, 10 + tail_lines)
    assert seen == batches
