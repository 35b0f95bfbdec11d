"""``dflash_runtime.manifest``: git facts read from files, the automatic tags, and
``run.json`` created once (a repository laid out by hand in a temporary folder)."""

from __future__ import annotations

import json
import platform
import socket
from pathlib import Path

import pytest

from dflash_runtime import manifest

SHA = "0123456789abcdef0123456789abcdef01234567"


def _repo(root: Path, head: str, refs: dict[str, str] | None = None,
          packed: str | None = None) -> Path:
    git = root / ".git"
    git.mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    for ref, sha in (refs or {}).items():
        (git / ref).parent.mkdir(parents=True, exist_ok=True)
        (git / ref).write_text(sha + "\n")
    if packed is not None:
        (git / "packed-refs").write_text(packed)
    return root


def test_a_branch_from_a_loose_ref_found_from_a_subfolder(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "r", "ref: refs/heads/main", {"refs/heads/main": SHA})
    (repo / "src" / "deep").mkdir(parents=True)
    assert manifest.git_info(repo / "src" / "deep") == {"git_branch": "main", "git_sha": SHA}


def test_a_packed_ref_and_a_detached_head(tmp_path: Path) -> None:
    packed = f"# pack-refs with: peeled\n{SHA} refs/heads/feature/x\n"
    repo = _repo(tmp_path / "p", "ref: refs/heads/feature/x", packed=packed)
    assert manifest.git_info(repo) == {"git_branch": "feature/x", "git_sha": SHA}
    assert manifest.git_info(_repo(tmp_path / "d", SHA)) == {"git_sha": SHA}


def test_a_worktree_follows_its_git_file_to_the_common_refs(tmp_path: Path) -> None:
    main = _repo(tmp_path / "main", "ref: refs/heads/main", {"refs/heads/wt": SHA})
    gitdir = main / ".git" / "worktrees" / "wt"
    gitdir.mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/wt\n")
    (gitdir / "commondir").write_text("../..\n")
    wt = tmp_path / "wt"
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {gitdir}\n")
    assert manifest.git_info(wt) == {"git_branch": "wt", "git_sha": SHA}


def test_outside_a_repository_or_a_strange_git_file(tmp_path: Path) -> None:
    # pytest's temporary folders lie outside any repository
    assert manifest.git_info(tmp_path) == {}
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / ".git").write_text("not a gitdir line\n")
    assert manifest.git_info(odd) == {}


def test_auto_tags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(manifest, "git_info", lambda start=None: {"git_sha": SHA})
    monkeypatch.setattr(manifest, "torch_version", lambda: "2.13.0+cpu")
    assert manifest.auto_tags() == {"git_sha": SHA, "torch": "2.13.0+cpu",
                                    "python": platform.python_version(),
                                    "host": socket.gethostname()}
    monkeypatch.setattr(manifest, "torch_version", lambda: None)
    assert "torch" not in manifest.auto_tags()


def test_torch_version_reads_an_imported_torch_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="9.9.9"))
    assert manifest.torch_version() == "9.9.9"


def test_write_manifest_creates_run_json_once(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setattr(manifest, "auto_tags", lambda: {"host": "h", "python": "3.11"})
    assert manifest.write_manifest(tmp_path, {"v": 1, "run_id": "r1", "name": None,
                                              "tags": {"host": "mine", "gpus": 8}})
    written = json.loads((tmp_path / "run.json").read_text())
    # None fields left out; the caller's tags win over the automatic ones
    assert written == {"v": 1, "run_id": "r1", "tags": {"host": "mine", "python": "3.11",
                                                        "gpus": 8}}
    # a second writer (another stage's rank 0) leaves the first one's manifest
    assert not manifest.write_manifest(tmp_path, {"v": 1, "run_id": "r2"})
    assert json.loads((tmp_path / "run.json").read_text())["run_id"] == "r1"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]      # no temporary left
    with pytest.raises(OSError):
        manifest.write_manifest(tmp_path / "missing", {"v": 1})
