"""``dflash_runtime.syncs``: the patches ``catch_syncs`` makes and takes back, one
catcher per process, and CPU tensors left alone (this machine has no GPU; the
device tensors' case is tests/runtime/test_cuda_mock.py's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from dflash_runtime import syncs


def test_patches_are_taken_back_to_the_very_objects() -> None:
    before = {name: getattr(torch.Tensor, name) for name in syncs.TENSOR_OPS}
    sync_before = torch.cuda.synchronize
    assert syncs.patched() == []
    catcher = syncs.catch_syncs(SimpleNamespace())
    try:
        names = {name for _, name in syncs.patched()}
        assert set(syncs.TENSOR_OPS) <= names and "synchronize" in names
        assert torch.Tensor.item is not before["item"]
    finally:
        catcher.remove()
    assert syncs.patched() == []
    assert {name: getattr(torch.Tensor, name) for name in syncs.TENSOR_OPS} == before
    assert torch.cuda.synchronize is sync_before
    catcher.remove()                        # idempotent


def test_one_catcher_per_process() -> None:
    with syncs.catch_syncs(SimpleNamespace()), \
            pytest.raises(RuntimeError, match="already being caught"):
        syncs.catch_syncs(SimpleNamespace())
    with syncs.catch_syncs(SimpleNamespace()) as again:     # after remove(): allowed
        assert again.caught == 0
    assert syncs.patched() == []


def test_cpu_tensors_are_not_syncs() -> None:
    with syncs.catch_syncs(SimpleNamespace()) as catcher:
        t = torch.tensor([1.5, 2.5])
        assert t.sum().item() == 4.0
        assert t.tolist() == [1.5, 2.5] and float(t[0]) == 1.5 and bool(t[1])
        assert t.nonzero().tolist() == [[0], [1]]
        assert catcher.caught == 0


def test_host_to_device_reports_keep_the_patches_while_needed() -> None:
    seen: list = []
    syncs.set_h2d(lambda t0, t1: seen.append((t0, t1)))
    try:
        assert syncs.patched() != []
        torch.ones(2).to("cpu")             # a CPU result: no copy to a device
        assert seen == []
    finally:
        syncs.set_h2d(None)
    assert syncs.patched() == []
