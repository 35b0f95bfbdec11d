"""``dflash_runtime.cuda``: the event pool, completion without a sync, the current
device and the allocator's figures, on a stand-in for ``torch`` (this machine has
no GPU; tests/gpu has the real device's tests)."""

from __future__ import annotations

from types import SimpleNamespace

from dflash_runtime.cuda import (
    EventPool,
    device_context,
    memory_figures,
    pairs_done,
    set_writer_device,
)


class _Event:
    def __init__(self, enable_timing: bool = False, done: bool = True) -> None:
        self.enable_timing = enable_timing
        self.done = done

    def query(self) -> bool:
        return self.done


def _torch(**cuda) -> SimpleNamespace:
    calls: list = []
    base = {"Event": _Event, "set_device": calls.append,
            "device": lambda d: ("device-context", d)}
    return SimpleNamespace(cuda=SimpleNamespace(**{**base, **cuda}), calls=calls)


def test_the_pool_holds_at_most_cap_pairs_and_counts_the_rest() -> None:
    pool = EventPool(_torch(), device=1, cap=2)
    a, b = pool.acquire(), pool.acquire()
    assert a[2] == 1 and a[3] is pool and a[0].enable_timing and a[1].enable_timing
    assert a is not b
    assert pool.acquire() is None and pool.acquire() is None
    assert pool.dropped == 2
    pool.release(a)
    assert pool.acquire() is a              # reused, not a third pair
    assert pool.dropped == 2


def test_pairs_done_asks_each_end_event() -> None:
    done = (_Event(), _Event(done=True))
    pending = (_Event(), _Event(done=False))
    assert pairs_done([done, done])
    assert not pairs_done([done, pending])
    assert pairs_done([])


def test_the_writer_device_changes_only_when_it_differs() -> None:
    torch = _torch()
    current = [-1]
    set_writer_device(torch, 0, current)
    set_writer_device(torch, 0, current)
    set_writer_device(torch, -1, current)          # host-only phase: nothing to set
    set_writer_device(torch, 2, current)
    assert torch.calls == [0, 2] and current == [2]
    assert device_context(torch, 3) == ("device-context", 3)
    with device_context(torch, -1):                 # no device: a context doing nothing
        pass


def test_memory_figures_from_the_allocator_counters() -> None:
    stats = {"allocated_bytes.all.current": 1024, "reserved_bytes.all.current": 4096.0,
             "num_alloc_retries": 2, "num_device_alloc": 7, "other": 1}
    torch = _torch(is_initialized=lambda: True, memory_stats=lambda: stats)
    assert memory_figures(torch) == {"allocated": 1024, "reserved": 4096, "alloc_retries": 2,
                                     "device_allocs": 7}
    assert memory_figures(_torch(is_initialized=lambda: False)) is None
    assert memory_figures(_torch(is_initialized=lambda: True, memory_stats=dict)) is None

    def broken():
        raise RuntimeError("CUDA error")

    assert memory_figures(_torch(is_initialized=lambda: True, memory_stats=broken)) is None
