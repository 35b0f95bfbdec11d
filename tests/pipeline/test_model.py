"""The pipeline's models, data and training step, in one process (no ranks, no recorder)."""

from __future__ import annotations

import itertools
import time

import pytest

torch = pytest.importorskip("torch")

from dflash_runtime.pipeline.data import EOS_ID, PackedLoader, mask_token_id
from dflash_runtime.pipeline.model import TargetDecoder, target_layer_ids
from dflash_runtime.pipeline.scenarios import (
    MAX_STEPS,
    SCENARIOS,
    make_config,
)
from dflash_runtime.pipeline.steps import DrafterStep, TargetStep, stretched

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small(**kw):
    base = {"vocab_size": 64, "seq_len": 32, "batch_size": 2, "mean_doc_len": 10, "hidden": 32,
            "heads": 2, "intermediate": 64, "target_layers": 6, "draft_layers": 2,
            "block_size": 4, "num_anchors": 6}
    base.update(kw)
    return make_config("balanced", steps=10, **base)


# -- target layers -------------------------------------------------------------------


def test_target_layers_are_dflash_evenly_spaced() -> None:
    assert target_layer_ids(36, 5) == [1, 9, 17, 25, 33]   # span 1..33 in 4 steps of 8
    assert target_layer_ids(6, 2) == [1, 3]
    assert target_layer_ids(24, 2) == [1, 21]
    assert target_layer_ids(8, 1) == [4]                   # one tap: the middle layer


def test_target_layers_need_depth() -> None:
    with pytest.raises(ValueError, match="at least 4 target layers"):
        target_layer_ids(3, 2)
    with pytest.raises(ValueError, match="num_taps"):
        target_layer_ids(6, 0)


# -- data ------------------------------------------------------------------------------


def _loader(**kw):
    args = {"vocab_size": 64, "seq_len": 200, "batch_size": 3, "mean_doc_len": 20,
            "bigram_p": 0.8, "seed": 5}
    args.update(kw)
    return PackedLoader(**args)


def test_loader_packs_documents_ending_with_eos() -> None:
    ids = next(_loader())["input_ids"]
    assert ids.shape == (3, 200) and ids.dtype == torch.int64
    assert int(ids.min()) >= EOS_ID and int(ids.max()) < mask_token_id(64)  # MASK never in data
    for row in ids.tolist():
        assert row[0] != EOS_ID
        # No empty document: never two EOS in a row.
        assert all(not (a == EOS_ID and b == EOS_ID) for a, b in itertools.pairwise(row))
        assert 3 <= row.count(EOS_ID) <= 25  # mean 20 tokens per document over 200 tokens


def test_loader_is_reproducible_per_stream() -> None:
    a, b, c = (next(_loader(stream=s))["input_ids"] for s in (0, 0, 1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_loader_follows_its_bigram_table() -> None:
    loader = _loader(bigram_p=1.0, seq_len=400, batch_size=1)
    row = next(loader)["input_ids"][0].tolist()
    pairs = [(a, b) for a, b in itertools.pairwise(row) if EOS_ID not in (a, b)]
    assert pairs and all(loader.successor[a] == b for a, b in pairs)


def test_loader_stall_waits() -> None:
    loader = _loader(stall_s=0.05, batch_size=1, seq_len=8)
    start = time.perf_counter()
    next(loader)
    assert time.perf_counter() - start >= 0.05


# -- models ----------------------------------------------------------------------------


def test_target_is_frozen_and_returns_every_layer() -> None:
    cfg = small()
    step = TargetStep(cfg, device=CPU, rank=0)
    ids = step.next_batch()
    states = step.forward(ids)
    assert len(states) == cfg.target_layers + 1
    assert all(s.shape == (4, 32, 32) for s in states)  # batch 2 for each of 2 drafter ranks
    assert not any(p.requires_grad for p in step.model.parameters())
    ctx = step.extract(states)
    assert ctx.shape == (4, 32, 2 * 32)
    assert torch.equal(ctx[..., :32], states[2]) and torch.equal(ctx[..., 32:], states[4])


def test_target_attention_stays_inside_documents() -> None:
    cfg = small()
    model = TargetDecoder(vocab_size=64, hidden=32, heads=2, layers=2, intermediate=64, seed=0)
    ids = torch.tensor([[5, 6, EOS_ID, 7, 8, 9]])
    other = torch.tensor([[9, 9, EOS_ID, 7, 8, 9]])  # first document changed
    step = TargetStep(cfg, device=CPU, rank=0)
    step.model = model
    a, b = step.forward(ids)[-1], step.forward(other)[-1]
    assert torch.allclose(a[0, 3:], b[0, 3:])       # the second document cannot see the first
    assert not torch.allclose(a[0, :3], b[0, :3])


def test_drafter_and_target_share_token_io() -> None:
    cfg = small()
    target = TargetStep(cfg, device=CPU, rank=0)
    drafter = DrafterStep(cfg, device=CPU, anchor_seed=1)
    assert torch.equal(target.model.io.embed.weight, drafter.io.embed.weight)
    assert torch.equal(target.model.io.lm_head.weight, drafter.io.lm_head.weight)
    assert not drafter.io.embed.weight.requires_grad


def _block_hidden(step, ids, context, anchor):
    doc, pos = step.doc_ids(ids)
    blocks = step.build_blocks(doc, pos, ids, anchors=(torch.tensor([[anchor]]),
                                                       torch.tensor([[True]])))
    bs = step.cfg.block_size
    noise_ids = torch.full((1, bs), step.mask_id)
    noise_ids[0, 0] = ids[0, anchor]
    return step.model(step.io.embed(noise_ids), context, blocks.q_pos, pos, blocks.mask)


def test_drafter_sees_only_context_before_its_anchor_in_its_document() -> None:
    cfg = small(seq_len=12, batch_size=1)
    step = DrafterStep(cfg, device=CPU, anchor_seed=0)
    ids = torch.tensor([[5, 6, EOS_ID, 7, 8, 9, 10, 11, 12, EOS_ID, 13, 14]])
    anchor = 6                                          # document 1 spans positions 3..9
    context = torch.randn(1, 12, 2 * 32)
    base = _block_hidden(step, ids, context, anchor)
    later = context.clone()
    later[0, anchor:] += 5.0                            # at/after the anchor: invisible
    earlier_doc = context.clone()
    earlier_doc[0, :3] += 5.0                           # another document: invisible
    inside = context.clone()
    inside[0, 4] += 5.0                                 # same document, before the anchor
    with torch.no_grad():
        assert torch.allclose(base, _block_hidden(step, ids, later, anchor), atol=1e-6)
        assert torch.allclose(base, _block_hidden(step, ids, earlier_doc, anchor), atol=1e-6)
        assert not torch.allclose(base, _block_hidden(step, ids, inside, anchor), atol=1e-3)


def test_training_lowers_the_loss() -> None:
    cfg = small(lr=3e-3, bigram_p=0.9)
    target = TargetStep(cfg, device=CPU, rank=0)
    drafter = DrafterStep(cfg, device=CPU, anchor_seed=1)
    losses, norms = [], []
    for _ in range(120):
        ids = target.next_batch()
        context = target.extract(target.forward(ids))
        doc, pos = drafter.doc_ids(ids)
        blocks = drafter.build_blocks(doc, pos, ids)
        loss = drafter.forward(ids, context, pos, blocks)
        drafter.backward(loss)
        norms.append(drafter.clip_grad_norm())
        drafter.optimizer_step()
        losses.append(loss.item())
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    # Uniform guessing over 62 data tokens costs log(62) = 4.13 nats; the bigram
    # structure lets the drafter go well below it within 120 steps (3.37 measured).
    assert first > 4.0
    assert last < first - 0.6
    assert all(n > 0 for n in norms)


def test_stretched_multiplies_wall_time() -> None:
    start = time.perf_counter()
    with stretched(3.0):
        time.sleep(0.02)
    assert time.perf_counter() - start >= 0.06
    start = time.perf_counter()
    with stretched(1.0):
        pass
    assert time.perf_counter() - start < 0.01


# -- configuration ---------------------------------------------------------------------


def test_scenarios_change_what_they_say() -> None:
    base = make_config("balanced")
    assert make_config("heavy-target").target_layers == 4 * base.target_layers
    assert make_config("heavy-drafter").num_anchors == 4 * base.num_anchors
    assert make_config("slow-loader").loader_stall_s > 0 == base.loader_stall_s
    straggler = make_config("straggler", world_size=4)
    assert straggler.straggler_rank == 3 and straggler.straggler_factor == 3.0
    assert set(SCENARIOS) == {"balanced", "slow-loader", "heavy-target", "heavy-drafter",
                              "straggler"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scenario": "fast"}, "unknown scenario 'fast'; choose one of: balanced, slow-loader"),
        ({"steps": 0}, f"steps must be a whole number from 1 to {MAX_STEPS}, got 0"),
        ({"steps": 2.5}, "steps must be a whole number"),
        ({"world_size": 1}, "world_size must be at least 2"),
        ({"scenario": "straggler", "world_size": 2}, "straggler scenario needs at least 2 drafter"),
        ({"blocks": 3}, "unknown pipeline setting(s): blocks"),
        ({"hidden": 30, "heads": 4}, "hidden (30) / heads (4)"),
    ],
)
def test_bad_configs_say_what_is_wrong(kwargs, message) -> None:
    with pytest.raises(ValueError) as info:
        make_config(**kwargs)
    assert message in str(info.value)
