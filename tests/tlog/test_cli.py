"""The CLI face: every command documents itself; errors are one line, never a traceback."""

from __future__ import annotations

import pytest

import tlog.cli  # noqa: F401  (registers every command)
from tests.support.cli import invoke
from tlog.app import app


def _commands() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_every_command_has_help_text() -> None:
    import typer.main

    group = typer.main.get_command(app)
    assert group.commands, "no command registered"
    missing = [name for name, cmd in group.commands.items() if not (cmd.help or "").strip()]
    assert not missing, f"commands without help text: {missing}"


@pytest.mark.parametrize("name", _commands())
def test_command_help_exits_zero(name: str) -> None:
    result = invoke([name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = invoke(["no-such-command"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_phase_names_are_printed_literally_never_as_markup(tmp_path) -> None:
    """A phase name in square brackets ("[param|fc1]", "[red]x") is text:
    rich would read it as markup and drop it (docs: "smaller ones")."""
    import json

    run = tmp_path / "brackets"
    run.mkdir()
    lines = []
    for i in range(30):
        lines.append(json.dumps({"iter": i, "ts": 1000.0 + i * 0.1, "dur": 0.1,
                                 "phases": {"[param|fc1]": 0.07, "[red]x": 0.02}}))
    (run / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    db = str(tmp_path / "t.duckdb")
    assert invoke(["ingest", str(run), "--db", db]).exit_code == 0
    result = invoke(["diagnose", "--run", "brackets", "--db", db])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "[param|fc1]" in text
    assert "[red]x" in text


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_a_reader_that_stops_early_ends_tlog_quietly_with_141(tmp_path, fmt) -> None:
    """``tlog ... | head -1``: the reader closes the pipe; tlog stops at its next
    write with 141 (128 + SIGPIPE), like ``git log | head -1``, nothing on stderr
    (rich's handling exited 1, a failed command under ``set -o pipefail``)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    run = tmp_path / "r"
    run.mkdir()
    (run / "rank0.jsonl").write_text("".join(
        json.dumps({"iter": i, "ts": 1000.0 + i, "dur": 1.0, "phases": {"step": 1.0}}) + "\n"
        for i in range(20)))
    db = str(tmp_path / "t.duckdb")
    assert invoke(["ingest", str(run), "--db", db]).exit_code == 0
    tlog = Path(sys.executable).with_name("tlog")
    # far more than a pipe's 64 KiB buffer, so tlog is still writing when the reader
    # closes, whatever the timing: CSV 200,000 rows of 500 characters (100 MB); a table
    # draws 1,000 rows (TABLE_MAX_ROWS), each 500 characters wrapped at 80 columns
    # into 7-8 lines (over 500 KB). (200,000 one-number rows fitted the buffer as a
    # 1,000-row table: tlog finished before the close and exited 0, in CI.)
    statement = "SELECT range, repeat('x', 500) AS s FROM range(200000)"
    proc = subprocess.Popen([str(tlog), "sql", statement, "--db", db,
                             "--format", fmt], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "COLUMNS": "80"})
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()            # the first line arrived
    proc.stdout.close()                      # the reader goes away, as head does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 128 + signal.SIGPIPE, err
    assert err == ""
