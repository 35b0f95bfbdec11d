"""The Hugging Face ``Trainer`` callback on a real, tiny GPT-2 (random weights, CPU).

Injected bottleneck: the training dataset's ``__getitem__`` sleeps 6 ms per sample, so
the loop waits for its data most of the time (starvation). The truth is measured with
bare timers in the same script: ``perf_counter`` around each ``__getitem__``, around
each step's batch fetch (a ``get_batch_samples`` override) and at each
``on_step_end`` (a second, bare callback), and ``time.time()`` around each evaluation
(an ``evaluate`` override): the evaluation dataset sleeps too (10 ms a sample), so an
evaluation counted into the iterations would move the shares.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from fw_helpers import SlowData, events, iterations

from dflash_runtime import Recorder
from dflash_runtime.integrations.hf import TlogCallback

SEQ, BATCH, ACCUM, STEPS, EVAL_EVERY, SLEEP_S = 16, 4, 2, 12, 4, 0.006


def _item(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(0, 64, (SEQ,), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


class _StepEnds(transformers.TrainerCallback):
    """Bare timer: ``perf_counter`` at every ``on_step_end``."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


class _TimedTrainer(transformers.Trainer):
    """Bare timers: the span of every evaluation and of every step's batch fetch."""

    eval_spans: list[tuple[float, float]]   # time.time()
    eval_pc: list[tuple[float, float]]      # perf_counter()
    fetches: list[tuple[float, float]]      # perf_counter() of every step's batch fetch

    def get_batch_samples(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return super().get_batch_samples(*args, **kwargs)
        finally:
            self.fetches.append((t0, time.perf_counter()))

    def evaluate(self, *args, **kwargs):
        t0, p0 = time.time(), time.perf_counter()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            self.eval_spans.append((t0, time.time()))
            self.eval_pc.append((p0, time.perf_counter()))


def _train(tmp_path: Path, callback, *, steps: int, evaluate: bool):
    """Train the tiny GPT-2 for ``steps`` optimizer steps with ``callback``; returns the
    trainer, the training dataset and the bare step-end timer."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                  n_positions=SEQ)
    model = transformers.GPT2LMHeadModel(cfg)
    train = SlowData(BATCH * ACCUM * steps, SLEEP_S, _item)
    evals = SlowData(8, 0.010, _item) if evaluate else None
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, gradient_accumulation_steps=ACCUM,
        eval_strategy="steps" if evaluate else "no", eval_steps=EVAL_EVERY, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True,
        dataloader_num_workers=0, learning_rate=1e-3, seed=0)
    bare = _StepEnds()
    trainer = _TimedTrainer(model=model, args=args, train_dataset=train, eval_dataset=evals,
                            callbacks=[callback, bare])
    trainer.eval_spans, trainer.eval_pc, trainer.fetches = [], [], []
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    trainer.train()
    return trainer, train, bare


def test_trainer_callback_counts_optimizer_steps_and_finds_the_slow_dataset(
        tmp_path: Path, starvation_verdict) -> None:
    run_dir = tmp_path / "run"
    rec = Recorder(run_dir, run_id="hf", tags={"device": "cpu"})
    trainer, train, bare = _train(tmp_path, TlogCallback(rec), steps=STEPS, evaluate=True)
    rec.close()

    # One iteration per optimizer step; each holds both micro-batches (samples, tokens
    # read in the forward hook of every micro-batch and summed).
    its = iterations(run_dir)
    assert trainer.state.global_step == STEPS
    assert len(its) == STEPS == len(bare.ends)
    for r in its:
        assert r["samples"] == BATCH * ACCUM
        assert r["tokens"] == BATCH * ACCUM * SEQ
        assert {"data_fetch", "forward", "backward", "grad_clip", "optimizer_step",
                "zero_grad"} <= set(r["phases"]) <= {"log", "data_fetch", "forward", "backward",
                                                     "grad_clip", "optimizer_step", "zero_grad"}
        assert r["kinds"]["data_fetch"] == "starvation"
    # The data phase holds the fetch of both micro-batches: per step, the bare-timed
    # __getitem__ seconds between the previous step's end and this one's (2 x 4 x 6 ms;
    # the last step fetches one batch: the loader prefetched the other a step earlier).
    fetched = 0.0
    for r, lo, hi in zip(its[1:], bare.ends[:-1], bare.ends[1:], strict=True):
        slept = sum(b - a for a, b in train.spans if lo < a and b <= hi)
        fetch = sum(b - a for a, b in trainer.fetches if lo < a and b <= hi)
        assert slept <= fetch <= r["phases"]["data_fetch"] + 1e-4
        fetched += fetch
    # (and little else: the loop's own steps between batches; a loaded machine's
    # scheduling delays land there too)
    assert sum(r["phases"]["data_fetch"] for r in its[1:]) <= 1.2 * fetched + len(its) * 2e-3
    assert sum(b - a for a, b in train.spans if bare.ends[0] < a <= bare.ends[1]) >= (
        BATCH * ACCUM * SLEEP_S)

    # Evaluation is no training iteration: every evaluation (bare-timed) is an event,
    # and no iteration overlaps one.
    assert len(trainer.eval_spans) == STEPS // EVAL_EVERY
    evs = events(run_dir, "evaluate")
    assert len(evs) == len(trainer.eval_spans)
    # (10 ms of slack: evaluate() still runs a little after its on_evaluate callback;
    # each evaluation lasts 80 ms at least.)
    for a, b in trainer.eval_spans:
        for r in its:
            assert r["ts"] + r["dur"] <= a + 0.01 or r["ts"] >= b - 0.01, (r, a, b)
    for (a, b), e in zip(trainer.eval_spans, evs, strict=True):
        assert e["dur"] == pytest.approx(b - a, abs=5e-3)

    # The verdict: starvation in `data`, its share within 5 points of the bare timers'.
    starvation_verdict(run_dir, trainer.fetches, bare.ends, trainer.eval_pc, "HF")


def test_without_instrument_the_callbacks_own_phases_cover_the_step(tmp_path: Path) -> None:
    """``instrument=False`` (or another instrumentation already active): the step is
    ``forward_backward`` (which must hold the bare-timed forwards of both
    micro-batches), ``optimizer_step`` and ``zero_grad`` from the callback pairs."""
    run_dir = tmp_path / "run"
    rec = Recorder(run_dir, run_id="hf-pairs")
    forwards: list[tuple[float, float]] = []
    steps = 4
    cb = TlogCallback(rec, instrument=False)
    orig = transformers.GPT2LMHeadModel.forward

    @functools.wraps(orig)  # the Trainer reads forward's signature
    def timed_forward(self, *args, **kwargs):  # bare timer around the model's forward
        t0 = time.perf_counter()
        try:
            return orig(self, *args, **kwargs)
        finally:
            forwards.append((t0, time.perf_counter()))

    transformers.GPT2LMHeadModel.forward = timed_forward
    try:
        trainer, _, bare = _train(tmp_path, cb, steps=steps, evaluate=False)
    finally:
        transformers.GPT2LMHeadModel.forward = orig
    rec.close()
    its = iterations(run_dir)
    assert len(its) == trainer.state.global_step == steps
    assert len(forwards) == steps * ACCUM
    for r, lo, hi in zip(its[1:], bare.ends[:-1], bare.ends[1:], strict=True):
        assert set(r["phases"]) == {"log", "data_fetch", "forward_backward", "optimizer_step",
                                    "zero_grad"}
        assert r["samples"] == BATCH * ACCUM
        fwd = [b - a for a, b in forwards if lo < a and b <= hi]
        assert len(fwd) == ACCUM and sum(fwd) <= r["phases"]["forward_backward"]
