"""``track`` on a real Accelerate loop with ``accelerator.accumulate`` (tiny MLP, CPU).

Injected bottleneck: the dataset's ``__getitem__`` sleeps 6 ms per sample
(starvation). Truth from bare timers in the same script: ``perf_counter`` around each
``__getitem__``, around each ``next`` of the loader, and after each real optimizer step (torch's own step hook on the
optimizer Accelerate wraps), and around the loop's evaluation, which must stay out of
the iterations.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

from fw_helpers import SlowData, TimedLoader, events, iterations

from dflash_runtime import Recorder
from dflash_runtime.integrations.accelerate import track

DIM, BATCH, ACCUM, STEPS, SLEEP_S, EVAL_EVERY = 32, 4, 2, 10, 0.006, 4


def _item(i: int):
    g = torch.Generator().manual_seed(i)
    return torch.randn(DIM, generator=g), torch.randn(1, generator=g)


@pytest.fixture
def accelerator():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield accelerate.Accelerator(gradient_accumulation_steps=ACCUM, cpu=True)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def test_track_counts_optimizer_steps_and_finds_the_slow_dataset(
        tmp_path: Path, starvation_verdict, accelerator) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.ReLU(),
                                torch.nn.Linear(DIM, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps: list[float] = []  # bare: perf_counter after each real optimizer step
    opt.register_step_post_hook(lambda *a: steps.append(time.perf_counter()))
    train = SlowData(BATCH * ACCUM * STEPS, SLEEP_S, _item)
    loader = torch.utils.data.DataLoader(train, batch_size=BATCH)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    run_dir = tmp_path / "run"
    rec = Recorder(run_dir, run_id="accelerate", tags={"device": "cpu"})
    timed = TimedLoader(loader)
    tracker = track(timed, accelerator, model, opt, recorder=rec)
    tensor_backward = torch.Tensor.backward
    eval_pc: list[tuple[float, float]] = []
    eval_wall: list[tuple[float, float]] = []
    n_steps = 0
    for x, y in tracker:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            n_steps += 1
            if n_steps % EVAL_EVERY == 0:
                with tracker.outside("evaluate"):
                    w0, p0 = time.time(), time.perf_counter()
                    time.sleep(0.05)  # an evaluation
                    eval_pc.append((p0, time.perf_counter()))
                    eval_wall.append((w0, time.time()))
    rec.close()

    # What instrument patched is restored once the loop ended.
    assert "zero_grad" not in vars(opt.optimizer) and "zero_grad" not in vars(model)
    assert torch.Tensor.backward is tensor_backward

    # One iteration per real optimizer step, each holding both micro-batches.
    its = iterations(run_dir)
    assert len(steps) == n_steps == STEPS == len(its)
    for r in its:
        assert r["samples"] == BATCH * ACCUM
        assert set(r["phases"]) == {"data_fetch", "forward", "backward", "grad_clip",
                                    "optimizer_step", "zero_grad"}
        assert r["kinds"]["data_fetch"] == "starvation"
    ends = steps
    fetched = 0.0
    for r, lo, hi in zip(its[1:], ends[:-1], ends[1:], strict=True):
        slept = sum(b - a for a, b in train.spans if lo < a and b <= hi)
        if hi != ends[-1]:  # the last step: the loader prefetched a batch a step earlier
            assert slept >= BATCH * ACCUM * SLEEP_S
        fetch = sum(b - a for a, b in timed.spans if lo < a and b <= hi)
        assert slept <= fetch <= r["phases"]["data_fetch"] + 1e-4
        fetched += fetch
    # (and little else: the loop's own steps between batches; a loaded machine's
    # scheduling delays land there too)
    assert sum(r["phases"]["data_fetch"] for r in its[1:]) <= 1.2 * fetched + len(its) * 2e-3

    # The evaluation is an event and overlaps no iteration.
    evs = events(run_dir, "evaluate")
    assert len(evs) == len(eval_wall) == STEPS // EVAL_EVERY
    for a, b in eval_wall:
        for r in its:
            assert r["ts"] + r["dur"] <= a or r["ts"] >= b, (r, a, b)

    starvation_verdict(run_dir, timed.spans, steps, eval_pc, "Accelerate")
