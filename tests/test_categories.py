"""The built-in phase category rules (docs/FORMAT.md "Categories"), name by name."""

from __future__ import annotations

import pytest

from dflash_runtime.format import categorize, is_collective, resolve_category, split_words


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("target_forward", ["target", "forward"]),
        ("gradNormItem", ["grad", "norm", "item"]),
        ("HTTPGet", ["http", "get"]),
        ("forward/mask_build", ["forward", "mask", "build"]),
        ("enumerate(DataLoader)#_Iter.__next__", ["enumerate", "data", "loader", "iter", "next"]),
        ("all-reduce.v2", ["all", "reduce", "v", "2"]),
    ],
)
def test_split_words(name: str, words: list[str]) -> None:
    assert split_words(name) == words


@pytest.mark.parametrize(
    ("name", "category"),
    [
        # the reference pipeline's phases
        ("batch_get", "starvation"),
        ("target_forward", "compute"),  # 'target' holds the letters 'get' but is not the word
        ("hs_extract", "compute"),
        ("hs_put", "backpressure"),
        ("hs_get", "starvation"),
        ("doc_ids", "compute"),
        ("mask_build", "compute"),
        ("block_mask", "compute"),
        ("draft_forward", "compute"),
        ("backward", "compute"),
        ("grad_allreduce", "sync"),
        ("grad_norm_item", "sync"),
        ("optimizer", "compute"),
        # framework-style loader names
        ("next_batch", "starvation"),
        ("get_train_batch", "starvation"),
        ("batch_generator", "starvation"),
        ("data_loading", "starvation"),
        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "starvation"),
        # sync: words and word pairs; a pair beats a single starvation word
        ("wait_stream", "sync"),
        ("event_wait", "sync"),
        ("all_reduce", "sync"),
        ("torch.cuda.synchronize", "sync"),
        ("loss.item", "sync"),
        ("barrier", "sync"),
        ("cudaStreamSynchronize", "sync"),
        ("to_cpu", "sync"),
        # children: only the leaf name counts
        ("forward/wait_stream", "sync"),
        ("hs_get/decode", "compute"),
        ("queue_wait", "starvation"),
        ("", "compute"),
        # collectives and distribution win over the starvation words
        # (torchrec's input distribution is an all-to-all, not a data source)
        ("## sparse_data_dist ##", "sync"),
        ("wait_sparse_data_dist", "sync"),
        ("all_to_all", "sync"),
        ("alltoall_fwd", "sync"),
        ("a2a_wait", "sync"),
        ("all_gather", "sync"),
        ("reduce_scatter_grads", "sync"),
        ("broadcast_params", "sync"),
        ("send_activations", "sync"),
        ("recv_activations", "sync"),
        ("nccl:all_reduce", "sync"),
        ("gloo:all_reduce", "sync"),
        ("c10d::allreduce_", "sync"),
        # input words and pairs
        ("collate", "starvation"),
        ("collate_fn", "starvation"),
        ("read_shard", "starvation"),
        ("shard_io", "starvation"),
        # whole words only: these hold the letters, not the words
        ("distill_loss", "compute"),
        ("ratio_scale", "compute"),
        ("resend_queue_put", "backpressure"),
        ("receive_batch", "starvation"),
    ],
)
def test_categorize(name: str, category: str) -> None:
    assert categorize(name) == category


def test_resolve_order_kinds_then_manifest_then_rules() -> None:
    assert resolve_category("hs_get") == "starvation"
    assert resolve_category("hs_get", phase_kinds={"hs_get": "compute"}) == "compute"
    assert resolve_category("hs_get", kinds={"hs_get": "sync"},
                            phase_kinds={"hs_get": "compute"}) == "sync"
    # an unknown category name is ignored, not trusted
    assert resolve_category("hs_get", kinds={"hs_get": "idle"}) == "starvation"
    # 'unaccounted' is not a phase category
    assert resolve_category("forward", kinds={"forward": "unaccounted"}) == "compute"


@pytest.mark.parametrize(
    ("name", "collective"),
    [
        ("grad_allreduce", True), ("all_reduce", True), ("## sparse_data_dist ##_sync", True),
        ("wait_sparse_data_dist", True), ("collective_wait", True), ("gloo:all_reduce", True),
        ("backward/ddp_allreduce_wait", True), ("barrier", True), ("a2a_wait", True),
        # sync, but a wait for the host's own queued device work: the walk splits these
        ("loss_item", False), ("cudaStreamSynchronize", False), ("wait_stream", False),
        ("to_cpu", False), ("forward", False), ("hs_get", False),
    ],
)
def test_is_collective(name: str, collective: bool) -> None:
    assert is_collective(name) is collective
    if collective:
        assert categorize(name) == "sync"   # every collective is sync by name
