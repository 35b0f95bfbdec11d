"""A real lockstep job written by the shim, with a straggler that starts mid-run.

``python -m benchmarks.live_job RUN_DIR --ranks 3 [--slow-rank 1 --onset-step K
--extra-ms 40] [--seconds 60]``: ``--ranks`` processes (``multiprocessing``,
spawned), each with its own :class:`dflash_runtime.Recorder` (stage ``train``,
flushing every 0.5 s), run the same loop: ``data_wait`` (sleeps
:data:`DATA_S`), ``forward`` (:data:`FORWARD_S`), ``backward``
(:data:`BACKWARD_S`, then a ``multiprocessing.Barrier``: every rank leaves
it when the last arrives, as from a gradient all-reduce), ``optimizer``
(:data:`OPTIMIZER_S`). From step ``--onset-step`` on, rank ``--slow-rank``
sleeps ``--extra-ms`` more in ``forward``; when it starts that step it
writes ``onset.json`` beside the run directory (``{"step", "wall"}``: its
own ``time.time()``), the truth the live tests and the benchmark measure
time-to-detect from. Without ``--onset-step`` the job is healthy. It stops
after ``--seconds`` or when a file ``stop`` appears beside the run
directory (rank 0 decides, every rank ends at the same step).

The module also holds :func:`time_to_detect`, the benchmark's live suite
(``benchmarks/bench_accuracy.py``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: Seconds each rank sleeps per step in each phase (a 55 ms step). Source:
#: tlog's choice: short steps so that half a minute holds hundreds.
DATA_S = 0.005
FORWARD_S = 0.020
BACKWARD_S = 0.025
OPTIMIZER_S = 0.005
#: Longest wait at the barrier (seconds): a rank that died must not hang the others.
BARRIER_TIMEOUT_S = 30.0


def _rank(rank: int, world: int, run_dir: str, run_id: str, barrier, stop_at, deadline: float,
          slow_rank: int | None, onset_step: int | None, extra_s: float) -> None:
    from dflash_runtime import Recorder

    rec = Recorder(run_dir, stage="train", rank=rank, world_size=world, flush_interval=0.5,
                   run_id=run_id, tags={"bench": "live"})
    stop_file = Path(run_dir).parent / f"{Path(run_dir).name}.stop"
    step = 0
    try:
        while step < stop_at.value:
            slow = slow_rank == rank and onset_step is not None and step >= onset_step
            if slow and step == onset_step:
                onset = Path(run_dir).parent / f"{Path(run_dir).name}.onset.json"
                tmp = onset.with_suffix(".tmp")
                tmp.write_text(json.dumps({"step": step, "wall": time.time()}))
                os.replace(tmp, onset)
            with rec.iteration(samples=8) as it:
                with it.phase("data_wait"):
                    time.sleep(DATA_S)
                with it.phase("forward"):
                    time.sleep(FORWARD_S + (extra_s if slow else 0.0))
                with it.phase("backward"):
                    time.sleep(BACKWARD_S)
                    # rank 0 decides the last step before the barrier: every rank
                    # reads it after the barrier, so all stop at the same step
                    if rank == 0 and (time.time() > deadline or stop_file.exists()):
                        stop_at.value = step + 1
                    barrier.wait(BARRIER_TIMEOUT_S)
                with it.phase("optimizer"):
                    time.sleep(OPTIMIZER_S)
            step += 1
    finally:
        rec.close()


def main(argv: list[str] | None = None) -> int:
    """Run the job (module docstring); exit 0 when every rank ended cleanly."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.live_job")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--onset-step", type=int, default=None,
                    help="the step from which --slow-rank straggles (default: healthy)")
    ap.add_argument("--extra-ms", type=float, default=40.0)
    args = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.ranks)
    stop_at = ctx.Value("q", 2**62)
    deadline = time.time() + args.seconds
    run_id = args.run_id or args.run_dir.name
    procs = [ctx.Process(target=_rank, args=(r, args.ranks, str(args.run_dir), run_id, barrier,
                                             stop_at, deadline, args.slow_rank,
                                             args.onset_step, args.extra_ms / 1e3))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return 0 if all(p.exitcode == 0 for p in procs) else 1


def start(run_dir: Path, *, ranks: int = 3, onset_step: int | None = None,
          seconds: float = 60.0, extra_ms: float = 40.0, log: Path | None = None
          ) -> subprocess.Popen:
    """Start the job as a child process (this interpreter, the repository on its path)."""
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "benchmarks.live_job", str(run_dir), "--ranks", str(ranks),
           "--seconds", str(seconds), "--extra-ms", str(extra_ms)]
    if onset_step is not None:
        cmd += ["--onset-step", str(onset_step)]
    out = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, env=env)


def onset_of(run_dir: Path) -> dict | None:
    """The ``onset.json`` the slow rank wrote (``{"step", "wall"}``), or None yet."""
    try:
        return json.loads((run_dir.parent / f"{run_dir.name}.onset.json").read_text())
    except (OSError, ValueError):
        return None


def flagged(served, run_id: str) -> list[int]:
    """The ranks ``GET /api/runs/RUN/live`` names stragglers now ([] also
    before the run's first iterations are in)."""
    status, _, body = served.get(f"/api/runs/{run_id}/live")
    if status != 200:
        return []
    return [s["rank"] for s in json.loads(body)["stragglers"]]


def time_to_detect(tmp: Path, *, runs: int = 3, ranks: int = 3, healthy_s: float = 30.0,
                   limit_s: float = 45.0) -> dict:
    """Seconds from each straggler's onset (its own clock) until the live API
    of a real ``tlog serve`` (default ingest interval) names it: ``runs``
    straggler jobs and one healthy job at once, each straggler starting
    after about ``healthy_s`` seconds of healthy steps (a full window of
    them), polled every 0.25 s for at most ``limit_s`` after the onset.
    Returns ``{"ttd": [seconds or None per run], "false_flags": [...]}``:
    ``(run, rank)`` flagged that was not the straggler after its onset (any
    flag before it, and the healthy job's, included)."""
    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tests.serve.served import start_service

    tmp.mkdir(parents=True, exist_ok=True)
    served = start_service(tmp, interval=2.0)
    step_s = DATA_S + FORWARD_S + BACKWARD_S + OPTIMIZER_S
    onset_step = int(healthy_s / step_s)
    seconds = healthy_s * 1.6 + limit_s
    jobs = {f"slow-{k}": start(served.runs / f"slow-{k}", ranks=ranks, onset_step=onset_step,
                               seconds=seconds, log=tmp / f"slow-{k}.log")
            for k in range(runs)}
    jobs["healthy"] = start(served.runs / "healthy", ranks=ranks, seconds=seconds,
                            log=tmp / "healthy.log")
    ttd: dict[str, float | None] = {k: None for k in jobs if k != "healthy"}
    false_flags: list[tuple[str, int]] = []
    try:
        while True:
            now = time.time()
            onsets = {k: onset_of(served.runs / k) for k in ttd}
            for k, o in onsets.items():
                if o is None:               # before its onset, any flag is false
                    false_flags += [(k, r) for r in flagged(served, k)]
                    continue
                if ttd[k] is not None or now - o["wall"] > limit_s:
                    continue
                named = flagged(served, k)
                if 1 in named:
                    ttd[k] = time.time() - o["wall"]
                false_flags += [(k, r) for r in named if r != 1]
            false_flags += [("healthy", r) for r in flagged(served, "healthy")]
            done = all(o is not None and (ttd[k] is not None or now - o["wall"] > limit_s)
                       for k, o in onsets.items())
            if done or any(p.poll() is not None for p in jobs.values()):
                break
            time.sleep(0.25)
    finally:
        for k in jobs:
            (served.runs / f"{k}.stop").touch()
        for p in jobs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        served.stop()
    return {"ttd": list(ttd.values()), "false_flags": sorted(set(false_flags)),
            "limit_s": limit_s}


def summary_line(result: dict) -> str:
    """One line: median and max time-to-detect, misses, false flags."""
    got = [t for t in result["ttd"] if t is not None]
    miss = len(result["ttd"]) - len(got)
    if not got:
        return (f"  time to detect: none of {len(result['ttd'])} stragglers flagged within "
                f"{result['limit_s']:.0f} s MISS")
    worst = max(got) if not miss else float("inf")
    ok = worst <= 30.0 and not result["false_flags"]
    return (f"  time to detect: median {statistics.median(got):.1f} s, max "
            f"{max(got):.1f} s over {len(got)} runs"
            + (f", {miss} not flagged within {result['limit_s']:.0f} s" if miss else "")
            + f"; false flags {len(result['false_flags'])} (budget: every straggler within "
              f"30 s, none on healthy ranks) {'ok' if ok else 'MISS'}")


if __name__ == "__main__":
    sys.exit(main())
