"""``run.json``: the run manifest rank 0 writes (docs/FORMAT.md "run.json").

Runs on the writer thread. Automatic tags, each only when it can be found:

- ``git_sha`` / ``git_branch``: read from the ``.git`` directory above the working
  directory (files only: no ``git`` subprocess is forked from a training process);
- ``torch``: ``torch.__version__`` if torch is imported, else the installed
  distribution's version from package metadata (torch is never imported here);
- ``python`` and ``host``.

The file is created with ``O_EXCL``: when several stages each have a rank 0, the first
one's manifest stays and the others leave it alone.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any


def git_info(start: str | os.PathLike | None = None) -> dict[str, str]:
    """``{"git_sha": ..., "git_branch": ...}`` of the repository containing ``start``.

    Reads ``.git/HEAD``, loose refs and ``packed-refs``; a ``.git`` file (worktrees,
    submodules) is followed. Returns ``{}`` outside a repository or on any read error.
    """
    try:
        here = Path(start or os.getcwd()).resolve()
        for d in (here, *here.parents):
            dot = d / ".git"
            if dot.is_file():
                text = dot.read_text().strip()
                if not text.startswith("gitdir:"):
                    return {}
                gitdir = (d / text.split(":", 1)[1].strip()).resolve()
            elif dot.is_dir():
                gitdir = dot
            else:
                continue
            return _read_head(gitdir)
    except OSError:
        return {}
    return {}


def _read_head(gitdir: Path) -> dict[str, str]:
    head = (gitdir / "HEAD").read_text().strip()
    if not head.startswith("ref:"):
        return {"git_sha": head} if head else {}
    ref = head.split(":", 1)[1].strip()
    out = {"git_branch": ref.removeprefix("refs/heads/")}
    common = gitdir
    commondir = gitdir / "commondir"
    if commondir.is_file():
        common = (gitdir / commondir.read_text().strip()).resolve()
    for base in (gitdir, common):
        loose = base / ref
        if loose.is_file():
            out["git_sha"] = loose.read_text().strip()
            return out
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref:
                out["git_sha"] = parts[0]
                break
    return out


def torch_version() -> str | None:
    """The torch version without importing torch, or ``None`` if it is not installed."""
    mod = sys.modules.get("torch")
    if mod is not None:
        return str(getattr(mod, "__version__", "")) or None
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("torch")
        except PackageNotFoundError:
            return None
    except Exception:  # noqa: BLE001 - broken metadata: leave the tag out
        return None


def auto_tags() -> dict[str, Any]:
    """The automatic tags (see the module docstring)."""
    tags: dict[str, Any] = dict(git_info())
    tv = torch_version()
    if tv:
        tags["torch"] = tv
    tags["python"] = platform.python_version()
    tags["host"] = socket.gethostname()
    return tags


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> bool:
    """Create ``run_dir/run.json`` from ``manifest`` unless it exists. Returns whether it wrote.

    ``None`` fields are left out; ``manifest["tags"]`` is merged over :func:`auto_tags`.
    Raises ``OSError`` if the directory is not writable (the caller warns and goes on).
    """
    out = {k: v for k, v in manifest.items() if v is not None and k != "tags"}
    tags = auto_tags()
    tags.update(manifest.get("tags") or {})
    out["tags"] = tags
    path = Path(run_dir) / "run.json"
    tmp = path.with_name(f".run.json.{os.getpid()}.tmp")
    data = (json.dumps(out, indent=2, default=str) + "\n").encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic create-if-absent with the full content
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
