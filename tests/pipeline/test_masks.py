"""Document ids, positions and the DFlash block mask, on cases small enough to check by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from dflash_runtime.pipeline.masks import (
    block_label_weights,
    block_positions,
    causal_doc_mask,
    dflash_block_mask,
    doc_ids_from_eos,
    positions_in_doc,
    sample_anchors,
)

T, F = True, False


def test_doc_ids_count_eos_before_each_token() -> None:
    ids = torch.tensor([[5, 1, 7, 8, 1, 9],
                        [1, 2, 3, 1, 1, 4]])
    # The EOS belongs to the document it ends; a leading EOS is a one-token document.
    assert doc_ids_from_eos(ids, eos_id=1).tolist() == [[0, 0, 1, 1, 1, 2],
                                                        [0, 1, 1, 1, 2, 3]]


def test_positions_restart_at_each_document() -> None:
    doc = torch.tensor([[0, 0, 1, 1, 1, 2],
                        [0, 1, 1, 1, 2, 3]])
    assert positions_in_doc(doc).tolist() == [[0, 1, 0, 1, 2, 0],
                                              [0, 0, 1, 2, 0, 0]]


def test_causal_doc_mask() -> None:
    mask = causal_doc_mask(torch.tensor([[0, 0, 1, 1]]))
    assert mask.shape == (1, 1, 4, 4)
    assert mask[0, 0].tolist() == [[T, F, F, F],
                                   [T, T, F, F],
                                   [F, F, T, F],
                                   [F, F, T, T]]


DOC6 = torch.tensor([[0, 0, 0, 1, 1, 1]])


def test_block_mask_sees_context_before_anchor_in_its_document_and_its_own_block() -> None:
    # S=6, blocks of 2 at anchors 2 (document 0) and 4 (document 1):
    # KV = [ctx 0..5 | block0: 6,7 | block1: 8,9].
    mask = dflash_block_mask(torch.tensor([[2, 4]]), torch.tensor([[T, T]]), DOC6, block_size=2)
    assert mask.shape == (1, 1, 4, 10)
    block0 = [T, T, F, F, F, F, T, T, F, F]   # ctx 0,1 (< 2, doc 0); own block
    block1 = [F, F, F, T, F, F, F, F, T, T]   # ctx 3 (< 4, doc 1); own block
    assert mask[0, 0].tolist() == [block0, block0, block1, block1]


def test_block_mask_sliding_window() -> None:
    mask = dflash_block_mask(torch.tensor([[2, 4]]), torch.tensor([[T, T]]), DOC6, block_size=2,
                             window=1)
    # Window 1: anchor 2 sees only ctx 1; anchor 4 sees ctx 3 (already its only one).
    assert mask[0, 0, 0].tolist() == [F, T, F, F, F, F, T, T, F, F]
    assert mask[0, 0, 2].tolist() == [F, F, F, T, F, F, F, F, T, T]


def test_padding_block_sees_only_itself() -> None:
    mask = dflash_block_mask(torch.tensor([[2, 0]]), torch.tensor([[T, F]]), DOC6, block_size=2)
    assert mask[0, 0, 2].tolist() == [F, F, F, F, F, F, F, F, T, T]
    assert bool(mask.any(dim=-1).all())  # no empty softmax row


def test_block_mask_rejects_bad_window() -> None:
    with pytest.raises(ValueError, match="window"):
        dflash_block_mask(torch.tensor([[2]]), torch.tensor([[T]]), DOC6, block_size=2, window=0)


def test_labels_and_decaying_weights() -> None:
    doc = torch.tensor([[0, 0, 0, 0, 1, 1]])
    idx, w = block_label_weights(torch.tensor([[1, 4]]), torch.tensor([[T, T]]), doc,
                                 block_size=3, gamma=2.0)
    assert idx.tolist() == [[[1, 2, 3], [4, 5, 5]]]  # anchor + k, clamped to S - 1
    # k=0 is the anchor itself (weight 0); then exp(-(k-1)/gamma): 1, exp(-1/2).
    # Block 1: position 6 is past the row's end.
    expected = [0.0, 1.0, math.exp(-0.5), 0.0, 1.0, 0.0]
    assert w.flatten().tolist() == pytest.approx(expected)


def test_labels_stop_at_the_document_end_and_padding_weighs_nothing() -> None:
    doc = torch.tensor([[0, 0, 1, 1, 1, 1]])
    _, w = block_label_weights(torch.tensor([[0, 3]]), torch.tensor([[T, F]]), doc,
                               block_size=3, gamma=None)
    # Block 0 (anchor 0, doc 0): label 1 is doc 0, label 2 is doc 1 -> 0. Block 1 is padding.
    assert w[0].tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_block_positions() -> None:
    assert block_positions(torch.tensor([[0, 5]]), block_size=3).tolist() == [[0, 1, 2, 5, 6, 7]]


def test_anchors_are_positions_whose_next_token_shares_the_document() -> None:
    # Valid: 0, 1 (doc 0) and 3, 4 (doc 1); 2 ends doc 0, 5 ends the row.
    anchors, keep = sample_anchors(DOC6, num_anchors=4, generator=torch.Generator().manual_seed(0))
    assert anchors.tolist() == [[0, 1, 3, 4]]
    assert keep.tolist() == [[T, T, T, T]]


def test_anchors_pad_when_too_few_valid_positions() -> None:
    anchors, keep = sample_anchors(DOC6, num_anchors=7, generator=torch.Generator().manual_seed(0))
    assert anchors.tolist() == [[0, 1, 3, 4, 0, 0, 0]]
    assert keep.tolist() == [[T, T, T, T, F, F, F]]


def test_anchors_are_distinct_sorted_and_reproducible() -> None:
    doc = torch.zeros(3, 64, dtype=torch.int64)
    a1, k1 = sample_anchors(doc, num_anchors=10, generator=torch.Generator().manual_seed(3))
    a2, _ = sample_anchors(doc, num_anchors=10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a1, a2)
    assert bool(k1.all())
    for row in a1.tolist():
        assert row == sorted(set(row)) and len(row) == 10 and max(row) <= 62


def test_sample_anchors_rejects_zero() -> None:
    with pytest.raises(ValueError, match="num_anchors"):
        sample_anchors(DOC6, num_anchors=0)
