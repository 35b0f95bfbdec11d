"""The template fast path never takes a line the exact checks would treat
differently: lines that share a template's shape but break a rule in each way
the lenient typed parse could hide are ingested with templates and with every
line through the exact checks, and must give the same rows and rejects."""

from __future__ import annotations

from pathlib import Path

import pytest
from ingest_helpers import rows, snapshot, write_lines
from tlog.ingest import connect, ingest_run
from tlog.ingest.templates import learn, template_of

BASE = ('{"type":"iter","v":1,"rank":0,"stage":"drafter","iter":%d,"ts":100.0,"dur":1.0,'
        '"phases":{"hs_get":0.25,"forward":0.5},"tokens":16,"kinds":{"hs_get":"starvation"},'
        '"mem":{"allocated":1024}}')

VARIANTS = [   # each: a text replacement in BASE that must not slip through a template
    ('"iter":%d', '"iter":"%d"'), ('"iter":%d', '"iter":%d.5'), ('"iter":%d', '"iter":%d.0'),
    ('"iter":%d', '"iter":%d, "iter":%d'), ('"ts":100.0', '"ts":true'), ('"ts":100.0', '"ts":null'),
    ('"dur":1.0', '"dur":-1.0'), ('"dur":1.0', '"dur":NaN'), ('"dur":1.0', '"dur":1e999'),
    ('"dur":1.0', '"dur":[1.0]'), ('"dur":1.0', '"dur":{}'), ('"dur":1.0', '"dur":"1.0"'),
    ('"hs_get":0.25,', '"hs_get":-0.25,'), ('"hs_get":0.25,', '"hs_get":"0.25",'),
    ('"hs_get":0.25,', '"hs_get":null,'), ('"hs_get":0.25,', '"hs_get":false,'),
    ('"hs_get":0.25,', '"hs_get":0.25,"extra":0.1,'), ('"hs_get":0.25,', '"hs_get":0.25,"hs_get":1,'),
    ('"forward":0.5', '"forward":0.5,"x":1'), ('"stage":"drafter"', '"stage":7'),
    ('"stage":"drafter"', '"stage":"a\\"b"'), ('"tokens":16', '"tokens":-16'),
    ('"tokens":16', '"tokens":16,"note":"x"'), ('"rank":0', '"rank":0.5'),
    ('"rank":0', '"rank":99999999999999999999'), ('"v":1', '"v":2'),
    ('"allocated":1024', '"allocated":1024.5'), ('"allocated":1024', '"allocated":-1'),
    ('"starvation"', '"compute"'), ('"mem":{"allocated":1024}}', '"mem":{"allocated":1024}} x'),
    ('"phases":{"hs_get":0.25,"forward":0.5}', '"phases":{"forward":0.5,"hs_get":0.25}'),
    ('"phases":{"hs_get":0.25,"forward":0.5}', '"phases":{"hs_get":0.25}'),
    ('"stage":"drafter"', '"stage":"drafter\\u00e9"'), ('"stage":"drafter"', '"stage":"truex"'),
]


def test_base_line_has_a_template():
    t = template_of(BASE % 0)
    assert t is not None and t.kind == "iter"
    assert t.phases == ("hs_get", "forward") and t.kinds == (("hs_get", "starvation"),)
    assert t.quotes == (BASE % 0).count('"')
    assert learn([BASE % 0, BASE % 1, "junk"]) == [t]


def _lines() -> list[str]:
    out = [BASE % i for i in range(5)]
    for k, (old, new) in enumerate(VARIANTS, start=5):
        assert old in BASE, old
        line = BASE.replace(old, new)
        out.append(line.replace("%d", str(k)))
        out.append(BASE % (100 + k))          # a good line between the variants
    return out


@pytest.mark.parametrize("chunk", [1 << 20, 600])
def test_templates_agree_with_exact_checks(tmp_path: Path, chunk: int):
    run = tmp_path / "run"
    write_lines(run / "rank0.jsonl", _lines())
    fast = connect(tmp_path / "fast.duckdb")
    exact = connect(tmp_path / "exact.duckdb")
    try:
        a = ingest_run(fast, run, chunk_bytes=chunk).to_dict()
        b = ingest_run(exact, run, check_all=True).to_dict()
        for key in ("records_loaded", "records_rejected", "rejected_by_reason", "errors",
                    "duplicates"):
            assert a[key] == b[key], key
        assert snapshot(fast, "run") == snapshot(exact, "run")
        # the good lines loaded, whatever happened to their neighbours
        iters = {r["iter"] for r in rows(fast, "SELECT iter FROM iterations")}
        assert {0, 1, 2, 3, 4} | {100 + k for k in range(5, 5 + len(VARIANTS))} <= iters
        # swapped phase order is kept as written (seq follows the record)
        swapped = 5 + VARIANTS.index(('"phases":{"hs_get":0.25,"forward":0.5}',
                                      '"phases":{"forward":0.5,"hs_get":0.25}'))
        assert rows(fast, "SELECT phase, seq FROM phases WHERE iter = ? ORDER BY seq",
                    [swapped]) == [{"phase": "forward", "seq": 0}, {"phase": "hs_get", "seq": 1}]
    finally:
        fast.close()
        exact.close()


def test_templates_with_other_keys_share_a_batch(tmp_path: Path):
    """Each template's lines are parsed with that template's own keys and phase
    names (``parse_sql._fast_transform``) and cast by name to all of them: with
    two ``iter`` templates whose phases overlap in another order, one with
    ``mem`` and no ``tokens``, and a ``meta`` template in one batch, every value
    lands under its own name (values written by hand below), as the exact
    checks load them."""
    a = ('{"type":"iter","v":1,"iter":%d,"ts":100.0,"dur":1.0,'
         '"phases":{"a":0.25,"b":0.5},"tokens":16}')
    b = ('{"type":"iter","v":1,"iter":%d,"ts":101.0,"dur":2.0,'
         '"phases":{"c":0.75,"b":0.125},"mem":{"allocated":2048}}')
    meta = ('{"type":"meta","v":1,"rank":1,"stage":"s","worker":"w","host":"h","pid":7,'
            '"clock":{"wall":1.0,"mono":2.0}}')
    lines = [meta] + [x % i for i in range(4) for x in (a, b.replace("%d", "1%d"))]
    assert sorted(t.kind for t in learn(lines)) == ["iter", "iter", "meta"]
    run = tmp_path / "run"
    write_lines(run / "rank1.jsonl", lines)
    fast, exact = connect(tmp_path / "fast.duckdb"), connect(tmp_path / "exact.duckdb")
    try:
        ingest_run(fast, run)
        ingest_run(exact, run, check_all=True)
        assert snapshot(fast, "run") == snapshot(exact, "run")
        got = rows(fast, "SELECT iter, phase, host_s FROM phases WHERE iter IN (2, 12) "
                         "ORDER BY iter, seq")
        assert [(r["iter"], r["phase"], r["host_s"]) for r in got] == [
            (2, "a", 0.25), (2, "b", 0.5), (12, "c", 0.75), (12, "b", 0.125)]
        got = rows(fast, "SELECT iter, rank, stage, worker, ts, dur, tokens, mem_allocated "
                         "FROM iterations WHERE iter IN (2, 12) ORDER BY iter")
        assert [tuple(r.values()) for r in got] == [(2, 1, "s", "w", 100.0, 1.0, 16, None),
                                                    (12, 1, "s", "w", 101.0, 2.0, None, 2048)]
        assert rows(fast, "SELECT host, pid FROM workers") == [{"host": "h", "pid": 7}]
    finally:
        fast.close()
        exact.close()
