"""``dflash_runtime.format``: the log format defined once: the built-in phase category
rules (docs/FORMAT.md "Categories") name by name, the fields of each record kind, the
names of implicit-sync call sites and point-to-point waits."""

from __future__ import annotations

import pytest

from dflash_runtime.format import (
    CATEGORIES,
    DEFAULT_RECORD_TYPE,
    GPU_FIELDS,
    RECORD_KINDS,
    Check,
    categorize,
    check_kind,
    fields_of,
    is_collective,
    is_p2p_wait,
    parse_sync_site,
    required_of,
    resolve_category,
    split_words,
    sync_site_name,
)


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


# --- fields, sync sites, point-to-point waits, kinds -----------------------------------

def test_fields_of_each_kind_and_the_required_ones() -> None:
    # iter: rank, stage, worker (every kind), then its own, in FIELDS order
    assert list(fields_of("iter")) == ["rank", "stage", "worker", "iter", "ts", "dur", "phases",
                                       "gpu", "cpu", "tokens", "samples", "kinds", "mem"]
    assert required_of("iter") == ("iter", "ts", "dur", "phases")
    assert required_of("queue") == ("ts", "name", "depth")
    assert required_of("meta") == ()
    # one name, two rules for two kinds
    assert fields_of("iter")["cpu"].check == Check.DUR
    assert fields_of("sys")["cpu"].check == Check.NUM0
    assert fields_of("sys")["gpu"].keys == GPU_FIELDS
    assert fields_of("meta")["world_size"].limit == 2**31 - 1
    assert fields_of("nope") == {}
    assert DEFAULT_RECORD_TYPE == "iter" and RECORD_KINDS == ("iter", "queue", "event",
                                                              "meta", "sys")


def test_sync_site_names_round_trip() -> None:
    name = sync_site_name("item", "train.py", 212)
    assert name == "sync.item@train.py:212"
    assert parse_sync_site(name) == ("item", "train.py", 212)
    assert parse_sync_site("optimizer_step/" + name) == ("item", "train.py", 212)
    # a file name with a "/" would make a child phase: written with "_"
    assert sync_site_name("cpu", "pkg/mod.py", 3) == "sync.cpu@pkg_mod.py:3"
    assert parse_sync_site("sync.item@train.py") is None           # no line
    assert parse_sync_site("hs_get") is None
    assert parse_sync_site("sync.item@train.py:212/child") is None


def test_point_to_point_waits() -> None:
    assert is_p2p_wait("recv_wait") and is_p2p_wait("forward/send_recv_wait")
    assert not is_p2p_wait("recv_batch") and not is_p2p_wait("recv_wait/x")


def test_check_kind() -> None:
    assert check_kind("sync") == "sync"
    with pytest.raises(ValueError, match="unknown phase kind 'unaccounted': use one of "
                                         "backpressure, compute, starvation, sync"):
        check_kind("unaccounted")
    assert CATEGORIES == ("starvation", "backpressure", "compute", "sync", "unaccounted")
