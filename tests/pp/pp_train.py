"""A real pipeline-parallel training job on gloo (CPU): 2 stages on 2 ranks, stage 1
about 3x heavier than stage 0, with its own truth.

Run under torchrun (``tests/pp/README.md``)::

    timeout 120 .venv/bin/torchrun --standalone --nproc_per_node=2 tests/pp/pp_train.py \\
        --job gpipe:instrument --job 1f1b:trace --out OUT

Schedules (``--job SCHEDULE:MODE``, repeatable: one torchrun runs them in turn):

- ``gpipe``, ``1f1b``: ``torch.distributed.pipelining``'s ``ScheduleGPipe`` /
  ``Schedule1F1B`` over one ``PipelineStage`` per rank (the stage module: rank 0
  ``--light-layers`` Linear+tanh blocks, rank 1 three times as many);
- ``interleaved``: ``ScheduleInterleaved1F1B``, 4 stages, two per rank (rank r
  holds stages r and r + 2, each half its layers);
- ``handwritten``: the same two stages with ``dist.send``/``dist.recv`` (GPipe
  order: every micro-batch's forward, then every backward).

Modes:

- ``instrument``: as README.md says, ``rec = Recorder.from_env()`` and
  ``rec.instrument(stage_module, optimizer, loader)``, nothing named by hand;
- ``trace``: no shim; ``torch.profiler.profile`` (CPU) with a schedule and
  ``prof.step()`` per step, one ``rank{R}.*.pt.trace.json`` per rank.

Truth: bare ``time.perf_counter()`` readings on each rank, never tlog's: the
whole step (schedule/loop + optimizer), each point-to-point call and wait (the
schedules' ``_batch_p2p`` and ``_wait_batch_p2p``, wrapped by this script; in the
hand-written pipeline each ``send``/``recv`` call), and the stage's own forward and backward compute (the
stage module's forward pre/post hooks; backward = the step less everything else
timed), written to ``OUT/SCHEDULE-MODE/truth/truth-rank{R}.json`` (outside the run
directory ``OUT/SCHEDULE-MODE/run``, which tlog ingests).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

WIDTH = 384
#: Samples per step and micro-batches per step.
BATCH, MICRO = 64, 4


class Samples(Dataset):
    """Deterministic ``(x, y)`` float32 pairs of shape ``(WIDTH,)``."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, WIDTH, generator=g)
        self.y = torch.randn(n, WIDTH, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def stage_module(layers: int) -> torch.nn.Sequential:
    """``layers`` Linear(WIDTH, WIDTH) + tanh blocks."""
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*blocks)


SCHEDULES = ("gpipe", "1f1b", "interleaved", "handwritten")
MODES = ("instrument", "trace")


def _job(text: str) -> tuple[str, str]:
    schedule, _, mode = text.partition(":")
    if schedule not in SCHEDULES or mode not in MODES:
        raise argparse.ArgumentTypeError(f"want SCHEDULE:MODE from {SCHEDULES} x {MODES}: {text!r}")
    return schedule, mode


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", type=_job, action="append", required=True,
                   help="SCHEDULE:MODE, repeatable: each job in turn in the same ranks (one "
                        "torchrun start-up); its files go to OUT/SCHEDULE-MODE/{run,truth}")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--light-layers", type=int, default=4)
    p.add_argument("--heavy-factor", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=5)
    return p.parse_args(argv)


class Truth:
    """The bare timers of one rank: per step its length, its p2p waits and its compute."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.fwd_s = 0.0
        self._f0 = 0.0

    def timed(self, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wait_s += time.perf_counter() - t0
        return run

    def fwd_pre(self, module, args):
        self._f0 = time.perf_counter()

    def fwd_post(self, module, args, out):
        self.fwd_s += time.perf_counter() - self._f0


def main(argv=None) -> None:
    """Join the process group once, then run each ``--job`` in turn as a job of its own."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for schedule, mode in args.job:
        run_job(args, schedule, mode, Path(args.out) / f"{schedule}-{mode}")
    dist.destroy_process_group()


#: The truth's timer around the schedules' p2p waits (wrapped once per process).
_TRUTH: list[Truth] = []


def run_job(args: argparse.Namespace, schedule_name: str, mode: str, out: Path) -> None:
    """One training job: fresh model, optimizer, loader, schedule and instrumentation;
    its logs or traces to ``out/run``, its truth to ``out/truth/truth-rank{R}.json``."""
    rank = dist.get_rank()
    torch.manual_seed(rank)
    layers = args.light_layers * (args.heavy_factor if rank == 1 else 1)
    truth = Truth()
    if schedule_name == "interleaved":
        # two stages per rank (rank r holds stages r and r + 2), each half the layers
        chunks = [stage_module(layers // 2) for _ in range(2)]
        model = torch.nn.ModuleList(chunks)
        for c in chunks:
            c.register_forward_pre_hook(truth.fwd_pre)
            c.register_forward_hook(truth.fwd_post)
    else:
        model = stage_module(layers)
        model.register_forward_pre_hook(truth.fwd_pre)
        model.register_forward_hook(truth.fwd_post)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Samples(args.steps * BATCH), batch_size=BATCH, shuffle=False)
    run_dir = out / "run"
    run_dir.mkdir(parents=True, exist_ok=True)

    schedule = None
    if schedule_name != "handwritten":
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )
        from torch.distributed.pipelining import schedules as pp_schedules

        # Truth: every p2p call and wait the schedules make goes through these two
        # module functions (issuing a transfer can block on gloo too).
        if not _TRUTH:
            _TRUTH.append(truth)
            for fn_name in ("_batch_p2p", "_wait_batch_p2p"):
                inner = getattr(pp_schedules, fn_name)

                def timed_call(*a, inner=inner, **kw):
                    t0 = time.perf_counter()
                    try:
                        return inner(*a, **kw)
                    finally:
                        _TRUTH[0].wait_s += time.perf_counter() - t0
                setattr(pp_schedules, fn_name, timed_call)
        _TRUTH[0] = truth
        loss_fn = torch.nn.functional.mse_loss
        if schedule_name == "interleaved":
            stages = [PipelineStage(c, rank + 2 * k, 4, torch.device("cpu"))
                      for k, c in enumerate(model)]
            schedule = ScheduleInterleaved1F1B(stages, MICRO, loss_fn=loss_fn)
        else:
            stage = PipelineStage(model, rank, 2, torch.device("cpu"))
            cls = ScheduleGPipe if schedule_name == "gpipe" else Schedule1F1B
            schedule = cls(stage, MICRO, loss_fn=loss_fn)

    rec = inst = prof = None
    if mode == "instrument":
        os.environ["TLOG_RUN_DIR"] = str(run_dir)
        from dflash_runtime import Recorder

        rec = Recorder.from_env()
        # interleaved: the rank's first stage module is the model README.md's call hooks
        inst = rec.instrument(model[0] if schedule_name == "interleaved" else model, opt, loader)
    else:
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler
        from torch.profiler import schedule as pschedule

        prof = profile(activities=[ProfilerActivity.CPU],
                       schedule=pschedule(wait=1, warmup=2, active=args.steps - 3),
                       on_trace_ready=tensorboard_trace_handler(str(run_dir),
                                                                worker_name=f"rank{rank}"))
        prof.start()

    send, recv = truth.timed(dist.send), truth.timed(dist.recv)
    steps = []
    dist.barrier()
    t_prev = time.perf_counter()
    for x, y in loader:
        w0, f0 = truth.wait_s, truth.fwd_s
        t0 = time.perf_counter()
        if schedule is not None:
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y)
        else:
            handwritten_step(rank, model, x, y, send, recv)
        opt.step()
        opt.zero_grad()
        t1 = time.perf_counter()
        if prof is not None:
            prof.step()
        t_next = time.perf_counter()
        # cycle: from the previous step's end to this one's, as the shim's iterations
        # and the profiler's steps run (a ProfilerStep span ends where prof.step() is
        # called: the call, which exports the trace at the last step, is outside it)
        steps.append({"step_s": t1 - t0, "cycle_s": t1 - t_prev,
                      "wait_s": truth.wait_s - w0, "forward_s": truth.fwd_s - f0})
        t_prev = t_next
    if prof is not None:
        prof.stop()
    if inst is not None:
        inst.remove()
        rec.close()
        os.environ.pop("TLOG_RUN_DIR", None)
    dist.barrier()
    kept = steps[args.warmup_steps:]
    tot = {k: sum(s[k] for s in kept) for k in ("step_s", "cycle_s", "wait_s", "forward_s")}
    (out / "truth").mkdir(parents=True, exist_ok=True)
    (out / "truth" / f"truth-rank{rank}.json").write_text(json.dumps({
        "rank": rank, "layers": layers, "schedule": schedule_name, "mode": mode,
        "warmup_steps": args.warmup_steps, "steps": steps, "steady": tot,
        "wait_share": tot["wait_s"] / tot["cycle_s"],
        "own_s_per_step": (tot["step_s"] - tot["wait_s"]) / len(kept)}))


def handwritten_step(rank: int, model, x, y, send, recv) -> None:
    """One GPipe-ordered step of two stages with blocking ``send``/``recv``:
    every micro-batch's forward (activations rank 0 -> 1), then every backward
    (gradients rank 1 -> 0)."""
    xs, ys = x.chunk(MICRO), y.chunk(MICRO)
    if rank == 0:
        outs = []
        for xm in xs:
            h = model(xm)
            send(h.detach(), dst=1)
            outs.append(h)
        for h in outs:
            g = torch.empty_like(h)
            recv(g, src=1)
            h.backward(g)
        return
    ins = []
    for ym in ys:
        h = torch.empty(len(ym), WIDTH)
        recv(h, src=0)
        h.requires_grad_(True)
        loss = torch.nn.functional.mse_loss(model(h), ym)
        ins.append((h, loss))
    for h, loss in ins:
        loss.backward()
        send(h.grad, dst=0)


if __name__ == "__main__":
    main()
