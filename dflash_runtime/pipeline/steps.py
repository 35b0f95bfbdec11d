"""The work of one iteration of each stage, one method per recorded phase.

:class:`TargetStep` and :class:`DrafterStep` hold a stage's model and state;
the worker loops (:mod:`dflash_runtime.pipeline.train`) call their methods,
each inside the phase it is named after. Keeping the work here, free of any
recording or distribution, lets tests run a training step in one process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from dflash_runtime.pipeline.data import EOS_ID, PackedLoader, mask_token_id
from dflash_runtime.pipeline.masks import (
    block_label_weights,
    block_positions,
    dflash_block_mask,
    doc_ids_from_eos,
    positions_in_doc,
    sample_anchors,
)
from dflash_runtime.pipeline.model import (
    Drafter,
    TargetDecoder,
    build_token_io,
    extract_context,
    target_layer_ids,
    weighted_block_loss,
)
from dflash_runtime.pipeline.scenarios import PipelineConfig

#: AdamW betas of DFlash/EAGLE drafter recipes (SpecForge's defaults for drafters).
ADAMW_BETAS = (0.9, 0.95)


@contextmanager
def stretched(factor: float) -> Iterator[None]:
    """Make the enclosed work take ``factor`` times its wall time.

    Models a throttled device (power or thermal cap, a slower part): the host
    waits while the work runs slower. The extra time is a sleep, so the slowed
    rank does not steal CPU from its peers on a shared machine. ``factor <= 1``
    does nothing.
    """
    if factor <= 1.0:
        yield
        return
    start = time.perf_counter()
    yield
    time.sleep((factor - 1.0) * (time.perf_counter() - start))


def make_loader(cfg: PipelineConfig, *, stream: int) -> PackedLoader:
    """The packed-data loader of a target rank (``stream``: its rank).

    One batch holds ``batch_size`` sequences for each drafter rank: a target
    iteration serves one step of every drafter rank.
    """
    return PackedLoader(vocab_size=cfg.vocab_size, seq_len=cfg.seq_len,
                        batch_size=cfg.batch_size * cfg.drafter_ranks,
                        mean_doc_len=cfg.mean_doc_len,
                        bigram_p=cfg.bigram_p, seed=cfg.seed, stream=stream,
                        stall_s=cfg.loader_stall_s)


class TargetStep:
    """A target rank: frozen decoder, its tapped layers, its loader.

    One iteration runs the target over ``batch_size`` sequences per drafter
    rank (one batched forward, as a target server batches its requests) and
    splits the result into one item per drafter rank (:meth:`split`).

    Phases: ``batch_get`` (:meth:`next_batch`), ``target_forward``
    (:meth:`forward`), ``hs_extract`` (:meth:`extract`).
    """

    def __init__(self, cfg: PipelineConfig, *, device: torch.device, rank: int) -> None:
        self.cfg, self.device = cfg, device
        self.model = TargetDecoder(vocab_size=cfg.vocab_size, hidden=cfg.hidden, heads=cfg.heads,
                                   layers=cfg.target_layers, intermediate=cfg.intermediate,
                                   seed=cfg.seed).to(device)
        if device.type == "cuda":  # serve the frozen target in bf16, as trainers do on GPUs
            self.model.to(torch.bfloat16)
        self.layer_ids = target_layer_ids(cfg.target_layers, cfg.draft_layers)
        self.loader = make_loader(cfg, stream=rank)

    def next_batch(self) -> torch.Tensor:
        """The next packed batch, ``[B, S]`` token ids on the device."""
        return next(self.loader)["input_ids"].to(self.device, non_blocking=True)

    def forward(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """All hidden states of the packed batch (document-causal attention)."""
        doc = doc_ids_from_eos(input_ids, EOS_ID)
        return self.model(input_ids, positions_in_doc(doc), doc)

    def extract(self, states: list[torch.Tensor]) -> torch.Tensor:
        """The tapped layers, concatenated: ``[B, S, taps * hidden]``."""
        return extract_context(states, self.layer_ids)

    def split(self, input_ids: torch.Tensor,
              context: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """One queue item per drafter rank: ``{"input_ids": [b, S], "context": [b, S, C]}``
        with ``b = batch_size`` (views: the tensors cross processes without a copy)."""
        n = self.cfg.drafter_ranks
        return [{"input_ids": i, "context": c}
                for i, c in zip(input_ids.chunk(n), context.chunk(n), strict=True)]


@dataclass
class Blocks:
    """The drafter's blocks for one batch (see :mod:`~dflash_runtime.pipeline.masks`).

    Shapes: ``anchors``/``keep`` ``[B, N]``; ``mask`` ``[B, 1, Q, S + Q]``;
    ``q_pos``, ``labels``, ``weights`` ``[B, Q]`` with ``Q = N * block_size``.
    """

    anchors: torch.Tensor
    keep: torch.Tensor
    mask: torch.Tensor
    q_pos: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor


class DrafterStep:
    """A drafter rank: the trainable drafter, the shared frozen token I/O, AdamW.

    Phases: ``doc_ids`` (:meth:`doc_ids`), ``mask_build`` (:meth:`build_blocks`),
    ``draft_forward`` (:meth:`forward`), ``backward``, ``grad_norm_item``
    (:meth:`clip_grad_norm`), ``optimizer`` (:meth:`optimizer_step`).

    Args:
        cfg: the run's config. device: where to train.
        anchor_seed: seed of this rank's anchor sampling.
    """

    def __init__(self, cfg: PipelineConfig, *, device: torch.device, anchor_seed: int) -> None:
        self.cfg, self.device = cfg, device
        self.io = build_token_io(cfg.vocab_size, cfg.hidden, seed=cfg.seed).to(device)
        torch.manual_seed(cfg.seed + 2)  # identical drafter init on every rank (as DDP broadcasts)
        self.model = Drafter(hidden=cfg.hidden, heads=cfg.heads, layers=cfg.draft_layers,
                             intermediate=cfg.intermediate, taps=cfg.draft_layers).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=ADAMW_BETAS,
                                     weight_decay=cfg.weight_decay)
        self.gen = torch.Generator().manual_seed(anchor_seed)
        self.mask_id = mask_token_id(cfg.vocab_size)

    def doc_ids(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Document ids and in-document positions of the packed batch, both ``[B, S]``."""
        doc = doc_ids_from_eos(input_ids, EOS_ID)
        return doc, positions_in_doc(doc)

    def build_blocks(self, doc: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor, *,
                     anchors: tuple[torch.Tensor, torch.Tensor] | None = None) -> Blocks:
        """Sample anchors (unless ``anchors=(anchors, keep)`` is given, ``[B, N]`` each)
        and build the block mask, positions, labels and weights."""
        cfg = self.cfg
        if anchors is None:
            anchors = sample_anchors(doc.cpu(), num_anchors=cfg.num_anchors, generator=self.gen)
        anchors, keep = (t.to(self.device) for t in anchors)
        mask = dflash_block_mask(anchors, keep, doc, block_size=cfg.block_size, window=cfg.window)
        label_idx, weights = block_label_weights(anchors, keep, doc, block_size=cfg.block_size,
                                                 gamma=cfg.loss_gamma)
        batch = input_ids.shape[0]
        labels = torch.gather(input_ids, 1, label_idx.view(batch, -1))
        anchor_pos = torch.gather(pos, 1, anchors)
        q_pos = block_positions(anchor_pos, block_size=cfg.block_size)
        return Blocks(anchors, keep, mask, q_pos, labels, weights.view(batch, -1))

    def forward(self, input_ids: torch.Tensor, context: torch.Tensor, pos: torch.Tensor,
                blocks: Blocks) -> torch.Tensor:
        """Drafter forward and the weighted block loss (a scalar with grad)."""
        bs = self.cfg.block_size
        batch, n_blocks = blocks.anchors.shape
        noise_ids = torch.full((batch, n_blocks, bs), self.mask_id, dtype=torch.int64,
                               device=self.device)
        anchor_tok = torch.gather(input_ids, 1, blocks.anchors)
        noise_ids[:, :, 0] = torch.where(blocks.keep, anchor_tok, self.mask_id)
        noise = self.io.embed(noise_ids.view(batch, -1))
        hidden = self.model(noise, context.to(noise.dtype), blocks.q_pos, pos, blocks.mask)
        logits = self.io.lm_head(hidden)
        return weighted_block_loss(logits, blocks.labels, blocks.weights)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``."""
        loss.backward()

    def grads(self) -> list[torch.Tensor]:
        """The gradients to all-reduce (parameters without a gradient get zeros)."""
        out = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            out.append(p.grad)
        return out

    def clip_grad_norm(self) -> float:
        """Clip the gradients to ``max_grad_norm`` and return the pre-clip norm.

        The ``.item()`` is the host-device synchronisation every training loop
        that logs its grad norm pays (phase ``grad_norm_item``).
        """
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        return float(norm.item())

    def optimizer_step(self) -> None:
        """AdamW step, then drop the gradients."""
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
