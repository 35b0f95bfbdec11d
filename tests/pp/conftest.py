"""Session fixture for the pipeline-parallel jobs: one torchrun runs every job of
``pp_train.py`` (``JOBS``) the first time any is asked for; each is then ingested
and diagnosed through the CLI into a database of its own (tests/pp/README.md).

``TLOG_PP_RUNS=DIR`` reuses runs made before (``DIR/<schedule>-<mode>/{run,truth}``,
as ``pp_train.py --out DIR`` writes them) instead of running torchrun.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ddp"))

from ddp_runs import run_torchrun, torchrun_cmd

from tests.support.cli import ingest_and_diagnose

#: Every job, in the order one torchrun runs them.
JOBS = ("gpipe:instrument", "1f1b:instrument", "interleaved:instrument",
        "handwritten:instrument", "gpipe:trace", "1f1b:trace", "interleaved:trace",
        "handwritten:trace")
#: Steps per job: 3-7 are warm-up; enough left for tlog's 20 steady iterations.
STEPS = 30
#: Wall-clock limit of the torchrun (s): eight jobs took 30-60 s each beside three other
#: workers on the 2-core machine.
TIMEOUT_S = 900


@dataclass
class PPCase:
    """One job: its files, the bare-timer truth per rank and tlog's diagnosis."""

    job: str
    out: Path
    truth: dict[int, dict]
    diagnosis: dict
    db: Path
    run_id: str

    def steady_iters(self, rank: int) -> list[int]:
        """The iteration numbers tlog judged steady on ``rank`` (which steps it
        judged, not what it measured: the truth's figures are compared over them)."""
        import duckdb
        from tlog.analyze.frames import attribute

        con = duckdb.connect(str(self.db), read_only=True)
        try:
            it = attribute(con, self.run_id).steady
        finally:
            con.close()
        return sorted(it.filter(it["rank"] == rank)["iter"].to_list())


@pytest.fixture(scope="session")
def pp(tmp_path_factory):
    """``pp("gpipe:instrument") -> PPCase``, all jobs run in one torchrun, once."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    reuse = os.environ.get("TLOG_PP_RUNS")
    state: dict[str, Path | BaseException] = {}
    cases: dict[str, PPCase] = {}

    def get(job: str) -> PPCase:
        if job in cases:
            return cases[job]
        if "out" not in state:
            if reuse:
                state["out"] = Path(reuse)
            else:
                out = tmp_path_factory.mktemp("pp")
                cmd = [*torchrun_cmd(2), str(HERE / "pp_train.py"),
                       *(a for j in JOBS for a in ("--job", j)), "--out", str(out),
                       "--steps", str(STEPS)]
                try:
                    run_torchrun(cmd, "pp_train", TIMEOUT_S)
                    state["out"] = out
                except Exception as e:  # noqa: BLE001 - failed once, failed for every job
                    state["out"] = e
        out = state["out"]
        if isinstance(out, BaseException):
            raise out
        d = out / job.replace(":", "-")
        db = tmp_path_factory.mktemp("db") / "t.duckdb"
        run_id = "pp-" + job.replace(":", "-")
        diagnosis = ingest_and_diagnose(d / "run", run_id, db)
        truth = {r: json.loads((d / "truth" / f"truth-rank{r}.json").read_text()) for r in (0, 1)}
        cases[job] = PPCase(job, d, truth, diagnosis, db, run_id)
        return cases[job]

    return get
