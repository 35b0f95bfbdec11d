"""tlog's CLI called in-process, as a user runs it (typer's test runner)."""

from __future__ import annotations

import json
from pathlib import Path


def cli(args: list[str]) -> tuple[int, str]:
    """``tlog ARGS``: its exit code and output."""
    from typer.testing import CliRunner

    import tlog.cli  # noqa: F401  (registers every command)
    from tlog.app import app

    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def ingest_and_diagnose(run_dir: Path, run_id: str, db: Path) -> dict:
    """``tlog ingest RUN_DIR`` into ``db`` as ``run_id``, then ``tlog diagnose --json``:
    the diagnosis. ``AssertionError`` with the output when either fails."""
    code, text = cli(["ingest", str(run_dir), "--run-id", run_id, "--db", str(db)])
    assert code == 0, f"tlog ingest of {run_dir} failed: {text}"
    code, text = cli(["diagnose", "--run", run_id, "--db", str(db), "--json"])
    assert code == 0, f"tlog diagnose of {run_id} failed: {text}"
    return json.loads(text)
