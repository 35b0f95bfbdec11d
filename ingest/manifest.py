"""``run.json``: the optional manifest at the root of a run directory (SCHEMA.md).

All fields are optional::

    {"v": 1, "run_id": "dflash-2026-11-29-a", "name": "all-SWA drafter",
     "started": 1764403200.0, "world_size": 8,
     "tags": {"git_sha": "abc123"}, "config": {"block_size": 16},
     "phase_kinds": {"hs_get": "starvation"}}

Without a manifest (or without ``run_id`` in it) the run id is the name of the
run directory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest.categories import PHASE_CATEGORIES
from ingest.errors import RunDirError
from ingest.sources import MANIFEST

#: The format version this reader understands (SCHEMA.md: "it must keep reading version 1").
FORMAT_VERSION = 1


@dataclass
class Manifest:
    """The parsed ``run.json`` (``present`` False when the run has none)."""

    present: bool = False
    run_id: str | None = None
    name: str | None = None
    started: float | None = None
    world_size: int | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    phase_kinds: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


def read_manifest(root: Path) -> Manifest:
    """Read ``root/run.json`` if it exists.

    Raises:
        RunDirError: the manifest is not a JSON object, has a field of the wrong
            type, a ``phase_kinds`` value that is not a category, or a ``v``
            other than 1 -- naming the file and the field.
    """
    path = root / MANIFEST
    if not path.is_file():
        return Manifest()
    where = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        msg = f"{where}: not UTF-8 text; the manifest must be a JSON object"
        raise RunDirError(msg) from None
    except json.JSONDecodeError as exc:
        msg = f"{where}:{exc.lineno}: not valid JSON ({exc.msg}); fix or remove the manifest"
        raise RunDirError(msg) from None
    if not isinstance(data, dict):
        msg = f"{where}: the manifest must be a JSON object, not {type(data).__name__}"
        raise RunDirError(msg)

    def want(key: str, types: type | tuple[type, ...], what: str) -> Any:
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, types):
            msg = f"{where}: field '{key}' must be {what}, got {json.dumps(value)[:60]}"
            raise RunDirError(msg)
        return value

    version = want("v", int, "an integer")
    if version is not None and version != FORMAT_VERSION:
        msg = (f"{where}: unknown manifest version {version} (this tlog reads version "
               f"{FORMAT_VERSION}); upgrade tlog")
        raise RunDirError(msg)
    run_id = want("run_id", str, "a string")
    if run_id is not None and not run_id.strip():
        msg = f"{where}: field 'run_id' is empty; remove it to use the directory name"
        raise RunDirError(msg)
    started = want("started", (int, float), "a number (epoch seconds)")
    if started is not None and not math.isfinite(started):
        msg = f"{where}: field 'started' must be a finite number of epoch seconds"
        raise RunDirError(msg)
    world_size = want("world_size", int, "a positive integer")
    if world_size is not None and world_size < 1:
        msg = f"{where}: field 'world_size' must be a positive integer, got {world_size}"
        raise RunDirError(msg)
    kinds = want("phase_kinds", dict, "an object of phase name -> category") or {}
    for phase, category in kinds.items():
        if category not in PHASE_CATEGORIES:
            msg = (f"{where}: phase_kinds['{phase}'] = {json.dumps(category)} is not a category; "
                   f"use one of {', '.join(sorted(PHASE_CATEGORIES))}")
            raise RunDirError(msg)
    return Manifest(
        present=True,
        run_id=run_id,
        name=want("name", str, "a string"),
        started=float(started) if started is not None else None,
        world_size=world_size,
        tags=want("tags", dict, "an object") or {},
        config=want("config", dict, "an object") or {},
        phase_kinds=dict(kinds),
        raw=data,
    )
