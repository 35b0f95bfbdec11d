"""SQL that parses and checks one batch of v1 JSONL lines (stages A and B),
built from the format module :mod:`dflash_runtime.format`.

A batch is an Arrow table ``_tlog_lines(fid, line, raw, quotes)`` (see
:class:`tlog.ingest.sources.LinesStream`). No Python code runs per record.

A. **Parse** (:func:`screen_sql` -> temp table ``_tlog_p``). Lines that pass a
   *template* learned from sampled lines (:mod:`tlog.ingest.templates`: a LIKE
   pattern, the count of ``"``, no boolean, typed checks) are read with one
   typed ``json_transform`` and are valid by construction. Every other line is
   read with a typed transform (nested objects kept as JSON text, ``json_keys``
   of ``phases``/``gpu``) and passes cheap *conservative screens*, since
   DuckDB's non-strict transform is lenient (``"7"`` reads as 7, ``1.5`` as 2):
   a regular expression for a number field whose value starts like a string,
   boolean, array or object (or a fraction for an integer field) and the
   reverse for string fields; a count of ``:`` that shows unknown or ``null``
   fields; the required fields, signs and finiteness; non-number values in
   ``phases``/``gpu``/``mem``; repeated phase names. A line failing any screen
   is *flagged*. The statement's steps (CTEs): ``like_matched`` (the template
   whose LIKE and quote count a line passes), ``fast_candidates`` (no boolean
   either), ``fast_parsed`` (the typed template parse), ``fast_checked`` (the
   template's value checks passed), ``general_parsed`` (the typed parse of the
   other lines), ``columns`` (one set of columns from either path),
   ``with_mem``, ``screened`` (the ``flag``).
B. **Exact check of flagged lines** (:data:`EXACT_SQL` -> ``_tlog_b``): each is
   re-parsed with every field as JSON and given its exact reason (or none: a
   line flagged only for an unknown field is loaded, with the field kept in
   ``extra``). All reason rules are here, in ``FIELDS`` order. Steps:
   ``flagged_lines``, ``validity`` (JSON or not), ``top_types``, ``as_json``,
   ``with_kind``, ``reasons`` (the first rule each line breaks).

Stages C-E (layouts, meta defaults, load) are in :mod:`tlog.ingest.batch`.
Reason codes (``rejects.code``): see :data:`REASON_CODES`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tlog.ingest.sources import MAX_LINE_BYTES
from tlog.ingest.templates import MAX_EXACT_INT, Template

from dflash_runtime.format import (
    CLOCK_FIELDS,
    FIELDS,
    FORMAT_VERSION,
    GPU_INT_FIELDS,
    MACHINE_INT_FIELDS,
    MAX_BIGINT,
    MAX_DURATION_S,
    MAX_EPOCH_S,
    MAX_PHASES,
    MAX_RANK,
    MEM_FIELDS,
    RECORD_KINDS,
    Field,
)

#: Rejected lines keep this many characters of their text (``rejects.raw``).
RAW_KEEP = 2000

#: Deepest nesting of arrays and objects in a line (the record itself is level
#: 1; v1 records nest 2 deep). Source: tlog's choice, a cap on absurd input: a
#: value nested ~1,000 deep exceeded Python's recursion limit in every reader of
#: ``extra`` (``json.loads``) and failed every later ingest of the run.
MAX_DEPTH = 64

#: The record kinds in words: ``iter, queue, event, meta or sys``.
_KINDS_TEXT = ", ".join(RECORD_KINDS[:-1]) + " or " + RECORD_KINDS[-1]

#: ``rejects.code`` -> what it means.
REASON_CODES: dict[str, str] = {
    "not_json": "the line is not JSON (or not UTF-8 text)",
    "not_object": "the line is JSON but not an object",
    "unknown_version": "the record's 'v' is not a schema version this tlog reads",
    "unknown_type": f"the record's 'type' is not {_KINDS_TEXT}",
    "missing_field": "a required field is missing (or null)",
    "wrong_type": "a field has the wrong JSON type",
    "bad_duration": (f"a duration is negative, not finite (NaN, Infinity) or longer than "
                     f"{MAX_DURATION_S:,.0f} s (a day)"),
    "bad_value": ("a count or rank is negative or out of range, or a timestamp is not epoch "
                  "seconds (negative, not finite, or looks like milliseconds)"),
    "bad_phase_value": "a value in 'phases' or 'gpu' is not a number",
    "bad_phase_name": "a name in 'phases' or 'gpu' is empty",
    "duplicate_key": "a key appears twice in one object (the record, 'phases' or 'gpu')",
    "too_large": (f"the line is longer than {MAX_LINE_BYTES:,} bytes, has more than "
                  f"{MAX_PHASES} names in 'phases' or 'gpu', or nests arrays/objects more "
                  f"than {MAX_DEPTH} deep (caps on absurd input)"),
}

_SQL_TYPE = {"int0": "BIGINT", "epoch": "DOUBLE", "dur": "DOUBLE", "num0": "DOUBLE",
             "str": "VARCHAR", "durs": "JSON", "cats": "JSON", "mem": "JSON", "clock": "JSON",
             "gauges": "JSON", "facts": "JSON"}
#: The scalar value rules (a typed column each); the others are objects (JSON).
_SCALAR = ("int0", "epoch", "dur", "num0", "str")
_STRUCT_A = json.dumps({"type": "VARCHAR", "v": "BIGINT",
                        **{f.name: _SQL_TYPE[f.check] for f in FIELDS}})
_STRUCT_B = json.dumps({"type": "JSON", "v": "JSON", **{f.name: "JSON" for f in FIELDS}})
_STRUCT_MEM = json.dumps({k: "BIGINT" for k in MEM_FIELDS})

_NUM_KEYS = "|".join(dict.fromkeys(
    ["v"] + [f.name for f in FIELDS if f.check in ("int0", "epoch", "dur", "num0")]))
_INT_KEYS = "|".join(dict.fromkeys(["v"] + [f.name for f in FIELDS if f.check == "int0"]))
_STR_KEYS = "|".join(dict.fromkeys(["type"] + [f.name for f in FIELDS if f.check == "str"]))
#: Screen A: a number field whose value does not start like a number, an integer
#: field holding a fraction or exponent, a string field whose value is not a string.
SUSPECT_RE = (rf'"(?:{_NUM_KEYS})"\s*:\s*[^-0-9NI\s]'
              rf'|"(?:{_INT_KEYS})"\s*:\s*-?[0-9]+[.eE]'
              rf'|"(?:{_STR_KEYS})"\s*:\s*[^"\s]')
#: Screen A on the (minified) text of ``phases``/``gpu``: a value that is not a
#: plain non-negative number below 10,000 without a non-negative exponent
#: (anything else may be a string, null, negative, NaN, Infinity, overflow or
#: longer than :data:`ingest.manifest.MAX_DURATION_S`).
BAD_DURS_RE = r':(?:[^0-9]|[0-9.]*[eE][+]?[0-9]|[0-9]{5})'

MACROS_SQL = """
CREATE OR REPLACE TEMP MACRO _tlog_colons(x) AS
    coalesce(strlen(x) - strlen(replace(x, ':', '')), 0);
CREATE OR REPLACE TEMP MACRO _tlog_nn(x) AS (x IS NOT NULL)::INTEGER;
CREATE OR REPLACE TEMP MACRO _tlog_jname(t) AS CASE
    WHEN t IS NULL OR t = 'NULL' THEN 'null' WHEN t = 'VARCHAR' THEN 'a string'
    WHEN t = 'ARRAY' THEN 'an array' WHEN t = 'OBJECT' THEN 'an object'
    WHEN t = 'BOOLEAN' THEN 'a boolean' WHEN t = 'DOUBLE' THEN 'a number'
    ELSE 'an integer' END;
CREATE OR REPLACE TEMP MACRO _tlog_isnum(x) AS
    coalesce(json_type(x) IN ('UBIGINT', 'BIGINT', 'DOUBLE'), false);
CREATE OR REPLACE TEMP MACRO _tlog_d(x) AS TRY_CAST(x AS DOUBLE);
CREATE OR REPLACE TEMP MACRO _tlog_isint(x) AS coalesce(
    (json_type(x) IN ('UBIGINT', 'BIGINT') AND try_cast(x::VARCHAR AS BIGINT) IS NOT NULL)
    OR (json_type(x) = 'DOUBLE' AND isfinite(_tlog_d(x)) AND _tlog_d(x) = trunc(_tlog_d(x))
        AND abs(_tlog_d(x)) < 9.0e18), false);
CREATE OR REPLACE TEMP MACRO _tlog_toobig(x, lim) AS coalesce(
    (json_type(x) IN ('UBIGINT', 'BIGINT')
     AND coalesce(try_cast(x::VARCHAR AS BIGINT) > lim, true))
    OR (json_type(x) = 'DOUBLE' AND isfinite(_tlog_d(x)) AND _tlog_d(x) = trunc(_tlog_d(x))
        AND _tlog_d(x) > lim), false);
CREATE OR REPLACE TEMP MACRO _tlog_present(x) AS x IS NOT NULL;
CREATE OR REPLACE TEMP MACRO _tlog_isobj(x) AS coalesce(json_type(x) = 'OBJECT', false);
CREATE OR REPLACE TEMP MACRO _tlog_q(s) AS '''' || s || '''';
""" + f"""
CREATE OR REPLACE TEMP MACRO _tlog_epoch(x) AS coalesce(x >= 0 AND x < {MAX_EPOCH_S!r}, false);
CREATE OR REPLACE TEMP MACRO _tlog_dur(x) AS
    coalesce(isfinite(x) AND x >= 0 AND x <= {MAX_DURATION_S!r}, false);
"""


_TYPED_TOP = {"type": "VARCHAR", "v": "BIGINT",
              **{f.name: _SQL_TYPE[f.check] for f in FIELDS if f.check in _SCALAR}}
#: Columns of ``_tlog_p`` read from both paths (fast ``f`` or general ``j``).
_SHARED = [n for n in _TYPED_TOP if n not in ("type",)]


def fast_positions(templates: list[Template]) -> dict[str, dict[str, int]]:
    """``{'phases'|'gpu': {name: 1-based position}}`` in the fast path's STRUCTs:
    phase values are read by position (``struct_extract_at``), so a phase name
    enters SQL only as data (inside the JSON text of the structure), never as
    an identifier."""
    return {col: {n: i + 1 for i, n in enumerate(dict.fromkeys(
        n for t in templates for n in getattr(t, col)))} for col in ("phases", "gpu")}


def _fast_keys(templates: list[Template]) -> set[str]:
    """Top-level keys some template holds: only these are in the fast path's
    structure (a line that passed a template has no other key, so the rest
    would read as NULL anyway; each key left out is work ``json_transform``
    does not do: 225,000 lines, 27 fields -> 15: 0.145 -> 0.127 CPU-s).
    ``type`` is not among them: a template's LIKE fixes it and ``kind``
    comes from the template."""
    return {"v"} | {k for t in templates for k, _ in t.fields if k != "type"}


def _fast_struct(templates: list[Template]) -> dict[str, Any]:
    """``json_transform`` structure of the template (fast) path of ``templates``
    as a dict: integers read as DOUBLE so that a fraction shows (the transform
    would round it); the keys of :func:`_fast_keys` only; ``phases``/``gpu``
    with their names in :func:`fast_positions` order (read by position)."""
    keys = _fast_keys(templates)
    struct: dict[str, Any] = {k: ("DOUBLE" if t == "BIGINT" else t)
                              for k, t in _TYPED_TOP.items() if k in keys}
    for col, names in fast_positions(templates).items():
        if names:
            struct[col] = dict.fromkeys(names, "DOUBLE")
    if "mem" in keys:
        struct["mem"] = dict.fromkeys(MEM_FIELDS, "DOUBLE")
    if "clock" in keys:
        struct["clock"] = dict.fromkeys(CLOCK_FIELDS, "DOUBLE")
    return struct


def _fast_structure(templates: list[Template]) -> str:
    """:func:`_fast_struct` of every template's keys, as JSON text."""
    return json.dumps(_fast_struct(templates))


def _sql_type(struct: dict[str, Any] | str) -> str:
    """The DuckDB type of a ``json_transform`` structure (names quoted: data, never
    identifiers)."""
    if isinstance(struct, str):
        return struct
    return "STRUCT(" + ", ".join('"' + k.replace('"', '""') + '" ' + _sql_type(v)
                                 for k, v in struct.items()) + ")"


def _fast_transform(templates: list[Template]) -> str:
    """SQL of ``f``, the typed parse of a line that passed template ``tpl0``:
    each template's line parsed with the structure of that template's own
    keys and phase names, cast to the structure of all of them
    (:func:`_fast_struct`; DuckDB casts a STRUCT to a STRUCT by field name,
    nested ones too, a field the source lacks NULL).
    Why: ``json_transform`` pays for every key of its structure, found or not
    (measured, 225,000 lines of the bench run: 16 keys 138-148 CPU-ms, the
    7 of an ``iter`` template 115-125)."""
    union = _fast_struct(templates)
    if len(templates) == 1:
        return f"json_transform(raw, {sql_str(json.dumps(union))})"
    cases = []
    for i, t in enumerate(templates):
        own = _fast_struct([t])
        if list(own) == list(union):
            cases.append(f"WHEN {i} THEN json_transform(raw, {sql_str(json.dumps(union))})")
        else:
            cases.append(f"WHEN {i} THEN json_transform(raw, {sql_str(json.dumps(own))})"
                         f"::{_sql_type(union)}")
    return "CASE tpl0 " + " ".join(cases) + " END"


#: ``m`` of a line whose template has no ``mem``: NULL, as the general path
#: gives a line without ``mem``.
_NULL_MEM = ("NULL::STRUCT(" + ", ".join(f"{k} BIGINT" for k in MEM_FIELDS) + ")")


def _fast_mem(templates: list[Template]) -> str:
    """SQL of ``m`` (typed ``mem``) on the fast path."""
    if "mem" not in _fast_keys(templates):
        return _NULL_MEM
    return "{" + ", ".join(f"'{k}': f.mem.{k}::BIGINT" for k in MEM_FIELDS) + "}"


def _fast_clock(templates: list[Template], otherwise: str = "NULL::JSON") -> str:
    """SQL of ``clock`` (JSON text) on the fast path (``otherwise``: of the others)."""
    if "clock" not in _fast_keys(templates):
        return otherwise
    fast = "json_object('wall', f.clock.wall, 'mono', f.clock.mono)"
    if otherwise == "NULL::JSON":
        return f"CASE WHEN f.clock IS NOT NULL THEN {fast} END"
    return (f"CASE WHEN tpl IS NOT NULL THEN CASE WHEN f.clock IS NOT NULL THEN {fast} END "
            f"ELSE {otherwise} END")


def _int_ok(x: str, limit: int = MAX_BIGINT) -> str:
    return f"({x} >= 0 AND {x} = trunc({x}) AND {x} <= {min(limit, MAX_EXACT_INT - 1)})"


_LIMIT = {f.name: f.limit for f in FIELDS}


def struct_at(struct: str, pos: int) -> str:
    """Field ``pos`` (1-based) of a STRUCT: names never become identifiers."""
    return f"struct_extract_at({struct}, {pos})"


def _fine(x: str) -> str:
    return f"({x} >= 0 AND isfinite({x}) AND {x} <= {MAX_DURATION_S!r})"


def _template_checks(t: Template, positions: dict[str, dict[str, int]]) -> str:
    """Step 4 of a template's test (:mod:`ingest.templates`) on the typed parse ``f``
    (``positions``: :func:`fast_positions`)."""
    conds = ["f.v = 1"] if any(k == "v" for k, _ in t.fields) else []
    for key, check in t.fields:
        x = f"f.{sql_ident(key)}"
        if check == "int0":
            conds.append(_int_ok(x, _LIMIT[key]))
        elif check == "epoch":
            conds.append(f"({x} >= 0 AND {x} < {MAX_EPOCH_S!r})")
        elif check == "dur":
            conds.append(_fine(x))
        elif check == "str":
            conds.append(f"{x} IS NOT NULL")
        elif check == "durs":
            names = t.phases if key == "phases" else t.gpu
            conds.extend(_fine(struct_at(x, positions[key][n])) for n in names)
        elif check == "mem":
            conds.extend(_int_ok(f"{x}.{sql_ident(n)}") for n in t.mem)
        elif check == "clock":
            conds.extend(f"isfinite({x}.{sql_ident(n)})" for n in t.clock)
    return "coalesce(" + " AND ".join(conds or ["true"]) + ", false)"


def screen_sql(templates: list[Template], *, check_all: bool = False, safe: bool = False,
               source: str = "_tlog_lines", target: str = "_tlog_p") -> str:
    """Stage A: typed parse (template lines) or typed parse + screens (the rest)
    -> ``target`` (default ``_tlog_p``). ``tpl`` is the index of the template a
    line passed. ``check_all`` flags every line (all go through stage B; for
    tests). ``safe`` wraps the template transform in ``try`` (a retry after it
    failed). ``source``: the lines table, or a subquery of it (each line is
    parsed on its own, so any subset gives those lines' rows)."""
    common = "_tlog_nn(type) + _tlog_nn(v) + _tlog_nn(rank) + _tlog_nn(stage) + _tlog_nn(worker)"
    str_colons = "_tlog_colons(type) + _tlog_colons(stage) + _tlog_colons(worker)"
    iter_known = " + ".join(f"_tlog_nn({f.name})" for f in FIELDS
                            if "iter" in f.kinds and f.name not in ("rank", "stage", "worker"))
    iter_colons = " + ".join(f"_tlog_colons({n})" for n in ("phases", "gpu", "kinds", "mem"))
    mem_known = " + ".join(f"_tlog_nn(m.{k})" for k in MEM_FIELDS)
    if templates:
        tpl = ("CASE " + " ".join(
            f"WHEN quotes = {t.quotes} AND raw LIKE {sql_str(t.like)} ESCAPE '\\' THEN {i}"
            for i, t in enumerate(templates)) + " END")
        kind = "CASE tpl " + " ".join(f"WHEN {i} THEN '{t.kind}'"
                                      for i, t in enumerate(templates)) + " END"
        fast = f"json_transform(raw, {sql_str(_fast_structure(templates))})"
        if safe:
            fast = f"try({fast})"
        positions = fast_positions(templates)
        checks = ("CASE tpl0 " + " ".join(f"WHEN {i} THEN {_template_checks(t, positions)}"
                                          for i, t in enumerate(templates)) + " END")
        fph = "f.phases" if any(t.phases for t in templates) else "NULL"
        fgpu = "f.gpu" if any(t.gpu for t in templates) else "NULL"
        fm = _fast_mem(templates)
        clock = _fast_clock(templates, "j.clock")
        keys = _fast_keys(templates)   # j is NULL on a template line: j.n is NULL there
        shared = ",\n           ".join(
            f"CASE WHEN tpl IS NOT NULL THEN f.{n}::{_TYPED_TOP[n]} ELSE j.{n} END AS {n}"
            if n in keys else f"j.{n} AS {n}" for n in _SHARED)
    else:
        tpl, kind, fast, checks = "NULL::INTEGER", "NULL", "NULL", "false"
        fph, fgpu, fm, clock = "NULL", "NULL", "NULL", "j.clock"
        shared = ",\n           ".join(f"j.{n} AS {n}" for n in _SHARED)
    return f"""
CREATE OR REPLACE TEMP TABLE {target} AS
WITH like_matched AS (
    SELECT fid, line, raw, {tpl} AS like0 FROM {source}
), fast_candidates AS (
    SELECT fid, line, raw,
           CASE WHEN like0 IS NOT NULL AND NOT contains(raw, 'true')
                 AND NOT contains(raw, 'false') THEN like0 END AS tpl0
    FROM like_matched
), fast_parsed AS (
    SELECT *, CASE WHEN tpl0 IS NOT NULL THEN {fast} END AS f FROM fast_candidates
), fast_checked AS (
    SELECT *, CASE WHEN f IS NOT NULL AND {checks} THEN tpl0 END AS tpl FROM fast_parsed
), general_parsed AS (
    SELECT *, CASE WHEN tpl IS NULL THEN try(json_transform(raw, '{_STRUCT_A}')) END AS j FROM fast_checked
), columns AS (
    SELECT fid, line, raw, tpl, f IS NULL AND j IS NULL AS unparsed,
           CASE WHEN tpl IS NOT NULL THEN {kind}
                WHEN j IS NOT NULL THEN coalesce(j.type, 'iter') END AS kind,
           j.type AS type,
           {shared},
           j.phases AS phases, j.gpu AS gpu, j.kinds AS kinds, j.mem AS mem,
           j.cuda AS cuda, j.machine AS machine,
           {clock} AS clock,
           {fph} AS fph, {fgpu} AS fgpu,
           CASE WHEN tpl IS NULL THEN json_keys(j.phases) END AS kp,
           CASE WHEN tpl IS NULL THEN json_keys(j.gpu) END AS kg,
           CASE WHEN tpl IS NOT NULL THEN {fm} END AS fm,
           CASE WHEN tpl IS NULL THEN regexp_matches(raw, '{SUSPECT_RE}') END AS suspect,
           CASE WHEN tpl IS NULL THEN _tlog_colons(raw) END AS colons
    FROM general_parsed
), with_mem AS (
    SELECT *, CASE WHEN tpl IS NOT NULL THEN fm ELSE json_transform(mem, '{_STRUCT_MEM}') END
                  AS m
    FROM columns
), screened AS (
    SELECT * EXCLUDE (suspect, colons, type, fm), CASE WHEN {str(check_all).lower()} THEN true
    WHEN tpl IS NOT NULL THEN false
    ELSE coalesce(
    unparsed OR suspect
    OR kind NOT IN ('iter', 'queue', 'event')
    OR v <> {FORMAT_VERSION} OR rank < 0 OR rank > {MAX_RANK}
    OR (kind = 'iter' AND (
        colons <> {common} + {str_colons} + {iter_known} + {iter_colons}
        OR iter IS NULL OR iter < 0 OR NOT _tlog_epoch(ts) OR NOT _tlog_dur(dur)
        OR phases IS NULL OR NOT starts_with(phases, '{{')
        OR len(kp) <> len(list_distinct(kp)) OR len(kg) <> len(list_distinct(kg))
        OR len(kp) > {MAX_PHASES} OR len(kg) > {MAX_PHASES}
        OR list_contains(kp, '') OR list_contains(kg, '')
        OR regexp_matches(phases, '{BAD_DURS_RE}')
        OR (gpu IS NOT NULL AND (NOT starts_with(gpu, '{{')
                                 OR regexp_matches(gpu, '{BAD_DURS_RE}')))
        OR (cpu IS NOT NULL AND NOT _tlog_dur(cpu)) OR tokens < 0 OR samples < 0
        OR (kinds IS NOT NULL AND (NOT starts_with(kinds, '{{')
                                   OR regexp_matches(kinds, ':[^"]')))
        OR (mem IS NOT NULL AND (NOT starts_with(mem, '{{')
                                 OR regexp_matches(mem, ':(?:[^0-9]|[0-9]*[.eE])')
                                 OR _tlog_colons(mem) <> {mem_known}))))
    OR (kind = 'queue' AND (
        colons <> {common} + {str_colons} + _tlog_nn(name) + _tlog_nn(ts) + _tlog_nn(depth)
                  + _tlog_nn(capacity) + _tlog_colons(name)
        OR name IS NULL OR NOT _tlog_epoch(ts) OR depth IS NULL OR depth < 0
        OR capacity < 0))
    OR (kind = 'event' AND (
        colons <> {common} + {str_colons} + _tlog_nn(name) + _tlog_nn(ts) + _tlog_nn(dur)
                  + _tlog_colons(name)
        OR name IS NULL OR NOT _tlog_epoch(ts) OR (dur IS NOT NULL AND NOT _tlog_dur(dur)))),
    false) END AS flag
    FROM with_mem
)
SELECT * EXCLUDE (raw, unparsed), CASE WHEN flag THEN raw END AS raw FROM screened
"""


#: The temp table of :func:`fast_only_sql`: the columns a template line can
#: fill; the temp view ``_tlog_p`` over it adds the others as constants.
FAST_TABLE = "_tlog_pf"


def fast_only_sql(templates: list[Template]) -> str:
    """Stage A of the lines that pass a template: the template (fast) path of
    :func:`screen_sql` alone -> the temp table :data:`FAST_TABLE` and over it
    the temp *view* ``_tlog_p``, with the same columns and types as
    :func:`screen_sql`'s table (those of the general path NULL, ``flag``
    false). Only the columns a template line can fill are stored (measured,
    225,000 lines: storing them 0.11 -> 0.07 CPU-s). A line that passes no
    template has ``tpl`` NULL here: the caller replaces those rows by
    :func:`screen_sql` over just those lines
    (:meth:`tlog.ingest.batch.BatchLoader.parse`).

    Why: DuckDB parses, binds and plans a statement at every execution (a
    prepared statement is planned again too), and :func:`screen_sql`'s
    general path and screens make that the largest fixed cost of a small
    batch (measured: 17-18 ms of a 55-65 ms ``--follow`` poll of 10 lines);
    this statement is a fraction of its size.
    """
    if not templates:
        raise ValueError("fast_only_sql needs templates")
    tpl = ("CASE " + " ".join(
        f"WHEN quotes = {t.quotes} AND raw LIKE {sql_str(t.like)} ESCAPE '\\' THEN {i}"
        for i, t in enumerate(templates)) + " END")
    kind = "CASE tpl " + " ".join(f"WHEN {i} THEN '{t.kind}'"
                                  for i, t in enumerate(templates)) + " END"
    fast = _fast_transform(templates)
    positions = fast_positions(templates)
    checks = ("CASE tpl0 " + " ".join(f"WHEN {i} THEN {_template_checks(t, positions)}"
                                      for i, t in enumerate(templates)) + " END")
    keys = _fast_keys(templates)
    # stored: the columns a template line can fill; the view adds the others
    # as constants (storing constant NULLs was a third of the cost of storing)
    stored = [f"f.{n}::{_TYPED_TOP[n]} AS {n}" for n in _SHARED if n in keys]
    wide = {n: n if n in keys else f"NULL::{_TYPED_TOP[n]} AS {n}" for n in _SHARED}
    for col, expr, null in (
            ("clock", _fast_clock(templates), "NULL::JSON AS clock"),
            ("fph", "f.phases" if any(t.phases for t in templates) else None, "NULL AS fph"),
            ("fgpu", "f.gpu" if any(t.gpu for t in templates) else None, "NULL AS fgpu"),
            ("m", None if "mem" not in keys else _fast_mem(templates), f"{_NULL_MEM} AS m")):
        if expr is None or expr == "NULL::JSON":
            wide[col] = null
        else:
            stored.append(f"{expr} AS {col}")
            wide[col] = col
    stored_sql = "".join(f",\n       {c}" for c in stored)
    shared = ",\n       ".join(wide[n] for n in _SHARED)
    return f"""
CREATE OR REPLACE TEMP TABLE {FAST_TABLE} AS
WITH like_matched AS (
    SELECT fid, line, raw, {tpl} AS like0 FROM _tlog_lines
), fast_candidates AS (
    SELECT fid, line, raw,
           CASE WHEN like0 IS NOT NULL AND NOT contains(raw, 'true')
                 AND NOT contains(raw, 'false') THEN like0 END AS tpl0
    FROM like_matched
), fast_parsed AS (
    SELECT fid, line, tpl0, CASE WHEN tpl0 IS NOT NULL THEN {fast} END AS f FROM fast_candidates
), fast_checked AS (
    SELECT *, CASE WHEN f IS NOT NULL AND {checks} THEN tpl0 END AS tpl FROM fast_parsed
)
SELECT fid, line, tpl{stored_sql}
FROM fast_checked;
CREATE OR REPLACE TEMP VIEW _tlog_p AS
SELECT fid, line, tpl, {kind} AS kind,
       {shared},
       NULL::JSON AS phases, NULL::JSON AS gpu, NULL::JSON AS kinds, NULL::JSON AS mem,
       NULL::JSON AS cuda, NULL::JSON AS machine,
       {wide["clock"]}, {wide["fph"]}, {wide["fgpu"]}, NULL::VARCHAR[] AS kp,
       NULL::VARCHAR[] AS kg, {wide["m"]}, false AS flag, NULL::VARCHAR AS raw
FROM {FAST_TABLE}
"""


def _field_rules(f: Field) -> list[tuple[str, str, str]]:
    """``(condition, code, reason SQL)`` rules of one field, in order (stage B)."""
    x = f"j.{f.name}"
    q = f"''{f.name}''"  # quoted inside a SQL string literal
    applies = "kind IN (" + ", ".join(f"'{k}'" for k in f.kinds) + ")"
    present = f"{applies} AND _tlog_present({x})"
    got = f"_tlog_jname(json_type({x}))"
    rules: list[tuple[str, str, str]] = []
    if f.required:
        req = "kind IN (" + ", ".join(f"'{k}'" for k in f.required) + ")"
        rules.append((f"{req} AND NOT _tlog_present({x})", "missing_field",
                      f"'missing required field {q}'"))
    if f.check == "int0":
        rules.extend(_int_rules(present, present, x, q, f.limit))
    elif f.check in ("epoch", "dur", "num0"):
        what = "a number of seconds" if f.check == "dur" else "a number"
        rules.append((f"{present} AND NOT _tlog_isnum({x})", "wrong_type",
                      f"'wrong type for {q}: expected {what}, got ' || {got}"))
        code = "bad_duration" if f.check == "dur" else "bad_value"
        noun = "duration" if f.check == "dur" else "value"
        rules.append((f"{present} AND NOT isfinite(_tlog_d({x}))", code,
                      f"'non-finite {noun} for {q}: ' || {x}::VARCHAR"))
        if f.check == "dur":
            rules.append((f"{present} AND _tlog_d({x}) < 0", code,
                          f"'negative duration for {q}: ' || {x}::VARCHAR"))
            rules.append((f"{present} AND _tlog_d({x}) > {MAX_DURATION_S!r}", code,
                          (f"'duration for {q} longer than a day: ' || {x}::VARCHAR || "
                           f"' s (at most {MAX_DURATION_S:.0f})'")))
        elif f.check == "num0":
            rules.append((f"{present} AND _tlog_d({x}) < 0", code,
                          f"'negative value for {q}: ' || {x}::VARCHAR"))
        else:   # the rule of ingest.manifest.epoch_problem
            rules.append((f"{present} AND _tlog_d({x}) < 0", code,
                          (f"'negative timestamp for {q}: ' || {x}::VARCHAR || "
                           f"' (epoch seconds expected)'")))
            unit = (f"CASE WHEN _tlog_d({x}) < 1e14 THEN 'looks like milliseconds' "
                    f"WHEN _tlog_d({x}) < 1e17 THEN 'looks like microseconds' "
                    f"WHEN _tlog_d({x}) < 1e20 THEN 'looks like nanoseconds' "
                    f"ELSE 'is out of range' END")
            rules.append((f"{present} AND _tlog_d({x}) >= {MAX_EPOCH_S!r}", code,
                          (f"'{q} ' || {unit} || ': ' || {x}::VARCHAR || "
                           f"' (epoch seconds expected, below {MAX_EPOCH_S:.0e})'")))
    elif f.check == "str":
        rules.append((f"{present} AND json_type({x}) <> 'VARCHAR'", "wrong_type",
                      f"'wrong type for {q}: expected a string, got ' || {got}"))
    else:  # objects
        rules.append((f"{present} AND NOT _tlog_isobj({x})", "wrong_type",
                      f"'wrong type for {q}: expected an object, got ' || {got}"))
        if f.check == "durs":
            what = "phase" if f.name == "phases" else "gpu"
            keys = f"json_keys({x})"
            dup = f"list_filter({keys}, lambda k, i: list_position({keys}, k) < i)[1]"
            rules.append((f"{present} AND len({keys}) > {MAX_PHASES}", "too_large",
                          f"'too many names in {q}: ' || len({keys}) || ' (limit {MAX_PHASES})'"))
            rules.append((f"{present} AND len({keys}) <> len(list_distinct({keys}))",
                          "duplicate_key",
                          f"'duplicate {what} name in {q}: ' || _tlog_q({dup})"))
            rules.append((f"{present} AND list_contains({keys}, '')", "bad_phase_name",
                          f"'empty {what} name in {q}'"))
            ents = f"map_entries(json_transform({x}, '\"MAP(VARCHAR, JSON)\"'))"
            notnum = f"list_filter({ents}, lambda e: NOT _tlog_isnum(e.value))[1]"
            rules.append((f"{present} AND {notnum} IS NOT NULL", "bad_phase_value",
                          (f"'{what} value not a number: ' || _tlog_q({notnum}.key) || ' is ' "
                          f"|| _tlog_jname(json_type({notnum}.value))")))
            nonfin = f"list_filter({ents}, lambda e: NOT isfinite(_tlog_d(e.value)))[1]"
            rules.append((f"{present} AND {nonfin} IS NOT NULL", "bad_duration",
                          (f"'non-finite duration for {what} ' || _tlog_q({nonfin}.key) || ': ' "
                          f"|| {nonfin}.value::VARCHAR")))
            neg = f"list_filter({ents}, lambda e: _tlog_d(e.value) < 0)[1]"
            rules.append((f"{present} AND {neg} IS NOT NULL", "bad_duration",
                          (f"'negative duration for {what} ' || _tlog_q({neg}.key) || ': ' "
                          f"|| {neg}.value::VARCHAR")))
            big = f"list_filter({ents}, lambda e: _tlog_d(e.value) > {MAX_DURATION_S!r})[1]"
            rules.append((f"{present} AND {big} IS NOT NULL", "bad_duration",
                          (f"'duration for {what} ' || _tlog_q({big}.key) || ' longer than a "
                           f"day: ' || {big}.value::VARCHAR || ' s (at most "
                           f"{MAX_DURATION_S:.0f})'")))
        elif f.check == "cats":
            ents = f"map_entries(json_transform({x}, '\"MAP(VARCHAR, JSON)\"'))"
            bad = f"list_filter({ents}, lambda e: json_type(e.value) <> 'VARCHAR')[1]"
            rules.append((f"{present} AND {bad} IS NOT NULL", "wrong_type",
                          (f"'wrong type for kinds ' || _tlog_q({bad}.key) || "
                          f"': expected a category name, got ' || _tlog_jname(json_type({bad}.value))")))
        else:
            rules.extend(_key_rules(f, present, x))
    return rules


def _int_rules(present: str, there: str, y: str, label: str,
               limit: int) -> list[tuple[str, str, str]]:
    """The rules of an ``integer ≥ 0`` value ``y`` (a field, or a key of an
    object field): at most ``limit``, an integer, not negative. ``present``:
    the condition that the field applies and is there; ``there``: that ``y``
    is there and not ``null``; ``label``: how messages name it."""
    return [
        (f"{present} AND _tlog_toobig({y}, {limit})", "bad_value",
         f"'value out of range for {label}: ' || {y}::VARCHAR || ' (at most {limit})'"),
        (f"{there} AND NOT _tlog_isint({y})", "wrong_type",
         (f"'wrong type for {label}: expected a non-negative integer, got ' "
          f"|| _tlog_jname(json_type({y}))")),
        (f"{present} AND _tlog_isint({y}) AND _tlog_d({y}) < 0", "bad_value",
         f"'negative value for {label}: ' || {y}::VARCHAR"),
    ]


def _key_rules(f: Field, present: str, x: str) -> list[tuple[str, str, str]]:
    """Rules on the known keys (:attr:`Field.keys`) of an object field: ``mem``
    and ``cuda`` (integers >= 0), ``clock`` (finite numbers), the ``sys``
    record's ``gpu`` (numbers >= 0, some integers), ``machine`` (strings and
    integers >= 0). A key that is absent or ``null`` is not checked."""
    rules: list[tuple[str, str, str]] = []
    for k in f.keys:
        y = f"({x}->'{k}')"
        there = f"{present} AND _tlog_present({y}) AND json_type({y}) <> 'NULL'"
        got = f"_tlog_jname(json_type({y}))"
        integer = (f.check == "mem" or (f.check == "gauges" and k in GPU_INT_FIELDS)
                   or (f.check == "facts" and k in MACHINE_INT_FIELDS))
        if integer:
            rules.extend(_int_rules(present, there, y, f"{f.name}.{k}", MAX_BIGINT))
        elif f.check == "facts":
            rules.append((f"{there} AND json_type({y}) <> 'VARCHAR'", "wrong_type",
                          f"'wrong type for {f.name}.{k}: expected a string, got ' || {got}"))
        elif f.check == "clock":
            rules.append((f"{there} AND NOT (_tlog_isnum({y}) AND isfinite(_tlog_d({y})))",
                          "wrong_type",
                          (f"'wrong type for {f.name}.{k}: expected a finite number, got ' "
                           f"|| {y}::VARCHAR")))
        else:   # gauges: a finite number >= 0
            rules.append((f"{there} AND NOT _tlog_isnum({y})", "wrong_type",
                          f"'wrong type for {f.name}.{k}: expected a number, got ' || {got}"))
            rules.append((f"{there} AND NOT isfinite(_tlog_d({y}))", "bad_value",
                          f"'non-finite value for {f.name}.{k}: ' || {y}::VARCHAR"))
            rules.append((f"{there} AND _tlog_d({y}) < 0", "bad_value",
                          f"'negative value for {f.name}.{k}: ' || {y}::VARCHAR"))
    return rules


#: A ``\\uXXXX`` escape of a UTF-16 surrogate pair, and of a surrogate (what is
#: left after removing the pairs is a lone half: valid to Python's ``json``, not
#: to DuckDB, and not text).
_PAIR_RE = r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
_HALF_RE = r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}"


def _exact_sql() -> str:
    """Stage B: the exact reason of every flagged line -> ``_tlog_b``."""
    rules: list[tuple[str, str, str]] = [
        ("blank", "", "NULL"),
        ((f"NOT valid AND regexp_matches(regexp_replace(raw, '{_PAIR_RE}', '', 'g'), "
          f"'{_HALF_RE}')"), "not_json",
         (f"'not JSON: ' || regexp_extract(regexp_replace(raw, '{_PAIR_RE}', '', 'g'), "
          f"'{_HALF_RE}') || ' is half of a UTF-16 surrogate pair, not a character'")),
        ("NOT valid", "not_json", "'not JSON'"),
        ("top <> 'OBJECT'", "not_object", "'not a JSON object: ' || _tlog_jname(top)"),
        ("len(json_keys(raw)) <> len(list_distinct(json_keys(raw)))", "duplicate_key",
         ("'duplicate key ' || _tlog_q(list_filter(json_keys(raw), lambda k, i: "
         "list_position(json_keys(raw), k) < i)[1])")),
        ("_tlog_present(j.v) AND NOT _tlog_isint(j.v)", "wrong_type",
         "'wrong type for ''v'': expected an integer, got ' || _tlog_jname(json_type(j.v))"),
        (f"_tlog_present(j.v) AND _tlog_d(j.v) <> {FORMAT_VERSION}", "unknown_version",
         (f"'unknown schema version ' || j.v::VARCHAR || ' (this tlog reads version "
         f"{FORMAT_VERSION}; upgrade tlog)'")),
        ("_tlog_present(j.type) AND json_type(j.type) <> 'VARCHAR'", "wrong_type",
         "'wrong type for ''type'': expected a string, got ' || _tlog_jname(json_type(j.type))"),
        ("kind NOT IN (" + ", ".join(f"'{k}'" for k in RECORD_KINDS) + ")", "unknown_type",
         f"'unknown record type ' || _tlog_q(kind) || ' (expected {_KINDS_TEXT})'"),
    ]
    for f in FIELDS:
        rules.extend(_field_rules(f))
    whens = "\n        ".join(
        f"WHEN {cond} THEN {{'code': {('NULL' if not code else repr(code))}, 'reason': {reason}}}"
        for cond, code, reason in rules)
    patches = {k: json.dumps({n: None for n in ["type", "v"] + [f.name for f in FIELDS
                                                                if k in f.kinds]})
               for k in RECORD_KINDS}
    patch = "CASE kind " + " ".join(f"WHEN '{k}' THEN '{p}'" for k, p in patches.items()) + " END"
    mem_patch = json.dumps({k: None for k in MEM_FIELDS})
    return f"""
CREATE OR REPLACE TEMP TABLE _tlog_b AS
WITH flagged_lines AS (
    SELECT fid, line, raw, trim(raw, chr(32) || chr(9) || chr(13) || chr(10)) = '' AS blank
    FROM _tlog_p WHERE flag
), validity AS (
    SELECT *, NOT blank AND json_valid(raw) AS valid FROM flagged_lines
), top_types AS (
    SELECT *, CASE WHEN valid THEN json_type(raw) END AS top FROM validity
), as_json AS (
    SELECT *, CASE WHEN top = 'OBJECT' THEN json_transform(raw, '{_STRUCT_B}') END AS j FROM top_types
), with_kind AS (
    SELECT *, CASE WHEN j.type IS NULL THEN 'iter'
                   WHEN json_type(j.type) = 'VARCHAR' THEN j.type->>'$' END AS kind
    FROM as_json
), reasons AS (
    SELECT *, CASE
        {whens}
        END AS r
    FROM with_kind
)
SELECT fid, line, blank, r.code AS code, r.reason AS reason,
       CASE WHEN mr IS NOT NULL AND mr::VARCHAR <> '{{}}'
            THEN json_merge_patch(e1, json_object('mem', mr))
            WHEN e1::VARCHAR <> '{{}}' THEN e1 END AS extra,
       CASE WHEN r.code IS NOT NULL THEN left(rtrim(raw, chr(13) || chr(10)), {RAW_KEEP}) END
           AS raw
FROM (SELECT *,
        CASE WHEN r.code IS NULL AND NOT blank THEN json_merge_patch(raw, {patch}) END AS e1,
        CASE WHEN r.code IS NULL AND NOT blank AND kind = 'iter' AND _tlog_isobj(j.mem)
             THEN json_merge_patch(j.mem, '{mem_patch}') END AS mr
      FROM reasons)
"""


EXACT_SQL = _exact_sql()
#: DuckDB optimizer passes turned off for :data:`EXACT_SQL` alone (``SET
#: disabled_optimizers``, reset after it). The statement is one CASE of ~160 rules
#: built from the format's fields with macros, run on the few flagged lines of a
#: batch: planning is nearly all its cost (DuckDB's profile of one run: binding 43
#: ms, optimizer 93 ms of which common_subexpressions 40, expression_rewriter 20,
#: projection_pullup 8, statistics_propagation 6, unused_columns 5), and those
#: passes speed up execution over many rows, which it never has. Measured (3
#: flagged lines, best/median of 7, two rounds): 0.15-0.20 / 0.16-0.24 s -> 0.10-0.11
#: / 0.11-0.12 s per batch with a flagged line; results identical (every reader
#: and hostile-line test).
EXACT_DISABLED_OPTIMIZERS = ("common_subexpressions,expression_rewriter,projection_pullup,"
                             "statistics_propagation,unused_columns")
#: ``_tlog_b`` when no line was flagged (stage B has nothing to check).
EMPTY_B_SQL = ("CREATE OR REPLACE TEMP TABLE _tlog_b (fid INTEGER, line BIGINT, blank BOOLEAN, "
               "code VARCHAR, reason VARCHAR, extra JSON, raw VARCHAR)")


_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET_RE = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """Deepest nesting of arrays and objects in the JSON ``text`` (a bare value
    is 0, ``{}`` is 1); brackets inside strings do not count."""
    depth = deepest = 0
    for b in _BRACKET_RE.findall(_STRING_RE.sub("", text)):
        if b in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def sql_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
