"""docs/FORMAT.md's tables against dflash_runtime/format.py, both ways: every
record kind, field (its kinds, whether required, its value rule), category and
name rule written in the document is in the module, and nothing in the module
is missing from the document."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dflash_runtime import format as fmt

DOC = Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md"


def _sections(text: str) -> list[tuple[str, list[list[str]]]]:
    """``[(heading, table rows)]``: each table (rows as lists of cells, header
    row included, separator row dropped) with the last heading above it."""
    out: list[tuple[str, list[list[str]]]] = []
    heading = ""
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r"-+", c) for c in cells):
                rows.append(cells)
            continue
        if rows:
            out.append((heading, rows))
            rows = []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
    return out


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


@pytest.fixture(scope="module")
def tables() -> list[tuple[str, list[list[str]]]]:
    return _sections(DOC.read_text(encoding="utf-8"))


def _field_tables(tables: list[tuple[str, list[list[str]]]]) -> dict[str, list[list[str]]]:
    """``{kind or '*': rows}`` of the tables headed ``field | type | required | meaning``."""
    out: dict[str, list[list[str]]] = {}
    for heading, rows in tables:
        if rows[0][:3] != ["field", "type", "required"]:
            continue
        names = _ticked(heading)
        key = names[0] if names else "*"
        assert key not in out, f"two field tables for {key!r}"
        out[key] = rows[1:]
    return out


def test_record_kinds(tables: list[tuple[str, list[list[str]]]]) -> None:
    text = DOC.read_text(encoding="utf-8")
    documented = re.findall(r"^### `(\w+)`:", text, flags=re.MULTILINE)
    assert sorted(documented) == sorted(fmt.RECORD_KINDS)
    assert set(_field_tables(tables)) == {"*", *fmt.RECORD_KINDS}


def test_fields_both_ways(tables: list[tuple[str, list[list[str]]]]) -> None:
    by_kind = _field_tables(tables)
    common = {}
    for row in by_kind["*"]:
        (name,) = _ticked(row[0])
        common[name] = row
    every_kind = {f.name for f in fmt.FIELDS if set(f.kinds) == set(fmt.RECORD_KINDS)}
    assert set(common) == set(fmt.ENVELOPE_FIELDS) | every_kind
    for kind in fmt.RECORD_KINDS:
        documented: dict[str, tuple[str, bool]] = {}
        for row in by_kind[kind] + [r for n, r in common.items() if n in every_kind]:
            for name in _ticked(row[0]):
                documented[name] = (row[1], row[2].startswith("yes"))
        module = {name: (fmt.CHECK_DOC[f.check], kind in f.required)
                  for name, f in fmt.fields_of(kind).items()}
        assert documented == module, kind


def test_object_keys(tables: list[tuple[str, list[list[str]]]]) -> None:
    by_kind = _field_tables(tables)
    mem = next(r for r in by_kind["iter"] if r[0] == "`mem`")
    assert tuple(_ticked(mem[3])) == fmt.MEM_FIELDS
    clock = next(r for r in by_kind["meta"] if r[0] == "`clock`")
    assert tuple(k for k in _ticked(clock[3]) if "(" not in k) == fmt.CLOCK_FIELDS
    machine = next(r for r in by_kind["meta"] if r[0] == "`machine`")
    assert set(_ticked(machine[3])) == set(fmt.MACHINE_FIELDS)
    cuda = next(r for r in by_kind["sys"] if r[0] == "`cuda`")
    assert set(_ticked(cuda[3])) == set(fmt.CUDA_FIELDS)
    gpu = next(r for r in by_kind["sys"] if r[0] == "`gpu`")
    assert set(_ticked(gpu[3])) == set(fmt.GPU_FIELDS)
    for name, f in (("machine", fmt.fields_of("meta")["machine"]),
                    ("cuda", fmt.fields_of("sys")["cuda"]), ("gpu", fmt.fields_of("sys")["gpu"])):
        assert f.keys == {"machine": fmt.MACHINE_FIELDS, "cuda": fmt.CUDA_FIELDS,
                          "gpu": fmt.GPU_FIELDS}[name]


def test_value_rules_named_in_the_doc() -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    for doc in fmt.CHECK_DOC.values():
        assert f"`{doc}`" in text
    assert f"`[0, {fmt.MAX_DURATION_S:.0f}]`" in text
    assert f"`[0, {fmt.MAX_EPOCH_S:.0e}".replace("e+", "e") in text
    assert f"more than {fmt.MAX_PHASES} names" in text
    assert f"`rank` up to {fmt.MAX_RANK:,}" in text
    assert f"`world_size` up to {fmt.INT32_MAX:,}" in text


def test_categories_both_ways(tables: list[tuple[str, list[list[str]]]]) -> None:
    (rows,) = [rows for _, rows in tables if rows[0] == ["category", "meaning"]]
    assert tuple(_ticked(r[0])[0] for r in rows[1:]) == fmt.CATEGORIES


def _pairs(cell: str) -> set[tuple[str, str]]:
    out = set()
    for text in _ticked(cell):
        a, b = text.split("_")
        out.add((a, b))
    return out


def test_name_rules_both_ways(tables: list[tuple[str, list[list[str]]]]) -> None:
    (rows,) = [rows for heading, rows in tables if heading == "Name rules"]
    assert rows[0] == ["order", "rule", "category", "word pairs", "words"]
    by_rule = {r[1]: r for r in rows[1:]}
    assert set(by_rule) == {"collective", "host waits", "handing on", "input", "anything else"}
    coll, host = by_rule["collective"], by_rule["host waits"]
    assert coll[2] == host[2] == "sync"
    assert _pairs(coll[3]) == fmt.COLLECTIVE_PAIRS
    assert set(_ticked(coll[4])) == fmt.COLLECTIVE_WORDS
    assert _pairs(coll[3]) | _pairs(host[3]) == fmt.SYNC_PAIRS
    assert set(_ticked(coll[4])) | set(_ticked(host[4])) == fmt.SYNC_WORDS
    back = by_rule["handing on"]
    assert back[2] == "backpressure"
    assert not _ticked(back[3]) and set(_ticked(back[4])) == fmt.BACKPRESSURE_WORDS
    inp = by_rule["input"]
    assert inp[2] == "starvation"
    assert _pairs(inp[3]) == fmt.STARVATION_PAIRS
    assert set(_ticked(inp[4])) == fmt.STARVATION_WORDS
    rest = by_rule["anything else"]
    assert rest[2] == "compute" and not _ticked(rest[3]) and not _ticked(rest[4])
    # the order column is the order categorize applies them: a name holding a
    # word of each of two rules gets the earlier rule's category
    order = {r[2]: int(r[0]) for r in rows[1:]}
    assert order["sync"] < order["backpressure"] < order["starvation"] < order["compute"]
    assert fmt.categorize("dist_put") == "sync"           # sync before backpressure
    assert fmt.categorize("put_data") == "backpressure"   # backpressure before starvation
    assert fmt.categorize("data_item") == "sync"          # sync before starvation


def test_doc_examples_of_the_word_split() -> None:
    """The examples the document gives of its splitting rule."""
    assert fmt.split_words("target_forward") == ["target", "forward"]
    assert fmt.categorize("target_forward") == "compute"
    assert fmt.split_words("hsGet") == ["hs", "get"]
    assert fmt.categorize("hsGet") == "starvation"
    assert fmt.categorize("sparse_data_dist") == "sync"
    assert fmt.categorize("forward/mask_build") == "compute"
    assert fmt.categorize("step_a2a") == "sync"


def test_implicit_sync_ops_both_ways(tables: list[tuple[str, list[list[str]]]]) -> None:
    (rows,) = [rows for heading, rows in tables if heading.startswith("Implicit syncs")]
    assert rows[0] == ["op", "the call"]
    from tlog.analyze.text import SYNC_CALL_TEXT

    documented = {_ticked(op)[0]: _ticked(call)[0] for op, call in rows[1:]}
    assert list(documented) == list(fmt.SYNC_OPS)
    assert documented == SYNC_CALL_TEXT
    name = fmt.sync_site_name("item", "train.py", 212)
    assert name == "sync.item@train.py:212"
    assert "`sync.<op>@<file>:<line>`" in DOC.read_text(encoding="utf-8")
    assert fmt.parse_sync_site(f"optimizer_step/{name}") == ("item", "train.py", 212)
    assert fmt.categorize(name) == "sync"
