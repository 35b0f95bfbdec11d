"""Console lines of GPT-NeoX, DeepSpeed's pipeline engine, NeMo 2, Megatron-LM
of 2020 and a key=value Megatron fork, written with the format strings of the
projects' own code (hence ``str.format`` and ``%`` where an f-string would do),
for the timer-log tests. Each function names the file it copies; the figures
are the caller's, so a test computes its expectations from the same numbers.

Sources (read with the ``fetch`` tool):

- EleutherAI/gpt-neox at ea7aefd: ``megatron/logging.py`` ``training_log``
  (the iteration line, ``print_rank_0``; ``human_readable_flops``),
  ``megatron/utils.py`` ``Timers.log`` (``"time (ms)"`` then
  ``" | {}: {:.2f}"``, normalised by ``log_interval``), ``megatron/training.py``
  (``forward`` around ``forward_step``, which times ``batch generator``;
  ``backward`` around ``backward_step``: ``backward-backward`` around
  ``model.backward``, ``backward-allreduce`` reset to 0; ``optimizer``).
- deepspeedai/DeepSpeed at edaa722: ``deepspeed/utils/timer.py``
  ``SynchronizedWallClockTimer.log`` (``print_dist``: ``"[Rank 0] "`` + the
  line), ``deepspeed/runtime/engine.py`` ``step`` (micro-step line every step,
  boundary line at each gradient-accumulation boundary),
  ``deepspeed/runtime/pipe/engine.py`` ``train_batch`` and
  ``_exec_optimizer_step`` (every ``steps_per_print`` steps, timers summed
  since the last print: ``batch_input`` + micro-step line, boundary line, the
  ``steps: ...`` line, the hand-off line).
- NVIDIA/NeMo at 8cfedd7: ``nemo/lightning/pytorch/callbacks/progress_printer.py``
  ``ProgressPrinter`` (``"Training epoch {e}, iteration {n-1}/{total-1}"`` then
  ``format_string``: integral floats as ints, others ``{:.4}``; metrics summed
  and divided by ``log_interval``, ``global_step`` the latest),
  ``nemo/utils/exp_manager.py`` ``TimingCallback`` (``train_step_timing in s``).
- NVIDIA/Megatron-LM at 3354081 (June 2020): ``megatron/training.py``
  ``training_log`` (``forward``, ``backward``, ``allreduce``, ``optimizer``,
  ``batch generator``), ``megatron/utils.py`` ``Timers.log``.
- argonne-lcf/Megatron-DeepSpeed at ffa3456: ``megatron/training_log.py``
  (``iteration=`` ... ``elapsed_time_per_iteration_ms=`` ... via ``log.info``;
  the logger's prefix as in its ``ALCF/notes/cooldown.md``), then
  ``megatron/timers.py``'s ``(min, max)`` block.
"""
# ruff: noqa: UP031, UP032

from __future__ import annotations


def neox_iteration(it: int, train_iters: int, samples_per_sec: float, elapsed_ms: float,
                   lr: float, flops: float, loss: float) -> str:
    """GPT-NeoX ``training_log``'s line (``elapsed_ms``: the interval's time
    over ``log_interval``, as NeoX divides it)."""
    def human_readable_flops(num: float) -> str:
        for unit in ["", "KFLOPS", "MFLOPS", "GFLOPS", "TFLOPS", "PFLOPS", "EFLOPS", "ZFLOPS"]:
            if abs(num) < 1000.0:
                return "%3.1f%s" % (num, unit)
            num /= 1000.0
        return "%.1f%s" % (num, "YFLOPS")
    s = " samples/sec: {:.3f} |".format(samples_per_sec)
    s += " iteration {:8d}/{:8d} |".format(it, train_iters)
    s += " elapsed time per iteration (ms): {:.1f} |".format(elapsed_ms)
    s += " learning rate: {:.3E} |".format(lr)
    s += f" approx flops per GPU: {human_readable_flops(flops)} |"
    s += " {}: {:.6E} |".format("lm_loss", loss)
    s += " loss scale: {:.1f} |".format(65536.0)
    s += " number of skipped iterations: {:3d} |".format(0)
    s += " number of nan iterations: {:3d} |".format(0)
    return s


def timers_line(pairs: list[tuple[str, float]]) -> str:
    """``Timers.log`` of GPT-NeoX, Megatron-LM before August 2022 and DeepSpeed
    (without the rank prefix): ``time (ms) | name: 1.23 | ...``."""
    s = "time (ms)"
    for name, elapsed in pairs:
        s += " | {}: {:.2f}".format(name, elapsed)
    return s


def ds_line(pairs: list[tuple[str, float]], rank: int = 0) -> str:
    """DeepSpeed's timer line as ``print_dist`` prints it."""
    return "[Rank {}] {}".format(rank, timers_line(pairs))


def ds_engine_step(fwd: float, bwd: float, inner: float, allreduce: float, step: float) -> list[str]:
    """DeepSpeed's engine ``step`` with gradient accumulation 1: the micro-step
    line, then the boundary line (ms)."""
    return [ds_line([("fwd_microstep", fwd), ("bwd_microstep", bwd),
                     ("bwd_inner_microstep", inner), ("bwd_allreduce_microstep", allreduce),
                     ("step_microstep", step)]),
            ds_line([("fwd", fwd), ("bwd", bwd), ("bwd_inner", inner),
                     ("bwd_allreduce", allreduce), ("step", step)])]


def ds_pipe_print(steps: int, loss: float, iter_s: float, samples_per_sec: float,
                  sums: dict[str, float]) -> list[str]:
    """DeepSpeed's pipeline engine at a ``steps_per_print`` step: ``sums`` are
    its timers' ms summed since the last print (the engine never normalises)."""
    micro = [("batch_input", sums["batch_input"]), ("fwd_microstep", sums["fwd"]),
             ("bwd_microstep", sums["bwd"]), ("bwd_inner_microstep", sums["bwd_inner"]),
             ("bwd_allreduce_microstep", sums["bwd_allreduce"]),
             ("step_microstep", sums["step"])]
    glob = [(n, sums[n]) for n in ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")]
    log_str = f"steps: {steps} loss: {loss:0.4f} "
    log_str += f"iter time (s): {iter_s:0.3f} samples/sec: {samples_per_sec:0.3f}"
    pipe = [(n, sums[n]) for n in ("pipe_send_output", "pipe_send_grad", "pipe_recv_input",
                                   "pipe_recv_grad")]
    return [ds_line(micro), ds_line(glob), log_str, ds_line(pipe)]


def nemo_line(epoch: int, n: int, total: int, metrics: dict[str, float]) -> str:
    """NeMo 2's ``ProgressPrinter`` line for ``current_epoch_step`` ``n``."""
    log_string = "Training" + f" epoch {epoch}, iteration {n - 1}/{total - 1}"
    for metric, val in metrics.items():
        if isinstance(val, (float)) and val.is_integer():
            val = int(val)
            log_string += f' | {metric}: {val}'
        else:
            log_string += f' | {metric}: {val:.4}'
    return log_string


def megatron_2020_iteration(it: int, train_iters: int, elapsed_ms: float, lr: float,
                            loss: float) -> str:
    """Megatron-LM's 2020 ``training_log`` line (no consumed samples, no batch size)."""
    s = ' iteration {:8d}/{:8d} |'.format(it, train_iters)
    s += ' elapsed time per iteration (ms): {:.1f} |'.format(elapsed_ms)
    s += ' learning rate: {:.3E} |'.format(lr)
    s += ' {}: {:.6E} |'.format('lm loss', loss)
    s += ' loss scale: {:.1f} |'.format(4096.0)
    return s


def minmax_block(pairs: list[tuple[str, float, float]]) -> list[str]:
    """Megatron core ``Timers`` ``(min, max)`` block (``get_all_timers_string``)."""
    out = '(min, max) time across ranks (ms):'
    for name, mn, mx in pairs:
        out += '\n    {}: ({:.2f}, {:.2f})'.format((name + ' ').ljust(48, '.'), mn, mx)
    return out.split("\n")


def keyvalue_iteration(stamp: str, it: int, train_iters: int, consumed_samples: int,
                       consumed_tokens: int, elapsed_ms: float, lr: float, gbs: int,
                       loss: float, seq_len: int) -> str:
    """argonne-lcf/Megatron-DeepSpeed's key=value line behind its logger's prefix."""
    s = f" iteration={it:8d}/{train_iters:8d} |"
    s += f" consumed_samples={consumed_samples:12d} |"
    s += f" consumed_tokens={consumed_tokens:12d} |"
    s += " elapsed_time_per_iteration_ms=" f"{elapsed_ms:.1f} |"
    s += f" learning_rate={lr:.6g} |"
    s += f" global_batch_size={gbs:5d} |"
    s += " {}={:.6f} |".format("lm loss", loss)
    s += " loss_scale={:.1f} |".format(1.0)
    s += " actual_seqlen={:5d} |".format(seq_len)
    s += " number_of_skipped_iterations={:3d} |".format(0)
    s += " number_of_nan_iterations={:3d} |".format(0)
    return f"[{stamp}][I][megatron/training_log:402:training_log] " + s
