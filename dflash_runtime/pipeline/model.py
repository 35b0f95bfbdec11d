"""The tiny frozen target decoder and the DFlash-style drafter.

Both are Llama/Qwen3-shaped (pre-norm RMSNorm, rotary positions, SwiGLU MLP)
and small enough to train on a CPU core.

- :class:`TargetDecoder` is frozen with random weights. Its forward returns
  the hidden state after the embeddings and after every layer; the drafter is
  conditioned on those of evenly spaced layers (:func:`target_layer_ids`,
  DFlash's choice).
- :class:`Drafter` is the DFlash drafter: the tapped target hidden states are
  concatenated, projected (``fc``) and normalised into one context feature per
  position, which every drafter layer *injects* as extra keys/values in front
  of the block's own keys/values ("KV injection"). Queries come only from the
  block positions. The drafter shares the target's (frozen) token embedding
  and LM head, as DFlash does.

Attention runs through :func:`attention`: PyTorch SDPA with a boolean mask,
and ``flash_attn`` for the target's document-causal attention where that
package imports and the tensors are on CUDA (never required).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dflash_runtime.pipeline.masks import causal_doc_mask

try:  # pragma: no cover - optional, CUDA only
    from flash_attn import flash_attn_varlen_func as _flash_varlen
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_varlen = None

#: RoPE base frequency (Llama/Qwen3 default before long-context scaling).
ROPE_THETA = 10000.0


def target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Target layers whose outputs condition the drafter (0-based layer index).

    DFlash (``build_target_layer_ids`` in z-lab/dflash) takes one layer per
    drafter layer, evenly spaced from layer 1 to layer ``L - 3``, or the middle
    layer for a single tap.

    >>> target_layer_ids(36, 5), target_layer_ids(6, 2), target_layer_ids(8, 1)
    ([1, 9, 17, 25, 33], [1, 3], [4])

    Raises:
        ValueError: fewer than 4 target layers for several taps, or ``num_taps < 1``.
    """
    if num_taps < 1:
        msg = f"num_taps must be at least 1, got {num_taps}"
        raise ValueError(msg)
    if num_taps == 1:
        return [num_target_layers // 2]
    if num_target_layers < 4:
        msg = f"several taps need at least 4 target layers, got {num_target_layers}"
        raise ValueError(msg)
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + i * span / (num_taps - 1)) for i in range(num_taps)]


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (rotate-half form).

    Args:
        x: ``[B, H, L, D]`` (D even); pos: ``[B, L]`` integer positions.
    """
    half = x.shape[-1] // 2
    freqs = ROPE_THETA ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = pos[:, None, :, None].to(torch.float32) * freqs          # [B, 1, L, half]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor) -> torch.Tensor:
    """Masked attention with PyTorch SDPA.

    Args:
        q: ``[B, H, Q, D]``; k, v: ``[B, H, K, D]``; mask: ``[B, 1, Q, K]`` bool (True attends).

    Returns:
        ``[B, H, Q, D]``.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def flash_attn_usable(t: torch.Tensor) -> bool:
    """Whether :mod:`flash_attn` imported and ``t`` lives on CUDA in fp16/bf16."""
    return _flash_varlen is not None and t.is_cuda and t.dtype in (torch.float16, torch.bfloat16)


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with rotary positions."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            msg = f"hidden size {hidden} is not a multiple of the head count {heads}"
            raise ValueError(msg)
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                doc_ids: torch.Tensor) -> torch.Tensor:
        """x: ``[B, S, hidden]``; pos, doc_ids: ``[B, S]``; mask: ``[B, 1, S, S]`` or None
        (only when flash-attn's varlen path is taken)."""
        q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))
        q, k = rope(q, pos), rope(k, pos)
        if mask is None:  # pragma: no cover - CUDA + flash_attn only
            out = _flash_doc_causal(q, k, v, doc_ids)
        else:
            out = attention(q, k, v, mask)
        b, _, length, _ = out.shape
        return self.o(out.transpose(1, 2).reshape(b, length, -1))


def _flash_doc_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      doc_ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - CUDA only
    """Document-causal attention with ``flash_attn_varlen_func`` (cu_seqlens per document)."""
    b, h, s, d = q.shape
    # Documents of all rows, in order: lengths from run boundaries of the flat doc-id stream.
    global_doc = doc_ids + torch.arange(b, device=doc_ids.device)[:, None] * (s + 1)
    _, counts = torch.unique_consecutive(global_doc.flatten(), return_counts=True)
    cu = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=q.device)
    cu[1:] = counts.cumsum(0)
    flat = [t.transpose(1, 2).reshape(b * s, h, d) for t in (q, k, v)]
    out = _flash_varlen(*flat, cu, cu, int(counts.max()), int(counts.max()), causal=True)
    return out.view(b, s, h, d).transpose(1, 2)


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden)
        self.attn = SelfAttention(hidden, heads)
        self.mlp_norm = nn.RMSNorm(hidden)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                doc_ids: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), pos, mask, doc_ids)
        return x + self.mlp(self.mlp_norm(x))


class TokenIO(nn.Module):
    """The target's token embedding, final norm and LM head (shared, frozen, with the drafter).

    Built first from the run's seed, so a drafter process that builds only
    this module gets the same weights as the target process.
    """

    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab_size, bias=False)


def build_token_io(vocab_size: int, hidden: int, *, seed: int) -> TokenIO:
    """The frozen :class:`TokenIO` of the run's target, reproducible from ``seed``."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        io = TokenIO(vocab_size, hidden)
    finally:
        torch.random.set_rng_state(gen_state)
    return io.requires_grad_(False).eval()


class TargetDecoder(nn.Module):
    """A tiny frozen decoder-only target with random weights.

    Args:
        vocab_size, hidden, heads, layers, intermediate: shape of the model.
        seed: weights are drawn from this seed (token I/O first, see :class:`TokenIO`).
    """

    def __init__(self, *, vocab_size: int, hidden: int, heads: int, layers: int,
                 intermediate: int, seed: int) -> None:
        super().__init__()
        self.io = build_token_io(vocab_size, hidden, seed=seed)
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed + 1)
        try:
            self.layers = nn.ModuleList(DecoderLayer(hidden, heads, intermediate)
                                        for _ in range(layers))
            # Random init leaves a residual stream that grows with depth; scale the
            # output projections like GPT-2 (1/sqrt(2L)) so deep targets stay sane.
            for layer in self.layers:
                for lin in (layer.attn.o, layer.mlp.down):
                    lin.weight.data.mul_(1.0 / math.sqrt(2 * layers))
        finally:
            torch.random.set_rng_state(gen_state)
        self.requires_grad_(False).eval()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, pos: torch.Tensor,
                doc_ids: torch.Tensor) -> list[torch.Tensor]:
        """Run the packed batch.

        Args:
            input_ids, pos, doc_ids: ``[B, S]``.

        Returns:
            ``layers + 1`` tensors ``[B, S, hidden]``: the embeddings, then each
            layer's output (HF's ``output_hidden_states`` convention, so layer
            ``i``'s output is element ``i + 1``).
        """
        x = self.io.embed(input_ids)
        mask = None if flash_attn_usable(x) else causal_doc_mask(doc_ids)
        states = [x]
        for layer in self.layers:
            x = layer(x, pos, mask, doc_ids)
            states.append(x)
        return states


def extract_context(states: list[torch.Tensor], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the tapped layers' outputs: ``[B, S, len(layer_ids) * hidden]``.

    ``states[0]`` is the embedding output, so layer ``i`` is ``states[i + 1]``
    (DFlash's ``extract_context_feature`` offset of 1).
    """
    return torch.cat([states[i + 1] for i in layer_ids], dim=-1).contiguous()


class InjectedAttention(nn.Module):
    """Block attention with KV injection of the target context.

    Keys/values are ``[proj(context) | proj(block)]``; queries come from the block.
    """

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            msg = f"hidden size {hidden} is not a multiple of the head count {heads}"
            raise ValueError(msg)
        self.heads, self.head_dim = heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, q_pos: torch.Tensor,
                ctx_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x: ``[B, Q, hidden]`` block states; ctx: ``[B, S, hidden]`` projected context;
        q_pos: ``[B, Q]``; ctx_pos: ``[B, S]``; mask: ``[B, 1, Q, S + Q]``."""
        q = rope(self._split(self.q(x)), q_pos)
        k_ctx, v_ctx = (self._split(t) for t in self.kv(ctx).chunk(2, dim=-1))
        k_blk, v_blk = (self._split(t) for t in self.kv(x).chunk(2, dim=-1))
        k = torch.cat([rope(k_ctx, ctx_pos), rope(k_blk, q_pos)], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        out = attention(q, k, v, mask)
        b, _, length, _ = out.shape
        return self.o(out.transpose(1, 2).reshape(b, length, -1))


class DrafterLayer(nn.Module):
    """Pre-norm drafter layer with KV injection."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(hidden)
        self.attn = InjectedAttention(hidden, heads)
        self.mlp_norm = nn.RMSNorm(hidden)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, q_pos: torch.Tensor,
                ctx_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), ctx, q_pos, ctx_pos, mask)
        return x + self.mlp(self.mlp_norm(x))


class Drafter(nn.Module):
    """The DFlash drafter (trainable).

    Args:
        hidden, heads, layers, intermediate: shape; ``taps``: number of target
            layers concatenated into the context feature.
    """

    def __init__(self, *, hidden: int, heads: int, layers: int, intermediate: int,
                 taps: int) -> None:
        super().__init__()
        self.fc = nn.Linear(taps * hidden, hidden, bias=False)
        self.ctx_norm = nn.RMSNorm(hidden)
        self.layers = nn.ModuleList(DrafterLayer(hidden, heads, intermediate)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)

    def forward(self, noise: torch.Tensor, context: torch.Tensor, q_pos: torch.Tensor,
                ctx_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Denoise the blocks.

        Args:
            noise: ``[B, Q, hidden]`` embeddings of the blocks (anchor token, then mask tokens).
            context: ``[B, S, taps * hidden]`` tapped target hidden states.
            q_pos: ``[B, Q]`` and ctx_pos: ``[B, S]`` rotary positions.
            mask: ``[B, 1, Q, S + Q]``
                (:func:`~dflash_runtime.pipeline.masks.dflash_block_mask`).

        Returns:
            ``[B, Q, hidden]`` final-normed block states (feed the LM head).
        """
        ctx = self.ctx_norm(self.fc(context))
        x = noise
        for layer in self.layers:
            x = layer(x, ctx, q_pos, ctx_pos, mask)
        return self.norm(x)


def weighted_block_loss(logits: torch.Tensor, labels: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
    """Weighted cross-entropy over block positions (DFlash loss).

    Args:
        logits: ``[B, Q, V]``; labels: ``[B, Q]`` token ids; weights: ``[B, Q]``
            from :func:`~dflash_runtime.pipeline.masks.block_label_weights`.

    Returns:
        Scalar ``sum(w * ce) / (sum(w) + 1e-6)`` (SpecForge's weighted mean).
    """
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    w = weights.flatten()
    return (ce * w).sum() / (w.sum() + 1e-6)
