"""Helpers of the framework-integration tests: a slow dataset and a loader timed with
bare timers, the truth they give, and the records a run wrote.

Importing it sets the offline and quiet environment (nothing is downloaded: models
are built from configs with random weights; no progress bars, no loggers).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from pathlib import Path

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true",
               "TRANSFORMERS_VERBOSITY": "error", "DISABLE_MLFLOW_INTEGRATION": "TRUE"}.items():
    os.environ.setdefault(_k, _v)


class SlowData:
    """A map-style dataset whose ``__getitem__`` sleeps ``sleep_s`` and records, with bare
    timers, when each call ran: ``spans`` (start, end) in ``time.perf_counter()``,
    ``walls`` the same in ``time.time()``."""

    def __init__(self, n: int, sleep_s: float, make) -> None:
        self.n = n
        self.sleep_s = sleep_s
        self.make = make
        self.spans: list[tuple[float, float]] = []
        self.walls: list[tuple[float, float]] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        w0, t0 = time.time(), time.perf_counter()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        item = self.make(i)
        self.spans.append((t0, time.perf_counter()))
        self.walls.append((w0, time.time()))
        return item


class TimedLoader:
    """Bare timer around a loader: ``spans`` (start, end) in ``time.perf_counter()`` of
    every ``next`` (the whole fetch: sampling, ``__getitem__``, collation)."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.spans: list[tuple[float, float]] = []

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        it = iter(self.loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.spans.append((t0, time.perf_counter()))
            yield batch


def fetch_share(spans: list[tuple[float, float]], ends: list[float],
                excluded: list[tuple[float, float]] = (),
                steps: Collection[int] | None = None) -> float:
    """Bare-timer truth: the share of the loop's time spent fetching (``spans``), over
    the cycles between consecutive step ends (``ends``; all ``perf_counter``; step
    ``k``'s cycle is ``(ends[k-1], ends[k]]``): fetch seconds inside them / their
    length, less the time an ``excluded`` span (an evaluation, which tlog records as
    an event between iterations) takes of the cycle. ``steps``: only those steps'
    cycles (the iterations tlog judged steady: with 12 steps a cycle more or less
    moved the share by several points on a loaded machine); else every cycle but the
    first (the loader's start-up)."""
    fetch = total = 0.0
    ks = range(2, len(ends)) if steps is None else sorted(k for k in steps if k >= 1)
    for lo, hi in ((ends[k - 1], ends[k]) for k in ks):
        total += hi - lo - sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in excluded)
        fetch += sum(min(b, hi) - max(a, lo) for a, b in spans if b > lo and a < hi)
    return fetch / total


def records(run_dir: Path) -> list[dict]:
    """Every record of the run's one JSONL file, in order."""
    (path,) = sorted(run_dir.glob("rank*.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def iterations(run_dir: Path) -> list[dict]:
    """The run's iteration records."""
    return [r for r in records(run_dir) if "iter" in r]


def events(run_dir: Path, name: str) -> list[dict]:
    """The run's event records named ``name``."""
    return [r for r in records(run_dir) if r.get("type") == "event" and r.get("name") == name]


