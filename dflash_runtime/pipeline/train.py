"""The worker loops and the launcher of the reference pipeline.

Process layout (one process per rank, started by ``torch.multiprocessing``, one
``torch.distributed`` world: gloo on CPU, NCCL when every rank has its own GPU):

- global ranks ``0 .. T-1`` are **target** ranks: load a packed batch with
  ``batch_size`` sequences per drafter rank (``batch_get``), run the frozen
  target over it (``target_forward``), concatenate the tapped layers
  (``hs_extract``) and put one item per drafter rank into the bounded
  hidden-state queue (``hs_put``: blocks while the queue is full, i.e.
  backpressure);
- global ranks ``T .. W-1`` are **drafter** ranks: take hidden states
  (``hs_get``: blocks while the queue is empty, i.e. starvation), build document
  ids (``doc_ids``) and the block mask (``mask_build``), run the drafter and
  its loss (``draft_forward``), ``backward``, all-reduce the gradients over the
  drafter ranks (``grad_allreduce``), clip the gradient norm and read it
  (``grad_norm_item``), and step AdamW (``optimizer``).

The hidden-state queue is a ``torch.multiprocessing`` queue: tensors cross
processes through shared memory, as hidden states cross GPUs in a
disaggregated DFlash/EAGLE trainer. All target ranks feed one queue that all
drafter ranks drain; target rank ``r`` serves drafter steps ``r, r + T, ...``,
each iteration one item for every drafter rank, so the drafter ranks of one
step get their inputs together and their all-reduce waits only for real skew.
Each rank records its own file, ``rank{r}.{stage}.jsonl``,
through :class:`dflash_runtime.Recorder`; rank 0 also writes ``run.json``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dflash_runtime import Recorder, timed
from dflash_runtime.pipeline.scenarios import (
    DEFAULT_STEPS,
    DEFAULT_WORLD_SIZE,
    PipelineConfig,
    make_config,
)
from dflash_runtime.pipeline.steps import DrafterStep, TargetStep, stretched

#: Every phase the pipeline records and its category (written as ``phase_kinds``
#: in ``run.json``; the same as ingest's built-in naming rules give).
PHASE_KINDS: dict[str, str] = {
    "batch_get": "starvation",
    "target_forward": "compute",
    "hs_extract": "compute",
    "hs_put": "backpressure",
    "hs_get": "starvation",
    "doc_ids": "compute",
    "mask_build": "compute",
    "draft_forward": "compute",
    "backward": "compute",
    "grad_allreduce": "sync",
    "grad_norm_item": "sync",
    "optimizer": "compute",
}
#: Modules the fork server imports once, before it forks any rank.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "dflash_runtime.pipeline.train"]
#: Name of the hidden-state queue in ``queue`` records.
HS_QUEUE = "hs_queue"
#: A drafter rank gives up after waiting this long for one item of hidden
#: states (a target rank died); a target rank after waiting this long for room.
QUEUE_TIMEOUT_S = 300.0
#: Collective timeout of the process group (seconds).
COLLECTIVE_TIMEOUT_S = 300.0
#: Seconds of wall time allowed per drafter step, plus :data:`START_ALLOWANCE_S`,
#: before the launcher stops a run that hangs (very generous: a busy 2-core
#: machine runs a step in about 0.1 s).
STEP_ALLOWANCE_S = 5.0
START_ALLOWANCE_S = 180.0


def new_run_id(scenario: str) -> str:
    """A fresh run id: ``dflash-<scenario>-<YYYYmmdd-HHMMSS>-<4 hex>`` (local time)."""
    return f"dflash-{scenario}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_pipeline(out_dir: str | os.PathLike[str], *, scenario: str = "balanced",
                 steps: int = DEFAULT_STEPS, world_size: int = DEFAULT_WORLD_SIZE,
                 seed: int = 0, run_id: str | None = None, timeout_s: float | None = None,
                 **overrides: Any) -> Path:
    """Run the reference DFlash pipeline and return its run directory.

    Args:
        out_dir: parent directory; the run is written to ``out_dir/<run_id>/``.
        scenario: a key of :data:`~dflash_runtime.pipeline.scenarios.SCENARIOS`.
        steps: drafter optimizer steps per drafter rank.
        world_size: total ranks; the first ``target_ranks`` (default 1) are target ranks.
        seed: seeds weights, data and anchor sampling.
        run_id: the run's id (default :func:`new_run_id`); also the directory name.
        timeout_s: stop the run (and raise) after this many seconds; default
            ``START_ALLOWANCE_S + STEP_ALLOWANCE_S * steps``.
        overrides: other :class:`~dflash_runtime.pipeline.scenarios.PipelineConfig` fields.

    Returns:
        The run directory: ``run.json`` and one ``rank{r}.{stage}.jsonl`` per rank.

    Raises:
        ValueError: a bad scenario, step count, setting or run id; CUDA asked
            for but absent; the run directory exists or cannot be created.
        RuntimeError: a rank failed or the run timed out (the message names the rank).
    """
    cfg = make_config(scenario, steps=steps, world_size=world_size, seed=seed, **overrides)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        msg = "device 'cuda' was asked for but CUDA is not available; use device='auto' or 'cpu'"
        raise ValueError(msg)
    run_id = run_id or new_run_id(scenario)
    if not run_id or "/" in run_id or run_id in (".", ".."):
        msg = f"run id must be a plain directory name, got {run_id!r}"
        raise ValueError(msg)
    run_dir = Path(out_dir) / run_id
    try:
        run_dir.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        msg = f"run directory {run_dir} already exists; choose another run id or --out"
        raise ValueError(msg) from None
    except OSError as exc:
        msg = f"cannot create the run directory {run_dir}: {exc.strerror or exc}"
        raise ValueError(msg) from None
    limit = timeout_s if timeout_s is not None else START_ALLOWANCE_S + STEP_ALLOWANCE_S * steps
    rendezvous = Path(tempfile.mkdtemp(prefix="tlog-pipeline-"))
    method = start_method()
    ctx = mp.get_context(method)
    hs_queue = ctx.Queue(maxsize=cfg.queue_capacity)
    try:
        with _no_main_reimport():
            procs = mp.start_processes(
                _worker, args=(cfg, str(run_dir), run_id, hs_queue, str(rendezvous / "store")),
                nprocs=cfg.world_size, join=False, start_method=method)
        deadline = time.monotonic() + limit
        try:
            while not procs.join(timeout=0.1):
                if time.monotonic() > deadline:
                    _terminate(procs)
                    msg = (f"the pipeline ran past {limit:.0f} s and was stopped; "
                           f"its partial logs are in {run_dir}")
                    raise RuntimeError(msg)
        except mp.ProcessRaisedException as exc:
            trace = run_dir / f"rank{exc.error_index}.error.txt"
            with contextlib.suppress(OSError):
                trace.write_text(str(exc), encoding="utf-8")
            msg = (f"pipeline rank {exc.error_index} failed: {_last_line(str(exc))} "
                   f"(traceback in {trace})")
            raise RuntimeError(msg) from None
        except mp.ProcessExitedException as exc:
            msg = f"pipeline rank {exc.error_index} exited with code {exc.exit_code}"
            raise RuntimeError(msg) from None
    finally:
        hs_queue.close()
        shutil.rmtree(rendezvous, ignore_errors=True)
    return run_dir


def start_method() -> str:
    """How rank processes start: ``forkserver`` where available, else ``spawn``.

    Both give each rank a fresh process that never inherits the caller's
    threads, OpenMP pool or CUDA context (``fork`` would). The fork server is
    started once per calling process and imports torch and this module once
    (:data:`FORKSERVER_PRELOAD`), so every later rank starts without paying
    ``import torch`` again (seconds on a busy machine); ``spawn`` (Windows)
    imports it in every rank.
    """
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        return "forkserver"
    return "spawn"


@contextlib.contextmanager
def _no_main_reimport() -> Iterator[None]:
    """Start processes without making them re-run the caller's ``__main__``.

    ``multiprocessing`` (spawn and forkserver) re-executes the parent's main
    script in every child so that functions defined there can be unpickled.
    The ranks need nothing from it (their entry point lives in this module),
    and re-running it costs time (``tlog`` imports every command) and breaks
    callers without an ``if __name__ == "__main__"`` guard, on stdin or in a
    notebook. While the processes start, ``__main__`` is a bare module with no
    file and no spec, which ``multiprocessing`` skips.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _terminate(procs: Any) -> None:
    for p in procs.processes:
        if p.is_alive():
            p.terminate()
    for p in procs.processes:
        p.join(timeout=5)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"


def pick_device(cfg: PipelineConfig, rank: int) -> torch.device:
    """The rank's device: ``cuda:<rank mod GPUs>`` with CUDA (``auto`` or ``cuda``), else CPU.

    Raises:
        RuntimeError: ``device="cuda"`` without CUDA.
    """
    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        msg = "device 'cuda' was asked for but CUDA is not available"
        raise RuntimeError(msg)
    return torch.device("cuda", rank % torch.cuda.device_count())


def _backend(device: torch.device, world_size: int) -> str:
    """NCCL needs one GPU per rank; with fewer GPUs (or on CPU) use gloo."""
    if device.type == "cuda" and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _worker(rank: int, cfg: PipelineConfig, run_dir: str, run_id: str, hs_queue: Any,
            store: str) -> None:
    """Entry point of one rank process."""
    torch.set_num_threads(1)  # one core per worker: ranks share a few CPU cores
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    device = pick_device(cfg, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    stage = cfg.stage_of(rank)
    dist.init_process_group(_backend(device, cfg.world_size), init_method=f"file://{store}",
                            rank=rank, world_size=cfg.world_size,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    drafter_group = dist.new_group(list(range(cfg.target_ranks, cfg.world_size)))
    rec = Recorder(run_dir, stage=stage, rank=rank, world_size=cfg.world_size, run_id=run_id,
                   name=f"reference DFlash pipeline, scenario {cfg.scenario}",
                   tags=_tags(cfg, device), config=cfg.to_dict(), phase_kinds=PHASE_KINDS)
    try:
        # Start the loops together once every rank has built its model (no rank's
        # first iterations wait for a slower rank's start-up).
        dist.barrier()
        if stage == "target":
            _target_loop(cfg, rank, device, rec, hs_queue)
        else:
            _drafter_loop(cfg, rank, device, rec, hs_queue, drafter_group, Path(run_dir))
        # Producers stay alive until every consumer has taken its last item:
        # tensors in the queue live in the producer's shared memory.
        dist.barrier()
    finally:
        rec.close()
        dist.destroy_process_group()


def _tags(cfg: PipelineConfig, device: torch.device) -> dict[str, Any]:
    tags: dict[str, Any] = {
        "scenario": cfg.scenario, "pipeline": "dflash-reference", "device": device.type,
        "target_ranks": cfg.target_ranks, "drafter_ranks": cfg.drafter_ranks,
    }
    if cfg.straggler_rank is not None and cfg.straggler_factor > 1.0:
        tags["straggler_rank"] = cfg.straggler_rank
    return tags


def _stream(device: torch.device) -> Any:
    """The CUDA stream to time phases on, or ``None`` on CPU (no device times)."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


class _Warmup:
    """The ``warmup`` event over a worker's first ``iterations`` iterations.

    Call :meth:`step` before each iteration; the event ends before iteration
    ``iterations`` starts (or at :meth:`end`, whichever comes first).
    """

    def __init__(self, rec: Recorder, iterations: int) -> None:
        self.iterations = iterations
        self.ctx: Any = rec.event("warmup", iterations=iterations) if iterations > 0 else None
        if self.ctx is not None:
            self.ctx.__enter__()

    def step(self, n: int) -> None:
        if n >= self.iterations:
            self.end()

    def end(self) -> None:
        if self.ctx is not None:
            ctx, self.ctx = self.ctx, None
            ctx.__exit__(None, None, None)


def _target_loop(cfg: PipelineConfig, rank: int, device: torch.device, rec: Recorder,
                 hs_queue: Any) -> None:
    step = TargetStep(cfg, device=device, rank=rank)
    stream = _stream(device)
    samples = cfg.batch_size * cfg.drafter_ranks
    tokens = samples * cfg.seq_len
    hsq = _timed_queue(hs_queue, rec, cfg)
    # Target rank r serves drafter steps r, r + T, r + 2T, ...: one item per drafter rank each.
    iterations = len(range(rank, cfg.steps, cfg.target_ranks))
    warm = _Warmup(rec, cfg.warmup_iters)
    try:
        for n in range(iterations):
            warm.step(n)
            with rec.iteration(tokens=tokens, samples=samples) as it:
                with it.phase("batch_get"):
                    input_ids = step.next_batch()
                with it.phase("target_forward", stream=stream):
                    states = step.forward(input_ids)
                with it.phase("hs_extract", stream=stream):
                    context = step.extract(states)
                for item in step.split(input_ids, context):
                    _put(hsq, item)  # phase hs_put: the wait for room (backpressure)
                del states, context, input_ids
    finally:
        warm.end()


def _drafter_loop(cfg: PipelineConfig, rank: int, device: torch.device, rec: Recorder,
                  hs_queue: Any, group: Any, run_dir: Path) -> None:
    drank = rank - cfg.target_ranks  # rank within the drafter stage
    step = DrafterStep(cfg, device=device, anchor_seed=cfg.seed * 7_919 + rank)
    stream = _stream(device)
    factor = cfg.straggler_factor if rank == cfg.straggler_rank else 1.0
    tokens, samples = cfg.batch_size * cfg.seq_len, cfg.batch_size
    world = cfg.drafter_ranks
    hsq = _timed_queue(hs_queue, rec, cfg)

    warm = _Warmup(rec, cfg.warmup_iters)
    try:
        for n in range(cfg.steps):
            warm.step(n)
            with rec.iteration(tokens=tokens, samples=samples) as it:
                payload = _get(hsq)  # phase hs_get: the wait for input (starvation)
                input_ids = payload["input_ids"].to(device, non_blocking=True)
                context = payload["context"].to(device, non_blocking=True)
                # Compute phases of a straggler rank run `factor` times longer. (Plain
                # nested `with`: the shim's phase contexts do not support ExitStack.)
                with it.phase("doc_ids", stream=stream), stretched(factor):
                    doc, pos = step.doc_ids(input_ids)
                with it.phase("mask_build", stream=stream), stretched(factor):
                    blocks = step.build_blocks(doc, pos, input_ids)
                with it.phase("draft_forward", stream=stream), stretched(factor):
                    loss = step.forward(input_ids, context, pos, blocks)
                with it.phase("backward", stream=stream), stretched(factor):
                    step.backward(loss)
                if world > 1:
                    with it.phase("grad_allreduce", stream=stream):
                        allreduce_mean(step.grads(), group=group, world=world)
                with it.phase("grad_norm_item"):
                    step.clip_grad_norm()
                with it.phase("optimizer", stream=stream), stretched(factor):
                    step.optimizer_step()
                del payload, input_ids, context
            done = n + 1
            if cfg.checkpoint_every and drank == 0 and done % cfg.checkpoint_every == 0 \
                    and done < cfg.steps:
                with rec.event("checkpoint", step=done):
                    save_checkpoint(step, run_dir / "checkpoints" / "drafter.pt")
    finally:
        warm.end()


def allreduce_mean(grads: list[torch.Tensor], *, group: Any, world: int) -> None:
    """Average ``grads`` over ``group`` in one flat bucket (as DDP buckets gradients)."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(world)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def save_checkpoint(step: DrafterStep, path: Path) -> None:
    """Save the drafter's weights and optimizer state to ``path`` (replacing it).

    Written to a temporary name and renamed, so a reader never sees half a file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": step.model.state_dict(), "optimizer": step.opt.state_dict()}, tmp)
    tmp.replace(path)


def _timed_queue(q: Any, rec: Recorder, cfg: PipelineConfig) -> Any:
    """The hidden-state queue wrapped by the shim: ``hs_get``/``hs_put`` waits, depth samples."""
    return timed(q, name=HS_QUEUE, recorder=rec, capacity=cfg.queue_capacity,
                 get_phase="hs_get", put_phase="hs_put")


def _put(q: Any, payload: dict[str, Any]) -> None:
    try:
        q.put(payload, timeout=QUEUE_TIMEOUT_S)
    except queue.Full:
        msg = (f"no room in the hidden-state queue for {QUEUE_TIMEOUT_S:.0f} s: "
               "did a drafter rank fail?")
        raise RuntimeError(msg) from None


def _get(q: Any) -> dict[str, Any]:
    try:
        return q.get(timeout=QUEUE_TIMEOUT_S)
    except queue.Empty:
        msg = f"no hidden states for {QUEUE_TIMEOUT_S:.0f} s: did a target rank fail?"
        raise RuntimeError(msg) from None
