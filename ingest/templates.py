"""Line templates: the fast path of the bulk parser.

A run's records look alike: the shim writes the same keys in the same order,
the same phase names, the same ``kinds``. From a few sampled lines of a batch
(parsed with :func:`json.loads`, about ten per file piece) this module builds
*templates*: RE2 patterns that fully match a line only when it is a valid
record of one shape -- its keys in this order, no other keys, each value of
the right JSON type and range (durations non-negative and finite, integers
non-negative and within BIGINT, the same ``kinds`` object). A line matching a
template needs no further check: DuckDB reads it with one typed
``json_transform`` (phases as a STRUCT of DOUBLE), and its phase layout is the
template's. Lines matching no template take the general path (screens, exact
checks) in :mod:`ingest.load`, so a template that is too narrow costs speed,
never correctness.

Value patterns (whitespace ``\\s*`` allowed around every token):

- non-negative integer: ``0`` or up to 18 digits (fits BIGINT);
- duration: non-negative number with at most 21 integer digits and a 2-digit
  exponent (always finite: below 1e121);
- timestamp: the same, optionally negative;
- string: ``"..."`` without control characters, with JSON's escapes only;

so a line that matches is valid JSON and the typed transform cannot fail on it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from ingest.categories import PHASE_CATEGORIES

_W = r"\s*"
INT0 = r"(?:0|[1-9][0-9]{0,17})"
UNUM = r"(?:0|[1-9][0-9]{0,20})(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{1,2})?"
NUM = "-?" + UNUM
STR = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
#: Most templates per batch (each adds one full-match test for unmatched lines).
MAX_TEMPLATES = 8
#: Lines sampled per piece: the first few and some spread through it.
SAMPLE_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
SAMPLE_HEAD = 3

_ITER_VALUES = {"rank": "int0", "stage": "str", "worker": "str", "iter": "int0", "ts": "num",
                "dur": "dur", "cpu": "dur", "tokens": "int0", "samples": "int0",
                "phases": "durs", "gpu": "durs", "kinds": "cats", "mem": "mem"}
_QUEUE_VALUES = {"rank": "int0", "stage": "str", "worker": "str", "name": "str", "ts": "num",
                 "depth": "int0", "capacity": "int0"}
_MEM_KEYS = ("allocated", "reserved", "alloc_retries", "device_allocs")
_SPECIAL = set(r"\.^$|?*+()[]{}")


def _lit(text: str) -> str:
    """``text`` as an RE2 literal."""
    return "".join("\\" + ch if ch in _SPECIAL else ch for ch in text)


def _key(name: str) -> str:
    return _lit(json.dumps(name, ensure_ascii=False))


def _obj(items: list[tuple[str, str]]) -> str:
    if not items:
        return r"\{" + _W + r"\}"
    body = (_W + "," + _W).join(_key(k) + _W + ":" + _W + v for k, v in items)
    return r"\{" + _W + body + _W + r"\}"


def _is_int0(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10**18


def _is_dur(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0)


@dataclass(frozen=True)
class Template:
    """One record shape. ``phases``/``gpu``: key order; ``kinds``: the record's
    ``kinds`` (same in every matching line); ``regex``: RE2 full-match pattern."""

    kind: str
    regex: str
    phases: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()
    kinds: tuple[tuple[str, str], ...] = ()
    mem: tuple[str, ...] = ()


def template_of(text: str) -> Template | None:
    """The template of one line, or ``None`` when the line is not a plain valid
    ``iter`` or ``queue`` record (it then has no fast path)."""
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    if not isinstance(rec, dict):
        return None
    kind = rec.get("type", "iter")
    specs = {"iter": _ITER_VALUES, "queue": _QUEUE_VALUES}.get(kind)  # type: ignore[call-overload]
    if specs is None:
        return None
    items: list[tuple[str, str]] = []
    phases: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()
    kinds: tuple[tuple[str, str], ...] = ()
    mem: tuple[str, ...] = ()
    for key, value in rec.items():
        if key == "type":
            items.append((key, _lit(json.dumps(kind))))
            continue
        if key == "v":
            if value != 1 or not _is_int0(value):
                return None
            items.append((key, "1"))
            continue
        check = specs.get(key)
        if check is None:
            return None
        if check == "int0":
            if not _is_int0(value):
                return None
            items.append((key, INT0))
        elif check == "num":
            if not (isinstance(value, int | float) and not isinstance(value, bool)
                    and math.isfinite(value) and abs(value) < 1e20):
                return None
            items.append((key, NUM))
        elif check == "dur":
            if not _is_dur(value):
                return None
            items.append((key, UNUM))
        elif check == "str":
            if not isinstance(value, str):
                return None
            items.append((key, STR))
        elif check == "durs":
            if not isinstance(value, dict) or not all(_is_dur(v) for v in value.values()):
                return None
            items.append((key, _obj([(k, UNUM) for k in value])))
            if key == "phases":
                phases = tuple(value)
            else:
                gpu = tuple(value)
        elif check == "cats":
            if not isinstance(value, dict) or not all(
                    isinstance(v, str) and v in PHASE_CATEGORIES for v in value.values()):
                return None
            items.append((key, _obj([(k, _lit(json.dumps(v, ensure_ascii=False)))
                                     for k, v in value.items()])))
            kinds = tuple(value.items())
        elif check == "mem":
            if not isinstance(value, dict) or not all(
                    k in _MEM_KEYS and _is_int0(v) for k, v in value.items()):
                return None
            items.append((key, _obj([(k, INT0) for k in value])))
            mem = tuple(value)
    if kind == "iter" and not all(k in rec for k in ("iter", "ts", "dur", "phases")):
        return None
    if kind == "queue" and not all(k in rec for k in ("name", "ts", "depth")):
        return None
    return Template(kind=kind, regex=_W + _obj(items) + _W, phases=phases, gpu=gpu,
                    kinds=kinds, mem=mem)


def learn(samples: list[str]) -> list[Template]:
    """Distinct templates of the sampled lines (at most :data:`MAX_TEMPLATES`,
    most frequent first). Templates whose phase names would collide in a
    DuckDB STRUCT (equal ignoring case) are dropped."""
    counts: dict[Template, int] = {}
    for text in samples:
        t = template_of(text)
        if t is not None:
            counts[t] = counts.get(t, 0) + 1
    ordered = sorted(counts, key=lambda t: -counts[t])[:MAX_TEMPLATES]
    clash: set[str] = set()
    for col in ("phases", "gpu"):
        first: dict[str, str] = {}
        for t in ordered:
            for n in getattr(t, col):
                if first.setdefault(n.lower(), n) != n:
                    clash.add(n.lower())
    return [t for t in ordered
            if not any(n.lower() in clash for n in t.phases + t.gpu)]
