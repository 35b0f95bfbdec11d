"""The writer's reconstruction of phases from the raw log (dflash_runtime.writer.build_phases).

Logs are hand-made in the format the recorder appends (recorder module docstring), with
round times so every duration can be checked exactly.
"""

from __future__ import annotations

from dflash_runtime.recorder import ENTER, ENTER_X
from dflash_runtime.writer import build_phases


def test_laps_measure_from_the_previous_mark_and_repeated_names_sum() -> None:
    log = ["load", 1.25, "forward", 3.0, "load", 3.5]
    phases, kinds, slots = build_phases(log, 1.0, 4.0)
    assert phases == {"load": 0.75, "forward": 1.75}
    assert list(phases) == ["load", "forward"]
    assert kinds is None and slots is None


def test_blocks_nest_as_parent_slash_child_in_start_order() -> None:
    # iteration 0..10: lap a (0..1); block fwd 2..8 with a lap mask (2..3) and a block
    # attn (4..6) holding a lap qk (4..5); lap tail after fwd (8..9).
    log = ["a", 1.0, ENTER, "fwd", 2.0, "mask", 3.0, ENTER, "attn", 4.0, "qk", 5.0, 6.0,
           8.0, "tail", 9.0]
    phases, _, _ = build_phases(log, 0.0, 10.0)
    assert phases == {"a": 1.0, "fwd": 6.0, "fwd/mask": 1.0, "fwd/attn": 2.0,
                      "fwd/attn/qk": 1.0, "tail": 1.0}
    assert list(phases) == ["a", "fwd", "fwd/mask", "fwd/attn", "fwd/attn/qk", "tail"]


def test_time_between_a_lap_and_a_block_is_not_given_to_the_block() -> None:
    log = ["a", 1.0, ENTER, "b", 3.0, 4.0, "c", 4.5]
    phases, _, _ = build_phases(log, 0.0, 5.0)
    assert phases == {"a": 1.0, "b": 1.0, "c": 0.5}  # 1..3 is unaccounted


def test_kinds_and_event_slots_are_keyed_by_full_name() -> None:
    log = [ENTER_X, ("hs_get", "starvation", None), 0.0, 2.0,
           ENTER, "fwd", 2.0, ENTER_X, ("gemm", None, 0), 2.5, 3.0, 4.0]
    phases, kinds, slots = build_phases(log, 0.0, 4.0)
    assert phases == {"hs_get": 2.0, "fwd": 2.0, "fwd/gemm": 0.5}
    assert kinds == {"hs_get": "starvation"}
    assert slots == {0: "fwd/gemm"}


def test_blocks_left_open_end_with_the_iteration() -> None:
    log = [ENTER, "outer", 1.0, ENTER, "inner", 2.0]
    phases, _, _ = build_phases(log, 0.0, 5.0)
    assert phases == {"outer": 4.0, "outer/inner": 3.0}


def test_a_truncated_tail_and_a_stray_end_are_ignored() -> None:
    assert build_phases(["a", 1.0, "b"], 0.0, 2.0)[0] == {"a": 1.0}
    assert build_phases([0.5, "a", 1.0], 0.0, 2.0)[0] == {"a": 1.0}
    assert build_phases(["a", 1.0, ENTER, "b"], 0.0, 2.0)[0] == {"a": 1.0}


def test_only_the_iterations_slice_of_a_shared_log_is_read() -> None:
    log = ["x", 1.0, "a", 2.5, "b", 3.0, "y", 9.0]
    phases, _, _ = build_phases(log, 2.0, 3.0, 2, 6)
    assert phases == {"a": 0.5, "b": 0.5}
