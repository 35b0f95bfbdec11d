"""Recorder.from_env (torchrun variables) and the run.json manifest rank 0 writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from runtime_helpers import read_lines

from dflash_runtime import Recorder
from dflash_runtime.manifest import git_info

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TLOG_RUN_DIR", "TLOG_STAGE",
                "TLOG_WORKER", "TLOG_ENABLED", "TLOG_RUN_ID", "TLOG_TAGS"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_from_env_reads_the_torchrun_variables(tmp_path, clean_env) -> None:
    clean_env.setenv("RANK", "5")
    clean_env.setenv("WORLD_SIZE", "8")
    clean_env.setenv("LOCAL_RANK", "1")
    clean_env.setenv("TLOG_RUN_DIR", str(tmp_path))
    clean_env.setenv("TLOG_STAGE", "drafter")
    rec = Recorder.from_env(install_handlers=False)
    rec.close()
    assert rec.path == tmp_path / "rank5.drafter.jsonl"
    meta = read_lines(rec.path)[0]
    assert (meta["rank"], meta["world_size"], meta["stage"], meta["worker"],
            meta["local_rank"]) == (5, 8, "drafter", "drafter-5", 1)
    assert not (tmp_path / "run.json").exists()  # only rank 0 writes the manifest


def test_arguments_override_the_environment(tmp_path, clean_env) -> None:
    clean_env.setenv("RANK", "2")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("TLOG_RUN_DIR", str(tmp_path / "ignored"))
    rec = Recorder.from_env(tmp_path, rank=0, stage="target", worker="target-a",
                            install_handlers=False)
    rec.close()
    assert rec.path == tmp_path / "rank0.target.jsonl"
    assert read_lines(rec.path)[0]["worker"] == "target-a"


def test_without_a_run_dir_or_with_tlog_enabled_0_it_is_disabled(tmp_path, clean_env) -> None:
    # No run directory: disabled, and rank 0 says so once (a job meant to record
    # must not find out after the run); other ranks stay quiet.
    with pytest.warns(RuntimeWarning, match="TLOG_RUN_DIR is not set"):
        assert Recorder.from_env().enabled is False
    clean_env.setenv("RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Recorder.from_env().enabled is False
    clean_env.setenv("RANK", "0")
    clean_env.setenv("TLOG_ENABLED", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Recorder.from_env().enabled is False     # switched off on purpose: silent
    clean_env.setenv("TLOG_RUN_DIR", str(tmp_path))
    clean_env.setenv("TLOG_ENABLED", "0")
    assert Recorder.from_env().enabled is False
    assert list(tmp_path.iterdir()) == []


def test_a_bad_rank_names_the_variable(clean_env) -> None:
    clean_env.setenv("RANK", "zero")
    with pytest.raises(ValueError, match=r"RANK='zero' is not an integer"):
        Recorder.from_env()


def test_run_id_and_tags_from_the_environment_reach_run_json(tmp_path, clean_env) -> None:
    # what `tlog run --run-id exp-9 --tag lr=3e-4 --tag gpus=8` sets for every rank
    clean_env.setenv("TLOG_RUN_DIR", str(tmp_path))
    clean_env.setenv("TLOG_RUN_ID", "exp-9")
    clean_env.setenv("TLOG_TAGS", '{"lr": "3e-4", "gpus": "8"}')
    rec = Recorder.from_env(tags={"gpus": "8xH200", "seed": 1}, install_handlers=False)
    rec.close()
    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest["run_id"] == "exp-9"
    # tags= in code wins key by key over TLOG_TAGS
    assert {"lr": "3e-4", "gpus": "8xH200", "seed": 1}.items() <= manifest["tags"].items()
    other = tmp_path / "other"
    rec = Recorder.from_env(other, run_id="mine", install_handlers=False)
    rec.close()
    assert json.loads((other / "run.json").read_text())["run_id"] == "mine"


@pytest.mark.parametrize("text", ["lr=3e-4", "[1, 2]", '"x"', "{"])
def test_bad_tlog_tags_names_the_variable(text, clean_env) -> None:
    clean_env.setenv("TLOG_TAGS", text)
    with pytest.raises(ValueError, match=r"TLOG_TAGS=.* is not a JSON object"):
        Recorder.from_env()


def _fake_repo(root: Path, sha: str, packed: bool) -> None:
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/perf/swa\n")
    if packed:
        (git / "packed-refs").write_text(f"# pack-refs\n{sha} refs/heads/perf/swa\n")
    else:
        (git / "refs" / "heads" / "perf").mkdir()
        (git / "refs" / "heads" / "perf" / "swa").write_text(sha + "\n")


@pytest.mark.parametrize("packed", [False, True])
def test_git_info_reads_loose_and_packed_refs(tmp_path, packed) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    _fake_repo(tmp_path, sha, packed)
    (tmp_path / "src" / "deep").mkdir(parents=True)
    assert git_info(tmp_path / "src" / "deep") == {"git_branch": "perf/swa", "git_sha": sha}


def test_git_info_detached_head_and_no_repo(tmp_path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / ".git" / "HEAD").write_text("89abcdef\n")
    assert git_info(tmp_path / "repo") == {"git_sha": "89abcdef"}
    assert git_info(Path("/")) == {}


MANIFEST_CHILD = """
import json, sys
from dflash_runtime import Recorder
rec = Recorder(sys.argv[1], stage="target", rank=0, world_size=4, run_id="exp-7",
               tags={"gpus": "8xH200"}, config={"block_size": 16},
               phase_kinds={"hs_get": "starvation"})
second = Recorder(sys.argv[1], stage="drafter", rank=0, world_size=4, run_id="other")
rec.close(); second.close()
print(json.dumps({"torch_imported": "torch" in sys.modules}))
"""


def test_rank0_writes_run_json_with_tags_without_importing_torch(tmp_path) -> None:
    sha = "fedcba9876543210fedcba9876543210fedcba98"
    _fake_repo(tmp_path, sha, packed=False)
    run = tmp_path / "runs" / "exp-7"
    done = subprocess.run([sys.executable, "-c", MANIFEST_CHILD, str(run)], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"torch_imported": False}
    manifest = json.loads((run / "run.json").read_text())
    tags = manifest.pop("tags")
    assert manifest == {"v": 1, "run_id": "exp-7", "started": manifest["started"],
                        "world_size": 4, "config": {"block_size": 16},
                        "phase_kinds": {"hs_get": "starvation"}}
    assert tags["git_sha"] == sha and tags["git_branch"] == "perf/swa"
    assert tags["gpus"] == "8xH200"
    try:
        from importlib.metadata import version

        expected_torch = version("torch")
    except Exception:  # noqa: BLE001 - torch not installed: no tag
        expected_torch = None
    assert tags.get("torch") == expected_torch
    assert sorted(p.name for p in run.iterdir()) == [
        "rank0.drafter.jsonl", "rank0.target.jsonl", "run.json"]  # first manifest kept
