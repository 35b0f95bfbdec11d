"""A real two-rank DDP job on gloo/CPU for tests/runtime/test_collectives.py.

Run as ``python ddp_wait_worker.py OUT_DIR DELAY_S STEPS``: spawns ranks 0 and 1.
Rank 1 sleeps ``DELAY_S`` inside its forward phase each step, so rank 0 reaches
the backward all-reduce ``DELAY_S`` earlier and waits for it there.

Truth, measured by bare timers in this script (independent of the shim): each
rank's ``time.time()`` at backward start and its own ``perf_counter`` duration
of backward, exchanged with ``all_gather_object``; written to
``OUT_DIR/truth.json`` by rank 0 together with the parameter checks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash_runtime import Recorder

WIDTH = 256


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH),
                         nn.ReLU(), nn.Linear(WIDTH, 8))


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(64, WIDTH, generator=g), torch.randn(64, 8, generator=g)


def _train(ddp: nn.Module, rank: int, steps: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(steps):
        x, y = _batch(rank, step)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in ddp.parameters()]


def _worker(rank: int, out: str, delay: float, steps: int) -> None:
    torch.set_num_threads(1)
    out_dir = Path(out)
    dist.init_process_group("gloo", init_method=f"file://{out_dir / 'store'}",
                            rank=rank, world_size=2)
    # ~0.25 MB of gradients in buckets of at most ~0.1 MB: several buckets per backward
    kw = {"bucket_cap_mb": 0.1}

    # 1. gradients identical with the measuring hook, the wrapped default hook, and none
    plain = _train(DDP(_model(0), **kw), rank, 5)
    watched_ddp = DDP(_model(0), **kw)
    rec_off = Recorder(out_dir / "off", rank=rank, world_size=2, enabled=False,
                       install_handlers=False)
    assert rec_off.watch_ddp(DDP(_model(0), **kw)) is False
    probe = Recorder(out_dir / "probe", rank=rank, world_size=2, install_handlers=False)
    assert probe.watch_ddp(watched_ddp) is True
    # Again on the same model (README's DDP line after rec.instrument): measured
    # already, nothing registered; with a hook of the user's: an error saying the order.
    again = probe.watch_ddp(watched_ddp)
    second_error = own_error = ""
    try:
        probe.watch_ddp(watched_ddp, hook=default_hooks.allreduce_hook)
    except RuntimeError as exc:
        second_error = str(exc)
    # A hook the user registered first: DDP takes one, so watch_ddp refuses, saying why.
    own = DDP(_model(0), **kw)
    own.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    try:
        probe.watch_ddp(own)
    except RuntimeError as exc:
        own_error = str(exc)
    watched = _train(watched_ddp, rank, 5)
    wrapped_ddp = DDP(_model(0), **kw)
    probe.watch_ddp(wrapped_ddp, hook=default_hooks.allreduce_hook,
                    state=dist.group.WORLD)
    wrapped = _train(wrapped_ddp, rank, 5)
    probe.close()
    same_watched = all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    same_wrapped = all(torch.equal(a, b) for a, b in zip(plain, wrapped, strict=True))
    moved = not all(torch.equal(a, b) for a, b in zip(plain, _model(0).parameters(), strict=False))

    # 2. the timed run: rank 1 is slow in forward by `delay`
    rec = Recorder(out_dir / "run", rank=rank, world_size=2, install_handlers=False)
    ddp = DDP(_model(1), **kw)
    rec.watch_ddp(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    bw_start, bw_dur = [], []
    for step in range(steps):
        x, y = _batch(rank, step)
        with rec.iteration(samples=64) as it:
            with it.phase("forward"):
                if rank == 1:
                    time.sleep(delay)
                loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            it.lap("zero_grad")
            bw_start.append(time.time())
            t = time.perf_counter()
            with it.phase("backward"):
                loss.backward()
            bw_dur.append(time.perf_counter() - t)
            with it.phase("optimizer"):
                opt.step()
    # 3. gradient accumulation: the no_sync micro-step has no all-reduce, the next has one
    for step in range(3):
        x, y = _batch(rank, 100 + step)
        with rec.iteration(samples=64) as it, ddp.no_sync(), it.phase("backward"):
            nn.functional.mse_loss(ddp(x), y).backward()
        with rec.iteration(samples=64) as it, it.phase("backward"):
            nn.functional.mse_loss(ddp(x), y).backward()
    stats = rec.stats()
    rec.close()
    gathered = [None, None]
    dist.all_gather_object(gathered, {"bw_start": bw_start, "bw_dur": bw_dur})
    if rank == 0:
        (out_dir / "truth.json").write_text(json.dumps({
            "ranks": gathered, "same_watched": same_watched, "same_wrapped": same_wrapped,
            "moved": moved, "again": again, "second_error": second_error,
            "own_error": own_error, "stats0": stats,
        }))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    out, delay, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    mp.spawn(_worker, args=(out, delay, steps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
