"""A real DDP training loop on gloo (CPU) with a known injected fault and its own truth.

Run under torchrun (``tests/ddp/README.md``)::

    timeout 120 .venv/bin/torchrun --standalone --nproc_per_node=2 tests/ddp/ddp_train.py \\
        --scenario compute_straggler --mode phases --run-dir OUT/run --truth-dir OUT/truth

Scenarios (``--scenario``), each on every rank unless said:

- ``healthy``: no fault.
- ``input_bound``: every rank's ``Dataset.__getitems__`` sleeps ``--batch-sleep-ms``
  once per batch, or ``--batch-sleep-ratio`` times the rank's recent compute when that
  is longer (a slow loader; ``num_workers=0``, so the loop waits for it).
- ``input_straggler``: only rank ``--slow-rank`` has the slow ``__getitems__``.
- ``compute_straggler``: only rank ``--slow-rank`` does extra real compute in its
  forward (``--extra-matmuls`` no-grad 768x768 matmuls + tanh on the activations,
  aten ops a profiler sees as compute), about 4x the forward's own time.

Modes (``--mode``):

- ``phases``: instrumented only with the shim's plain phases as README.md shows
  (``Recorder.from_env()``, ``rec.iteration(samples=B)``, phases ``data_wait``,
  ``forward``, ``backward``, ``optimizer``; no ``kind=``, no hooks of the shim).
  The logs go to ``--run-dir`` (``TLOG_RUN_DIR`` is set to it; default: ``$TLOG_RUN_DIR``,
  as ``tlog run`` sets it).
- ``measured``: the same, plus the shim's measured all-reduce wait
  (``rec.watch_ddp(model, hook=...)``, docs/RUNTIME.md), wrapping the truth's hook.
- ``trace``: no shim; ``torch.profiler.profile`` (CPU activity) with
  ``schedule(wait, warmup, active)`` writes one ``*.pt.trace.json`` per rank to
  ``--run-dir`` through ``tensorboard_trace_handler``; ``prof.step()`` each step.

In every mode the truth is measured with bare ``time.perf_counter()`` timers around
the data fetch, forward, backward, optimizer, the injected fault itself and the
whole step, and written to ``--truth-dir/truth-rank{R}.json`` (never in the run
directory: ingest must not read it). The gradient all-reduce runs inside
``backward``; a DDP communication hook (part of the truth only: it does exactly
what DDP's default hook does, an all-reduce of the bucket divided by the world
size, and records when each bucket became ready) gives each step's exposed
collective wait = (``backward`` returns) - (last bucket ready): the time the rank
sat in ``backward`` after its own gradients were done, waiting for the all-reduce
(its peers' arrival plus the transfer).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SCENARIOS = ("healthy", "input_bound", "input_straggler", "compute_straggler")
D_IN, HIDDEN, CLASSES = 512, 768, 10


class SyntheticData(Dataset):
    """Deterministic (x, y) samples, fetched a batch at a time; slow when ``sleep_s`` > 0.

    ``x``: float32 ``(d_in,)``; ``y``: int64 class in ``[0, CLASSES)``.
    ``__getitems__`` (the batched fetch the DataLoader calls when a Dataset has it,
    as Hugging Face datasets do) returns the batch as two stacked tensors (one
    indexing op each, not 2 x 1024 small ones: a profiler trace stays small) and
    sleeps ``sleep_s`` once per batch: a slow read or decode. ``fault_s``
    accumulates the measured seconds of those sleeps.
    """

    def __init__(self, n: int, sleep_s: float, d_in: int = D_IN) -> None:
        self.n = n
        self.sleep_s = sleep_s
        self.fault_s = 0.0
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d_in, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]

    def __getitems__(self, indices: list[int]):
        if self.sleep_s > 0:
            t0 = time.perf_counter()
            time.sleep(self.sleep_s)
            self.fault_s += time.perf_counter() - t0
        idx = torch.as_tensor(indices)
        return self.x[idx], self.y[idx]  # already a batch: collate_batch passes it on


def collate_batch(batch):
    """The DataLoader's collate_fn for a batch ``__getitems__`` already stacked."""
    return batch


class MLP(torch.nn.Module):
    """512 -> 768 -> 768 -> 10 MLP (1.0M parameters, 4.0 MB of fp32 gradients).

    ``extra_matmuls`` > 0: the forward also runs that many no-grad
    ``tanh(h @ W_extra)`` on its hidden activations (the compute fault; backward
    is unchanged); ``fault_s`` accumulates their measured seconds.
    """

    def __init__(self, extra_matmuls: int = 0) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(D_IN, HIDDEN)
        self.l2 = torch.nn.Linear(HIDDEN, HIDDEN)
        self.l3 = torch.nn.Linear(HIDDEN, CLASSES)
        self.extra_matmuls = extra_matmuls
        # A plain tensor, not a buffer: DDP broadcasts buffers from rank 0 at every
        # forward (broadcast_buffers=True), a collective that would move the peers'
        # wait for a slow rank from backward into forward.
        self.w_extra = torch.randn(HIDDEN, HIDDEN) / HIDDEN**0.5
        self.fault_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.l1(x))
        if self.extra_matmuls:
            t0 = time.perf_counter()
            with torch.no_grad():
                e = h
                for _ in range(self.extra_matmuls):
                    e = torch.tanh(e @ self.w_extra)
                self._sink = float(e[0, 0])  # keeps the result live (a CPU read, no device)
            self.fault_s += time.perf_counter() - t0
        h = F.relu(self.l2(h))
        return self.l3(h)


class BucketTimes:
    """State of the timing comm hook: when each bucket of the current step was ready."""

    def __init__(self) -> None:
        self.ready: list[float] = []


def timed_allreduce_hook(state: BucketTimes, bucket):
    """DDP's default all-reduce (sum / world size), recording the bucket-ready time."""
    state.ready.append(time.perf_counter())
    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", choices=SCENARIOS)
    p.add_argument("--mode", type=_modes,
                   help="phases, measured or trace; several comma-separated run one after "
                        "the other in the same ranks (one torchrun start-up for all)")
    p.add_argument("--job", type=_job, action="append", default=[],
                   help="SCENARIO:MODE[,MODE...], repeatable, instead of --scenario/--mode: "
                        "every job in turn in the same ranks (one torchrun start-up for the "
                        "whole suite); '{scenario}' and '{mode}' in --run-dir/--truth-dir")
    p.add_argument("--run-dir", default=os.environ.get("TLOG_RUN_DIR"),
                   help="shim logs (phases) or traces (trace); '{mode}' in it is replaced by "
                        "the mode (required with several modes); default $TLOG_RUN_DIR, "
                        "as `tlog run` sets it")
    p.add_argument("--truth-dir", required=True,
                   help="truth-rank{R}.json, outside the run dir; '{mode}' as in --run-dir")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--batch-sleep-ms", type=float, default=120.0,
                   help="sleep per batch fetch of a slow loader (120 ms: at 80 ms a loaded 2-core machine pushed input_straggler's lockstep gain under its 1.3 floor)")
    p.add_argument("--batch-sleep-ratio", type=float, default=0.75,
                   help="a slow loader sleeps at least this multiple of its rank's median compute "
                        "(forward + backward + optimizer, less the all-reduce wait) over the last 5 "
                        "steps, so the fault stays the larger part of a step when a loaded machine "
                        "slows the compute (a fixed 120 ms fell under input_straggler's 1.3x floor "
                        "at load 9-14); 0 keeps --batch-sleep-ms fixed")
    p.add_argument("--extra-matmuls", type=int, default=8,
                   help="compute_straggler: extra 768x768 matmuls in the slow rank's forward")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="leading steps left out of the truth's steady sums")
    p.add_argument("--reference-steps", type=int, default=0,
                   help="straggler scenarios: before the first mode and after each, a "
                        "reference job of this many steps with the fault removed and no "
                        "instrumentation; the steady step rates before and after a mode go "
                        "to its truth dir as reference-rank{R}.json (the gain of really "
                        "fixing the straggler, measured in the same minutes); 0: none")
    p.add_argument("--prof-wait", type=int, default=2)
    p.add_argument("--prof-warmup", type=int, default=3)
    p.add_argument("--prof-active", type=int, default=35)
    args = p.parse_args(argv)
    if not args.run_dir:
        p.error("give --run-dir, or run under `tlog run` (which sets TLOG_RUN_DIR)")
    if args.job and (args.scenario or args.mode):
        p.error("give --job, or --scenario with --mode, not both")
    if not args.job:
        if not (args.scenario and args.mode):
            p.error("give --scenario and --mode, or --job SCENARIO:MODE[,MODE...]")
        args.job = [(args.scenario, args.mode)]
    several = {"{mode}": sum(len(m) for _, m in args.job) > 1, "{scenario}": len(args.job) > 1}
    for key, needed in several.items():
        if needed and not (key in args.run_dir and key in args.truth_dir):
            p.error(f"with several jobs or modes, --run-dir and --truth-dir must contain '{key}'")
    return args


MODES = ("phases", "measured", "trace")
#: Scenarios with a slow rank: the ones a reference job (``--reference-steps``) serves.
STRAGGLERS = ("input_straggler", "compute_straggler")


def _modes(text: str) -> tuple[str, ...]:
    """``--mode`` value: one mode or several, comma-separated, each once."""
    modes = tuple(m.strip() for m in text.split(","))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"want modes from {MODES}, each once: {text!r}")
    return modes


def _job(text: str) -> tuple[str, tuple[str, ...]]:
    """``--job`` value: ``SCENARIO:MODE[,MODE...]``."""
    scenario, _, modes = text.partition(":")
    if scenario not in SCENARIOS:
        raise argparse.ArgumentTypeError(f"want SCENARIO:MODES with SCENARIO from {SCENARIOS}: {text!r}")
    return scenario, _modes(modes)


def main(argv=None) -> None:
    """Join the process group once, then run each ``--job`` (scenario: modes) and each of
    its modes in turn as its own job.

    Each mode builds its own dataset, sampler, loader, model (same seed), optimizer,
    instrumentation and truth, exactly as a run of that mode alone: only the
    interpreter, the torch import and the rendezvous are shared (what a torchrun
    start-up costs, ~3-5 s of CPU on 2 cores), and the warm-up steps each mode
    leaves out of its truth (and tlog out of its steady state) absorb a warm process.
    """
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for scenario, modes in args.job:
        job = argparse.Namespace(**{**vars(args), "scenario": scenario, "mode": modes})
        run_job(job, lambda d, m, s=scenario: Path(d.replace("{scenario}", s).replace("{mode}", m)))
    dist.destroy_process_group()


def run_job(args: argparse.Namespace, where) -> None:
    """``args.scenario`` in each of ``args.mode`` in turn; ``where(template, mode)`` is a
    run or truth directory. Straggler scenarios get their reference jobs around each."""
    refs = args.reference_steps > 0 and args.scenario in STRAGGLERS
    before = run_mode(args, "reference", None, None) if refs else None
    for mode in args.mode:
        truth_dir = where(args.truth_dir, mode)
        run_mode(args, mode, where(args.run_dir, mode), truth_dir)
        if refs:
            after = run_mode(args, "reference", None, None)
            (truth_dir / f"reference-rank{dist.get_rank()}.json").write_text(json.dumps({
                "steps_per_s": [before, after], "steps": args.reference_steps,
                "warmup_steps": args.warmup_steps,
                "how": "steady steps / their summed step_s, by this rank's perf_counter, of a "
                       "job run just before and just after this one in the same ranks: the "
                       "same loop with the fault removed, no instrumentation"}))
            before = after


def run_mode(args: argparse.Namespace, mode: str, run_dir: Path | None,
             truth_dir: Path | None) -> float | None:
    """One training job of ``args.steps`` steps in ``mode``; its truth to ``truth_dir``.

    ``mode`` "reference": ``args.reference_steps`` steps of the same loop with no fault
    and no instrumentation, nothing written; returns its steady steps per second by
    this rank's timers (None for the other modes)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    reference = mode == "reference"
    n_steps = args.reference_steps if reference else args.steps

    slow_loader = not reference and (args.scenario == "input_bound" or (
        args.scenario == "input_straggler" and rank == args.slow_rank))
    extra = args.extra_matmuls if (not reference and args.scenario == "compute_straggler"
                                   and rank == args.slow_rank) else 0
    ds = SyntheticData(n_steps * args.batch * world, args.batch_sleep_ms / 1e3 if slow_loader else 0.0)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=0, drop_last=True,
                        collate_fn=collate_batch)
    model = DDP(MLP(extra))
    buckets = BucketTimes()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
    rec = None
    prof = None
    if mode in ("phases", "measured"):
        os.environ["TLOG_RUN_DIR"] = str(run_dir)
        from dflash_runtime import Recorder
        rec = Recorder.from_env()
    if mode == "measured":
        # The shim's measured all-reduce wait, wrapping the truth's timing hook (DDP
        # takes one communication hook per model).
        if not rec.watch_ddp(model, hook=timed_allreduce_hook, state=buckets):
            raise RuntimeError("rec.watch_ddp registered nothing: is TLOG_RUN_DIR set?")
    else:
        model.register_comm_hook(buckets, timed_allreduce_hook)
    if mode == "trace":
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
        prof = profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=args.prof_wait, warmup=args.prof_warmup, active=args.prof_active),
            on_trace_ready=tensorboard_trace_handler(str(run_dir), worker_name=f"rank{rank}"),
        )
        prof.start()

    steps: list[dict] = []
    # Trace mode: when the last prof.step() returned, where the next ProfilerStep#N
    # span starts (None before the first).
    prof_end: float | None = None
    it_loader = iter(loader)
    dist.barrier()
    for step in range(n_steps):
        prof_step_s = 0.0
        ds_fault0, model_fault0 = ds.fault_s, model.module.fault_s
        buckets.ready.clear()
        wall0 = time.time()
        t_start = time.perf_counter()
        if rec is not None:
            with rec.iteration(samples=args.batch) as it:
                with it.phase("data_wait"):
                    t0 = time.perf_counter()
                    x, y = next(it_loader)
                    t1 = time.perf_counter()
                with it.phase("forward"):
                    loss = F.cross_entropy(model(x), y)
                    t2 = time.perf_counter()
                with it.phase("backward"):
                    loss.backward()
                    t3 = time.perf_counter()
                with it.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    t4 = time.perf_counter()
            t_end = time.perf_counter()
        else:
            t0 = time.perf_counter()
            x, y = next(it_loader)
            t1 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t4 = time.perf_counter()
            # The ProfilerStep#N span runs from the end of one prof.step() to the start of
            # the next; the call itself (and the trace export in the last one) is outside
            # every step, so it is outside the truth's step too. The step starts where
            # the span does, at the previous call's return: the loop's own lines before
            # the data fetch (this bookkeeping) are in the span, and a rank descheduled
            # there on a busy machine lost that time inside the profiler's step (85.6 ms
            # before the fetch of an input_straggler step, timed from t0 it was not).
            t_end = t4
            if prof is not None:
                if prof_end is not None:
                    t_start = prof_end
                prof.step()
                prof_end = time.perf_counter()
                prof_step_s = prof_end - t4
        last_ready = max(buckets.ready) if buckets.ready else t3
        steps.append({
            "step": step, "wall_start": wall0,
            "step_s": t_end - t_start, "data_s": t1 - t0, "forward_s": t2 - t1,
            "backward_s": t3 - t2, "optimizer_s": t4 - t3,
            "comm_wait_s": max(0.0, t3 - last_ready), "buckets": len(buckets.ready),
            "prof_step_s": prof_step_s,
            "fault_s": (ds.fault_s - ds_fault0) + (model.module.fault_s - model_fault0),
        })
        if slow_loader and args.batch_sleep_ratio > 0:
            recent = [s["forward_s"] + s["backward_s"] + s["optimizer_s"] - s["comm_wait_s"]
                      for s in steps[-5:]]
            ds.sleep_s = max(args.batch_sleep_ms / 1e3,
                             args.batch_sleep_ratio * statistics.median(recent))
    if prof is not None:
        prof.stop()
    if rec is not None:
        rec.close()
        os.environ.pop("TLOG_RUN_DIR", None)   # a following trace-mode job runs without it
    dist.barrier()

    n = len(steps)
    if reference:
        kept = steps[min(args.warmup_steps, n - 1):]
        return len(kept) / sum(st["step_s"] for st in kept)
    if mode == "trace":
        # Steps the profiler recorded: prof.step() calls number wait+warmup .. +active-1.
        first = args.prof_wait + args.prof_warmup
        steady = list(range(first, min(n, first + args.prof_active)))
    else:
        steady = list(range(min(args.warmup_steps, n), n))
    keys = ("step_s", "data_s", "forward_s", "backward_s", "optimizer_s", "comm_wait_s", "fault_s")
    totals = {k: sum(steps[i][k] for i in steady) for k in keys}
    truth = {
        "rank": rank, "world_size": world, "scenario": args.scenario, "mode": mode,
        "host": socket.gethostname(), "batch": args.batch, "steps": n,
        "fault": {
            "slow_loader": slow_loader,
            "sleep_per_batch_s": (totals["fault_s"] / len(steady)) if slow_loader and steady else 0.0,
            "extra_matmuls": extra, "phase": ("data_wait" if slow_loader else "forward" if extra else None),
        },
        "steady_steps": steady,
        "steady_totals_s": totals,
        "unit": "seconds, time.perf_counter() on this rank's training thread",
        "how": ("step_s = the iteration (phases/measured mode: the shim's iteration block; trace mode: "
                "the previous prof.step()'s return (the first step: data fetch start) to optimizer "
                "end, as the trace's ProfilerStep spans run; prof.step() itself excluded); comm_wait_s = backward return - last DDP bucket ready (timing comm hook doing "
                "DDP's default all-reduce); fault_s = measured seconds of the injected sleep or "
                "extra matmuls; totals over steady_steps (trace mode: the profiled steps)"),
        "per_step": steps,
    }
    truth_dir.mkdir(parents=True, exist_ok=True)
    (truth_dir / f"truth-rank{rank}.json").write_text(json.dumps(truth, indent=1))


if __name__ == "__main__":
    main()
