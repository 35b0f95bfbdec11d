"""Document ids for packed sequences and the DFlash block mask.

Packed sequences hold several documents back to back, each ended by an EOS
token. Attention and labels must not cross a document boundary, so both the
target's causal mask and the drafter's block mask are built from per-token
document ids.

The DFlash training layout (z-lab/dflash, as implemented in SpecForge's
``specforge/core/dflash.py``, ``create_dflash_sdpa_mask``):

- ``N`` anchor positions are sampled per sequence. Each anchor opens a *block*
  of ``block_size`` drafter positions: the anchor's own token, then mask tokens.
- Keys/values are ``[context (S target hidden states) | block 0 | ... | block N-1]``;
  queries are ``[block 0 | ... | block N-1]``.
- A block sees the context strictly before its anchor (the target hidden state
  at the anchor itself is not available at inference), and its own block,
  bidirectionally; other blocks are invisible.

This module adds what packing needs: a block sees only context of its
anchor's document, and a label past the end of that document weighs 0.
An optional sliding window limits the context to the ``window`` positions
before the anchor (SpecForge's ``sliding_attention`` layers).

All functions are pure tensor functions (no state, no device transfers); every
mask is boolean with ``True`` meaning "may attend", the convention of
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch


def doc_ids_from_eos(input_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Document id of every token of packed sequences.

    A document ends with (and includes) its EOS token; the next token starts
    the next document. Ids count from 0 in each row.

    Args:
        input_ids: ``[B, S]`` token ids (int64).
        eos_id: the end-of-document token id.

    Returns:
        ``[B, S]`` int64: ``doc[b, i]`` = number of EOS tokens in ``input_ids[b, :i]``.

    >>> doc_ids_from_eos(torch.tensor([[5, 1, 7, 8, 1, 9]]), eos_id=1).tolist()
    [[0, 0, 1, 1, 1, 2]]
    """
    is_eos = (input_ids == eos_id).to(torch.int64)
    # Exclusive prefix sum: the EOS itself still belongs to the document it ends.
    return torch.cumsum(is_eos, dim=1) - is_eos


def positions_in_doc(doc_ids: torch.Tensor) -> torch.Tensor:
    """Position of every token within its document (RoPE position ids).

    Args:
        doc_ids: ``[B, S]`` non-decreasing document ids (from :func:`doc_ids_from_eos`).

    Returns:
        ``[B, S]`` int64, 0 at the first token of each document.

    >>> positions_in_doc(torch.tensor([[0, 0, 1, 1, 1, 2]])).tolist()
    [[0, 1, 0, 1, 2, 0]]
    """
    batch, seq_len = doc_ids.shape
    idx = torch.arange(seq_len, device=doc_ids.device).expand(batch, seq_len)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    # Index of the latest document start at or before each position.
    start_idx = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - start_idx


def causal_doc_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Causal attention within documents, for the target decoder.

    Args:
        doc_ids: ``[B, S]`` document ids.

    Returns:
        ``[B, 1, S, S]`` bool: query ``i`` may attend key ``j`` iff ``j <= i``
        and both are in the same document.
    """
    seq_len = doc_ids.shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=doc_ids.device).tril()
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (causal & same_doc)[:, None]


def sample_anchors(doc_ids: torch.Tensor, *, num_anchors: int,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample anchor positions for the drafter's blocks.

    A position can anchor a block when the next token is in the same document
    (so the block has at least one label). Up to ``num_anchors`` valid
    positions are drawn per row without replacement and sorted (SpecForge's
    ``_sample_anchor_positions``); rows with fewer valid positions pad with
    anchor 0 and ``keep=False``.

    Args:
        doc_ids: ``[B, S]`` document ids.
        num_anchors: blocks per sequence, ``N`` (> 0).
        generator: random source (seeded per rank for reproducible runs).

    Returns:
        ``(anchors, keep)``: ``[B, N]`` int64 positions (sorted within a row)
        and ``[B, N]`` bool, ``False`` for padding blocks.

    Raises:
        ValueError: ``num_anchors`` < 1.
    """
    if num_anchors < 1:
        msg = f"num_anchors must be at least 1, got {num_anchors}"
        raise ValueError(msg)
    batch, seq_len = doc_ids.shape
    valid = torch.zeros_like(doc_ids, dtype=torch.bool)
    valid[:, :-1] = doc_ids[:, 1:] == doc_ids[:, :-1]
    scores = torch.rand(batch, seq_len, generator=generator, device=doc_ids.device)
    scores = torch.where(valid, scores, torch.full_like(scores, 2.0))  # invalid sort last
    n = min(num_anchors, seq_len)
    picked = scores.argsort(dim=1)[:, :n]
    keep = torch.gather(valid, 1, picked)
    anchors = torch.where(keep, picked, torch.zeros_like(picked))
    # Sort kept anchors ascending; padding (keep=False) goes last.
    order = torch.where(keep, anchors, torch.full_like(anchors, seq_len)).argsort(dim=1)
    anchors = torch.gather(anchors, 1, order)
    keep = torch.gather(keep, 1, order)
    if n < num_anchors:
        pad = num_anchors - n
        anchors = torch.cat([anchors, anchors.new_zeros(batch, pad)], dim=1)
        keep = torch.cat([keep, keep.new_zeros(batch, pad)], dim=1)
    return anchors, keep


def block_positions(anchors: torch.Tensor, *, block_size: int) -> torch.Tensor:
    """Sequence position of every drafter query: ``anchor + k`` for ``k < block_size``.

    Args:
        anchors: ``[B, N]`` anchor positions.

    Returns:
        ``[B, N * block_size]`` int64 (may exceed ``S - 1`` near the end of a row;
        callers clamp before indexing).
    """
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + offsets).flatten(1)


def dflash_block_mask(anchors: torch.Tensor, keep: torch.Tensor, doc_ids: torch.Tensor, *,
                      block_size: int, window: int | None = None) -> torch.Tensor:
    """The DFlash training attention mask over ``[context | blocks]``.

    Query ``q`` of block ``n = q // block_size`` with anchor ``a = anchors[b, n]``
    may attend:

    - context key ``j < S`` iff ``j < a`` (strictly before the anchor), ``j`` is in
      ``a``'s document, and, with a ``window``, ``j >= a - window``;
    - draft key ``S + m`` iff ``m // block_size == n`` (its own block, bidirectional).

    A padding block (``keep`` False) sees only its own block, so no softmax
    row is empty (SDPA returns NaN for a fully masked row); its loss weight is 0.

    Args:
        anchors: ``[B, N]`` anchor positions; ``keep``: ``[B, N]`` bool.
        doc_ids: ``[B, S]`` document ids of the context.
        block_size: positions per block (DFlash: 16 for released drafters; here small).
        window: optional sliding window over the context, in tokens (> 0).

    Returns:
        ``[B, 1, N * block_size, S + N * block_size]`` bool.

    Raises:
        ValueError: ``window`` is not positive.
    """
    if window is not None and window <= 0:
        msg = f"window must be a positive number of tokens, got {window}"
        raise ValueError(msg)
    batch, n_blocks = anchors.shape
    seq_len = doc_ids.shape[1]
    q_len = n_blocks * block_size
    device = anchors.device
    q_anchor = anchors.repeat_interleave(block_size, dim=1)          # [B, Q]
    q_keep = keep.repeat_interleave(block_size, dim=1)               # [B, Q]
    anchor_doc = torch.gather(doc_ids, 1, q_anchor)                  # [B, Q]
    kv = torch.arange(seq_len, device=device)
    ctx = kv[None, None, :] < q_anchor[:, :, None]                   # [B, Q, S]
    ctx &= doc_ids[:, None, :] == anchor_doc[:, :, None]
    if window is not None:
        ctx &= kv[None, None, :] >= (q_anchor - window)[:, :, None]
    ctx &= q_keep[:, :, None]
    q_block = torch.arange(q_len, device=device) // block_size
    own = (q_block[:, None] == q_block[None, :]).expand(batch, q_len, q_len)
    return torch.cat([ctx, own], dim=2)[:, None]


def block_label_weights(anchors: torch.Tensor, keep: torch.Tensor, doc_ids: torch.Tensor, *,
                        block_size: int, gamma: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels and loss weights of every block position.

    Position ``k`` of a block predicts the token at ``anchor + k`` (SpecForge's
    "same-position prediction"). Its weight is 0 for the anchor itself
    (``k = 0``), for padding blocks, past the end of the row, and past the end
    of the anchor's document; otherwise ``exp(-(k - 1) / gamma)``, the DFlash
    position-decaying weight (earlier positions matter more for acceptance
    length), or 1 with ``gamma=None``.

    Args:
        anchors, keep: ``[B, N]`` from :func:`sample_anchors`.
        doc_ids: ``[B, S]`` document ids.
        block_size: positions per block.
        gamma: decay constant (DFlash recommends 7 for blocks of 16, 5 for 10,
            4 for 8, as echoed in SpecForge's training scripts); ``None`` disables decay.

    Returns:
        ``(label_idx, weights)``: ``[B, N, block_size]`` int64 positions into the
        sequence (clamped to ``S - 1``) and ``[B, N, block_size]`` float32 weights.
    """
    seq_len = doc_ids.shape[1]
    k = torch.arange(block_size, device=anchors.device)
    idx = anchors[:, :, None] + k                                    # [B, N, bs]
    in_row = idx < seq_len
    idx = idx.clamp(max=seq_len - 1)
    batch, _n_blocks = anchors.shape
    flat = idx.view(batch, -1)
    label_doc = torch.gather(doc_ids, 1, flat).view_as(idx)
    anchor_doc = torch.gather(doc_ids, 1, anchors)[:, :, None]
    ok = in_row & (label_doc == anchor_doc) & keep[:, :, None] & (k > 0)
    weights = ok.to(torch.float32)
    if gamma is not None:
        weights = weights * torch.exp(-(k - 1).clamp(min=0).to(torch.float32) / gamma)
    return idx, weights
