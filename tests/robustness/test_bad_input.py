"""Bad input, by mistake or from a hostile log: every command answers with ONE
line ``tlog: error: ...`` naming what is wrong (and what to do), exit 1 or 2,
never a traceback, and leaves the database as it was.

Cases found by a destructive pass over every command (see the commit messages);
the ones fixed in ``ingest/parse_sql.py`` / ``ingest/sources.py`` are at the end.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pytest

from tests.support.cli import assert_one_line_error, invoke
from tests.support.runs import TINY_RUN, write_run


def _tlog(*args: str | Path, env: dict[str, str] | None = None):
    return invoke([str(a) for a in args], env=env)


def _ingest_json(run: Path, db: Path, *extra: str) -> dict:
    result = _tlog("ingest", "--json", "--db", db, *extra, run)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "t.duckdb"


@pytest.fixture
def good_run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "good", TINY_RUN)


# --- click's own parse errors: one line, exit 2 (were a 4-line usage block) -----------------

@pytest.mark.parametrize(("args", "words"), [
    (["--bogus"], ["no such option", "--bogus", "tlog --help"]),
    # a command's option before the command (found by a new user)
    (["--db", "x.duckdb", "runs"], ["no such option: --db", "options go after the command",
                                    "tlog runs --db ..."]),
    (["--format", "csv", "sql", "select 1"], ["options go after the command",
                                              "tlog sql --format ...", "tlog sql --help"]),
    (["no-such-command"], ["no such command", "no-such-command"]),
    (["diagnose", "extra"], ["unexpected extra argument", "tlog diagnose --help"]),
    (["compare"], ["missing argument", "tlog compare --help"]),
    (["compare", "a", "b", "--top", "0"], ["--top"]),
    (["query", "phase_breakdown", "-f", "xml"], ["--format", "xml"]),
    (["demo", "--steps", "abc"], ["--steps", "integer"]),
])
def test_parse_errors_are_one_line(args: list[str], words: list[str]) -> None:
    assert_one_line_error(_tlog(*args), 2, *words)


def test_db_option_naming_a_directory_is_one_line(tmp_path: Path, good_run: Path) -> None:
    assert_one_line_error(_tlog("ingest", "--db", tmp_path, good_run), 2,
                          "--db", "is a directory")


def test_report_output_naming_a_directory_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(_tlog("report", "--run", "x", "-o", tmp_path), 2,
                          "--output", "is a directory")


def test_no_arguments_still_prints_the_help() -> None:
    result = _tlog()
    assert "Usage:" in result.output and "Commands" in result.output
    assert "tlog: error" not in result.output


# --- the safety net in tlog.app._Group for errors no layer named --------------------------

def test_unexpected_error_is_one_line_naming_a_bug(monkeypatch, good_run: Path,
                                                  db: Path) -> None:
    import tlog.ingest.run as ingest_cmd  # the CLI calls it from there

    def boom(*_a, **_k):
        raise ZeroDivisionError("float division by zero\nsecond line")

    monkeypatch.setattr(ingest_cmd, "ingest_run", boom)
    line = assert_one_line_error(_tlog("ingest", "--db", db, good_run), 1,
                                 "internal error", "ZeroDivisionError",
                                 "float division by zero", "TLOG_DEBUG=1")
    assert "second line" not in line


def test_tlog_debug_shows_the_real_exception(monkeypatch, good_run: Path, db: Path) -> None:
    import tlog.ingest.run as ingest_cmd  # the CLI calls it from there

    def boom(*_a, **_k):
        raise ZeroDivisionError("x")

    monkeypatch.setattr(ingest_cmd, "ingest_run", boom)
    result = _tlog("ingest", "--db", db, good_run, env={"TLOG_DEBUG": "1"})
    assert isinstance(result.exception, ZeroDivisionError)


def test_os_error_is_one_line_with_reason_and_file(monkeypatch, good_run: Path,
                                                  db: Path) -> None:
    """An unreadable log (PermissionError from open) was a traceback."""
    import tlog.ingest.run as ingest_cmd  # the CLI calls it from there

    def denied(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(good_run / "rank0.jsonl"))

    monkeypatch.setattr(ingest_cmd, "ingest_run", denied)
    assert_one_line_error(_tlog("ingest", "--db", db, good_run), 1,
                          "Permission denied", "rank0.jsonl")


def test_hostile_rank_never_leaves_a_half_written_run(tmp_path: Path, good_run: Path,
                                                      db: Path) -> None:
    """A rank beyond INT32 made DuckDB fail mid-ingest with a traceback. Now: either
    one error line and the database exactly as before (the batch rolled back), or,
    once ingest/parse_sql.py rejects the line itself, the good lines loaded."""
    _ingest_json(good_run, db)
    bad = write_run(tmp_path / "bad", [
        {"iter": 0, "ts": 1.0, "dur": 1.0, "phases": {}},
        {"iter": 1, "ts": 2.0, "dur": 1.0, "phases": {}, "rank": 99_999_999_999},
    ])
    result = _tlog("ingest", "--db", db, bad)
    expected = [("bad", 1), ("good", 3)]
    if result.exit_code != 0:
        assert_one_line_error(result, 1, "99999999999")
        expected = [("good", 3)]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id, count(*) FROM iterations GROUP BY ALL "
                           "ORDER BY 1").fetchall() == expected
        assert con.execute("SELECT run_id FROM runs ORDER BY 1").fetchall() \
            == [(r,) for r, _ in expected]


# --- tlog ingest options -------------------------------------------------------------------

@pytest.mark.parametrize(("run_id", "words"), [
    ("", ["--run-id", "is empty"]),
    ("   ", ["--run-id", "is empty"]),
    ("a\nb", ["--run-id", "control character", "'\\n'", "position 2"]),
    ("a\x1b[31mb", ["--run-id", "control character", "'\\x1b'"]),
    ("x" * 5000, ["--run-id", "5,000 characters", "at most 512"]),
])
def test_bad_run_id_is_a_usage_error(run_id: str, words: list[str], good_run: Path,
                                     db: Path) -> None:
    """'' used to fall back silently to the directory name; a line break was stored
    (and broke every one-line output); 5,000 characters were echoed in full."""
    line = assert_one_line_error(_tlog("ingest", "--db", db, "--run-id", run_id, good_run),
                                 2, *words)
    assert len(line) < 400
    assert not db.exists()


def test_unusual_but_printable_run_id_is_kept(good_run: Path, db: Path) -> None:
    report = _ingest_json(good_run, db, "--run-id", "<b>日本 run/1</b>")
    assert report["run_id"] == "<b>日本 run/1</b>"
    assert report["records_loaded"]["iter"] == 3


@pytest.mark.parametrize(("args", "words"), [
    (["--interval", "inf", "--follow"], ["--interval", "inf"]),
    (["--interval", "nan", "--follow"], ["--interval", "nan"]),
    (["--wait", "nan"], ["--wait", "nan"]),
])
def test_non_finite_interval_or_wait_is_a_usage_error(args: list[str], words: list[str],
                                                      good_run: Path, db: Path) -> None:
    """--follow --interval inf ended in an OverflowError from time.sleep."""
    assert_one_line_error(_tlog("ingest", "--db", db, *args, good_run), 2, *words)


# --- run.json ------------------------------------------------------------------------------

@pytest.mark.parametrize(("manifest", "words"), [
    ('{"world_size": 99999999999}', ["world_size", "2147483647", "99999999999"]),
    ("[" * 100_000 + "]" * 100_000, ["run.json", "nested too deeply"]),
    ('{"run_id": "a", "run_id": "b"}', ["run.json", "duplicate key 'run_id'"]),
    ('{"run_id": "a\\nb"}', ["run.json", "run_id", "control character"]),
    ('{"run_id": "' + "x" * 600 + '"}', ["run.json", "run_id", "at most 512"]),
    ('{"name": "s\\ud800x"}', ["run.json", "\\ud800", "half of a UTF-16 pair"]),
    ('{"phase_kinds": {"a\\udfff": "sync"}}', ["run.json", "\\udfff"]),
])
def test_bad_manifest_is_one_line(manifest: str, words: list[str], tmp_path: Path,
                                  db: Path) -> None:
    """world_size and started out of range and deep nesting were tracebacks; a
    duplicate key silently kept the last value (records reject duplicate keys)."""
    run = write_run(tmp_path / "r", TINY_RUN, manifest=manifest)
    assert_one_line_error(_tlog("ingest", "--db", db, run), 1, *words)


def test_manifest_with_a_byte_order_mark_is_read(tmp_path: Path, db: Path) -> None:
    run = write_run(tmp_path / "r", TINY_RUN, manifest='\ufeff{"run_id": "bom", "world_size": 2}')
    report = _ingest_json(run, db)
    assert report["run_id"] == "bom"
    assert report["records_loaded"]["iter"] == 3


# --- the database file ---------------------------------------------------------------------

def test_tlog_db_naming_a_directory(tmp_path: Path) -> None:
    for args in (["runs"], ["diagnose"], ["sql", "SELECT 1"]):
        assert_one_line_error(_tlog(*args, env={"TLOG_DB": str(tmp_path)}), 1,
                              str(tmp_path), "is a directory", "--db")


def test_a_file_that_is_not_duckdb_is_refused_and_untouched(tmp_path: Path,
                                                           good_run: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"my notes\n")
    for args in (["ingest", good_run], ["runs"], ["diagnose"]):
        assert_one_line_error(_tlog(*args, "--db", path), 1, "not a tlog database",
                              "untouched", "--db")
    assert path.read_bytes() == b"my notes\n"


def test_another_programs_duckdb_file_is_refused_and_untouched(tmp_path: Path,
                                                              good_run: Path) -> None:
    """tlog ingest used to add its tables into it; tlog runs/diagnose/report/compare
    failed with a Catalog Error traceback."""
    path = tmp_path / "analytics.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE sales (x INTEGER); INSERT INTO sales VALUES (7)")
    for args in (["ingest", good_run], ["runs"], ["diagnose"], ["compare", "a", "b"],
                 ["report", "--run", "a"], ["export", "--parquet", tmp_path / "out"]):
        assert_one_line_error(_tlog(*args, "--db", path), 1, "not a tlog database",
                              "other tables")
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() \
            == [("sales",)]


def test_an_empty_duckdb_file_is_refused_for_reading(tmp_path: Path) -> None:
    path = tmp_path / "empty.duckdb"
    duckdb.connect(str(path)).close()
    assert_one_line_error(_tlog("runs", "--db", path), 1, "not a tlog database", "is empty")


# --- output ------------------------------------------------------------------------------

def test_table_output_draws_at_most_1000_rows(good_run: Path, db: Path) -> None:
    """A 1,000,000-row result in a table took over 2 minutes and 2 GB (rich lays
    out every cell); CSV and JSON still print every row."""
    _ingest_json(good_run, db)
    result = _tlog("sql", "SELECT range AS i FROM range(1500)", "--db", db)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "│ 999 │" in out and "│ 1000 │" not in out
    assert "(500 more rows not shown of 1,500: use --format csv or json" in out
    csv = _tlog("sql", "SELECT range AS i FROM range(1500)", "--db", db, "-f", "csv")
    assert csv.stdout.splitlines()[-1] == "1499"


# --- hostile log content: one line or file reported, the rest loads ------------------------

def test_rank_beyond_int32_rejects_only_its_line(tmp_path: Path, db: Path) -> None:
    run = write_run(tmp_path / "r", [
        *TINY_RUN, {"iter": 3, "ts": 1003.0, "dur": 1.0, "phases": {}, "rank": 99_999_999_999}])
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 3
    assert report["errors"] == [{"file": "rank0.jsonl", "line": 5, "reason":
                                 "value out of range for 'rank': 99999999999 (at most 2147483646)"}]


I64 = 2**63
IT = {"iter": 3, "ts": 1003.0, "dur": 1.0, "phases": {}}


@pytest.mark.parametrize(("record", "field", "value"), [
    ({**IT, "iter": I64}, "'iter'", I64),
    ({**IT, "iter": 10**20}, "'iter'", 10**20),
    ({**IT, "tokens": I64}, "'tokens'", I64),
    ({**IT, "samples": 2**64 - 1}, "'samples'", 2**64 - 1),
    ({**IT, "mem": {"allocated": I64}}, "mem.allocated", I64),
    ({**IT, "mem": {"reserved": 1, "device_allocs": I64}}, "mem.device_allocs", I64),
    ({"type": "queue", "name": "q", "ts": 1.0, "depth": I64}, "'depth'", I64),
    ({"type": "queue", "name": "q", "ts": 1.0, "depth": 1, "capacity": I64}, "'capacity'", I64),
    ({"type": "event", "name": "e", "ts": 1.0, "rank": 2**31}, "'rank'", 2**31),
    ({"type": "meta", "world_size": 2**31}, "'world_size'", 2**31),
    ({"type": "meta", "pid": I64}, "'pid'", I64),
])
def test_integer_beyond_its_column_rejects_only_its_line(record: dict, field: str, value: int,
                                                         tmp_path: Path, db: Path) -> None:
    """Every integer field is checked against its column (INTEGER for rank and
    world_size, BIGINT for the rest) on both paths (templates are learned from
    TINY_RUN's lines; the odd line takes the general path)."""
    run = write_run(tmp_path / "r", [*TINY_RUN, record])
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 3
    assert len(report["errors"]) == 1 and report["errors"][0]["line"] == 5
    reason = report["errors"][0]["reason"]
    assert reason.startswith(f"value out of range for {field}: {value} (at most "), reason


def test_a_live_log_with_a_huge_rank_keeps_ingesting(tmp_path: Path, db: Path) -> None:
    """The bad line used to fail this and every later ingest of the run."""
    run = write_run(tmp_path / "r", [*TINY_RUN, {**IT, "rank": 2**40}])
    assert _ingest_json(run, db)["records_rejected"] == 1
    with (run / "rank0.jsonl").open("a") as fh:
        fh.write(json.dumps({**IT, "iter": 4, "ts": 1004.0}) + "\n")
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 1 and report["records_rejected"] == 0


def test_rank_at_its_limit_loads(tmp_path: Path, db: Path) -> None:
    run = write_run(tmp_path / "r", [*TINY_RUN, {**IT, "rank": 2**31 - 2}])
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 4 and report["records_rejected"] == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT world_size FROM runs").fetchall() == [(2**31 - 1,)]


@pytest.mark.parametrize("phases", [{"": 0.25, "fwd": 0.5}, {"fwd": 0.5, "": 0.25}])
def test_empty_phase_name_rejects_its_line(phases: dict, tmp_path: Path, db: Path) -> None:
    """A phase needs a name (docs/FORMAT.md "Reading rules"); "" broke the
    generated SQL and failed the whole ingest."""
    run = write_run(tmp_path / "r", [*TINY_RUN, {**IT, "phases": phases},
                                      {**IT, "iter": 4, "phases": {"x": 0.1}, "gpu": {"": 0.1}}])
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 3
    assert report["errors"] == [
        {"file": "rank0.jsonl", "line": 5, "reason": "empty phase name in 'phases'"},
        {"file": "rank0.jsonl", "line": 6, "reason": "empty gpu name in 'gpu'"}]


#: Names a template may hold (no quote, backslash or control character) ...
PLAIN_NAMES = ["it's; DROP TABLE runs; --", "日本語/子", "x" * 20_000, "%_%", "FWD", "fwd2"]
#: ... and the others (general path only).
HOSTILE_NAMES = [*PLAIN_NAMES, 'a"b', "back\\slash", "tab\tnew\nline", "nul\u0000"]


@pytest.mark.parametrize("template_path", [True, False])
def test_phase_names_enter_sql_as_data(template_path: bool, tmp_path: Path, db: Path) -> None:
    """Names with quotes, backslashes, LIKE wildcards, control characters,
    unicode, 20,000 characters: stored as they are, on the template path (many
    alike lines) and the general path (every line different)."""
    from tlog.ingest.templates import template_of

    names = PLAIN_NAMES if template_path else HOSTILE_NAMES
    records = []
    for i in range(40):
        phases = {n: 0.5 ** (k + 2) for k, n in enumerate(names)}
        if not template_path:
            phases[f"only{i}"] = 0.001   # every line another layout
        records.append({"iter": i, "ts": 1000.0 + i, "dur": 1.0, "phases": phases,
                        "gpu": {names[0]: 0.125}})
    assert (template_of(json.dumps(records[0])) is not None) == template_path
    run = write_run(tmp_path / "r", records)
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 40 and report["records_rejected"] == 0
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT phase, host_s, gpu_s FROM phases WHERE iter = 7 "
                          "AND phase NOT LIKE 'only%' ORDER BY seq").fetchall()
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
    assert got == [(n, 0.5 ** (k + 2), 0.125 if k == 0 else None) for k, n in enumerate(names)]
    assert "runs" in tables


@pytest.mark.parametrize("n", [256, 257])
@pytest.mark.parametrize("many", [1, 20])
def test_phases_per_record_cap(n: int, many: int, tmp_path: Path, db: Path) -> None:
    """MAX_PHASES = 256 names per record: 257 is rejected, 256 loads (one line:
    general path; 20 alike lines: template path)."""
    from tlog.ingest.templates import MAX_PHASES

    assert MAX_PHASES == 256
    records = [{"iter": i, "ts": 1000.0 + i, "dur": 1.0,
                "phases": {f"p{k}": 0.001 for k in range(n)}} for i in range(many)]
    report = _ingest_json(write_run(tmp_path / "r", records), db)
    if n == 256:
        assert report["records_loaded"]["iter"] == many and report["records_rejected"] == 0
    else:
        assert report["records_loaded"]["iter"] == 0
        assert report["rejected_by_reason"] == {"too_large": many}
        assert report["errors"][0]["reason"] == "too many names in 'phases': 257 (limit 256)"


def test_a_line_over_the_cap_is_rejected_and_cut(monkeypatch, tmp_path: Path,
                                                 db: Path) -> None:
    """The line-length cap (ingest.sources.MAX_LINE_BYTES, 1 MiB) lowered to 300
    bytes so that the test is fast; the slow test below uses the real one."""
    import tlog.ingest.sources

    monkeypatch.setattr(tlog.ingest.sources, "MAX_LINE_BYTES", 300)
    long = json.dumps({**IT, "x": "y" * 3000})
    run = write_run(tmp_path / "r", [*TINY_RUN, long, json.dumps({**IT, "iter": 4})])
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 4
    assert report["errors"] == [{"file": "rank0.jsonl", "line": 5,
                                 "reason": f"line too long ({len(long):,} bytes, limit 300)"}]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT code, raw FROM rejects").fetchall() == [
            ("too_large", long[:2000])]


@pytest.mark.parametrize("content", [b"hello, not gzip\n", b"\x1f\x8b\x08\x00garbage" * 10])
def test_a_jsonl_gz_that_is_not_gzip_is_reported(content: bytes, tmp_path: Path,
                                                db: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "rank0.jsonl.gz").write_bytes(content)
    result = _tlog("ingest", "--json", "--db", db, run)
    said = result.stdout + result.stderr
    assert "rank0.jsonl.gz" in said and "gzip" in said.lower()
    report = json.loads(result.stdout)
    assert report["errors"][0]["file"] == "rank0.jsonl.gz"
    assert report["errors"][0]["line"] == 1
    assert report["errors"][0]["reason"].startswith(
        "not gzip" if content.startswith(b"hello") else "damaged gzip stream after 0 bytes")


def test_a_gzip_damaged_mid_stream_loads_its_good_prefix(tmp_path: Path, db: Path) -> None:
    """The good prefix loads, the damage is an error entry (file, the line after
    the last complete one, reason), the file is not counted as read and is
    reported again by the next ingest, without loading anything twice."""
    run = tmp_path / "r"
    run.mkdir()
    good = gzip.compress("".join(json.dumps(r) + "\n" for r in TINY_RUN).encode())
    (run / "rank0.jsonl.gz").write_bytes(good + b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"
                                         + b"\xff" * 64)
    for _ in range(2):
        report = _ingest_json(run, db)
        assert report["errors"][0]["file"] == "rank0.jsonl.gz"
        assert report["errors"][0]["line"] == 5
        assert report["errors"][0]["reason"].startswith("damaged gzip stream after ")
        assert report["files_read"] == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM iterations").fetchall() == [(3,)]


def test_a_truncated_gzip_loads_its_complete_lines(tmp_path: Path, db: Path) -> None:
    """A .gz still being written (or from a killed writer) yields what it holds."""
    run = tmp_path / "r"
    run.mkdir()
    body = "".join(json.dumps(r) + "\n" for r in TINY_RUN).encode()
    data = gzip.compress(body * 50)
    (run / "rank0.jsonl.gz").write_bytes(data[: len(data) - 20])
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] > 0
    assert report["records_rejected"] == 0


@pytest.mark.slow
def test_a_huge_line_is_rejected_not_fatal(tmp_path: Path, db: Path) -> None:
    run = write_run(tmp_path / "r", [
        *TINY_RUN, {"iter": 3, "ts": 1003.0, "dur": 1.0, "phases": {}, "x": "y" * 50_000_000}])
    report = _ingest_json(run, db)
    assert report["records_loaded"]["iter"] == 3
    assert report["records_rejected"] == 1


def test_diagnose_of_a_run_whose_lines_were_all_rejected_points_at_rejects(
        tmp_path: Path, db: Path) -> None:
    run = write_run(tmp_path / "allbad", [
        {"iter": 0, "ts": 1000.0, "dur": -1.0, "phases": {}},
        {"iter": 1, "ts": 1001.0, "phases": {}},
    ])
    report = _ingest_json(run, db)
    assert report["records_rejected"] == 2
    line = assert_one_line_error(_tlog("diagnose", "--run", "allbad", "--db", db), 1,
                                 "holds no iterations", "all 2", "rejected", "FROM rejects")
    assert "WHERE run_id = 'allbad'" in line
