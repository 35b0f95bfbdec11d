"""Line templates: the fast path of the bulk parser.

A run's records look alike: the writer puts the same keys in the same order
with the same separators, the same phase names, the same ``kinds``. From a few
sampled lines of a batch (parsed with :func:`json.loads`, about ten per piece
of a file) this module builds *templates*; a line that passes its template's
test needs no further check, is read with one typed ``json_transform``
(phases as a STRUCT of DOUBLE) and gets the template's phase layout. Lines
that pass no template take the general path (screens, exact checks) in
:mod:`tlog.ingest.parse_sql`, so a template too narrow costs speed, never correctness.

The test of a template (all cheap, vectorised):

1. ``raw LIKE pattern``: the keys in this order with these separators, literal
   ``type``/``v``/``kinds``; every value a wildcard (``"%"`` for a string).
2. the line's count of ``"`` equals the template's (every key and string value
   of the template, none else): so no wildcard holds a string or a key -- no
   unknown field, no duplicate key, no number written as a string, no string
   written as a number (it would lose its two quotes).
3. the line contains neither ``true`` nor ``false`` (a boolean would read as 1/0).
4. after the typed parse (integers read as DOUBLE): every field of the template
   is non-null (an array, object or ``null`` reads as NULL), integers are whole,
   non-negative and below 2**53, durations non-negative and finite, timestamps
   finite, ``v`` is 1.

A line that is not valid JSON fails the parse and goes to the general path.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from dflash_runtime.format import (
    CLOCK_FIELDS,
    DEFAULT_RECORD_TYPE,
    MAX_DURATION_S,
    MAX_EPOCH_S,
    MAX_PHASES,
    MEM_FIELDS,
    PHASE_CATEGORIES,
    fields_of,
    required_of,
)

#: Most templates per batch (each adds one LIKE test for the lines no earlier
#: template took).
MAX_TEMPLATES = 8
#: Lines sampled per piece: the first few and some spread through it.
SAMPLE_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
SAMPLE_HEAD = 3

#: Value checks of the fields a template may hold, by record kind (events always
#: take the general path).
SPECS: dict[str, dict[str, str]] = {
    kind: {name: f.check.value for name, f in fields_of(kind).items()}
    for kind in ("iter", "queue", "meta")}
#: Fields a template's record must hold, by record kind.
REQUIRED: dict[str, tuple[str, ...]] = {kind: required_of(kind) for kind in SPECS}
#: Integers above this lose precision as DOUBLE: such lines take the general path.
MAX_EXACT_INT = 2**53
#: Most distinct phase and gpu names over the templates of one batch: their
#: typed parse reads every line into one STRUCT of all of them, whose cost grows
#: with templates x names (measured: 8 templates of 128 different names each,
#: 20 lines: 7.7 s and 2.1 GB). Templates beyond it are dropped (their lines take
#: the general path); the usual run has one template of 5-10 names.
MAX_TEMPLATE_NAMES = 256


def _like_lit(text: str) -> str:
    """``text`` as a LIKE literal (escape character ``\\``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _is_int0(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_EXACT_INT


def _is_dur(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            and 0 <= v <= MAX_DURATION_S)


def _is_epoch(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            and 0 <= v < MAX_EPOCH_S)


def _plain(s: str) -> bool:
    """A string without quotes, backslashes, control characters or lone UTF-16
    surrogates (``"\\ud800"`` decodes to one: valid JSON, not text)."""
    return (not any(c in s for c in '"\\')
            and all(0x20 <= ord(c) and not 0xD800 <= ord(c) <= 0xDFFF for c in s))


@dataclass(frozen=True)
class Template:
    """One record shape.

    Attributes:
        kind: ``iter``, ``queue`` or ``meta``.
        like: LIKE pattern (escape ``\\``) a matching line satisfies.
        quotes: number of ``"`` in a matching line.
        fields: ``(key, check)`` of the top-level fields, in order.
        phases, gpu, mem, clock: key order of those objects.
        kinds: the record's ``kinds`` (the same in every matching line).
    """

    kind: str
    like: str
    quotes: int
    fields: tuple[tuple[str, str], ...]
    phases: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()
    kinds: tuple[tuple[str, str], ...] = ()
    mem: tuple[str, ...] = ()
    clock: tuple[str, ...] = ()

    def matches(self, text: str) -> bool:
        """The LIKE, quote and boolean tests in Python (for the samples)."""
        rx = "".join(".*" if part == "%" else re.escape(re.sub(r"\\(.)", r"\1", part))
                     for part in re.split(r"(?<!\\)(%)", self.like))
        return (re.fullmatch(rx, text, flags=re.DOTALL) is not None
                and text.count('"') == self.quotes
                and "true" not in text and "false" not in text)


def _separators(text: str) -> tuple[str, str]:
    item = ", " if re.search(r'[0-9"\]}el], "', text) else ","
    key = ": " if '": ' in text else ":"
    return item, key


def template_of(text: str) -> Template | None:
    """The template of one line, or ``None`` when the line is not a plain valid
    ``iter``, ``queue`` or ``meta`` record (it then has no fast path)."""
    try:
        rec = json.loads(text)
    except (ValueError, RecursionError):   # RecursionError: nested ~1,000 deep
        return None
    if not isinstance(rec, dict):
        return None
    kind = rec.get("type", DEFAULT_RECORD_TYPE)
    if not isinstance(kind, str):            # e.g. "type": ["iter"]
        return None
    specs = SPECS.get(kind)
    if specs is None:
        return None
    item, colon = _separators(text)
    for ascii_keys in (False, True):
        t = _build(rec, kind, specs, item, colon, ascii_keys)
        if t is not None and t.matches(text.rstrip("\r\n")):
            return t
    return None


def _build(rec: dict, kind: str, specs: dict[str, str], item: str, colon: str,
           ascii_keys: bool) -> Template | None:
    def key(k: str) -> str:
        return _like_lit(json.dumps(k, ensure_ascii=ascii_keys)) + _like_lit(colon)

    def obj(parts: list[str]) -> str:
        return "{" + _like_lit(item).join(parts) + "}"

    parts: list[str] = []
    fields: list[tuple[str, str]] = []
    quotes = 0
    phases: tuple[str, ...] = ()
    gpu: tuple[str, ...] = ()
    kinds: tuple[tuple[str, str], ...] = ()
    mem: tuple[str, ...] = ()
    clock: tuple[str, ...] = ()
    for k, value in rec.items():
        if not _plain(k):
            return None
        quotes += 2
        if k == "type":
            parts.append(key(k) + _like_lit(json.dumps(kind)))
            quotes += 2
            continue
        if k == "v":
            if value != 1 or not _is_int0(value):
                return None
            parts.append(key(k) + "1")
            continue
        check = specs.get(k)
        if check is None:
            return None
        fields.append((k, check))
        if check == "int0":
            if not _is_int0(value):
                return None
            parts.append(key(k) + "%")
        elif check == "epoch":
            if not _is_epoch(value):
                return None
            parts.append(key(k) + "%")
        elif check == "dur":
            if not _is_dur(value):
                return None
            parts.append(key(k) + "%")
        elif check == "str":
            if not isinstance(value, str) or not _plain(value):
                return None
            parts.append(key(k) + '"%"')
            quotes += 2
        elif check in ("durs", "mem"):
            ok = _is_dur if check == "durs" else _is_int0
            if (not isinstance(value, dict) or not all(ok(v) for v in value.values())
                    or not all(_plain(n) and n for n in value) or len(value) > MAX_PHASES
                    or (check == "mem" and not set(value) <= set(MEM_FIELDS))):
                return None
            parts.append(key(k) + obj([key(n) + "%" for n in value]))
            quotes += 2 * len(value)
            if k == "phases":
                phases = tuple(value)
            elif k == "gpu":
                gpu = tuple(value)
            else:
                mem = tuple(value)
        elif check == "clock":
            if not isinstance(value, dict) or not set(value) <= set(CLOCK_FIELDS) or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                    for v in value.values()):
                return None
            parts.append(key(k) + obj([key(n) + "%" for n in value]))
            quotes += 2 * len(value)
            clock = tuple(value)
        elif check == "cats":
            if not isinstance(value, dict) or not all(
                    isinstance(v, str) and v in PHASE_CATEGORIES and _plain(n)
                    for n, v in value.items()):
                return None
            parts.append(key(k) + obj([key(n) + _like_lit(json.dumps(v)) for n, v in value.items()]))
            quotes += 4 * len(value)
            kinds = tuple(value.items())
        else:   # no fast path for this field's rule (``machine``): the general path
            return None
    names = {k for k, _ in fields}
    if not set(REQUIRED[kind]) <= names:
        return None
    return Template(kind=kind, like=obj(parts) + "%", quotes=quotes, fields=tuple(fields),
                    phases=phases, gpu=gpu, kinds=kinds, mem=mem, clock=clock)


def learn(samples: list[str]) -> list[Template]:
    """Distinct templates of the sampled lines (at most :data:`MAX_TEMPLATES`,
    most frequent first). Templates whose phase names would collide in a
    DuckDB STRUCT (equal ignoring case) are dropped, and so are the less frequent
    ones once :data:`MAX_TEMPLATE_NAMES` names are held."""
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
    kept: list[Template] = []
    names: set[str] = set()
    for t in ordered:
        if any(n.lower() in clash for n in t.phases + t.gpu):
            continue
        more = names | set(t.phases) | set(t.gpu)
        if len(more) <= MAX_TEMPLATE_NAMES:
            kept.append(t)
            names = more
    return kept
