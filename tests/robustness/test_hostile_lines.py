"""A hostile line rejects only itself: whatever a line holds, it
becomes one reject with a clear reason, and every good line before and after
it loads, now, at every later ingest and under ``--follow``.

Before: a phase name holding a lone UTF-16 surrogate, ``"type": ["iter"]`` or
a value nested 1,000 deep made every later ingest of the run fail with an
internal error (the template sampler's ``json.loads`` / the typed parse's
STRUCT), so nothing after the line ever loaded.

The fuzz test generates JSON values and byte strings (Hypothesis, derandomized:
the same examples every run) as lines between good lines and checks the exact
counts, which the test computes itself from what it generated.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ingest_helpers import following, iter_line
from tlog.ingest import connect, ingest_run

DEEP = 1000
#: (line, reject code, words of the reason)
HOSTILE: list[tuple[str | bytes, str, str]] = [
    ('{"iter": 90, "ts": 1.0, "dur": 1.0, "phases": {"\\ud800": 0.5}}', "not_json",
     "\\ud800 is half of a UTF-16 surrogate pair"),
    ('{"type": "meta", "stage": "s\\udc80x"}', "not_json", "\\udc80 is half of a UTF-16"),
    ('{"iter": 90, "ts": 1.0, "dur": 1.0, "phases": {"a": 0.5}, "gpu": {"\\udbff": 0.1}}',
     "not_json", "\\udbff is half"),
    ('{"type": ["iter"], "iter": 90, "ts": 1.0, "dur": 1.0, "phases": {}}', "wrong_type",
     "wrong type for 'type': expected a string, got an array"),
    ('{"type": {"a": 1}, "iter": 90, "ts": 1.0, "dur": 1.0, "phases": {}}', "wrong_type",
     "expected a string, got an object"),
    ('{"iter": 90, "ts": 1.0, "dur": 1.0, "phases": {}, "x": ' + "[" * DEEP + "]" * DEEP + "}",
     "too_large", "nested 1,001 levels deep (limit 64)"),
    ('{"iter": 90, "ts": 1.0, "dur": 1.0, "phases": {"a": ' + '{"b":' * DEEP + "1"
     + "}" * DEEP + "}}", "too_large", "nested 1,002 levels deep"),
    ("[" * DEEP + "]" * DEEP, "too_large", "nested 1,000 levels deep"),
    ('{"iter": 90, "ts": 1700000000000.0, "dur": 1.0, "phases": {"a": 0.5}}', "bad_value",
     "'ts' looks like milliseconds: 1700000000000.0"),
    ('{"iter": 90, "ts": 1.7e18, "dur": 1.0, "phases": {"a": 0.5}}', "bad_value",
     "'ts' looks like nanoseconds"),
    ('{"iter": 90, "ts": -1e18, "dur": 1.0, "phases": {"a": 0.5}}', "bad_value",
     "negative timestamp for 'ts'"),
    ('{"type": "queue", "name": "q", "ts": 1.7e12, "depth": 1}', "bad_value",
     "looks like milliseconds"),
    ('{"iter": 90, "ts": 1.0, "dur": 1.0, "phases": {"a": 1e308, "b": 1e308}}', "bad_duration",
     "duration for phase 'a' longer than a day: 1e308 s (at most 86400)"),
    ('{"iter": 90, "ts": 1.0, "dur": 1e308, "phases": {"a": 0.5}}', "bad_duration",
     "duration for 'dur' longer than a day"),
    ('{"iter": 90, "ts": 1.0, "dur": 1.0, "cpu": 86400.5, "phases": {"a": 0.5}}',
     "bad_duration", "duration for 'cpu' longer than a day"),
    ('{"iter": 90, "ts": 1.0, "dur": 1.0, "phases": {"a": 0.5}, "gpu": {"a": 1e5}}',
     "bad_duration", "duration for gpu 'a' longer than a day"),
    ('{"type": "event", "name": "ckpt", "ts": 5.0, "dur": 1e300}', "bad_duration",
     "duration for 'dur' longer than a day"),
    ('{"iter": 90, "ts": 1e400, "dur": 1.0, "phases": {}}', "bad_value", "non-finite"),
    (b'{"iter": 90, "ts": 1.0, "dur": 1.0, "phases": {"\xff": 0.5}}', "not_json",
     "not UTF-8"),
    ('"\u2028"', "not_object", "not a JSON object: a string"),
]


def _write(path: Path, lines: list[str | bytes], mode: str = "wb") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as fh:
        fh.writelines((line.encode("utf-8") if isinstance(line, str) else line) + b"\n"
                      for line in lines)


def _iters(con, run_id: str) -> list[int]:
    return [r[0] for r in con.execute("SELECT iter FROM iterations WHERE run_id = ? "
                                      "ORDER BY iter", [run_id]).fetchall()]


@pytest.mark.parametrize("check_all", [False, True], ids=["templates", "exact"])
@pytest.mark.parametrize(("line", "code", "words"), HOSTILE,
                         ids=[f"h{i}" for i in range(len(HOSTILE))])
def test_a_hostile_line_rejects_only_itself(line: str | bytes, code: str, words: str,
                                            check_all: bool, tmp_path: Path) -> None:
    log = tmp_path / "run" / "rank0.jsonl"
    _write(log, [iter_line(0), iter_line(1), line, iter_line(2), iter_line(3)])
    con = connect(tmp_path / "t.duckdb")
    try:
        first = ingest_run(con, tmp_path / "run", check_all=check_all)
        assert first.records_loaded["iter"] == 4
        assert first.rejected_by_reason == {code: 1}
        (got_code, reason), = con.execute("SELECT code, reason FROM rejects WHERE line = 3"
                                          ).fetchall()
        assert got_code == code and words in reason, reason
        # the same line again after more good lines: the run keeps loading
        _write(log, [iter_line(4), line, iter_line(5)], mode="ab")
        second = ingest_run(con, tmp_path / "run", check_all=check_all)
        assert second.records_loaded["iter"] == 2
        assert second.rejected_by_reason == {code: 1}
        third = ingest_run(con, tmp_path / "run", check_all=check_all)
        assert third.records_total == 0 and third.records_rejected == 0
        assert third.files_unchanged == 1
        assert _iters(con, "run") == [0, 1, 2, 3, 4, 5]
        assert con.execute("SELECT list(line ORDER BY line) FROM rejects").fetchall()[0][0] == [
            3, 7]
    finally:
        con.close()


def test_every_hostile_line_under_follow(tmp_path: Path) -> None:
    """``tlog ingest --follow`` keeps going past every hostile line (it exited)."""
    run = tmp_path / "live"
    log = run / "rank0.jsonl"
    _write(log, [iter_line(0)])
    db = tmp_path / "t.duckdb"
    with following(run, db) as (out, ended):
        _wait(out, "loaded 1 iter")
        _write(log, [line for line, _, _ in HOSTILE] + [iter_line(1), iter_line(2)], mode="ab")
        _wait(out, "loaded 2 iter")
        _write(log, [iter_line(3)], mode="ab")
        _wait(out, "loaded 1 iter", after=2)
    code, err = ended
    assert code == 0, err
    con = connect(db)
    try:
        assert _iters(con, "live") == [0, 1, 2, 3]
        got = con.execute("SELECT code, count(*) FROM rejects GROUP BY code").fetchall()
        want: dict[str, int] = {}
        for _, c, _ in HOSTILE:
            want[c] = want.get(c, 0) + 1
        assert dict(got) == want
    finally:
        con.close()


def _wait(lines: list[str], text: str, after: int = 1, timeout: float = 60.0) -> None:
    """Wait until ``text`` is in ``after`` lines of ``lines``."""
    deadline = time.monotonic() + timeout
    while sum(text in line for line in lines) < after:
        assert time.monotonic() < deadline, f"no {text!r} in {lines}"
        time.sleep(0.05)


# --- fuzz ----------------------------------------------------------------------------------

REQUIRED = ("iter", "ts", "dur", "phases")
#: Strings that broke tlog before (lone surrogates, terminal escapes, markup,
#: U+2028), and any text, lone UTF-16 surrogates included (Hypothesis leaves
#: them out by default).
_text = st.sampled_from(["\ud800", "\udfff", "a\udc80", "", "\x1b[2J", "x\ny", "[/]",
                         "[link=file:///etc]x", "\u2028", "iter"]) | st.text(
    st.characters(exclude_categories=()), max_size=6)
#: Numbers near the edges of the rules (epoch seconds, a day, BIGINT, doubles).
_number = st.sampled_from([0, -0.0, -1, 86400, 86400.5, 1e11, 1.7e12, 2**31 - 2, 2**31 - 1,
                           2**63, 1e308, 5e-324, 0.5]) | st.integers() | st.floats(allow_nan=True)
_json = st.recursive(
    st.none() | st.booleans() | _number | _text,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_text, kids, max_size=4),
    max_leaves=12)
#: A whole line that is a JSON value (no record: an object lacks a required key).
_value_line = _json.map(lambda v: ("value", v))
#: A line of any bytes but a line break.
_bytes_line = st.binary(max_size=40).map(lambda b: ("bytes", b.replace(b"\n", b" ")))
#: A valid record but for one fuzzed phase name and value.
_phase_line = st.tuples(_text, _json).map(lambda nv: ("phase", nv))
#: A valid record but for one fuzzed field.
_field_line = st.tuples(st.sampled_from(["type", "ts", "dur", "cpu", "stage", "worker", "rank",
                                         "tokens", "phases", "gpu", "v"]),
                        _json | st.sampled_from(["iter", "meta", "queue", "event"])).map(
    lambda fv: ("field", fv))


def _number_in(value: object, lo: float, hi: float, *, whole: bool = False,
               below: bool = False) -> bool:
    """``value`` is a JSON number (not a boolean) in ``[lo, hi]`` (``[lo, hi)``
    with ``below``), a whole one with ``whole``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if whole and not isinstance(value, int):
        return False
    try:
        f = float(value)
    except OverflowError:
        return False
    return math.isfinite(f) and lo <= f and (f < hi if below else f <= hi)


def _field_outcome(name: str, value: object) -> str:
    """What ingest must do with an otherwise valid iter record whose field
    ``name`` is ``value`` (docs/FORMAT.md, docs/DATABASE.md "Ranges and caps"; a
    null field is a missing one, ``ingest.REASON_CODES['missing_field']``)."""
    if value is None:
        return "reject" if name in REQUIRED else "load"
    if name == "type":
        if value == "iter":
            return "load"
        return "meta" if value == "meta" else "reject"   # a meta keeps unknown fields
    if name == "v":
        return "load" if value == 1 and not isinstance(value, bool) else "reject"
    if name == "ts":
        return "load" if _number_in(value, 0, 1e11, below=True) else "reject"
    if name in ("dur", "cpu"):
        return "load" if _number_in(value, 0, 86400) else "reject"
    if name in ("stage", "worker"):
        ok = isinstance(value, str) and not _is_lone_surrogate(json.loads(json.dumps(value)))
        return "load" if ok else "reject"
    if name == "rank":
        return "load" if _number_in(value, 0, 2**31 - 2, whole=True) else "reject"
    if name == "tokens":
        return "load" if _number_in(value, 0, 2**63 - 1, whole=True) else "reject"
    # phases / gpu: an object of phase name -> seconds
    if not isinstance(value, dict):
        return "reject"
    return "load" if all(_phase_ok(k, v) for k, v in value.items()) else "reject"


def _is_lone_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def _phase_ok(name: str, value: object) -> bool:
    """Whether a record whose only phase is ``name: value`` loads (FORMAT.md:
    a non-empty name; a number of seconds, finite, 0 to 86,400)."""
    name = json.loads(json.dumps(name))    # two halves written in a row make a pair
    if name == "" or _is_lone_surrogate(name):
        return False
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        f = float(value)
    except OverflowError:
        return False
    return math.isfinite(f) and 0 <= f <= 86400


def _encode(item: tuple[str, object], n: int) -> tuple[bytes, str]:
    """The line's bytes and what ingest must do with it: ``load``, ``reject``, ``skip``."""
    kind, value = item
    if kind == "bytes":
        assert isinstance(value, bytes)
        if value.strip(b" \t\r") == b"":
            return value, "skip"           # blank: neither loaded nor rejected
        try:
            rec = json.loads(value.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return value, "reject"
        assume(not (isinstance(rec, dict) and set(REQUIRED) & set(rec)))
        return value, "reject"
    if kind == "value":
        if isinstance(value, dict):
            assume(not set(REQUIRED) & set(value) and "type" not in value)
        return json.dumps(value).encode("utf-8", "surrogatepass"), "reject"
    if kind == "field":
        field, v = value  # type: ignore[misc]
        rec = {"iter": 1000 + n, "ts": 5000.0 + n, "dur": 1.0, "phases": {"fwd": 0.5}}
        rec[field] = v
        return json.dumps(rec).encode("utf-8"), _field_outcome(field, v)
    name, v = value  # type: ignore[misc]
    text = json.dumps({"iter": 1000 + n, "ts": 5000.0 + n, "dur": 1.0, "phases": {name: v}})
    return text.encode("utf-8"), ("load" if _phase_ok(name, v) else "reject")


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(st.one_of(_value_line, _bytes_line, _phase_line, _field_line), min_size=1,
               max_size=12),
       st.integers(min_value=0, max_value=3))
def test_fuzzed_lines_between_good_lines(items: list, split: int) -> None:
    """Exact counts: every good line loads, each fuzzed line is loaded or
    rejected as the test's own rule says, across two ingests (the second after
    more lines are appended) and a third that finds nothing new."""
    encoded = [_encode(item, n) for n, item in enumerate(items)]
    cut = min(split, len(encoded))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = root / "run" / "rank0.jsonl"
        first = [iter_line(0)] + [line for line, _ in encoded[:cut]] + [iter_line(1)]
        second = [line for line, _ in encoded[cut:]] + [iter_line(2)]
        _write(log, first)
        con = connect(root / "t.duckdb")
        try:
            outcomes = [what for _, what in encoded]
            r1 = ingest_run(con, root / "run")
            assert r1.records_loaded["iter"] == 2 + outcomes[:cut].count("load")
            assert r1.records_loaded["meta"] == outcomes[:cut].count("meta")
            assert r1.records_rejected == outcomes[:cut].count("reject"), r1.errors
            _write(log, second, mode="ab")
            r2 = ingest_run(con, root / "run")
            assert r2.records_loaded["iter"] == 1 + outcomes[cut:].count("load")
            assert r2.records_rejected == outcomes[cut:].count("reject"), r2.errors
            r3 = ingest_run(con, root / "run")
            assert r3.records_total == 0 and r3.files_unchanged == 1
            kept = [0, 1, 2] + [1000 + n for n, what in enumerate(outcomes) if what == "load"]
            assert _iters(con, "run") == sorted(kept)
            assert con.execute("SELECT count(*) FROM rejects").fetchall()[0][0] == (
                outcomes.count("reject"))
        finally:
            con.close()
