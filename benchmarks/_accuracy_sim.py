"""Simulated lockstep data-parallel runs with an injected fault, written as the shim writes.

The detection benchmark (``benchmarks/bench_accuracy.py``) runs tlog on these.
Each rank ``r`` of step ``i`` does, in order: ``data_wait`` (its loader,
starvation), ``forward``, the own part of ``backward``, then joins the
gradient all-reduce that ends ``backward`` (DDP's place for it), then
``optimizer``. The all-reduce releases every rank at the slowest arrival
plus the transfer time ``c`` of that step plus a per-rank exit jitter (the
moment each process runs again). Each phase's seconds are the profile's
mean times the profile's measured relative deviation of one real step
(:mod:`benchmarks._noise_profiles`), drawn per rank in blocks of
consecutive steps, so the noise is the measured one, its tails included.

A fault on rank ``f`` from step ``onset`` on (sizes are fractions of the
profile's healthy step time ``step_s``):

- ``input``: its ``data_wait`` grows by ``size * step_s`` (a slow loader);
- ``compute``: its ``forward`` grows by ``size * step_s``;
- ``comm``: its side of the all-reduce takes ``size * step_s`` longer (a
  slow link or NIC, a starved communication thread): it joins the
  collective that much later than its own arrival, inside ``backward``, so
  its peers wait for it there. In ``measured`` mode the shim's measured
  wait (``backward/ddp_allreduce_wait``, from the last bucket ready to the
  collective's end) holds it, as it would on a real rank.

The lines are made by the shim's own serialiser
(:func:`dflash_runtime.writer._iter_record` on the raw log a recorder
would have kept for those timings, and ``_dumps``), and ``run.json`` by
:func:`dflash_runtime.manifest.write_manifest`, so ingest reads exactly
what a recorder writes. The truth (which rank, which step, the gain of
removing the fault) comes from this construction alone: :func:`true_gain`
re-runs the same steps with the fault removed and the same noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dflash_runtime import writer as shim_writer
from dflash_runtime.format import FORMAT_VERSION
from dflash_runtime.manifest import write_manifest

PHASES = ("data_wait", "forward", "backward", "optimizer")
FAULT_CLASSES = ("input", "compute", "comm")
#: Where each fault class adds its seconds: the index in the own-work array
#: (data_wait, forward, backward own part, optimizer); ``comm`` adds to the
#: rank's side of the collective instead (module docstring).
FAULT_PHASE = {"input": 0, "compute": 1}
#: Exit jitter of the collective: each rank resumes up to this many seconds
#: after the release (the scheduler). Source: tlog's choice, as the tests'
#: lockstep model (tests/diagnosis/lockstep_sim.py) uses.
EXIT_JITTER_S = 50e-6
#: Epoch seconds of a simulated run's first step (2026-12-07 00:00 UTC).
T0 = 1796601600.0


@dataclass(frozen=True)
class Profile:
    """A measured noise profile (:mod:`benchmarks._noise_profiles`).

    Attributes:
        name: its key.
        source: where it was measured (file, run, command).
        means_s: mean seconds of data_wait, forward, backward own part,
            optimizer, and the collective's transfer ``c``.
        series: per measured rank, (steps, 5) relative deviations of one
            step's seconds from that rank's median, in the order of ``means_s``.
    """

    name: str
    source: str
    means_s: tuple[float, float, float, float, float]
    series: tuple[np.ndarray, ...]

    @property
    def step_s(self) -> float:
        """The healthy step's seconds by the means: own work plus the transfer."""
        return float(sum(self.means_s))


@dataclass
class Injection:
    """What was injected into one simulated run (the truth).

    ``fault`` is None for a healthy run; then ``rank``, ``onset`` and
    ``size`` are None too. ``extra_s``: seconds added per faulty step.
    """

    fault: str | None
    rank: int | None
    onset: int | None
    size: float | None
    extra_s: float = 0.0


@dataclass
class SimRun:
    """One simulated run: its timings and the truth."""

    world: int
    steps: int
    own: np.ndarray          # (R, n, 4) own seconds: data_wait, forward, backward own, optimizer
    comm_extra: np.ndarray   # (R, n) seconds a rank's side of the collective took longer
    c: np.ndarray            # (n,) transfer seconds of each step's collective
    exit_jitter: np.ndarray  # (R, n)
    injection: Injection


def _draw(profile: Profile, world: int, steps: int, rng: np.random.Generator,
          block: int) -> np.ndarray:
    """(world, steps, 5) relative deviations: each rank reads blocks of
    ``block`` consecutive measured steps from a measured rank and offset drawn
    at random (a moving-block bootstrap: the measured tails and runs of slow
    steps stay as they were); from a series shorter than ``5 * block`` steps,
    single steps (its few steps repeated in order would make every rank's
    noise periodic)."""
    out = np.empty((world, steps, 5))
    for r in range(world):
        filled = 0
        while filled < steps:
            s = profile.series[int(rng.integers(len(profile.series)))]
            b = min(block if len(s) >= 5 * block else 1, steps - filled)
            at = int(rng.integers(len(s) - b + 1))
            out[r, filled:filled + b] = s[at:at + b]
            filled += b
    return out


def simulate(profile: Profile, world: int, *, steps: int, fault: str | None, size: float,
             seed: int, onset_share: float = 0.5, block: int = 10) -> SimRun:
    """Simulate one run of ``world`` ranks and ``steps`` steps with noise from
    ``profile``; ``fault`` (one of :data:`FAULT_CLASSES`, or None: healthy) of
    ``size`` (a fraction of the healthy step) on a rank drawn at random, from a
    step drawn uniformly in ``[0, onset_share * steps]`` (so the fault holds
    at least the rest of the run). Everything is drawn from ``seed``."""
    if fault is not None and fault not in FAULT_CLASSES:
        raise ValueError(f"fault must be one of {FAULT_CLASSES} or None, got {fault!r}")
    rng = np.random.default_rng(seed)
    dev = _draw(profile, world, steps, rng, block)
    means = np.asarray(profile.means_s)
    scaled = np.maximum(dev * means, 0.0)
    own = scaled[:, :, :4].copy()
    c = np.median(scaled[:, :, 4], axis=0)       # one transfer per step, every rank alike
    comm_extra = np.zeros((world, steps))
    inj = Injection(fault=None, rank=None, onset=None, size=None)
    if fault is not None:
        rank = int(rng.integers(world))
        onset = int(rng.integers(int(onset_share * steps) + 1))
        extra = size * profile.step_s
        if fault == "comm":
            comm_extra[rank, onset:] += extra
        else:
            own[rank, onset:, FAULT_PHASE[fault]] += extra
        inj = Injection(fault=fault, rank=rank, onset=onset, size=size, extra_s=extra)
    jitter = rng.uniform(0.0, EXIT_JITTER_S, (world, steps))
    return SimRun(world=world, steps=steps, own=own, comm_extra=comm_extra, c=c,
                  exit_jitter=jitter, injection=inj)


def timeline(own: np.ndarray, comm_extra: np.ndarray, c: np.ndarray,
             exit_jitter: np.ndarray) -> dict[str, np.ndarray]:
    """Run the lockstep loop; (R, n) arrays of seconds from the run's start:
    ``start``, ``ready`` (own backward done: its last bucket ready),
    ``joined`` (its side of the collective done: ``ready`` + its comm
    extra), ``release`` and ``end``."""
    r, n, _ = own.shape
    out = {k: np.zeros((r, n)) for k in ("start", "ready", "joined", "release", "end")}
    t = np.zeros(r)
    for i in range(n):
        out["start"][:, i] = t
        out["ready"][:, i] = t + own[:, i, 0] + own[:, i, 1] + own[:, i, 2]
        out["joined"][:, i] = out["ready"][:, i] + comm_extra[:, i]
        out["release"][:, i] = out["joined"][:, i].max() + c[i] + exit_jitter[:, i]
        out["end"][:, i] = out["release"][:, i] + own[:, i, 3]
        t = out["end"][:, i]
    return out


def total_s(run: SimRun, *, fixed: bool = False, since: int = 0) -> float:
    """Wall seconds of steps ``since`` to the end (the first of them starting
    to the last ending), without exit jitter; ``fixed``: with the injected
    fault removed (the same noise otherwise)."""
    own, extra = run.own, run.comm_extra
    inj = run.injection
    if fixed and inj.fault is not None:
        own = own.copy()
        extra = np.zeros_like(extra)
        if inj.fault in FAULT_PHASE:
            own[inj.rank, inj.onset:, FAULT_PHASE[inj.fault]] -= inj.extra_s
    tl = timeline(own, extra, run.c, np.zeros_like(run.exit_jitter))
    return float(tl["end"].max() - tl["start"][:, since].min())


def true_gain(run: SimRun) -> float | None:
    """Throughput gain (new / old - 1) of removing the injected fault while it
    lasts, by the construction: the wall time of the steps from its onset on,
    over the same steps without it (the same noise). What fixing it buys from
    then on; None for a healthy run."""
    inj = run.injection
    if inj.fault is None:
        return None
    return total_s(run, since=inj.onset) / total_s(run, fixed=True, since=inj.onset) - 1


class _Rounds:
    """A measured-wait source for the shim's serialiser (what
    ``dflash_runtime.collectives.CollectiveSlot`` gives it): the all-reduce
    of this iteration, from the last bucket ready to its end."""

    finished = True

    def __init__(self, ready: float, done: float) -> None:
        self._rounds = [(ready, done, None)]

    def take(self, t0: float, t1: float) -> list:
        return self._rounds


def write_run(run: SimRun, run_dir: Path, *, run_id: str, measured: bool = False,
              tags: dict | None = None) -> None:
    """Write the run as the shim would: ``run.json`` and one
    ``rank{r}.train.jsonl`` per rank (a ``meta`` line, then one ``iter`` line
    per step, by the shim's serialiser). ``measured``: each step carries the
    shim's measured all-reduce wait (``rec.watch_ddp``); else the waits are
    left for tlog to infer from the ranks' alignment."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tl = timeline(run.own, run.comm_extra, run.c, run.exit_jitter)
    write_manifest(run_dir, {"v": FORMAT_VERSION, "run_id": run_id, "started": T0,
                             "world_size": run.world, "tags": dict(tags or {})})
    for r in range(run.world):
        meta = {"type": "meta", "v": FORMAT_VERSION, "rank": r, "stage": "train",
                "worker": f"train-{r}", "host": f"node-{r // 8}", "pid": 1000 + r,
                "world_size": run.world, "clock": {"wall": T0, "mono": 0.0}}
        lines = [shim_writer._dumps(meta)]
        for i in range(run.steps):
            t0 = tl["start"][r, i]
            t_data = t0 + run.own[r, i, 0]
            t_fwd = t_data + run.own[r, i, 1]
            t_bwd = tl["release"][r, i]
            t1 = tl["end"][r, i]
            # The raw log a recorder keeps: laps (name, end time) from t0.
            log = ["data_wait", t_data, "forward", t_fwd, "backward", t_bwd, "optimizer", t1]
            own_cpu = run.own[r, i, 1] + run.own[r, i, 2] + run.own[r, i, 3]
            item = (shim_writer._ITER, i, t0, t1, own_cpu, log, 0, len(log), None, None,
                    None, None, None, None)
            # the collective ends before backward returns (the rank resumes after it)
            done = min(t_bwd - run.exit_jitter[r, i], t_bwd - 1e-7)
            coll = _Rounds(tl["ready"][r, i], done) if measured else None
            rec, _ = shim_writer._iter_record(item, T0, coll)
            lines.append(shim_writer._dumps(rec))
        (run_dir / f"rank{r}.train.jsonl").write_text("".join(lines), encoding="utf-8")
