"""The one-sentence answer of ``tlog compare`` (:func:`comparison_sentence`):
how much faster or slower, whether it is real, what moved most, and
whether the machine changed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tlog.analyze.text import pct, signed_ms

if TYPE_CHECKING:
    from tlog.analyze.compare import Comparison


#: Most setting differences (tags, config) the sentence names (tlog's choice; the
#: rest are counted, ``Comparison.settings`` holds them all).
SETTINGS_SHOWN = 4


def comparison_sentence(c: Comparison) -> str:
    """One sentence: how much faster or slower, whether it is real, what moved most,
    which settings differ (``Comparison.settings``: the code and configuration the
    runs' ``run.json`` name) and what differed in the environment; when the change
    is likely contention (``Comparison.environment.contention``: measured from the
    run-queue delay, or a guess that says so) the load is named instead of a phase."""
    base, cand = c.baseline, c.candidate
    if c.throughput_ratio is None:
        head = f"{cand} vs {base}: throughput not comparable (no unit both runs report)"
    else:
        change = c.throughput_ratio - 1.0
        if abs(change) < 0.0005:
            head = f"{cand} is about as fast as {base} ({c.unit} ratio {c.throughput_ratio:.3f})"
        else:
            how = "faster" if change > 0 else "slower"
            head = (f"{cand} is {pct(abs(change))} {how} than {base} "
                    f"({c.unit} ratio {c.throughput_ratio:.3f})")
    head += "; " + c.significance.reason
    top = next((x for x in c.contributors if x.share_of_gap is not None
                and x.delta_s_per_iter != 0), None)
    env = c.environment
    if env is not None and env.contention:
        return head + "; " + env.sentence + "."
    if c.significant and top is not None:
        head += (f". Most of the gap: {top.stage} {top.phase} "
                 f"{signed_ms(top.delta_s_per_iter)}/iter "
                 f"({pct(top.share_of_gap)} of the stage's change)")
    if c.significant and c.settings:
        head += "; the runs' settings differ: " + ", ".join(c.settings[:SETTINGS_SHOWN]) + (
            f" and {len(c.settings) - SETTINGS_SHOWN} more" if len(c.settings) > SETTINGS_SHOWN
            else "")
    if env is not None and env.sentence:
        head += "; " + env.sentence
    return head + "."
