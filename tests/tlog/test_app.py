"""``tlog.app``: the CLI's shared pieces: names from logs made inert, JSON without
NaN, the machine's failures and a Ctrl-C inside DuckDB recognised, one error line."""

from __future__ import annotations

import errno
import json
import math

import duckdb
import pytest
import typer

from tlog.app import fail, interrupted_in_duckdb, json_ready, machine_failure, print_json, shown


@pytest.mark.parametrize(("text", "out"), [
    ("plain name", "plain name"),
    ("a\x1b[2Jb", "a\\x1b[2Jb"),
    ("x\nBottleneck: forged\r\t", "x\\nBottleneck: forged\\r\\t"),
    ("p\u2028q\u202er\x9b", "p\\u2028q\\u202er\\x9b"),
    ("[red]x[/]", "[red]x[/]"),           # markup stays text: the consoles never read it
    (7, "7"),
])
def test_shown_escapes_what_acts_on_a_terminal(text, out: str) -> None:
    assert shown(text) == out


def test_json_without_nan(capsys) -> None:
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": (2, "x")}
    assert json_ready(value) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, "x"]}
    print_json(value)
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [1.0, None, {"c": None}],
                                                   "d": [2, "x"]}


@pytest.mark.parametrize(("exc", "says"), [
    (OSError(errno.ENOSPC, "No space left on device", "/data/t.duckdb.wal"),
     "disk full (no space left on device) writing /data/t.duckdb.wal: free space"),
    (OSError(errno.EFBIG, "File too large"), "file size limit reached (file too large): "),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/q"), "disk quota exceeded writing /q"),
    (MemoryError(), "out of memory: close other programs"),
    (duckdb.IOException("IO Error: Could not write file: No space left on device"),
     "disk full (no space left on device): "),
    (duckdb.IOException("IO Error: Corrupt database file: bad checksum"),
     "the database looks damaged (IO Error: Corrupt database file: bad checksum): keep a copy"),
])
def test_machine_failures_each_their_line(exc: BaseException, says: str) -> None:
    line = machine_failure(exc)
    assert line is not None and line.startswith(says) and "\n" not in line


def test_other_errors_are_not_the_machines() -> None:
    assert machine_failure(OSError(errno.ENOENT, "No such file")) is None
    assert machine_failure(ValueError("disk full")) is None        # not an OS or DuckDB error


def test_a_ctrl_c_that_duckdb_let_out_as_another_error() -> None:
    assert interrupted_in_duckdb(RuntimeError("Query interrupted"))
    assert interrupted_in_duckdb(duckdb.InterruptException("INTERRUPT Error"))
    assert interrupted_in_duckdb(duckdb.InvalidInputException("... KeyboardInterrupt ..."))
    try:
        try:
            raise RuntimeError("Query interrupted")
        except RuntimeError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert interrupted_in_duckdb(outer)
    assert not interrupted_in_duckdb(RuntimeError("Query interrupted later"))


def test_fail_is_one_escaped_line_on_stderr_and_the_exit_code(capsys) -> None:
    with pytest.raises(typer.Exit) as info:
        fail("no run 'a\x1bb'", code=2)
    assert info.value.exit_code == 2
    captured = capsys.readouterr()
    assert captured.err == "tlog: error: no run 'a\\x1bb'\n" and captured.out == ""
