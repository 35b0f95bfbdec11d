"""Write the scenario run folders of the diagnosis suite (deterministic).

Run from the repository root: ``python tests/scenarios/make_scenarios.py``.
Each scenario is ``tests/scenarios/<name>/run/`` (v1 JSONL files, one per
worker, and a ``run.json``); its ``expected.json`` beside ``run/`` is written
by hand (the arithmetic is in its ``why`` field), never by this script or by
the code under test. Every duration is a round number of milliseconds so the
expected figures can be checked with pencil and paper.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
T0 = 1764403200.0

Phases = list[tuple[str, float] | tuple[str, float, float]]


def worker_file(run: Path, *, stage: str, rank: int, n: int, phases: Callable[[int], Phases],
                dur: Callable[[int], float] | None = None, extra: Callable[[int], dict] | None = None,
                t0: float = T0) -> None:
    """Write ``rank{rank}.{stage}.jsonl``: a meta line, then ``n`` iterations.

    ``dur`` defaults to the sum of the top-level host times; ``ts`` runs on
    back to back from ``t0``.
    """
    lines = [{"type": "meta", "v": 1, "rank": rank, "stage": stage, "worker": f"{stage}-{rank}",
              "host": "node-0", "pid": 1000 + rank, "clock": {"wall": t0, "mono": 100.0}}]
    ts = t0
    for i in range(n):
        ph = phases(i)
        host = {p[0]: round(p[1], 6) for p in ph}
        gpu = {p[0]: round(p[2], 6) for p in ph if len(p) > 2}
        d = round(dur(i) if dur else sum(p[1] for p in ph if "/" not in p[0]), 6)
        rec = {"iter": i, "ts": round(ts, 6), "dur": d, "phases": host}
        if gpu:
            rec["gpu"] = gpu
        if extra:
            rec.update(extra(i))
        lines.append(rec)
        ts += d
    path = run / f"rank{rank}.{stage}.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        for rec in lines:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def append(run: Path, name: str, records: list[dict]) -> None:
    """Append extra records (queue samples, events) to ``name`` in ``run``."""
    with (run / name).open("a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def fresh(name: str, **manifest) -> Path:
    run = ROOT / name / "run"
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"v": 1, "run_id": name, **manifest}, indent=1) + "\n",
                                  encoding="utf-8")
    return run


def single_loop_starvation(loader: str) -> None:
    """A single loop that waits 40 ms of each 100 ms step in its loader."""
    run = fresh(f"starvation_{loader}")
    worker_file(run, stage="main", rank=0, n=40,
                phases=lambda i: [(loader, 0.040), ("forward", 0.020), ("backward", 0.030),
                                  ("optimizer", 0.010)],
                extra=lambda i: {"tokens": 4096})


def periodic_stalls() -> None:
    """The loader stalls 3 s every fourth iteration (i % 4 == 3)."""
    run = fresh("periodic_stalls")
    worker_file(run, stage="main", rank=0, n=60,
                phases=lambda i: [("data_load", 3.010 if i % 4 == 3 else 0.010),
                                  ("forward", 0.040), ("backward", 0.050)])


def sync_loop(name: str, *, device: bool) -> None:
    """The worked example of docs/DIAGNOSIS.md (tests/diagnosis/test_attribution.py): host forward 30, backward 60, loss_item 45, optimizer 5 ms;
    with device times forward 55, backward 80, optimizer 4 ms."""
    run = fresh(name)

    def phases(i: int) -> Phases:
        if device:
            return [("forward", 0.030, 0.055), ("backward", 0.060, 0.080), ("loss_item", 0.045),
                    ("optimizer", 0.005, 0.004)]
        return [("forward", 0.030), ("backward", 0.060), ("loss_item", 0.045),
                ("optimizer", 0.005)]

    worker_file(run, stage="main", rank=0, n=40, phases=phases)


def pipeline(name: str, *, target: Phases, drafter: Phases, target_n: int, drafter_n: int,
             queue_depth: Callable[[int], int]) -> None:
    """One target worker feeding two drafter ranks through ``hs_queue`` (capacity 4)."""
    run = fresh(name, world_size=3)
    worker_file(run, stage="target", rank=0, n=target_n, phases=lambda i: target,
                extra=lambda i: {"tokens": 4096, "samples": 4})
    for rank in (1, 2):
        worker_file(run, stage="drafter", rank=rank, n=drafter_n, phases=lambda i: drafter,
                    extra=lambda i: {"tokens": 4096, "samples": 4})
    append(run, "rank0.target.jsonl",
           [{"type": "queue", "name": "hs_queue", "ts": T0 + 0.1 * j, "depth": queue_depth(j),
             "capacity": 4} for j in range(50)])


def straggler(name: str, *, slow_rank: int, kind: str) -> None:
    """Four data-parallel ranks whose gradient all-reduce evens every step out to 145 ms.

    ``kind="compute"``: rank ``slow_rank``'s backward is 100 ms instead of 60,
    so the other ranks wait 45 ms in grad_allreduce instead of 5.
    ``kind="input"``: rank ``slow_rank`` waits 45 ms in next_batch instead of 5.
    """
    run = fresh(name, world_size=4)
    for rank in range(4):
        slow = rank == slow_rank
        data = 0.045 if (slow and kind == "input") else 0.005
        backward = 0.100 if (slow and kind == "compute") else 0.060
        allreduce = 0.005 if slow else 0.045
        worker_file(run, stage="train", rank=rank, n=40,
                    phases=lambda i, d=data, b=backward, a=allreduce: [
                        ("next_batch", d), ("forward", 0.030), ("backward", b),
                        ("grad_allreduce", a), ("optimizer", 0.005)])


def drift() -> None:
    """mask_build grows by 0.5 ms per iteration (0 -> 29.5 ms over 60 iterations)."""
    run = fresh("drift")
    worker_file(run, stage="main", rank=0, n=60,
                phases=lambda i: [("data_wait", 0.010), ("mask_build", 0.0005 * i),
                                  ("forward", 0.050), ("backward", 0.040)])


def mostly_unaccounted() -> None:
    """Timers cover 50 ms of each 100 ms step."""
    run = fresh("mostly_unaccounted")
    worker_file(run, stage="main", rank=0, n=40,
                phases=lambda i: [("forward", 0.020), ("backward", 0.030)],
                dur=lambda i: 0.100)


def allocator_thrash() -> None:
    """Every fifth iteration (i % 5 == 4) the allocator retries (a cache flush)
    and that step's backward takes 250 ms instead of 50; device allocations
    grow by one per iteration."""
    run = fresh("allocator_thrash")
    worker_file(run, stage="main", rank=0, n=40,
                phases=lambda i: [("next_batch", 0.005), ("forward", 0.040),
                                  ("backward", 0.250 if i % 5 == 4 else 0.050),
                                  ("optimizer", 0.005)],
                extra=lambda i: {"mem": {"allocated": 2 << 30, "reserved": 4 << 30,
                                         "alloc_retries": (i + 1) // 5,
                                         "device_allocs": 100 + i}})


def short_run() -> None:
    """Six iterations: too few to judge."""
    run = fresh("short_run")
    worker_file(run, stage="main", rank=0, n=6,
                phases=lambda i: [("next_batch", 0.010), ("forward", 0.050),
                                  ("backward", 0.040)])


def main() -> None:
    """Write every scenario's run folder."""
    for loader in ("next_batch", "get_train_batch", "batch_generator", "data_loading"):
        single_loop_starvation(loader)
    periodic_stalls()
    sync_loop("sync_host_only", device=False)
    sync_loop("sync_with_device_times", device=True)
    pipeline("pipeline_target_bound",
             target=[("batch_get", 0.005), ("target_forward", 0.085), ("hs_put", 0.010)],
             drafter=[("hs_get", 0.080), ("draft_forward", 0.040), ("backward", 0.060),
                      ("optimizer", 0.020)],
             target_n=60, drafter_n=30, queue_depth=lambda j: 1 if j == 7 else 0)
    pipeline("pipeline_drafter_bound",
             target=[("batch_get", 0.005), ("target_forward", 0.030), ("hs_put", 0.065)],
             drafter=[("hs_get", 0.002), ("draft_forward", 0.050), ("backward", 0.118),
                      ("optimizer", 0.030)],
             target_n=60, drafter_n=30, queue_depth=lambda j: 3 if j == 7 else 4)
    straggler("straggler_compute", slow_rank=2, kind="compute")
    straggler("straggler_input", slow_rank=1, kind="input")
    drift()
    mostly_unaccounted()
    allocator_thrash()
    short_run()


if __name__ == "__main__":
    main()
