"""The writer's template lines (``writer._fast_iter_line``) against the numbers
computed by hand from the raw log, and against the general path's dict + JSON,
for the same queued iterations."""

from __future__ import annotations

import json
import random

import pytest

from dflash_runtime import writer

OFF = 1_764_403_200.0 - 1000.0   # wall - perf_counter, as the writer reads it


def _item(names: list[str], gaps: list[float], *, cpu: float | None = 0.0031,
          tokens: object = None, samples: object = None, n: object = 7,
          prefix: int = 0) -> tuple:
    """A queued iteration (recorder tuple) of laps ``names`` ``gaps`` seconds apart,
    its log preceded by ``prefix`` entries of an earlier iteration."""
    t0 = 1000.123456789
    log: list = ["old", 999.0] * prefix
    t = t0
    for name, gap in zip(names, gaps, strict=True):
        t += gap
        log += [name, t]
    t1 = t + 0.0005
    return (writer._ITER, n, t0, t1, cpu, log, 2 * prefix, len(log), tokens, samples,
            None, None, None, None)


def _general(item: tuple) -> dict:
    rec, pending = writer._iter_record(item, OFF)
    assert pending is None
    return json.loads(writer._dumps(rec))


def test_template_line_holds_the_laps_rounded_to_the_nanosecond() -> None:
    names = ["data", "forward", "backward", 'we"ird %s name', "opt/step"]
    gaps = [0.0021234567891, 0.0051, 0.004000000049, 1.5e-10, 0.25]
    item = _item(names, gaps, tokens=4096, samples=8)
    line = writer._fast_iter_line(item, OFF)
    assert line is not None and line.endswith("}\n") and line.count("\n") == 1
    got = json.loads(line)
    # by hand: each lap is the time since the previous mark, rounded to 9 decimals
    t0, log = item[2], item[5]
    marks = [t0, *log[1::2]]
    want = {name: round(b - a, 9) for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)}
    assert list(got["phases"]) == names
    assert got["phases"] == want
    assert got["phases"]["we\"ird %s name"] == 0.0        # 0.15 ns rounds to 0
    assert got["ts"] == round(t0 + OFF, 6)
    assert got["dur"] == round(item[3] - t0, 9)
    assert (got["type"], got["v"], got["iter"]) == ("iter", 1, 7)
    assert (got["cpu"], got["tokens"], got["samples"]) == (0.0031, 4096, 8)
    assert got == _general(item)
    assert list(got) == list(_general(item))              # same key order


@pytest.mark.parametrize("seed", range(20))
def test_template_and_general_paths_write_the_same_numbers(seed: int) -> None:
    rng = random.Random(seed)
    k = rng.randint(0, 12)
    names = [f"p{i}_{rng.randint(0, 99)}" for i in range(k)]
    gaps = [rng.choice([rng.uniform(0, 1e-6), rng.uniform(0, 0.05), rng.uniform(0, 30)])
            for _ in range(k)]
    item = _item(names, gaps, cpu=rng.choice([None, rng.uniform(0, 0.1)]),
                 tokens=rng.choice([None, rng.randint(0, 10**6)]), prefix=rng.randint(0, 3))
    line = writer._fast_iter_line(item, OFF)
    assert line is not None
    assert json.loads(line) == _general(item)


def _blocks(spans: list[tuple[str, float, float]]) -> tuple:
    """A queued iteration of blocks side by side (``rec.instrument``'s phases):
    ``(name, begin, end)`` seconds after its start."""
    t0 = 1000.5
    log: list = []
    for name, a, b in spans:
        log += [1, name, t0 + a, t0 + b]      # recorder.ENTER, name, begin ... end
    return (writer._ITER, 3, t0, t0 + 0.05, None, log, 0, len(log), None, 8, None, None,
            None, None)


def test_blocks_side_by_side_take_the_template_too() -> None:
    item = _blocks([("data_fetch", 0.0, 0.0021), ("forward", 0.0025, 0.0101),
                    ("backward", 0.0101, 0.0302), ("optimizer_step", 0.031, 0.0333)])
    line = writer._fast_iter_line(item, OFF)
    assert line is not None
    got = json.loads(line)
    t0 = item[2]
    # by hand: each block's end minus its begin; the gaps between are in no phase
    assert got["phases"] == {"data_fetch": round((t0 + 0.0021) - t0, 9),
                             "forward": round((t0 + 0.0101) - (t0 + 0.0025), 9),
                             "backward": round((t0 + 0.0302) - (t0 + 0.0101), 9),
                             "optimizer_step": round((t0 + 0.0333) - (t0 + 0.031), 9)}
    assert got["samples"] == 8
    assert got == _general(item)


@pytest.mark.parametrize("log", [
    [1, "fwd", 1000.6, 1, "inner", 1000.61, 1000.62, 1000.63],    # a block inside another
    [1, "fwd", 1000.6, "lap", 1000.61, 1000.62],                   # a lap inside a block
    [1, "fwd", 1000.6, 1000.61, "lap", 1000.62, "x", 1000.63],     # a lap after a block
    [1, "fwd", 1000.6, 1000.61, 1, "fwd", 1000.62, 1000.63],       # a name twice: summed
    [2, ("h2d", None, None), 1000.6, 1000.61],                      # a block with a kind
    [1, "fwd", 1000.6, 1000.61, 1, "open", 1000.62],               # a block still open
])
def test_nested_or_mixed_blocks_take_the_general_path(log: list) -> None:
    item = (writer._ITER, 3, 1000.5, 1000.7, None, log, 0, len(log), None, None, None, None,
            None, None)
    assert writer._fast_iter_line(item, OFF) is None


@pytest.mark.parametrize("case", ["repeat", "kinds", "float_tokens", "bool_iter", "odd",
                                  "negative"])
def test_records_the_template_cannot_write_take_the_general_path(case: str) -> None:
    item = list(_item(["a", "b"], [0.001, 0.002]))
    if case == "repeat":       # a name twice: the general path sums them
        item[5] = ["a", 1000.2, "a", 1000.3]
        item[7] = 4
    elif case == "kinds":
        item[10] = {"a": "sync"}
    elif case == "float_tokens":
        item[8] = 12.5
    elif case == "bool_iter":
        item[1] = True
    elif case == "odd":        # a truncated trailing name
        item[5] = item[5] + ["c"]
        item[7] += 1
    elif case == "negative":   # a clock that went back: the general path clamps to 0
        item[5] = ["a", 999.0, "b", 1000.5]
    assert writer._fast_iter_line(tuple(item), OFF) is None
