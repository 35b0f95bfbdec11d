"""``tlog.job``: a job's environment, run id and exit status (small real jobs:
``python -c``; the signal relay and leftovers are tests/run/test_tlog_run.py's)."""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tlog.job import (
    CommandNotFoundError,
    CommandNotRunnableError,
    default_run_id,
    exit_code_of,
    job_env,
    run_job,
)


def test_job_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = job_env({"PATH": "/bin", "TLOG_TAGS": "old"}, Path("runs/r1"), "r1", {"gpus": "8"})
    assert env["PATH"] == "/bin"
    assert env["TLOG_RUN_DIR"] == str(tmp_path / "runs" / "r1")     # absolute
    assert env["TLOG_RUN_ID"] == "r1"
    assert json.loads(env["TLOG_TAGS"]) == {"gpus": "8"}
    assert "TLOG_TAGS" not in job_env({"TLOG_TAGS": "old"}, tmp_path, "r1", {})


def test_default_run_id_names_the_script() -> None:
    at = datetime(2025, 11, 29, 8, 0, 5)
    assert default_run_id(["torchrun", "--nproc_per_node=2", "train.py", "--lr", "1"], at) == (
        "train-20251129-080005")
    assert default_run_id(["/usr/bin/make", "all"], at) == "make-20251129-080005"


def test_exit_code_of() -> None:
    assert exit_code_of(0) == 0 and exit_code_of(3) == 3
    assert exit_code_of(-signal.SIGTERM) == 128 + 15 and exit_code_of(-9) == 137


def test_a_job_runs_with_the_environment_and_its_status(tmp_path: Path) -> None:
    out = tmp_path / "seen.txt"
    code = ("import os, sys; open(sys.argv[1], 'w').write(os.environ['TLOG_RUN_ID']); "
            "sys.exit(3)")
    env = job_env(os.environ, tmp_path, "job-1", {})
    result = run_job([sys.executable, "-c", code, str(out)], env, grace_s=1.0)
    assert (result.exit_code, result.signal, result.interrupts) == (3, None, 0)
    assert out.read_text() == "job-1" and result.seconds > 0 and result.leftovers == []


def test_a_job_killed_by_a_signal(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    result = run_job([sys.executable, "-c", code], dict(os.environ), grace_s=1.0)
    assert (result.exit_code, result.signal) == (128 + signal.SIGTERM, signal.SIGTERM)


def test_commands_that_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(CommandNotFoundError, match="no-such-command-x: command not found") as e:
        run_job(["no-such-command-x"], dict(os.environ))
    assert e.value.exit_code == 127
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")          # not executable
    with pytest.raises(CommandNotRunnableError, match="permission denied") as e:
        run_job([str(script)], dict(os.environ))
    assert e.value.exit_code == 126
