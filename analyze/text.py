"""How tlog writes numbers in text: one rule per kind of figure, used by the
findings and verdict (``analyze``), ``tlog compare``'s sentences, the report
pages (``reports``) and the CLI (``tlog``), so a figure reads the same
everywhere ("61 ms" in the verdict was "61.2 ms" in the report).

The rules (tlog's choice; each function's docstring gives its examples):

- **Durations** (:func:`ms`): at least two significant figures, in the unit
  that keeps the figure under 1000: seconds with two decimals from 1 s
  (``1.25 s``), whole milliseconds from 10 ms (``61 ms``), one decimal from
  1 ms (``4.3 ms``), microseconds below 1 ms (``120 µs``, ``4.0 µs``). Whole
  milliseconds from 10 ms because a training iteration's run-to-run noise is
  above 1% (a tenth of a millisecond at 10 ms is not a real figure).
- **Shares** (:func:`pct`): whole percent from 10% (``41%``), one decimal
  below (``4.3%``), where a tenth of a point still matters.
- **Ratios** (:func:`times`): two decimals below 2x (``1.42x``), one from 2x
  (``3.2x``); throughput gains as the multiplier (:func:`speedup`).
- **Sizes** (:func:`size`): bytes in binary units, three significant figures
  (``8.00 MiB``, ``1.50 GiB``).
- **Counts and rates** (:func:`num`, :func:`rate`): grouped whole numbers
  from 100 (``12,414 tokens/s``), three significant figures below (``9.41 it/s``).

Every function takes plain floats; the ``*_or_dash`` forms of the reports
accept anything (``None``, NaN, text) and give ``"–"`` for what is not a
finite number. Nothing here imports more than the standard library and the
log format (``dflash_runtime.format``, standard library only).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dflash_runtime.format import parse_sync_site

if TYPE_CHECKING:
    from tlog.analyze.results import SystemSummary

#: What a table cell shows for a missing or non-numeric figure.
DASH = "–"


def finite(x: Any) -> float | None:
    """``x`` as a finite float, or None (None, bools, text, NaN, infinities)."""
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def ms(seconds: float) -> str:
    """Seconds as a short human duration (module docstring "Durations"):
    ``1.25 s``, ``61 ms``, ``4.3 ms``, and under 1 ms in microseconds
    (``120 µs``, ``40 µs``, ``0.4 µs``, not ``0.1 ms`` for both 60 and
    120 µs). Each unit is used only where its rounded figure stays below the
    next unit's (0.9996 s is ``1.00 s``); a missing figure is ``"–"``."""
    v = finite(seconds)
    if v is None:
        return DASH
    v += 0.0                                 # -0.0 -> 0.0
    a = abs(v)
    if round(a, 2) >= 1:
        return f"{v:.2f} s"
    if round(a * 1e3) >= 10:
        return f"{v * 1e3:.0f} ms"
    if round(a * 1e3, 1) >= 1:
        return f"{v * 1e3:.1f} ms"
    if a == 0:
        return "0 µs"
    us = v * 1e6
    return f"{us:.0f} µs" if round(abs(us)) >= 10 else f"{us:.1f} µs"


def signed_ms(seconds: float | None) -> str:
    """A change of duration, :func:`ms` with its sign: ``+18 ms``, ``-1.2 ms``,
    ``0 µs`` (no sign for no change); ``"–"`` for a missing figure."""
    v = finite(seconds)
    if v is None:
        return DASH
    return ("+" if v > 0 else "") + ms(v)


def pct(x: float | None) -> str:
    """A share as a percentage (module docstring "Shares"): ``0.4123`` ->
    ``'41%'``, ``0.043`` -> ``'4.3%'``; ``"–"`` for a missing figure."""
    v = finite(x)
    if v is None:
        return DASH
    if abs(v) < 5e-4:  # float dust from sums of seconds
        return "0%"
    return f"{v * 100:.1f}%" if abs(v) < 0.1 else f"{v * 100:.0f}%"


def signed_pct(x: float | None) -> str:
    """A relative change, :func:`pct` with its sign: ``0.12`` -> ``'+12%'``,
    ``-0.012`` -> ``'-1.2%'``; ``"–"`` for a missing figure."""
    v = finite(x)
    if v is None:
        return DASH
    text = pct(abs(v))
    return text if text == "0%" else ("+" if v > 0 else "-") + text


def times(ratio: float | None) -> str:
    """A ratio of times or rates: ``3.237`` -> ``'3.2x'``, ``1.421`` -> ``'1.42x'``
    (two decimals below 2x, where a hundredth still matters); ``"–"`` when missing."""
    v = finite(ratio)
    if v is None:
        return DASH
    return f"{v:.2f}x" if v < 2 else f"{v:.1f}x"


def speedup(gain: float) -> str:
    """A throughput gain (a fraction: new / old - 1) as the pipeline's throughput
    multiplier, the one figure every text shows: ``1.593`` -> ``'2.59x'``.
    The JSON carries the same multiplier as ``speedup*`` beside the fraction."""
    return f"{1 + gain:.2f}x"


def multiplier(x: Any) -> str:
    """A throughput multiplier (``speedup*`` keys) as every text shows it:
    ``2.593`` -> ``'2.59x'`` (:func:`speedup` of ``x - 1``); ``"–"`` when missing."""
    v = finite(x)
    return DASH if v is None else speedup(v - 1)


def num(x: Any) -> str:
    """A count or rate, grouped and with at most 3 significant decimals:
    ``14512.3`` -> ``'14,512'``, ``230`` -> ``'230'``, ``1.234567`` -> ``'1.23'``;
    ``"–"`` when missing."""
    v = finite(x)
    if v is None:
        return DASH
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def size(nbytes: Any) -> str:
    """Bytes in binary units, three significant figures, the unit keeping the
    figure under 1024: ``8388608`` -> ``'8.00 MiB'``, ``1.5 * 2**30`` ->
    ``'1.50 GiB'``, ``512`` -> ``'512 B'``, ``1010 * 2**20`` -> ``'1010 MiB'``
    (whole units from 100 on, never an exponent); signed; ``"–"`` when missing."""
    v = finite(nbytes)
    if v is None:
        return DASH
    a, unit = abs(v), "B"
    for nxt in ("KiB", "MiB", "GiB", "TiB"):
        if round(a, 0) < 1024:
            break
        a, unit = a / 1024, nxt
    if unit == "B":
        return f"{v:.0f} B"
    text = f"{a:.0f}" if a >= 99.95 else (f"{a:.1f}" if a >= 9.995 else f"{a:.2f}")
    return f"{'-' if v < 0 else ''}{text} {unit}"


def rate(value: Any, unit: str) -> str:
    """A throughput with its unit, the figure as :func:`num` writes it:
    ``(12414.3, "tokens/s")`` -> ``'12,414 tokens/s'``, ``(9.412, "it/s")`` ->
    ``'9.41 it/s'``; ``"–"`` (and the unit) when missing; no unit: the figure alone."""
    return f"{num(value)} {unit}".rstrip()


def when(epoch_s: Any) -> str:
    """Epoch seconds as ``2026-11-29 08:00 UTC``; ``"–"`` when missing."""
    v = finite(epoch_s)
    if v is None:
        return DASH
    return datetime.fromtimestamp(v, UTC).strftime("%Y-%m-%d %H:%M UTC")


def value(x: Any) -> str:
    """Any evidence value as short text: floats to 4 significant digits, dicts
    and lists as compact JSON (300 characters at most), None as ``"–"``."""
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict | list | tuple):
        return json.dumps(x, default=str, separators=(", ", ": "))[:300]
    return DASH if x is None else str(x)


#: How prose writes each implicit-sync operation of ``dflash_runtime.format.SYNC_OPS``.
SYNC_CALL_TEXT: dict[str, str] = {
    "item": ".item()", "tolist": ".tolist()", "cpu": ".cpu()", "to_cpu": ".to('cpu')",
    "nonzero": ".nonzero()", "bool": "bool(tensor)", "float": "float(tensor)",
    "int": "int(tensor)", "synchronize": "torch.cuda.synchronize()",
    "stream_synchronize": "Stream.synchronize()", "event_synchronize": "Event.synchronize()",
}


def phase_label(phase: str) -> str:
    """How prose names a phase: itself, except an implicit sync caught by the shim
    (``optimizer_step/sync.item@train.py:212``), named by its call and site:
    ``"`.item()` at train.py:212 in optimizer_step"``
    (``dflash_runtime.format.parse_sync_site``).

    >>> phase_label("optimizer_step/sync.item@train.py:212")
    '`.item()` at train.py:212 in optimizer_step'
    >>> phase_label("hs_get")
    'hs_get'
    """
    site = parse_sync_site(phase)
    if site is None:
        return phase
    op, file, line = site
    text = f"`{SYNC_CALL_TEXT.get(op, op)}` at {file}:{line}"
    parent = phase.rpartition("/")[0]
    return f"{text} in {parent}" if parent else text


def in_phase(phase: str | None, phase_share: float, share: float, per_iter: float,
             per: str = "/iter") -> str:
    """Where a category's time goes, for prose after its share: ``" in hs_get
    (4.3 ms/iter)"`` when the phase holds (to the printed percent) all of it,
    else ``", 27% in batch_get (30 ms/iter)"``: the phase's own share, so a
    category share is never read as one phase's."""
    if not phase:
        return ""
    label = phase_label(phase)
    if pct(phase_share) == pct(share):
        return f" in {label} ({ms(per_iter)}{per})"
    return f", {pct(phase_share)} in {label} ({ms(per_iter)}{per})"


def system_line(summary: SystemSummary | None) -> str | None:
    """The machine and its load in one line, as ``tlog diagnose`` prints it
    (None when nothing was recorded): ``"machine: box (AMD EPYC, 2 cores,
    23.5 GiB; NVIDIA H200 x1, driver 550.54.15); steady state: load 7.2 on 2
    usable cores, 1 runnable thread, the process 0.23 cores, the thread on
    the CPU 21% of its compute time, RSS 25.0 MiB, GPU 20% busy, SM 1410 of
    1980 MHz, throttled in 100% of samples"``. Names come from the logs: the
    caller escapes them for a terminal. ``summary``: a
    :class:`~tlog.analyze.results.SystemSummary`, or anything with its
    attributes (the stored diagnosis' JSON, seen through
    :class:`tlog.render.JsonView`)."""
    if summary is None or (summary.machine is None and summary.samples == 0):
        return None
    parts = []
    m = summary.machine
    if m is not None:
        cpu = ", ".join(x for x in (m.cpu_model, f"{m.ncpu} cores" if m.ncpu else None,
                                    size(m.mem_total) if m.mem_total else None) if x)
        gpu = ", ".join(x for x in (
            f"{m.gpu_name} x{m.gpu_count}" if m.gpu_name and m.gpu_count else m.gpu_name,
            f"driver {m.driver}" if m.driver else None) if x)
        inside = "; ".join(x for x in (cpu, gpu) if x)
        parts.append(f"machine: {m.host or '?'}" + (f" ({inside})" if inside else ""))
    load = []
    if summary.load1 is not None:
        load.append(f"load {summary.load1:.1f}"
                    + (f" on {summary.ncpu} usable core{'' if summary.ncpu == 1 else 's'}"
                       if summary.ncpu else ""))
    if summary.running is not None:
        load.append(f"{summary.running:g} runnable thread{'' if summary.running == 1 else 's'}")
    if summary.process_cpu_cores is not None:
        load.append(f"the process {summary.process_cpu_cores:.2f} cores")
    if summary.on_cpu_share is not None:
        load.append(f"the thread on the CPU {pct(summary.on_cpu_share)} of its compute time")
    if summary.run_queue_share is not None:
        load.append(f"the thread waited for a core {pct(summary.run_queue_share)} of its time")
    if summary.rss_bytes is not None:
        load.append(f"RSS {size(summary.rss_bytes)}")
    if summary.gpu_util is not None:
        load.append(f"GPU {summary.gpu_util:.0f}% busy")
    if summary.gpu_sm_clock_mhz is not None:
        load.append(f"SM {summary.gpu_sm_clock_mhz:.0f}"
                    + (f" of {summary.gpu_sm_clock_max_mhz:.0f}"
                       if summary.gpu_sm_clock_max_mhz else "") + " MHz")
    if summary.throttled_share:
        load.append(f"throttled in {pct(summary.throttled_share)} of samples")
    if summary.samples and load:
        parts.append("steady state: " + ", ".join(load))
    return "; ".join(parts) if parts else None
