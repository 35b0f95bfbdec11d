"""Session fixtures for the DDP scenarios: each scenario runs once per mode, lazily.

``ddp(scenario, mode)`` gives a :class:`DDPCase`: the run (one torchrun runs the
scenario's suite, ``ddp_runs.SUITES``, each scenario in all its modes in turn,
``ddp_runs.run_suite``, into a session temporary directory, the first time any of
them is asked for), its bare-timer truth, and
tlog's ``diagnose --json`` after ``tlog ingest`` of the run directory into a
database of its own (both through the CLI, as a user runs them).

``TLOG_DDP_RUNS=DIR`` reuses runs made before (``python tests/ddp/ddp_runs.py DIR``
writes ``DIR/<scenario>-<mode>/{run,truth}``) instead of running torchrun: for
working on the analysis against fixed inputs. Without it every run is fresh.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddp_runs import RUN_TIMEOUT_S, Truth, modes_of, run_suite, suite_of

from tests.support.cli import cli


def _distributed_missing() -> str | None:
    """Why torch.distributed with gloo cannot run here, or None."""
    try:
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - any import failure means no DDP here
        return f"torch.distributed does not import: {e}"
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if not dist.is_gloo_available():
        return "the gloo backend is not available in this torch build"
    return None


@dataclass
class DDPCase:
    """One scenario run in one mode: its files, truth and tlog's diagnosis (JSON dict)."""

    scenario: str
    mode: str
    out: Path
    truth: Truth
    diagnosis: dict
    ingest_output: str
    wall_s: float | None
    db: Path | None = None      # the database tlog ingested it into
    run_id: str = ""


def _cli(args: list[str]) -> tuple[int, str]:
    return cli(args)


@pytest.fixture(scope="session")
def ddp(tmp_path_factory):
    """``ddp(scenario, mode) -> DDPCase``, each pair run and diagnosed once per session."""
    missing = _distributed_missing()
    cache: dict[tuple[str, str], DDPCase | BaseException] = {}
    # scenario -> its modes' runs (mode -> (out, torchrun wall s)), or the failure:
    # one torchrun runs a suite's scenarios in all their modes (ddp_runs.run_suite).
    runs: dict[str, dict[str, tuple[Path, float]] | BaseException] = {}
    reuse = os.environ.get("TLOG_DDP_RUNS")

    def get(scenario: str, mode: str) -> DDPCase:
        if missing:
            pytest.skip(missing)
        key = (scenario, mode)
        if key not in cache:
            try:
                cache[key] = _make(scenario, mode)
            except Exception as e:  # noqa: BLE001 - a failed run is kept: tried once, not once per test
                cache[key] = e
        got = cache[key]
        if isinstance(got, BaseException):
            raise got
        return got

    def _make(scenario: str, mode: str) -> DDPCase:
        wall = None
        if reuse and (Path(reuse) / f"{scenario}-{mode}" / "truth").is_dir():
            out = Path(reuse) / f"{scenario}-{mode}"
        else:
            if scenario not in runs:
                # its suite in one torchrun, the first time any of its scenarios is asked for
                todo = [s for s in suite_of(scenario) if s not in runs]
                try:
                    res = run_suite({s: modes_of(s) for s in todo}, tmp_path_factory.mktemp("runs"),
                                    timeout_s=RUN_TIMEOUT_S)
                    for s in todo:
                        runs[s] = {m: (r.out, r.wall_s) for m, r in res[s].items()}
                except Exception as e:  # noqa: BLE001 - failed once, failed for every mode
                    for s in todo:
                        runs[s] = e
            got = runs[scenario]
            if isinstance(got, BaseException):
                raise got
            out, wall = got[mode]
        db = tmp_path_factory.mktemp(f"db-{scenario}-{mode}") / "t.duckdb"
        run_id = f"ddp-{scenario}-{mode}"
        code, ingest_out = _cli(["ingest", str(out / "run"), "--run-id", run_id, "--db", str(db)])
        assert code == 0, f"tlog ingest of {scenario}-{mode} failed: {ingest_out}"
        code, diag_out = _cli(["diagnose", "--run", run_id, "--db", str(db), "--json"])
        assert code == 0, f"tlog diagnose of {scenario}-{mode} failed: {diag_out}"
        return DDPCase(scenario, mode, out, Truth.load(out / "truth"), json.loads(diag_out),
                       ingest_out, wall, db, run_id)

    return get
