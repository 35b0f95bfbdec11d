"""The callback-friendly API: iterations and phases begun and ended by calls.

Each test writes the same loop once with ``with`` blocks and once with
``begin``/``end`` calls under the same fake clock, and compares the records to
each other and to values computed by hand.
"""

from __future__ import annotations

import warnings

import pytest
from runtime_helpers import WALL0, records

from dflash_runtime import NULL_ITERATION, Recorder


def _with_form(rec, clock) -> None:
    clock.t = 100.0
    with rec.iteration(tokens=64, samples=2) as it:
        clock.t = 100.5
        with it.phase("forward"):
            clock.t = 101.0
            it.lap("mask")
            with it.phase("attn", kind="compute"):
                clock.t = 101.25
            clock.t = 101.5
        with it.phase("grad_item", kind="sync"):
            clock.t = 102.0
        clock.t = 102.5


def _call_form(rec, clock) -> None:
    clock.t = 100.0
    it = rec.begin_iteration(tokens=64, samples=2)
    clock.t = 100.5
    it.begin("forward")
    clock.t = 101.0
    it.lap("mask")
    it.begin("attn", kind="compute")
    clock.t = 101.25
    it.end("attn")
    clock.t = 101.5
    it.end()
    it.begin("grad_item", kind="sync")
    clock.t = 102.0
    it.end("grad_item")
    clock.t = 102.5
    rec.end_iteration()


EXPECTED = {
    "type": "iter", "v": 1, "iter": 0, "ts": WALL0 + 100.0, "dur": 2.5,
    "phases": {"forward": 1.0, "forward/mask": 0.5, "forward/attn": 0.25, "grad_item": 0.5},
    "tokens": 64, "samples": 2, "kinds": {"forward/attn": "compute", "grad_item": "sync"},
}


@pytest.mark.parametrize("form", [_with_form, _call_form])
def test_begin_end_writes_the_record_the_with_form_writes(tmp_path, clock, form) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a paired use warns nothing
        form(rec, clock)
    rec.close()
    assert records(rec.path) == [EXPECTED]
    assert "begin_end_mismatches" not in rec.stats()


def test_end_iteration_error_and_open_phases_end_with_the_iteration(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    for err in (KeyError("x"), ValueError, "OutOfMemoryError", None):
        t0 = clock.t
        it = rec.begin_iteration()
        it.begin("step")
        clock.t = t0 + 1.0
        it.begin("inner")
        clock.t = t0 + 3.0
        rec.end_iteration(error=err)     # step and step/inner end here
        clock.t = t0 + 10.0
    rec.close()
    got = records(rec.path)
    assert [r.get("error") for r in got] == ["KeyError", "ValueError", "OutOfMemoryError", None]
    assert all(r["phases"] == {"step": 3.0, "step/inner": 2.0} and r["dur"] == 3.0 for r in got)
    assert rec.begun_iteration is None


def test_mismatches_warn_once_never_raise_and_keep_what_is_sound(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec.end_iteration()                       # nothing begun: ignored
        clock.t = 100.0
        it = rec.begin_iteration()
        assert rec.begun_iteration is it
        it.end()                                  # no phase open: ignored
        it.begin("outer")
        clock.t = 101.0
        it.begin("inner")
        clock.t = 102.0
        it.end("nope")                            # not open: ignored
        it.end("outer")                           # ends inner and outer at 102
        clock.t = 103.0
        it.end()                                  # nothing open any more: ignored
        rec.end_iteration()
        clock.t = 110.0
        rec.begin_iteration()                     # never ended: dropped at the next begin
        clock.t = 111.0
        rec.begin_iteration()
        clock.t = 112.0
        it2 = rec.begun_iteration
        it2.begin("x")
        it2.end("nope")                           # same kind of mismatch: not warned again
        clock.t = 113.0
        rec.end_iteration()
        rec.end_iteration()                       # again: counted, not warned again
    rec.close()
    got = records(rec.path)
    assert [(r["iter"], r["dur"], r["phases"]) for r in got] == [
        (0, 3.0, {"outer": 2.0, "outer/inner": 1.0}),
        (2, 2.0, {"x": 1.0}),
    ]
    # one warning per kind of mismatch: end_iteration, end, end-outer, begin
    assert [w.category for w in caught] == [RuntimeWarning] * 4
    assert rec.stats()["begin_end_mismatches"] == 8


def test_begin_end_mixes_with_with_blocks_and_laps(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    clock.t = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rec.iteration() as it:
            it.begin("backward")
            clock.t = 1.0
            with it.phase("hook"):                # a with block inside a begun phase
                clock.t = 1.5
            clock.t = 2.0
            it.end("backward")                    # the with block closed: backward is innermost
            with it.phase("opt"):
                it.begin("zero")
                clock.t = 2.5
                it.end()
                clock.t = 3.0
            clock.t = 4.0
    rec.close()
    (r,) = records(rec.path)
    assert r["phases"] == {"backward": 2.0, "backward/hook": 0.5, "opt": 1.0, "opt/zero": 0.5}


def test_nested_iteration_begun_inside_a_with_iteration(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    clock.t = 0.0
    with rec.iteration() as outer:
        outer.lap("a")
        clock.t = 1.0
        inner = rec.begin_iteration(samples=3)
        assert inner is not outer
        inner.begin("p")
        clock.t = 1.5
        inner.end()
        rec.end_iteration()
        clock.t = 2.0
        outer.lap("b")
    rec.close()
    got = sorted(records(rec.path), key=lambda r: r["iter"])
    assert [r["phases"] for r in got] == [{"a": 0.0, "b": 2.0}, {"p": 0.5}]
    assert got[1]["samples"] == 3


def test_disabled_recorder_begin_end_are_no_ops(tmp_path) -> None:
    rec = Recorder(tmp_path, enabled=False)
    it = rec.begin_iteration(tokens=1)
    assert it is NULL_ITERATION
    it.begin("x", kind="sync")
    it.end("x")
    rec.end_iteration(error=KeyError)
    assert rec.begun_iteration is None
    assert not list(tmp_path.iterdir())
