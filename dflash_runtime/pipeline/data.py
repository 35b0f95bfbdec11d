"""Synthetic packed training data with something to learn.

Documents of geometric length (mean ``mean_doc_len``) are packed back to back
into rows of ``seq_len`` tokens, each document ended by EOS. Inside a
document, a token follows its fixed *bigram successor* with probability
``bigram_p``, else it is uniform: a drafter that reads the anchor token and the
target context can lower its loss well below ``log(vocab)``, so a run shows a
falling loss, as a real one does.

Token ids: ``0`` padding (unused), ``1`` EOS, ``vocab_size - 1`` the drafter's
MASK token, data tokens in ``[2, vocab_size - 1)``.
"""

from __future__ import annotations

import random
import time

import torch

#: Reserved token ids.
PAD_ID = 0
EOS_ID = 1


def mask_token_id(vocab_size: int) -> int:
    """The drafter's MASK token: the last id, never produced by the data."""
    return vocab_size - 1


class PackedLoader:
    """An endless iterator of packed batches ``{"input_ids": [B, S] int64}``.

    Args:
        vocab_size, seq_len, batch_size, mean_doc_len, bigram_p: the data's shape.
        seed: the bigram table derives from ``seed`` alone (shared by every
            rank); the documents from ``(seed, stream)``.
        stream: per-rank stream id, so ranks read different documents.
        stall_s: seconds of simulated I/O wait added to every batch (the
            ``slow-loader`` scenario; a sleep, as a real stalled read blocks
            without using the CPU).
    """

    def __init__(self, *, vocab_size: int, seq_len: int, batch_size: int, mean_doc_len: int,
                 bigram_p: float, seed: int, stream: int = 0, stall_s: float = 0.0) -> None:
        self.seq_len, self.batch_size = seq_len, batch_size
        self.bigram_p, self.stall_s = bigram_p, stall_s
        self.lo, self.hi = EOS_ID + 1, mask_token_id(vocab_size)  # data ids: [lo, hi)
        table = random.Random(seed)
        ids = list(range(self.lo, self.hi))
        succ = ids[:]
        table.shuffle(succ)
        self.successor = dict(zip(ids, succ))
        self.p_end = 1.0 / max(mean_doc_len, 2)
        self.rng = random.Random(seed * 1_000_003 + 7919 * (stream + 1))

    def __iter__(self) -> PackedLoader:
        return self

    def _row(self) -> list[int]:
        rng, row, prev = self.rng, [], None
        for _ in range(self.seq_len):
            in_doc = prev is not None and prev != EOS_ID  # a document has >= 1 data token
            if in_doc and rng.random() < self.p_end:
                tok = EOS_ID
            elif in_doc and rng.random() < self.bigram_p:
                tok = self.successor[prev]
            else:
                tok = rng.randrange(self.lo, self.hi)
            row.append(tok)
            prev = tok
        return row

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.stall_s > 0:
            time.sleep(self.stall_s)
        rows = [self._row() for _ in range(self.batch_size)]
        return {"input_ids": torch.tensor(rows, dtype=torch.int64)}
