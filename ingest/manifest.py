"""``run.json``: the optional manifest at the root of a run directory (docs/FORMAT.md).

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
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlog.ingest.errors import RunDirError
from tlog.ingest.sources import MANIFEST

from dflash_runtime.format import (
    FORMAT_VERSION,
    INT32_MAX,
    MAX_EPOCH_S,
    PHASE_CATEGORIES,
)

#: Longest run id accepted (characters). Source: ``ingest.run``'s own limit
#: (512); a run id names a report folder and an export partition, and file
#: names are limited to 255 bytes on most file systems, so it is a name, not a text.
RUN_ID_MAX_CHARS = 512

#: ``(upper bound, unit)``: a timestamp past :data:`MAX_EPOCH_S` below the bound
#: looks written in that unit.
_EPOCH_UNITS = ((1e14, "milliseconds"), (1e17, "microseconds"), (1e20, "nanoseconds"))


def epoch_problem(value: float) -> str | None:
    """What is wrong with ``value`` as a wall-clock timestamp (epoch seconds):
    ``"negative"``, ``"looks like milliseconds"`` (micro-, nanoseconds),
    ``"out of range"``, or ``None`` when it is in ``[0, MAX_EPOCH_S)``. The
    SQL of ``tlog.ingest.parse_sql`` applies the same rule to ``ts``."""
    if not math.isfinite(value):
        return "not finite"
    if value < 0:
        return "negative"
    if value < MAX_EPOCH_S:
        return None
    for bound, unit in _EPOCH_UNITS:
        if value < bound:
            return f"looks like {unit}"
    return "out of range"


def run_id_problem(run_id: str) -> str | None:
    """What is wrong with ``run_id`` as a run id, or ``None`` when it is fine.

    A run id must hold a non-blank character, at most :data:`RUN_ID_MAX_CHARS`
    characters and no control characters (a line break or an escape would break
    every one-line output that names the run).
    """
    if not run_id.strip():
        return "is empty"
    if len(run_id) > RUN_ID_MAX_CHARS:
        return f"is {len(run_id):,} characters long (at most {RUN_ID_MAX_CHARS})"
    for pos, char in enumerate(run_id):
        if unicodedata.category(char) == "Cc":
            return f"holds the control character {char!r} at position {pos + 1}"
    return None


def _started_problem(value: float) -> str | None:
    try:
        return epoch_problem(float(value))
    except OverflowError:          # an integer of 400 digits
        return "out of range"


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: an object with a key twice is an error (as in records)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"duplicate key {key!r}")
        data[key] = value
    return data


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
    #: things in run.json that were ignored (e.g. an implausible ``started``)
    warnings: list[str] = field(default_factory=list)

    @property
    def gives_phase_kinds(self) -> bool:
        """Whether this manifest decides the run's ``phase_kinds`` (a run.json,
        even one without them, or kinds given in code); else the database keeps
        what an earlier ingest stored."""
        return self.present or bool(self.phase_kinds)


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
        # utf-8-sig: a byte-order mark (some editors write one) is not an error.
        text = path.read_text(encoding="utf-8-sig")
        data = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except UnicodeDecodeError:
        msg = f"{where}: not UTF-8 text; the manifest must be a JSON object"
        raise RunDirError(msg) from None
    except OSError as exc:
        msg = f"{where}: cannot read the manifest: {exc.strerror or exc}"
        raise RunDirError(msg) from None
    except json.JSONDecodeError as exc:
        msg = f"{where}:{exc.lineno}: not valid JSON ({exc.msg}); fix or remove the manifest"
        raise RunDirError(msg) from None
    except ValueError as exc:  # a duplicate key (the hook), or an absurdly long number
        msg = f"{where}: not valid JSON ({exc}); fix or remove the manifest"
        raise RunDirError(msg) from None
    except RecursionError:
        msg = f"{where}: not valid JSON (nested too deeply); fix or remove the manifest"
        raise RunDirError(msg) from None
    if not isinstance(data, dict):
        msg = f"{where}: the manifest must be a JSON object, not {type(data).__name__}"
        raise RunDirError(msg)
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:   # "\ud800": valid JSON, not text
        bad = exc.object[exc.start:exc.end].encode("unicode_escape").decode()
        msg = (f"{where}: a string holds {bad}, half of a UTF-16 pair (not a character); "
               f"fix the manifest")
        raise RunDirError(msg) from None

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
    if run_id is not None and (problem := run_id_problem(run_id)):
        msg = f"{where}: field 'run_id' {problem}; fix it, or remove it to use the directory name"
        raise RunDirError(msg)
    started = want("started", (int, float), "a number (epoch seconds)")
    warnings = []
    if started is not None and (problem := _started_problem(started)) is not None:
        warnings.append(f"{where}: field 'started' ({started!r}) {problem} for epoch seconds "
                        f"(at most {MAX_EPOCH_S:.0e}); ignored, the earliest iteration ts is used")
        started = None
    world_size = want("world_size", int, "a positive integer")
    if world_size is not None and not 1 <= world_size <= INT32_MAX:
        msg = (f"{where}: field 'world_size' must be a positive integer up to {INT32_MAX}, "
               f"got {world_size}")
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
        warnings=warnings,
    )
