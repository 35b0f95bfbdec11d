"""Number and text formatting shared by the report pages (plain strings; the
HTML writer escapes them)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from tlog.analyze.findings import speedup


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def pct(x: Any, digits: int = 1) -> str:
    """``0.4213`` -> ``"42.1%"``; non-numbers -> ``"–"``."""
    v = _finite(x)
    return "–" if v is None else f"{v * 100:.{digits}f}%"


def ms(seconds: Any) -> str:
    """Seconds as milliseconds: ``0.0612`` -> ``"61.2 ms"``; 10 s and more in seconds."""
    v = _finite(seconds)
    if v is None:
        return "–"
    if abs(v) >= 10:
        return f"{v:.1f} s"
    if abs(v) >= 0.1:
        return f"{v * 1000:.0f} ms"
    return f"{v * 1000:.2g} ms" if abs(v) < 0.001 else f"{v * 1000:.1f} ms"


def signed_ms(seconds: Any) -> str:
    """Like :func:`ms` with a sign: ``+18.0 ms`` / ``-1.2 ms``."""
    v = _finite(seconds)
    if v is None:
        return "–"
    return ("+" if v > 0 else "") + ms(v)


def num(x: Any) -> str:
    """A count or rate, grouped and with at most 3 significant decimals: ``14512.3`` -> "
    "``"14,512"``."""
    v = _finite(x)
    if v is None:
        return "–"
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def ratio(x: Any) -> str:
    """``1.234`` -> ``"1.23x"``."""
    v = _finite(x)
    return "–" if v is None else f"{v:.2f}x"


def gain(x: Any) -> str:
    """A gain fraction as a signed percentage: ``0.12`` -> ``"+12.0%"``."""
    v = _finite(x)
    return "–" if v is None else f"{v * 100:+.1f}%"


def multiplier(x: Any) -> str:
    """A throughput multiplier (``speedup*`` keys) as every text shows it:
    ``2.593`` -> ``"2.59x"`` (``analyze.findings.speedup``, the one definition)."""
    v = _finite(x)
    return "–" if v is None else speedup(v - 1)


def when(epoch_s: Any) -> str:
    """Epoch seconds as ``2026-11-29 08:00 UTC``."""
    v = _finite(epoch_s)
    if v is None:
        return "–"
    return datetime.fromtimestamp(v, UTC).strftime("%Y-%m-%d %H:%M UTC")


def value(x: Any) -> str:
    """Any evidence value as short text: floats to 4 significant digits, dicts
    and lists as compact JSON."""
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict | list | tuple):
        return json.dumps(x, default=str, separators=(", ", ": "))[:300]
    return "–" if x is None else str(x)
