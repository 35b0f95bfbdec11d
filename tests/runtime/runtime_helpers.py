"""Helpers of the runtime-shim tests (a module name unique across tests/: pytest puts
each test directory on sys.path, so a shared name like ``conftest`` would clash)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

#: The repository root: what a child script's PYTHONPATH holds.
ROOT = Path(__file__).resolve().parents[2]

#: Wall-clock time the fake clock pairs with perf_counter 0.0 (epoch seconds).
WALL0 = 1_700_000_000.0


class FakeClock:
    """A ``perf_counter`` stand-in: returns ``t``; with ``step`` it advances per call."""

    def __init__(self, t: float = 0.0, step: float = 0.0) -> None:
        self.t = t
        self.step = step
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        t = self.t
        self.t += self.step
        return t


def read_lines(path: Path) -> list[dict]:
    """Every line of a JSONL file, parsed (fails on a bad line)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def records(path: Path, kind: str = "iter") -> list[dict]:
    """The records of one ``type`` in a shim file."""
    return [r for r in read_lines(path) if r.get("type") == kind]


def run_child(code: str, *args: str, wait: bool = True, timeout: float = 60, **kw):
    """Run ``code`` (dedented) in a fresh interpreter with the repository importable;
    ``args`` are its ``sys.argv[1:]``. ``wait``: the ``CompletedProcess`` (text
    output captured, ``timeout`` seconds, ``TimeoutExpired`` past it); else the
    running ``Popen`` with pipes."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    if wait:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False, **kw)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)
