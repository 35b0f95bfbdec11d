"""The Lightning callback on a real ``Trainer.fit`` of a tiny MLP (random weights, CPU).

Injected bottleneck: the training dataset's ``__getitem__`` sleeps 10 ms per sample
(starvation). Truth from bare timers in the same script: ``perf_counter`` around each
``__getitem__``, around each ``next`` of the loader, and at each batch end that follows an optimizer step (the optimizer's
own step hook from torch says when it stepped), and the validation dataset's
``__getitem__`` spans (it sleeps 10 ms a sample), which no iteration may overlap.

Injected framework overhead: a callback sleeps 5 ms in every ``on_train_batch_end``
(bare-timed too): Lightning's own time between batches, which must land in
``lightning_loop``, never in ``data_fetch`` (starvation).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from fw_helpers import SlowData, TimedLoader, events, iterations, records

from dflash_runtime.integrations.lightning import TlogCallback

DIM, BATCH, ACCUM, STEPS, SLEEP_S = 32, 4, 2, 10, 0.010
HOOK_S = 0.005  # the slow callback's sleep per batch end
VAL_EVERY = 4  # training batches (2 optimizer steps)


def _item(i: int):
    g = torch.Generator().manual_seed(i)
    return torch.randn(DIM, generator=g), torch.randn(1, generator=g)


class _Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.ReLU(),
                                       torch.nn.Linear(DIM, 1))
        self.steps: list[float] = []  # bare: perf_counter after each real optimizer step

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.01)
        opt.register_step_post_hook(lambda *a: self.steps.append(time.perf_counter()))
        return opt


class _BatchEnds(pl.Callback):
    """Bare timer: perf_counter at each batch end that follows an optimizer step."""

    def __init__(self, net: _Net) -> None:
        self.net = net
        self.ends: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if len(self.net.steps) > len(self.ends):
            self.ends.append(time.perf_counter())


class _SlowHook(pl.Callback):
    """Framework overhead between batches: sleeps ``HOOK_S`` in each batch end; bare
    timers: ``walls`` (start, end) in ``time.time()`` of each sleep."""

    def __init__(self) -> None:
        self.walls: list[tuple[float, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        w0 = time.time()
        time.sleep(HOOK_S)
        self.walls.append((w0, time.time()))


def test_lightning_callback_counts_optimizer_steps_and_finds_the_slow_dataset(
        tmp_path: Path, starvation_verdict, monkeypatch) -> None:
    torch.manual_seed(0)
    net = _Net()
    train = SlowData(BATCH * ACCUM * STEPS, SLEEP_S, _item)
    val = SlowData(2 * BATCH, 0.010, _item)
    loader = TimedLoader(torch.utils.data.DataLoader(train, batch_size=BATCH))
    val_loader = torch.utils.data.DataLoader(val, batch_size=BATCH)
    run_dir = tmp_path / "run"
    monkeypatch.setenv("TLOG_RUN_DIR", str(run_dir))  # the callback makes its recorder
    bare = _BatchEnds(net)
    slow = _SlowHook()
    trainer = pl.Trainer(
        max_steps=STEPS, accumulate_grad_batches=ACCUM, val_check_interval=VAL_EVERY,
        limit_val_batches=2, num_sanity_val_steps=0, accelerator="cpu", devices=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[TlogCallback(), bare, slow])
    trainer.fit(net, loader, val_loader)   # the callback closes its recorder at the end
    assert not {"start", "stop"} & set(vars(trainer.profiler))  # its wrappers removed

    (meta,) = [r for r in records(run_dir) if r.get("type") == "meta" and "rank" in r]
    assert (meta["rank"], meta["world_size"]) == (0, 1)   # from the trainer

    # One iteration per optimizer step (torch's own step hook counts them), each
    # holding both batches of the accumulation.
    its = iterations(run_dir)
    assert trainer.global_step == len(net.steps) == STEPS
    assert len(its) == STEPS
    for r in its:
        assert r["samples"] == BATCH * ACCUM
        assert set(r["phases"]) == {"data_fetch", "lightning_loop", "forward", "zero_grad",
                                    "backward", "optimizer_step"}
        assert r["kinds"]["data_fetch"] == "starvation"
        assert r["kinds"]["lightning_loop"] == "compute"
    # Per step: the data phase holds the bare-timed fetch of both batches (2 x 4 x 10 ms).
    ends = bare.ends
    fetched = hooks = 0.0
    for r, lo, hi in zip(its[1:], ends[:-1], ends[1:], strict=True):
        slept = sum(b - a for a, b in train.spans if lo < a and b <= hi)
        assert slept >= BATCH * ACCUM * SLEEP_S  # (Lightning's loader does not prefetch)
        fetch = sum(b - a for a, b in loader.spans if lo < a and b <= hi)
        assert slept <= fetch <= r["phases"]["data_fetch"] + 1e-4
        # ... and nothing else: the slow callback's sleeps in the step (bare-timed,
        # their middles inside the record's span) are in `lightning_loop`.
        assert r["phases"]["data_fetch"] < fetch + HOOK_S, (r["phases"], fetch)
        hooked = sum(b - a for a, b in slow.walls if r["ts"] < (a + b) / 2 < r["ts"] + r["dur"])
        assert hooked >= HOOK_S, (r, slow.walls)
        assert hooked <= r["phases"]["lightning_loop"], (r["phases"], hooked)
        fetched += fetch
        hooks += hooked
    # (and little else: the fetcher's own steps around the loader's `next`; a loaded
    # machine's scheduling delays land there too)
    assert sum(r["phases"]["data_fetch"] for r in its[1:]) <= 1.2 * fetched + len(its) * 2e-3
    assert sum(r["phases"]["data_fetch"] for r in its[1:]) <= fetched + len(its) * 1e-3
    # `lightning_loop` holds the sleeps and Lightning's own steps between batches
    # (0.3-0.5 ms a batch measured on a quiet machine, about 1 ms loaded).
    loop = sum(r["phases"]["lightning_loop"] for r in its[1:])
    assert hooks <= loop <= hooks + (len(its) - 1) * ACCUM * 2e-3, (loop, hooks)

    # Validation is no training iteration: an event, overlapping no iteration.
    n_val = STEPS * ACCUM // VAL_EVERY
    evs = events(run_dir, "validation")
    assert len(evs) == n_val and len(val.walls) == n_val * 2 * BATCH
    for a, b in val.walls:
        for r in its:
            assert r["ts"] + r["dur"] <= a or r["ts"] >= b, (r, a, b)

    # The verdict: starvation in `data`, within 5 points of the bare timers' share.
    val_pc = [(min(val.spans[k][0] for k in range(i, i + 2 * BATCH)),
               max(val.spans[k][1] for k in range(i, i + 2 * BATCH)))
              for i in range(0, len(val.spans), 2 * BATCH)]
    starvation_verdict(run_dir, loader.spans, bare.ends, val_pc, "Lightning")
