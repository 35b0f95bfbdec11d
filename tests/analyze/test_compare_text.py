"""``analyze.compare_text.comparison_sentence``: the sentence of ``tlog compare``,
put together from a comparison's parts (written here by hand)."""

from __future__ import annotations

from types import SimpleNamespace

from tlog.analyze.compare_text import SETTINGS_SHOWN, comparison_sentence

REAL = "the change is beyond noise (95% interval +8.0 .. +12 ms)"


def _contributor(phase: str, delta: float, share: float | None) -> SimpleNamespace:
    return SimpleNamespace(stage="main", phase=phase, delta_s_per_iter=delta,
                           share_of_gap=share)


def _comparison(ratio: float | None, *, significant: bool = True, contributors=(),
                settings=(), environment=None) -> SimpleNamespace:
    return SimpleNamespace(baseline="base", candidate="cand", unit="tokens/s",
                           throughput_ratio=ratio, significant=significant,
                           significance=SimpleNamespace(reason=REAL),
                           contributors=list(contributors), settings=list(settings),
                           environment=environment)


def test_slower_with_the_phase_that_moved_most() -> None:
    c = _comparison(0.8, contributors=[_contributor("load", 0.0, None),
                                       _contributor("forward", 0.018, 0.75)])
    # 1 - 0.8 = 20% slower; the first contributor with a share and a change is named
    assert comparison_sentence(c) == (
        f"cand is 20% slower than base (tokens/s ratio 0.800); {REAL}. Most of the gap: "
        "main forward +18 ms/iter (75% of the stage's change).")


def test_faster_same_speed_and_not_comparable() -> None:
    assert comparison_sentence(_comparison(1.25, significant=False)) == (
        f"cand is 25% faster than base (tokens/s ratio 1.250); {REAL}.")
    assert comparison_sentence(_comparison(1.0004, significant=False)) == (
        f"cand is about as fast as base (tokens/s ratio 1.000); {REAL}.")
    assert comparison_sentence(_comparison(None, significant=False)) == (
        "cand vs base: throughput not comparable (no unit both runs report); " + REAL + ".")


def test_settings_are_named_up_to_a_limit_only_for_a_real_change() -> None:
    six = [f"config.k{i} {i} -> {i + 1}" for i in range(6)]
    text = comparison_sentence(_comparison(0.9, settings=six))
    assert text.endswith("; the runs' settings differ: config.k0 0 -> 1, config.k1 1 -> 2, "
                         "config.k2 2 -> 3, config.k3 3 -> 4 and 2 more.")
    assert SETTINGS_SHOWN == 4
    assert "settings differ" not in comparison_sentence(
        _comparison(0.9, significant=False, settings=six))


def test_contention_replaces_the_phase_and_other_differences_are_appended() -> None:
    busy = SimpleNamespace(contention=True, sentence="the candidate ran beside 3 busy threads")
    c = _comparison(0.8, contributors=[_contributor("forward", 0.018, 0.75)],
                    environment=busy)
    assert comparison_sentence(c) == (f"cand is 20% slower than base (tokens/s ratio 0.800); "
                                      f"{REAL}; the candidate ran beside 3 busy threads.")
    other = SimpleNamespace(contention=False, sentence="the GPU differs (A100 -> H100)")
    assert comparison_sentence(_comparison(1.5, environment=other)).endswith(
        f"{REAL}; the GPU differs (A100 -> H100).")
