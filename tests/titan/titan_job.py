"""A 2-rank gloo DDP job on CPU that logs like torchtitan's trainer, the shim, and bare timers.

One rank of the job (the test starts one process per rank, ``test_titan_job.py``)::

    python tests/titan/titan_job.py --rank R --world 2 --port P --out OUT [--slow-rank 1]

The training loop is torchtitan's ``Trainer.train`` / ``train_step``
(``torchtitan/trainer.py`` at b5bcd76c66d0acb1a08b176d9639425bc55e0b2a) on a
small model: per step ``set_step(step)``, a ``step`` span holding
``gc_collect`` (``GarbageCollection.run``: no collection before ``gc_freq``
steps), ``zero_grad``, ``fetching_batch`` around ``next(data_iterator)``, the
``local_valid_tokens`` scalar, ``fwd_bwd`` holding
``post_dataloading_process`` then forward, loss and backward (DDP's gradient
all-reduce inside), ``optim``
(``clip_grad_norm_``, ``optimizer.step()``, the LR scheduler), on logging steps
(step 1 and every ``--log-freq``) ``collect_dist_metrics`` (the
``global_valid_tokens`` scalar, the loss all-reduced and read back), and
``checkpoint_save`` (``CheckpointManager._save``: not a save step, it returns at
once). The records are written by ``titan_writer.py``, torchtitan's own writer
code copied (its docstring names the files), to ``OUT/titan/structured_logs/``.

Left out of torchtitan's step: the global token count's all-reduce before
``fwd_bwd`` (``dist_sum_tensor``), which on an accelerator runs on the device
and never blocks the host; a blocking CPU stand-in would add a host wait that
torchtitan on a GPU does not have (the loss here is divided by the local count,
DDP averages the gradients; the global count is summed with the loss in
``collect_dist_metrics``).

The same steps are recorded by the shim as README.md shows
(``Recorder.from_env()``, ``rec.iteration``, plain phases ``data_wait`` around the
fetch, ``forward`` (model + loss), ``backward``, ``optimizer``, and
``metrics_allreduce`` around the metrics collectives) to ``OUT/shim/``, and by
bare ``time.perf_counter()`` timers to ``OUT/truth/truth-rank{R}.json`` (never read
by tlog): the step, the fetch, the injected sleep, forward,
backward, the exposed gradient all-reduce wait (``backward`` return - the
last DDP bucket ready, from a comm hook doing DDP's default all-reduce), the
optimizer and the metrics collectives.

The fault: rank ``--slow-rank``'s ``Dataset.__getitems__`` (``num_workers=0``)
sleeps ``--sleep-ms`` per batch, or ``--sleep-ratio`` times its rank's recent
compute when that is longer (a loaded machine slows the compute, the fault stays
the larger part of a step): an input straggler. ``--slow-rank -1``: none.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ddp"))

import titan_writer as sl  # beside this file

# the DDP scenarios' batched slow dataset and timing hook
from ddp_train import BucketTimes, SyntheticData, collate_batch, timed_allreduce_hook

D_IN, HIDDEN, CLASSES = 256, 512, 10
#: torchtitan's ``IGNORE_INDEX`` (``torchtitan/components/loss.py``): labels not counted.
IGNORE_INDEX = -100


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--sleep-ms", type=float, default=100.0)
    p.add_argument("--sleep-ratio", type=float, default=1.0)
    p.add_argument("--log-freq", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="leading steps left out of the truth's steady sums")
    args = p.parse_args(argv)
    rank, world = args.rank, args.world
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "TLOG_RUN_DIR": str(args.out / "shim")})
    torch.set_num_threads(1)
    torch.manual_seed(0)

    # torchtitan/train.py main(): the structured logger first, then the trainer
    sl.init_structured_logger(source="training", output_dir=str(args.out / "titan"))
    sl.log_trace_instant("structured_logger_started")
    from dflash_runtime import Recorder
    rec = Recorder.from_env()
    with sl.log_trace_span("torch_distributed_init"):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=world)

    slow = rank == args.slow_rank
    ds = SyntheticData(args.steps * args.batch * world, args.sleep_ms / 1e3 if slow else 0.0,
                       d_in=D_IN)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=0,
                        drop_last=True, collate_fn=collate_batch)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(D_IN, HIDDEN), torch.nn.ReLU(),
                                    torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                    torch.nn.Linear(HIDDEN, CLASSES)))
    buckets = BucketTimes()
    model.register_comm_hook(buckets, timed_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    sl.log_trace_instant("training_start")
    data_iterator = iter(loader)
    steps: list[dict] = []
    dist.barrier()
    for step in range(1, args.steps + 1):
        sl.set_step(step, relative_step=step)
        buckets.ready.clear()
        fault0 = ds.fault_s
        metrics_s = 0.0
        t_start = time.perf_counter()
        with rec.iteration(samples=args.batch) as it, sl.log_trace_span("step"):
            with sl.log_trace_span("gc_collect"):
                pass            # GarbageCollection.run: step % gc_freq != 0, no collection
            opt.zero_grad(set_to_none=True)
            with it.phase("data_wait"), sl.log_trace_span("fetching_batch"):
                t0 = time.perf_counter()
                x, y = next(data_iterator)
                t1 = time.perf_counter()
            local_valid_tokens = (y != IGNORE_INDEX).sum()
            sl.log_trace_scalar({"local_valid_tokens": int(local_valid_tokens)})
            with sl.log_trace_span("fwd_bwd"):
                with sl.log_trace_span("post_dataloading_process"):
                    inputs, labels = x, y
                with it.phase("forward"):
                    t2 = time.perf_counter()
                    loss = F.cross_entropy(model(inputs), labels, reduction="sum") \
                        / local_valid_tokens
                    t3 = time.perf_counter()
                with it.phase("backward"):
                    loss.backward()
                    t4 = time.perf_counter()
            with it.phase("optimizer"), sl.log_trace_span("optim"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                opt.step()
                sched.step()
                t5 = time.perf_counter()
            if step == 1 or step % args.log_freq == 0:
                with it.phase("metrics_allreduce"), sl.log_trace_span("collect_dist_metrics"):
                    tm0 = time.perf_counter()
                    total = torch.stack([loss.detach(), local_valid_tokens.double()])
                    dist.all_reduce(total)
                    sl.log_trace_scalar({"global_valid_tokens": int(total[1].item())})
                    metrics_s = time.perf_counter() - tm0
            with sl.log_trace_span("checkpoint_save"):
                pass            # CheckpointManager._save: not a save step, returns at once
        t_end = time.perf_counter()
        last_ready = max(buckets.ready) if buckets.ready else t4
        steps.append({
            "step": step, "step_s": t_end - t_start, "data_s": t1 - t0,
            "fault_s": ds.fault_s - fault0, "forward_s": t3 - t2,
            "backward_s": t4 - t3, "ddp_wait_s": max(0.0, t4 - last_ready),
            "optimizer_s": t5 - t4, "metrics_s": metrics_s,
        })
        if slow and args.sleep_ratio > 0:
            recent = [s["forward_s"] + s["backward_s"] + s["optimizer_s"] - s["ddp_wait_s"]
                      for s in steps[-5:]]
            ds.sleep_s = max(args.sleep_ms / 1e3, args.sleep_ratio * statistics.median(recent))
    rec.close()
    dist.barrier()
    with sl.log_trace_span("torch_distributed_teardown"):
        dist.destroy_process_group()
    sl.reset()

    steady = list(range(min(args.warmup_steps, len(steps)), len(steps)))
    keys = [k for k in steps[0] if k != "step"]
    (args.out / "truth").mkdir(parents=True, exist_ok=True)
    (args.out / "truth" / f"truth-rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world_size": world, "host": socket.gethostname(), "slow": slow,
        "steady_steps": [steps[i]["step"] for i in steady],
        "steady_totals_s": {k: sum(steps[i][k] for i in steady) for k in keys},
        "unit": "seconds, time.perf_counter() on this rank's training thread",
        "how": "step_s: the shim's iteration block (around torchtitan's step span); "
               "data_s: next(data_iterator); ddp_wait_s: backward return - last DDP bucket ready; metrics_s: "
               "the metrics collectives; fault_s: the injected sleeps",
        "per_step": steps,
    }, indent=1))


if __name__ == "__main__":
    main()
