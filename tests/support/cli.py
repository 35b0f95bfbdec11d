"""tlog's CLI called in-process, as a user runs it (typer's test runner), and the
check every command's answer to bad input shares.

- :func:`invoke`: ``tlog ARGS`` in this process; the result keeps stdout and
  stderr apart (click >= 8.2 always does) and also gives both interleaved.
- :func:`cli`: the same, as ``(exit code, output)``.
- :func:`assert_one_line_error`: the house rule for bad input (one
  ``tlog: error:`` line on stderr, nothing on stdout, no traceback, the exit code).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from click.testing import Result

#: How every tlog error line starts (printed by tlog.app; README, "tlog: error: ...").
ERROR_PREFIX = "tlog: error: "


def invoke(args: Sequence[str | Path], *, input: str | None = None,
           env: Mapping[str, str | None] | None = None) -> Result:
    """``tlog ARGS`` run in this process by typer's ``CliRunner``.

    Args:
        args: the command line after ``tlog`` (paths are turned into text).
        input: what the command reads on stdin.
        env: environment variables set for the call (``None`` unsets one).

    Returns:
        click's ``Result``: ``exit_code``, ``stdout`` and ``stderr`` (separate),
        ``output`` (both, interleaved as a terminal shows them) and
        ``exception`` (what ended the command, ``SystemExit`` included).
    """
    from typer.testing import CliRunner

    import tlog.cli  # noqa: F401  (registers every command)
    from tlog.app import app

    return CliRunner().invoke(app, [str(a) for a in args], input=input, env=env)


def cli(args: Sequence[str | Path]) -> tuple[int, str]:
    """``tlog ARGS``: its exit code and output (stdout and stderr interleaved)."""
    result = invoke(args)
    return result.exit_code, result.output


def assert_one_line_error(result: Result, code: int, *words: str) -> str:
    """Assert tlog's answer to bad input, and return its line.

    The house rule (README: "A user mistake gives one line"): exit ``code``; stderr is exactly one
    line starting ``tlog: error: `` that holds each of ``words`` (compared
    without case); stdout is empty; no traceback anywhere in the output.
    """
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(ERROR_PREFIX), line
    assert result.stdout == "", result.stdout
    for word in words:
        assert word.lower() in line.lower(), (word, line)
    return line


def ingest_and_diagnose(run_dir: Path, run_id: str, db: Path) -> dict:
    """``tlog ingest RUN_DIR`` into ``db`` as ``run_id``, then ``tlog diagnose --json``:
    the diagnosis. ``AssertionError`` with the output when either fails."""
    code, text = cli(["ingest", str(run_dir), "--run-id", run_id, "--db", str(db)])
    assert code == 0, f"tlog ingest of {run_dir} failed: {text}"
    code, text = cli(["diagnose", "--run", run_id, "--db", str(db), "--json"])
    assert code == 0, f"tlog diagnose of {run_id} failed: {text}"
    return json.loads(text)
