"""Bulk parse, validation and load of one batch of v1 JSONL lines, in DuckDB SQL.

A batch is an Arrow table ``_tlog_lines(fid, line, raw, quotes)`` (see
:func:`ingest.sources.lines_table`). No Python code runs per record; Python
only works on the few *distinct* things of a batch: templates, phase layouts,
``meta`` lines, files.

Stages (each one SQL statement over the whole batch):

A. **Parse** (``_tlog_p``). Lines that pass a *template* learned from sampled
   lines (:mod:`ingest.templates`: a LIKE pattern, the count of ``"``, no
   boolean, typed checks) are read with one typed ``json_transform`` and are
   valid by construction. Every other line is read with a typed transform
   (nested objects kept as JSON text, ``json_keys`` of ``phases``/``gpu``) and
   passes cheap *conservative screens*, since DuckDB's non-strict transform is
   lenient (``"7"`` reads as 7, ``1.5`` as 2): a regular expression for a
   number field whose value starts like a string, boolean, array or object (or
   a fraction for an integer field) and the reverse for string fields; a count
   of ``:`` that shows unknown or ``null`` fields; the required fields, signs
   and finiteness; non-number values in ``phases``/``gpu``/``mem``; repeated
   phase names. A line failing any screen is *flagged*.
B. **Exact check of flagged lines** (``_tlog_b``): each is re-parsed with every
   field as JSON and given its exact reason (or none: a line flagged only for
   an unknown field is loaded, with the field kept in ``extra``). All reason
   rules are here, in :data:`FIELDS` order. Skipped when nothing is flagged.
C. **Layouts**: each template, and each distinct ``(phase names, gpu names,
   kinds)`` of the other loadable lines, gets a layout id (names in record
   order, then gpu-only names, and the category of each: record ``kinds`` >
   manifest ``phase_kinds`` > :func:`dflash_runtime.format.categorize`).
D. **Meta defaults**: ``meta`` lines cut each file into segments; a record's
   ``rank``/``stage``/``worker`` default to its segment's (else rank 0, stage
   ``main``, worker ``<stage>-<rank>``).
E. **Load**: iterations (phase times as lists in layout order), duplicates by
   ``(run, rank, stage, worker, iter)`` kept once (the first by file, line;
   then against what the database holds), queue samples, events, workers,
   rejects.

Tests run every case three ways (templates, every line through stage B, tiny
batches) and expect the same rows: ``tests/ingest/test_reader_cases.py``.

Reason codes (``rejects.code``): see :data:`REASON_CODES`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
from tlog.ingest.sources import MAX_LINE_BYTES
from tlog.ingest.templates import MAX_EXACT_INT, Template

from dflash_runtime.format import (
    CLOCK_FIELDS,
    FIELDS,
    FORMAT_VERSION,
    MAX_BIGINT,
    MAX_DURATION_S,
    MAX_EPOCH_S,
    MAX_PHASES,
    MAX_RANK,
    MEM_FIELDS,
    PHASE_CATEGORIES,
    RECORD_KINDS,
    Field,
    categorize,
    resolve_category,
)

#: Rejected lines keep this many characters of their text (``rejects.raw``).
RAW_KEEP = 2000

#: Deepest nesting of arrays and objects in a line (the record itself is level
#: 1; v1 records nest 2 deep). Source: tlog's choice, a cap on absurd input: a
#: value nested ~1,000 deep exceeded Python's recursion limit in every reader of
#: ``extra`` (``json.loads``) and failed every later ingest of the run.
MAX_DEPTH = 64

#: ``rejects.code`` -> what it means.
REASON_CODES: dict[str, str] = {
    "not_json": "the line is not JSON (or not UTF-8 text)",
    "not_object": "the line is JSON but not an object",
    "unknown_version": "the record's 'v' is not a schema version this tlog reads",
    "unknown_type": "the record's 'type' is not iter, queue, event or meta",
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

_SQL_TYPE = {"int0": "BIGINT", "epoch": "DOUBLE", "dur": "DOUBLE", "str": "VARCHAR",
             "durs": "JSON", "cats": "JSON", "mem": "JSON", "clock": "JSON"}
_STRUCT_A = json.dumps({"type": "VARCHAR", "v": "BIGINT",
                        **{f.name: _SQL_TYPE[f.check] for f in FIELDS}})
_STRUCT_B = json.dumps({"type": "JSON", "v": "JSON", **{f.name: "JSON" for f in FIELDS}})
_STRUCT_MEM = json.dumps({k: "BIGINT" for k in MEM_FIELDS})

_NUM_KEYS = "|".join(["v"] + [f.name for f in FIELDS if f.check in ("int0", "epoch", "dur")])
_INT_KEYS = "|".join(["v"] + [f.name for f in FIELDS if f.check == "int0"])
_STR_KEYS = "|".join(["type"] + [f.name for f in FIELDS if f.check == "str"])
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

_MACROS = """
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
              **{f.name: _SQL_TYPE[f.check] for f in FIELDS
                 if f.check in ("int0", "epoch", "dur", "str")}}
#: Columns of ``_tlog_p`` read from both paths (fast ``f`` or general ``j``).
_SHARED = [n for n in _TYPED_TOP if n not in ("type",)]


def _fast_positions(templates: list[Template]) -> dict[str, dict[str, int]]:
    """``{'phases'|'gpu': {name: 1-based position}}`` in the fast path's STRUCTs:
    phase values are read by position (``struct_extract_at``), so a phase name
    enters SQL only as data (inside the JSON text of the structure), never as
    an identifier."""
    return {col: {n: i + 1 for i, n in enumerate(dict.fromkeys(
        n for t in templates for n in getattr(t, col)))} for col in ("phases", "gpu")}


def _fast_structure(templates: list[Template]) -> str:
    """``json_transform`` structure of the template (fast) path: integers read as
    DOUBLE so that a fraction shows (the transform would round it)."""
    struct: dict[str, Any] = {k: ("DOUBLE" if t == "BIGINT" else t) for k, t in _TYPED_TOP.items()}
    for col, names in _fast_positions(templates).items():
        if names:
            struct[col] = dict.fromkeys(names, "DOUBLE")
    struct["mem"] = dict.fromkeys(MEM_FIELDS, "DOUBLE")
    struct["clock"] = dict.fromkeys(CLOCK_FIELDS, "DOUBLE")
    return json.dumps(struct)


def _int_ok(x: str, limit: int = MAX_BIGINT) -> str:
    return f"({x} >= 0 AND {x} = trunc({x}) AND {x} <= {min(limit, MAX_EXACT_INT - 1)})"


_LIMIT = {f.name: f.limit for f in FIELDS}


def _at(struct: str, pos: int) -> str:
    """Field ``pos`` (1-based) of a STRUCT: names never become identifiers."""
    return f"struct_extract_at({struct}, {pos})"


def _fine(x: str) -> str:
    return f"({x} >= 0 AND isfinite({x}) AND {x} <= {MAX_DURATION_S!r})"


def _template_checks(t: Template, positions: dict[str, dict[str, int]]) -> str:
    """Step 4 of a template's test (:mod:`ingest.templates`) on the typed parse ``f``
    (``positions``: :func:`_fast_positions`)."""
    conds = ["f.v = 1"] if any(k == "v" for k, _ in t.fields) else []
    for key, check in t.fields:
        x = f"f.{_ident(key)}"
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
            conds.extend(_fine(_at(x, positions[key][n])) for n in names)
        elif check == "mem":
            conds.extend(_int_ok(f"{x}.{_ident(n)}") for n in t.mem)
        elif check == "clock":
            conds.extend(f"isfinite({x}.{_ident(n)})" for n in t.clock)
    return "coalesce(" + " AND ".join(conds or ["true"]) + ", false)"


def screen_sql(templates: list[Template], *, check_all: bool = False, safe: bool = False) -> str:
    """Stage A: typed parse (template lines) or typed parse + screens (the rest)
    -> ``_tlog_p``. ``tpl`` is the index of the template a line passed.
    ``check_all`` flags every line (all go through stage B; for tests). ``safe``
    wraps the template transform in ``try`` (a retry after it failed)."""
    common = "_tlog_nn(type) + _tlog_nn(v) + _tlog_nn(rank) + _tlog_nn(stage) + _tlog_nn(worker)"
    str_colons = "_tlog_colons(type) + _tlog_colons(stage) + _tlog_colons(worker)"
    iter_known = " + ".join(f"_tlog_nn({f.name})" for f in FIELDS
                            if "iter" in f.kinds and f.name not in ("rank", "stage", "worker"))
    iter_colons = " + ".join(f"_tlog_colons({n})" for n in ("phases", "gpu", "kinds", "mem"))
    mem_known = " + ".join(f"_tlog_nn(m.{k})" for k in MEM_FIELDS)
    if templates:
        tpl = ("CASE " + " ".join(
            f"WHEN quotes = {t.quotes} AND raw LIKE {_sql_str(t.like)} ESCAPE '\\' THEN {i}"
            for i, t in enumerate(templates)) + " END")
        kind = "CASE tpl " + " ".join(f"WHEN {i} THEN '{t.kind}'"
                                      for i, t in enumerate(templates)) + " END"
        fast = f"json_transform(raw, {_sql_str(_fast_structure(templates))})"
        if safe:
            fast = f"try({fast})"
        positions = _fast_positions(templates)
        checks = ("CASE tpl0 " + " ".join(f"WHEN {i} THEN {_template_checks(t, positions)}"
                                          for i, t in enumerate(templates)) + " END")
        fph = "f.phases" if any(t.phases for t in templates) else "NULL"
        fgpu = "f.gpu" if any(t.gpu for t in templates) else "NULL"
        fm = "{" + ", ".join(f"'{k}': f.mem.{k}::BIGINT" for k in MEM_FIELDS) + "}"
        clock = ("CASE WHEN tpl IS NOT NULL THEN CASE WHEN f.clock IS NOT NULL THEN "
                 "json_object('wall', f.clock.wall, 'mono', f.clock.mono) END ELSE j.clock END")
        shared = ",\n           ".join(
            f"CASE WHEN tpl IS NOT NULL THEN f.{n}::{_TYPED_TOP[n]} ELSE j.{n} END AS {n}"
            for n in _SHARED)
    else:
        tpl, kind, fast, checks = "NULL::INTEGER", "NULL", "NULL", "false"
        fph, fgpu, fm, clock = "NULL", "NULL", "NULL", "j.clock"
        shared = ",\n           ".join(f"j.{n} AS {n}" for n in _SHARED)
    return f"""
CREATE OR REPLACE TEMP TABLE _tlog_p AS
WITH a0 AS (
    SELECT fid, line, raw, {tpl} AS like0 FROM _tlog_lines
), a AS (
    SELECT fid, line, raw,
           CASE WHEN like0 IS NOT NULL AND NOT contains(raw, 'true')
                 AND NOT contains(raw, 'false') THEN like0 END AS tpl0
    FROM a0
), b AS (
    SELECT *, CASE WHEN tpl0 IS NOT NULL THEN {fast} END AS f FROM a
), c AS (
    SELECT *, CASE WHEN f IS NOT NULL AND {checks} THEN tpl0 END AS tpl FROM b
), d AS (
    SELECT *, CASE WHEN tpl IS NULL THEN try(json_transform(raw, '{_STRUCT_A}')) END AS j FROM c
), e AS (
    SELECT fid, line, raw, tpl, f IS NULL AND j IS NULL AS unparsed,
           CASE WHEN tpl IS NOT NULL THEN {kind}
                WHEN j IS NOT NULL THEN coalesce(j.type, 'iter') END AS kind,
           j.type AS type,
           {shared},
           j.phases AS phases, j.gpu AS gpu, j.kinds AS kinds, j.mem AS mem,
           {clock} AS clock,
           {fph} AS fph, {fgpu} AS fgpu,
           CASE WHEN tpl IS NULL THEN json_keys(j.phases) END AS kp,
           CASE WHEN tpl IS NULL THEN json_keys(j.gpu) END AS kg,
           CASE WHEN tpl IS NOT NULL THEN {fm} END AS fm,
           CASE WHEN tpl IS NULL THEN regexp_matches(raw, '{SUSPECT_RE}') END AS suspect,
           CASE WHEN tpl IS NULL THEN _tlog_colons(raw) END AS colons
    FROM d
), g AS (
    SELECT *, CASE WHEN tpl IS NOT NULL THEN fm ELSE json_transform(mem, '{_STRUCT_MEM}') END
                  AS m
    FROM e
), h AS (
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
    FROM g
)
SELECT * EXCLUDE (raw, unparsed), CASE WHEN flag THEN raw END AS raw FROM h
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
        rules.append((f"{present} AND _tlog_toobig({x}, {f.limit})", "bad_value",
                      f"'value out of range for {q}: ' || {x}::VARCHAR || ' (at most {f.limit})'"))
        rules.append((f"{present} AND NOT _tlog_isint({x})", "wrong_type",
                      f"'wrong type for {q}: expected a non-negative integer, got ' || {got}"))
        rules.append((f"{present} AND _tlog_d({x}) < 0", "bad_value",
                      f"'negative value for {q}: ' || {x}::VARCHAR"))
    elif f.check in ("epoch", "dur"):
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
        elif f.check == "mem":
            for k in MEM_FIELDS:
                y = f"({x}->'{k}')"
                rules.append((f"{present} AND _tlog_toobig({y}, {MAX_BIGINT})", "bad_value",
                              (f"'value out of range for mem.{k}: ' || {y}::VARCHAR "
                               f"|| ' (at most {MAX_BIGINT})'")))
                rules.append(((f"{present} AND _tlog_present({y}) AND json_type({y}) <> 'NULL' "
                              f"AND NOT _tlog_isint({y})"), "wrong_type",
                              (f"'wrong type for mem.{k}: expected a non-negative integer, got ' "
                              f"|| _tlog_jname(json_type({y}))")))
                rules.append((f"{present} AND _tlog_isint({y}) AND _tlog_d({y}) < 0", "bad_value",
                              f"'negative value for mem.{k}: ' || {y}::VARCHAR"))
        elif f.check == "clock":
            for k in CLOCK_FIELDS:
                y = f"({x}->'{k}')"
                rules.append(((f"{present} AND _tlog_present({y}) AND json_type({y}) <> 'NULL' "
                              f"AND NOT (_tlog_isnum({y}) AND isfinite(_tlog_d({y})))"), "wrong_type",
                              (f"'wrong type for clock.{k}: expected a finite number, got ' "
                              f"|| {y}::VARCHAR")))
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
         "'unknown record type ' || _tlog_q(kind) || ' (expected iter, queue, event or meta)'"),
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
WITH x AS (
    SELECT fid, line, raw, trim(raw, chr(32) || chr(9) || chr(13) || chr(10)) = '' AS blank
    FROM _tlog_p WHERE flag
), y AS (
    SELECT *, NOT blank AND json_valid(raw) AS valid FROM x
), z AS (
    SELECT *, CASE WHEN valid THEN json_type(raw) END AS top FROM y
), t AS (
    SELECT *, CASE WHEN top = 'OBJECT' THEN json_transform(raw, '{_STRUCT_B}') END AS j FROM z
), k AS (
    SELECT *, CASE WHEN j.type IS NULL THEN 'iter'
                   WHEN json_type(j.type) = 'VARCHAR' THEN j.type->>'$' END AS kind
    FROM t
), r AS (
    SELECT *, CASE
        {whens}
        END AS r
    FROM k
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
      FROM r)
"""


EXACT_SQL = _exact_sql()
#: ``_tlog_b`` when no line was flagged (stage B has nothing to check).
EMPTY_B_SQL = ("CREATE OR REPLACE TEMP TABLE _tlog_b (fid INTEGER, line BIGINT, blank BOOLEAN, "
               "code VARCHAR, reason VARCHAR, extra JSON, raw VARCHAR)")


@dataclass
class BatchFile:
    """A file of the batch: ``fid`` is its index in the lines table."""

    fid: int
    rel: str
    meta: dict[str, Any]           # meta defaults carried in (from earlier lines)
    meta_out: dict[str, Any] = field(default_factory=dict)  # after this batch


@dataclass
class BatchResult:
    """What one batch loaded (counts of records by kind, rejects, duplicates)."""

    loaded: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)   # by code
    duplicates: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)   # first few {file, line, reason}
    warnings: list[str] = field(default_factory=list)
    min_ts: float | None = None
    ranks: set[int] = field(default_factory=set)


class LayoutBook:
    """The phase layouts of one run: ``(names, given kinds, categories) -> layout id``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str) -> None:
        self.run_id = run_id
        rows = con.execute(
            "SELECT layout, list(phase ORDER BY seq), list(given ORDER BY seq), "
            "list(category ORDER BY seq) FROM phase_layouts WHERE run_id = ? GROUP BY layout",
            [run_id]).fetchall()
        self.ids: dict[tuple[tuple[str, ...], tuple[str | None, ...], tuple[str, ...]], int] = {
            (tuple(names), tuple(given), tuple(cats)): int(layout)
            for layout, names, given, cats in rows}
        self.next_id = max(self.ids.values(), default=-1) + 1
        self.pending: list[tuple[int, tuple[str, ...], tuple[str | None, ...],
                                 tuple[str, ...]]] = []

    def get(self, names: tuple[str, ...], given: tuple[str | None, ...],
            cats: tuple[str, ...]) -> int:
        """Layout id of ``(names, given, cats)`` (``given``: the category each
        name's record ``kinds`` gave, or None); a new one is stored by :meth:`flush`."""
        key = (names, given, cats)
        found = self.ids.get(key)
        if found is not None:
            return found
        layout = self.next_id
        self.next_id += 1
        self.pending.append((layout, names, given, cats))
        self.ids[key] = layout
        return layout

    def flush(self, con: duckdb.DuckDBPyConnection) -> None:
        """Insert the new layouts into ``phase_layouts`` in one statement
        (``executemany`` costs about 0.5 ms a row: 1,000 new layouts of 256
        phases took 140 s)."""
        if not self.pending:
            return
        rows = [(layout, seq, name, name.rsplit("/", 1)[0] if "/" in name else None, cat, g)
                for layout, names, given, cats in self.pending
                for seq, (name, g, cat) in enumerate(zip(names, given, cats, strict=True))]
        cols = list(zip(*rows, strict=True))
        table = pa.table({"layout": pa.array(cols[0], pa.int32()),
                          "seq": pa.array(cols[1], pa.int32()),
                          "phase": pa.array(cols[2], pa.string()),
                          "parent": pa.array(cols[3], pa.string()),
                          "category": pa.array(cols[4], pa.string()),
                          "given": pa.array(cols[5], pa.string())})
        con.register("_tlog_new_layouts", table)
        try:
            con.execute("INSERT INTO phase_layouts (run_id, layout, seq, phase, parent, category, "
                        "given) SELECT $run, layout, seq, phase, parent, category, given "
                        "FROM _tlog_new_layouts", {"run": self.run_id})
        finally:
            con.unregister("_tlog_new_layouts")
        self.pending = []

    def forget(self) -> None:
        """Drop the cache (after a rolled-back transaction)."""
        self.ids.clear()
        self.next_id = 0
        self.pending = []


def recategorize(con: duckdb.DuckDBPyConnection, run_id: str,
                 phase_kinds: dict[str, str]) -> list[dict[str, str]]:
    """Bring the categories of run ``run_id``'s phases up to date: each phase
    whose record gave no ``kinds`` gets ``phase_kinds`` (run.json) else the
    name rules (:func:`dflash_runtime.format.categorize`), as a new ingest would.
    So editing ``phase_kinds`` in run.json (or a newer tlog's rules) takes
    effect at the next ``tlog ingest``, without reloading the logs. Categories
    a record's ``kinds`` gave are kept (they come first, FORMAT.md).

    Returns:
        ``[{"phase", "from", "to"}]``, one per changed (phase, old category),
        sorted by phase. One set-based UPDATE (20,000 changed names: well under
        a second); runs inside the caller's transaction.
    """
    rows = con.execute("SELECT DISTINCT phase, category FROM phase_layouts "
                       "WHERE run_id = ? AND given IS NULL", [run_id]).fetchall()
    changes = sorted((phase, old, new) for phase, old in rows
                     if (new := resolve_category(phase, None, phase_kinds)) != old)
    if changes:
        cols = list(zip(*changes, strict=True))
        con.register("_tlog_recat", pa.table({"phase": pa.array(cols[0], pa.string()),
                                              "old": pa.array(cols[1], pa.string()),
                                              "new": pa.array(cols[2], pa.string())}))
        try:
            con.execute("""UPDATE phase_layouts SET category = c.new FROM _tlog_recat c
                           WHERE phase_layouts.run_id = ? AND phase_layouts.phase = c.phase
                             AND phase_layouts.category = c.old
                             AND phase_layouts.given IS NULL""", [run_id])
        finally:
            con.unregister("_tlog_recat")
    return [{"phase": phase, "from": old, "to": new} for phase, old, new in changes]


def phase_kinds_warnings(con: duckdb.DuckDBPyConnection, run_id: str,
                         phase_kinds: dict[str, str]) -> list[str]:
    """What in ``phase_kinds`` cannot apply to run ``run_id``: a name no record
    of the run has (a typo?), or a phase every record of which gives its own
    ``kinds`` (they come first). Empty when the run has no phases yet."""
    if not phase_kinds:
        return []
    rows = con.execute("SELECT phase, bool_and(given IS NOT NULL) FROM phase_layouts "
                       "WHERE run_id = ? GROUP BY phase", [run_id]).fetchall()
    if not rows:
        return []
    seen = dict(rows)

    def listed(names: list[str]) -> str:
        return ", ".join(repr(n) for n in names[:10]) + (
            f" and {len(names) - 10} more" if len(names) > 10 else "")

    out = []
    if missing := sorted(n for n in phase_kinds if n not in seen):
        out.append(f"run.json phase_kinds names {listed(missing)}, which no record of this "
                   f"run has (a typo?)")
    if ruled := sorted(n for n in phase_kinds if seen.get(n)):
        out.append(f"run.json phase_kinds for {listed(ruled)} does not apply: the records "
                   f"give their own kinds, which come first")
    return out


#: Errors listed per ingest in the report (all rejects are in the ``rejects`` table).
MAX_ERRORS = 100
#: Above this many distinct phase names or layouts per batch, phase values are
#: read through a DuckDB MAP instead of one STRUCT (slower, any size).
MAX_STRUCT_NAMES = 256
MAX_STRUCT_COMBOS = 64


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


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _temp_table(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """``CREATE OR REPLACE TEMP TABLE name`` holding the Arrow ``table``: one
    statement (``executemany`` costs milliseconds a row; a batch of 10,000
    small files has 10,000 files and meta segments)."""
    view = f"{name}_arrow"
    con.register(view, table)
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {view}")
    finally:
        con.unregister(view)


class BatchLoader:
    """Loads batches of one run (one instance per ingest of a run)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str,
                 phase_kinds: dict[str, str], *, check_all: bool = False) -> None:
        self.con = con
        self.run_id = run_id
        self.phase_kinds = phase_kinds
        self.layouts = LayoutBook(con, run_id)
        self.check_all = check_all   # tests: send every line through stage B
        self.errors_left = MAX_ERRORS
        self.ranged_segments = False
        con.execute(_MACROS)

    # -- the batch ---------------------------------------------------------------------------
    def parse(self, lines: pa.Table, templates: list[Template]) -> list[Template]:
        """Stages A and B into temp tables (no transaction needed: nothing
        persistent changes, so a failed attempt can be retried). Returns the
        templates in use."""
        con = self.con
        if self.check_all:
            templates = []
        con.register("_tlog_lines", lines)
        try:
            try:
                con.execute(screen_sql(templates, check_all=self.check_all))
            except duckdb.Error:
                if not templates:
                    raise
                con.execute(screen_sql(templates, check_all=self.check_all, safe=True))
            if con.execute("SELECT count(*) FROM _tlog_p WHERE flag").fetchall()[0][0]:
                con.execute(EXACT_SQL)
                self._too_deep()
            else:
                con.execute(EMPTY_B_SQL)
        finally:
            con.unregister("_tlog_lines")
        return templates

    def _too_deep(self) -> None:
        """Reject the flagged lines nested more than :data:`MAX_DEPTH` deep
        (``too_large``): only lines with more than that many ``[``/``{`` are
        measured, in Python, outside strings."""
        con = self.con
        rows = con.execute(f"""
            SELECT fid, line, raw FROM _tlog_p WHERE flag AND strlen(raw) - strlen(
                replace(replace(raw, '[', ''), '{{', '')) > {MAX_DEPTH}""").fetchall()
        deep = [(fid, line, depth) for fid, line, raw in rows
                if (depth := nesting_depth(raw)) > MAX_DEPTH]
        if not deep:
            return
        cols = list(zip(*deep, strict=True))
        con.register("_tlog_deep", pa.table({"fid": pa.array(cols[0], pa.int32()),
                                             "line": pa.array(cols[1], pa.int64()),
                                             "depth": pa.array(cols[2], pa.int64())}))
        try:
            con.execute(f"""
                UPDATE _tlog_b SET code = 'too_large', extra = NULL,
                    reason = 'nested ' || format('{{:,}}', d.depth) || ' levels deep (limit '
                             || {MAX_DEPTH} || ')',
                    raw = left(rtrim(p.raw, chr(13) || chr(10)), {RAW_KEEP})
                FROM _tlog_deep d, _tlog_p p
                WHERE _tlog_b.fid = d.fid AND _tlog_b.line = d.line
                  AND p.fid = d.fid AND p.line = d.line""")
        finally:
            con.unregister("_tlog_deep")

    def load(self, files: list[BatchFile], bad_lines: list,
             templates: list[Template]) -> BatchResult:
        """Load one parsed batch (:meth:`parse`) inside the caller's transaction."""
        con = self.con
        res = BatchResult()
        by_fid = {f.fid: f for f in files}
        try:
            self._files_table(files)
            self._rejects(res, by_fid, bad_lines)
            self._meta(res, files)
            parts = self._layouts(res, templates)
            self._iterations(res, parts)
            self._queues_events(res)
            self._workers()
        finally:
            try:
                con.execute("DROP TABLE IF EXISTS _tlog_p; DROP TABLE IF EXISTS _tlog_b; "
                            "DROP TABLE IF EXISTS _tlog_skip; DROP TABLE IF EXISTS _tlog_seg_t; "
                            "DROP TABLE IF EXISTS _tlog_combo_t; DROP TABLE IF EXISTS _tlog_files_t")
            except duckdb.Error:
                pass  # an aborted transaction: the caller rolls back
        return res

    def _run(self, sql: str) -> duckdb.DuckDBPyConnection:
        """Execute ``sql`` with ``$run`` bound when it uses it."""
        return self.con.execute(sql, {"run": self.run_id} if "$run" in sql else None)

    def _files_table(self, files: list[BatchFile]) -> None:
        _temp_table(self.con, "_tlog_files_t", pa.table({
            "fid": pa.array([f.fid for f in files], pa.int32()),
            "path": pa.array([f.rel for f in files], pa.string())}))

    def _note(self, res: BatchResult, rows: list[tuple[str, int, str]]) -> None:
        for file, line, reason in rows[:self.errors_left]:
            res.errors.append({"file": file, "line": int(line), "reason": reason})
        self.errors_left = max(0, self.errors_left - len(rows))

    def _rejects(self, res: BatchResult, by_fid: dict[int, BatchFile], bad_lines: list) -> None:
        con = self.con
        con.execute("""
            INSERT INTO rejects (run_id, file, line, reason, raw, code)
            SELECT $run, f.path, b.line, b.reason, b.raw, b.code
            FROM _tlog_b b JOIN _tlog_files_t f USING (fid)
            WHERE b.code IS NOT NULL""", {"run": self.run_id})
        for code, n in con.execute("SELECT code, count(*) FROM _tlog_b WHERE code IS NOT NULL "
                                   "GROUP BY code").fetchall():
            res.rejected[code] += n
        if self.errors_left:
            self._note(res, con.execute(
                "SELECT f.path, b.line, b.reason FROM _tlog_b b JOIN _tlog_files_t f USING (fid) "
                "WHERE b.code IS NOT NULL ORDER BY b.fid, b.line LIMIT ?",
                [self.errors_left]).fetchall())
        if bad_lines:
            bad_lines = sorted(bad_lines, key=lambda b: (b.fid, b.line))
            rows = [(by_fid[b.fid].rel, b.line, b.reason) for b in bad_lines]
            con.executemany("INSERT INTO rejects (run_id, file, line, reason, raw, code) "
                            "VALUES (?, ?, ?, ?, ?, ?)",
                            [(self.run_id, f, ln, r, b.raw[:RAW_KEEP], b.code)
                             for (f, ln, r), b in zip(rows, bad_lines, strict=True)])
            res.rejected.update(Counter(b.code for b in bad_lines))
            self._note(res, rows)

    # -- meta defaults -----------------------------------------------------------------------
    def _meta(self, res: BatchResult, files: list[BatchFile]) -> None:
        """Cut each file into segments of constant meta defaults -> ``_tlog_seg_t``."""
        con = self.con
        rows = con.execute("""
            SELECT p.fid, p.line, p.rank, p.stage, p.worker, p.host, p.pid, p.world_size,
                   p.clock::VARCHAR, b.extra::VARCHAR
            FROM _tlog_p p LEFT JOIN _tlog_b b USING (fid, line)
            WHERE p.kind = 'meta' AND (NOT p.flag OR (b.code IS NULL AND NOT b.blank))
            ORDER BY p.fid, p.line""").fetchall()
        res.loaded["meta"] += len(rows)
        by_fid: dict[int, list[tuple]] = {}
        for row in rows:
            by_fid.setdefault(row[0], []).append(row)
        segs: list[tuple] = []
        for f in files:
            meta = dict(f.meta)
            lo = 0
            for (_, line, rank, stage, worker, host, pid, world, clock, extra) in by_fid.get(f.fid, []):
                if line > 1 or lo:
                    segs.append(self._seg(f.fid, lo, line, meta))
                new = {"rank": rank, "stage": stage, "worker": worker, "host": host, "pid": pid,
                       "world_size": world}
                if clock:
                    c = json.loads(clock)
                    new["clock_wall"], new["clock_mono"] = c.get("wall"), c.get("mono")
                meta.update({k: v for k, v in new.items() if v is not None})
                if extra:
                    meta.setdefault("extra", {}).update(json.loads(extra))
                lo = line
            segs.append(self._seg(f.fid, lo, 2**62, meta))
            f.meta_out = meta
        self.ranged_segments = len(segs) > len(files)
        cols = list(zip(*segs, strict=True)) or [[] for _ in range(11)]
        types = (pa.int32(), pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.string(),
                 pa.string(), pa.int64(), pa.int64(), pa.float64(), pa.float64())
        names = ("fid", "lo", "hi", "rank", "stage", "worker", "host", "pid", "world_size",
                 "clock_wall", "clock_mono")
        _temp_table(con, "_tlog_seg_t", pa.table(
            [pa.array(range(len(segs)), pa.int32()),
             *(pa.array(c, t) for c, t in zip(cols, types, strict=True))],
            names=["sid", *names]))

    @staticmethod
    def _seg(fid: int, lo: int, hi: int, meta: dict[str, Any]) -> tuple:
        return (fid, lo, hi, meta.get("rank"), meta.get("stage"), meta.get("worker"),
                meta.get("host"), meta.get("pid"), meta.get("world_size"),
                meta.get("clock_wall"), meta.get("clock_mono"))

    # -- layouts -----------------------------------------------------------------------------
    def _layout(self, res: BatchResult, kp: list[str], kg: list[str],
                kinds: dict[str, Any]) -> dict[str, Any]:
        """Layout of one (phase names, gpu names, kinds): names in record order,
        then gpu-only names; categories by kinds > phase_kinds > the name rules."""
        in_kp = {n: i for i, n in enumerate(kp)}
        in_kg = {n: i for i, n in enumerate(kg)}
        gpu_only = [k for k in kg if k not in in_kp]
        names = tuple(kp + gpu_only)
        cats, givens = [], []
        for name in names:
            given = kinds.get(name)
            if given is not None and given not in PHASE_CATEGORIES:
                warning = (f"kinds: {given!r} for phase {name!r} is not a category (ignored; "
                           f"use one of {', '.join(sorted(PHASE_CATEGORIES))})")
                if warning not in res.warnings:
                    res.warnings.append(warning)
                given = None
            givens.append(given)
            cats.append(given or self.phase_kinds.get(name) or categorize(name))
        layout = self.layouts.get(names, tuple(givens), tuple(cats)) if names else None
        return {"layout": layout,
                "names": names, "kp": kp, "kg": kg,
                "host_pos": [in_kp.get(n) for n in names],
                "gpu_pos": [in_kg.get(n) for n in names]}

    def _layouts(self, res: BatchResult, templates: list[Template]) -> dict[str, Any]:
        """Layouts of the template lines and of every distinct (phase names, gpu
        names, kinds) of the other loadable iter lines -> ``_tlog_combo_t``."""
        con = self.con
        tpl = {i: self._layout(res, list(t.phases), list(t.gpu), dict(t.kinds))
               for i, t in enumerate(templates) if t.kind == "iter"}
        rows = con.execute("""
            SELECT DISTINCT p.kp, p.kg, p.kinds::VARCHAR
            FROM _tlog_p p LEFT JOIN _tlog_b b USING (fid, line)
            WHERE p.kind = 'iter' AND p.tpl IS NULL
              AND (NOT p.flag OR (b.code IS NULL AND NOT b.blank))""").fetchall()
        combos = []
        for i, (kp, kg, kinds_text) in enumerate(rows):
            c = self._layout(res, list(kp or []), list(kg or []),
                             json.loads(kinds_text) if kinds_text else {})
            c.update(combo=i, kg=list(kg) if kg else None, kinds=kinds_text)
            combos.append(c)
        if combos:
            table = pa.table({
                "combo": pa.array([c["combo"] for c in combos], pa.int32()),
                "kp": pa.array([c["kp"] for c in combos], pa.list_(pa.string())),
                "kg": pa.array([c["kg"] for c in combos], pa.list_(pa.string())),
                "kinds": pa.array([c["kinds"] for c in combos], pa.string()),
                "layout": pa.array([c["layout"] for c in combos], pa.int32()),
            })
            con.register("_tlog_combo", table)
            try:
                con.execute("CREATE OR REPLACE TEMP TABLE _tlog_combo_t AS "
                            "SELECT * FROM _tlog_combo")
            finally:
                con.unregister("_tlog_combo")
        self.layouts.flush(con)
        return {"templates": tpl, "combos": combos, "positions": _fast_positions(templates)}

    @staticmethod
    def _struct_list(struct: str, pos: list[int | None], keys: list[str] | None,
                     index: dict[str, int]) -> str:
        """SQL list of the values of ``struct`` in layout order: ``pos[i]`` is the
        index in ``keys`` of the layout's i-th name (None: not in this record),
        ``index`` the 1-based position of each name in ``struct``."""
        items = ", ".join(_at(struct, index[keys[q]]) if q is not None and keys else "NULL"
                          for q in pos)
        return f"[{items}]::DOUBLE[]"

    def _general_values(self, combos: list[dict[str, Any]], col: str, pos_key: str) -> str:
        """SQL for the list of values of ``col`` (``phases`` or ``gpu``) in layout
        order, for lines of the general path (by their combo ``c.combo``)."""
        src = "kp" if col == "phases" else "kg"
        all_names = sorted({n for c in combos for n in (c[src] or [])})
        if not all_names or not any(q is not None for c in combos for q in c[pos_key]):
            return "NULL::DOUBLE[]"
        lowered = {n.lower() for n in all_names}
        if (len(all_names) <= MAX_STRUCT_NAMES and len(combos) <= MAX_STRUCT_COMBOS
                and len(lowered) == len(all_names)):
            struct = json.dumps(dict.fromkeys(all_names, "DOUBLE"))
            index = {n: i + 1 for i, n in enumerate(all_names)}
            cases = [f"WHEN {c['combo']} THEN {self._struct_list('s', c[pos_key], c[src], index)}"
                     for c in combos if any(q is not None for q in c[pos_key])]
            return (f"(SELECT CASE c.combo {' '.join(cases)} END "
                    f"FROM (SELECT json_transform(p.{col}, {_sql_str(struct)}) AS s))")
        # any number of names: a MAP, looked up by the layout's names
        return (f"(SELECT CASE WHEN m IS NULL THEN NULL ELSE list_transform(l.names, "
                f"lambda n: m[n]) END FROM (SELECT json_transform(p.{col}, "
                f"'\"MAP(VARCHAR, DOUBLE)\"') AS m))")

    # -- iterations --------------------------------------------------------------------------
    def _effective(self, kind: str | tuple[str, ...], joins: str = "") -> str:
        """FROM clause of the loadable lines of ``kind`` (one or several) with
        their meta segment."""
        kinds = (kind,) if isinstance(kind, str) else kind
        which = "p.kind IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"
        seg = ("s.fid = p.fid AND p.line >= s.lo AND p.line < s.hi" if self.ranged_segments
               else "s.fid = p.fid")
        return f"""
            FROM _tlog_p p
            LEFT JOIN _tlog_b b ON b.fid = p.fid AND b.line = p.line
            LEFT JOIN _tlog_seg_t s ON {seg}
            {joins}
            WHERE {which} AND (NOT p.flag OR (b.code IS NULL AND NOT b.blank))"""

    _KEYS = """
            coalesce(p.rank, s.rank, 0)::INTEGER AS rank,
            coalesce(p.stage, s.stage, 'main') AS stage,
            coalesce(p.worker,
                     CASE WHEN (p.stage IS NULL OR p.stage = s.stage)
                           AND (p.rank IS NULL OR p.rank = s.rank) THEN s.worker END,
                     coalesce(p.stage, s.stage, 'main') || '-'
                         || coalesce(p.rank, s.rank, 0)::VARCHAR) AS worker"""

    def _iterations(self, res: BatchResult, parts: dict[str, Any]) -> None:
        con = self.con
        tpl, combos, positions = parts["templates"], parts["combos"], parts["positions"]
        joins = ""
        if combos:
            joins = ("LEFT JOIN _tlog_combo_t c ON p.tpl IS NULL AND c.kp IS NOT DISTINCT FROM p.kp "
                     "AND c.kg IS NOT DISTINCT FROM p.kg "
                     "AND c.kinds IS NOT DISTINCT FROM p.kinds::VARCHAR")
            if (len(combos) > MAX_STRUCT_COMBOS
                    or len({n for c in combos for n in c["names"]}) > MAX_STRUCT_NAMES):
                joins += (" LEFT JOIN (SELECT layout, list(phase ORDER BY seq) AS names "
                          "FROM phase_layouts WHERE run_id = $run GROUP BY layout) l "
                          "ON l.layout = c.layout")
        general = {"layout": "c.layout" if combos else "NULL::INTEGER",
                   "host": self._general_values(combos, "phases", "host_pos") if combos
                   else "NULL::DOUBLE[]",
                   "gpu": self._general_values(combos, "gpu", "gpu_pos") if combos
                   else "NULL::DOUBLE[]"}

        def by_template(what: str) -> str:
            cases = []
            for i, t in tpl.items():
                if what == "layout":
                    value = "NULL" if t["layout"] is None else str(t["layout"])
                elif what == "host":
                    value = self._struct_list("p.fph", t["host_pos"], t["kp"],
                                              positions["phases"])
                else:
                    value = (self._struct_list("p.fgpu", t["gpu_pos"], t["kg"], positions["gpu"])
                             if t["kg"] else "NULL::DOUBLE[]")
                cases.append(f"WHEN {i} THEN {value}")
            if not cases:
                return general[what]
            return (f"CASE WHEN p.tpl IS NOT NULL THEN CASE p.tpl {' '.join(cases)} END "
                    f"ELSE {general[what]} END")

        frm = self._effective("iter", joins)
        n, n_keys, min_ts, ranks = self._run(f"""
            SELECT coalesce(sum(k), 0), count(*), min(t), list(DISTINCT rank) FROM (
                SELECT rank, stage, worker, iter, count(*) AS k, min(ts) AS t FROM (
                    SELECT {self._KEYS}, p.iter, p.ts {frm})
                GROUP BY rank, stage, worker, iter)""").fetchall()[0]
        if not n:
            return
        keyed = f"SELECT p.fid, p.line, {self._KEYS}, p.iter {frm}"
        skip_parts = []
        if n > n_keys:
            skip_parts.append(f"""SELECT fid, line FROM (SELECT fid, line, row_number() OVER (
                PARTITION BY rank, stage, worker, iter ORDER BY fid, line) AS k FROM ({keyed}))
                WHERE k > 1""")
        has_old = con.execute("SELECT count(*) FROM (SELECT 1 FROM iterations WHERE run_id = ? "
                              "LIMIT 1)", [self.run_id]).fetchall()[0][0]
        if has_old:
            skip_parts.append(f"""SELECT fid, line FROM ({keyed}) e WHERE EXISTS (
                SELECT 1 FROM iterations i WHERE i.run_id = $run AND i.rank = e.rank
                AND i.stage = e.stage AND i.worker = e.worker AND i.iter = e.iter)""")
        skip = ""
        skipped = 0
        if skip_parts:
            self._run("CREATE OR REPLACE TEMP TABLE _tlog_skip AS " + " UNION ".join(skip_parts))
            skipped = int(con.execute("SELECT count(*) FROM _tlog_skip").fetchall()[0][0])
            if skipped:
                res.duplicates += skipped
                skip = ("AND NOT EXISTS (SELECT 1 FROM _tlog_skip k "
                        "WHERE k.fid = p.fid AND k.line = p.line)")
        self._run(f"""
            INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, cpu, tokens, samples,
                mem_allocated, mem_reserved, mem_alloc_retries, mem_device_allocs, file, line,
                extra, layout, phase_host_s, phase_gpu_s)
            SELECT $run, {self._KEYS}, p.iter, p.ts, p.dur, p.cpu, p.tokens, p.samples,
                p.m.allocated, p.m.reserved, p.m.alloc_retries, p.m.device_allocs, f.path,
                p.line, b.extra, {by_template('layout')}, {by_template('host')},
                {by_template('gpu')}
            {self._effective('iter', joins + ' JOIN _tlog_files_t f ON f.fid = p.fid')} {skip}
            """)
        res.loaded["iter"] += int(n) - skipped
        res.min_ts = min_ts
        res.ranks.update(int(r) for r in ranks or [])

    def _queues_events(self, res: BatchResult) -> None:
        con = self.con
        n = con.execute(f"""
            INSERT INTO queue_samples (run_id, rank, stage, worker, name, ts, depth, capacity,
                                       file, line, extra)
            SELECT $run, {self._KEYS}, p.name, p.ts, p.depth, p.capacity, f.path, p.line, b.extra
            {self._effective('queue', 'JOIN _tlog_files_t f ON f.fid = p.fid')}
            """, {"run": self.run_id}).fetchall()[0][0]
        res.loaded["queue"] += int(n)
        n = con.execute(f"""
            INSERT INTO events (run_id, rank, stage, worker, name, ts, dur, file, line, extra)
            SELECT $run, {self._KEYS}, p.name, p.ts, coalesce(p.dur, 0), f.path, p.line, b.extra
            {self._effective('event', 'JOIN _tlog_files_t f ON f.fid = p.fid')}
            """, {"run": self.run_id}).fetchall()[0][0]
        res.loaded["event"] += int(n)

    def _workers(self) -> None:
        """One ``workers`` row per new (rank, stage, worker) of the run (one scan
        of the batch; the first record by (file, line) gives the meta segment)."""
        keyed = (f"SELECT {self._KEYS}, s.sid, p.fid, (p.fid::BIGINT << 40) + p.line AS pos "
                 f"{self._effective(('iter', 'queue', 'event'))}")
        self.con.execute(f"""
            INSERT INTO workers (run_id, rank, stage, worker, host, pid, world_size, clock_wall,
                                 clock_mono, file)
            SELECT $run, w.rank, w.stage, w.worker, s.host, s.pid, s.world_size, s.clock_wall,
                   s.clock_mono, f.path
            FROM (SELECT rank, stage, worker, arg_min(sid, pos) AS sid, arg_min(fid, pos) AS fid
                  FROM ({keyed}) GROUP BY rank, stage, worker) w
            JOIN _tlog_seg_t s ON s.sid = w.sid
            JOIN _tlog_files_t f ON f.fid = w.fid
            WHERE NOT EXISTS (SELECT 1 FROM workers o WHERE o.run_id = $run AND o.rank = w.rank
                              AND o.stage = w.stage AND o.worker = w.worker)
            """, {"run": self.run_id})
