"""``size``: bytes in binary units, never in exponent notation (tryout 16: a leak's
finding read "453 MiB -> 1.01e+03 MiB")."""

from __future__ import annotations

import math

import pytest
from tlog.analyze.results import MachineInfo, SystemSummary
from tlog.analyze.text import (
    DASH,
    finite,
    in_phase,
    ms,
    multiplier,
    num,
    pct,
    phase_label,
    rate,
    signed_ms,
    signed_pct,
    size,
    speedup,
    system_line,
    times,
    value,
    when,
)


@pytest.mark.parametrize(("nbytes", "text"), [
    (512, "512 B"),
    (8 * 2**20, "8.00 MiB"),
    (1.5 * 2**30, "1.50 GiB"),
    (1010 * 2**20, "1010 MiB"),             # was '1.01e+03 MiB'
    (1023 * 2**20, "1023 MiB"),
    (999.6 * 2**10, "1000 KiB"),            # was '1e+03 KiB'
    (99.97 * 2**20, "100 MiB"),             # rounds up to a whole 100, not '1e+02'
    (-1010 * 2**20, "-1010 MiB"),
    (1023.7 * 2**20, "1.00 GiB"),           # rounds to 1024 MiB: the next unit
])
def test_size_writes_whole_units_from_100_on(nbytes, text) -> None:
    assert size(nbytes) == text


# --- durations, shares, ratios: each rule of the module docstring at its edges --------

@pytest.mark.parametrize(("seconds", "text"), [
    (1.25, "1.25 s"),
    (0.9996, "1.00 s"),          # rounds to 1.00 s: the next unit, never "1000 ms"
    (0.0612, "61 ms"),           # whole milliseconds from 10 ms
    (0.00995, "10 ms"),          # 9.95 ms rounds to 10: whole milliseconds
    (0.0094, "9.4 ms"),
    (0.0043, "4.3 ms"),
    (0.00012, "120 µs"),
    (0.00006, "60 µs"),          # not "0.1 ms" for both 60 and 120 µs
    (0.000004, "4.0 µs"),
    (0.0, "0 µs"),
    (-0.0, "0 µs"),              # no "-0"
    (-0.0612, "-61 ms"),
    (None, "–"),
    (float("nan"), "–"),
    ("fast", "–"),
])
def test_ms_picks_the_unit_that_keeps_two_figures(seconds, text) -> None:
    assert ms(seconds) == text


def test_signed_forms_put_a_sign_only_on_a_change() -> None:
    assert signed_ms(0.018) == "+18 ms"
    assert signed_ms(-0.0012) == "-1.2 ms"
    assert signed_ms(0.0) == "0 µs"
    assert signed_pct(0.12) == "+12%"
    assert signed_pct(-0.012) == "-1.2%"
    assert signed_pct(0.0001) == "0%"        # below half a tenth of a point: no sign
    assert signed_ms(None) == signed_pct(math.inf) == DASH


@pytest.mark.parametrize(("share", "text"), [
    (0.4123, "41%"), (0.1, "10%"), (0.0999, "10.0%"), (0.043, "4.3%"),
    (0.0004, "0%"), (-0.25, "-25%"), (1.0, "100%"), (True, "–"),
])
def test_pct_whole_from_ten_percent_one_decimal_below(share, text) -> None:
    assert pct(share) == text


def test_ratios_and_multipliers() -> None:
    assert times(1.421) == "1.42x"
    assert times(1.999) == "2.00x"           # still below 2: two decimals
    assert times(3.237) == "3.2x"
    assert times(None) == DASH
    assert speedup(1.593) == "2.59x"         # a gain of +159.3% is 2.593 times the throughput
    assert speedup(0.0) == "1.00x"
    assert multiplier(2.593) == "2.59x"
    assert multiplier("x") == DASH


@pytest.mark.parametrize(("x", "text"), [
    (14512.3, "14,512"), (230, "230"), (230.0, "230"), (1.234567, "1.23"),
    (99.94, "99.9"), (1234567, "1,234,567"), (-1500.4, "-1,500"), (None, "–"),
])
def test_num_groups_whole_numbers_and_keeps_three_figures(x, text) -> None:
    assert num(x) == text


def test_rate_when_and_value() -> None:
    assert rate(12414.3, "tokens/s") == "12,414 tokens/s"
    assert rate(9.412, "it/s") == "9.41 it/s"
    assert rate(None, "it/s") == "– it/s"
    assert rate(7, "") == "7"
    # 2025-01-01 is 55 * 365 + 14 leap days = 20,089 days after 1970-01-01;
    # November 29th is 332 days later; plus 8 hours
    assert when((20089 + 332) * 86400 + 8 * 3600) == "2025-11-29 08:00 UTC"
    assert when(None) == DASH
    assert value(0.123456) == "0.1235"
    assert value({"a": [1, 2]}) == '{"a": [1, 2]}'
    # cut at 300 characters: "[" and "0, " .. "9, " are 31, then 67 of "NN, " (10 .. 76)
    # are 268, and the 300th character is the "7" of 77
    long = value(list(range(200)))
    assert len(long) == 300 and long.endswith("75, 76, 7")
    assert value(None) == DASH
    assert value(7) == "7"


def test_finite_refuses_what_is_not_a_number() -> None:
    assert finite("2.5") == 2.5
    assert finite(3) == 3.0
    for x in (None, True, False, "abc", math.nan, -math.inf, [1]):
        assert finite(x) is None


def test_phase_label_names_an_implicit_sync_by_its_call_and_site() -> None:
    assert phase_label("optimizer_step/sync.item@train.py:212") == \
        "`.item()` at train.py:212 in optimizer_step"
    assert phase_label("sync.to_cpu@loop.py:7") == "`.to('cpu')` at loop.py:7"
    assert phase_label("sync.newop@x.py:1") == "`newop` at x.py:1"    # an op without prose
    assert phase_label("hs_get") == "hs_get"


def test_in_phase_says_the_phase_share_only_when_it_differs() -> None:
    # the phase holds all the category's time (same printed percent): no second share
    assert in_phase("hs_get", 0.2504, 0.2501, 0.0043) == " in hs_get (4.3 ms/iter)"
    # 27% of the time in batch_get out of a 41% category
    assert in_phase("batch_get", 0.27, 0.41, 0.030) == ", 27% in batch_get (30 ms/iter)"
    assert in_phase("load", 0.5, 0.5, 0.2, per="/step") == " in load (200 ms/step)"
    assert in_phase(None, 0.5, 0.5, 0.2) == ""


GiB = 1 << 30


def test_system_line() -> None:
    m = MachineInfo("box", "AMD EPYC", 2, 16 * GiB, "NVIDIA H200", 1, "550.54.15", "12.4")
    s = SystemSummary(m, 10, 2, 7.2, 1.0, 0.23, 0.21, 25 * 2**20, 20.0, 1410.0, 1980.0, 1.0,
                      run_queue_share=0.05)
    assert system_line(s) == (
        "machine: box (AMD EPYC, 2 cores, 16.0 GiB; NVIDIA H200 x1, driver 550.54.15); "
        "steady state: load 7.2 on 2 usable cores, 1 runnable thread, the process 0.23 "
        "cores, the thread on the CPU 21% of its compute time, the thread waited for a core "
        "5.0% of its time, RSS 25.0 MiB, GPU 20% busy, SM 1410 of 1980 MHz, throttled in "
        "100% of samples")
    bare = SystemSummary(None, 0, None, None, None, None, None, None, None, None, None, None)
    assert system_line(bare) is None and system_line(None) is None
    only = SystemSummary(MachineInfo(None, None, None, None, None, None, None, None), 0, *[None] * 10)
    assert system_line(only) == "machine: ?"
