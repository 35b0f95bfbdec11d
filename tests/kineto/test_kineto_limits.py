"""The trace reader's limits (docs/KINETO.md, "Limits"): whatever a file holds,
reading it holds a chunk and one event of text, and an event over a limit is
left out, counted, and named in one warning line.

- An event whose ``args`` nest arrays 200,000 deep (a 400 KB file): before, the
  peak resident set grew with the square of the depth (20,000 levels: 1.08 GiB;
  200,000: killed at 22 GiB). Measured in a fresh process beside the same trace
  without the nesting: the difference is bounded.
- A property test (hypothesis) of every limit: random traces of valid and
  hostile events (nesting, sizes, long names, ids of the wrong type, non-finite
  or huge times), cut into tiny chunks so every event straddles a chunk's end,
  against an independent reading of the same text with ``json.loads``.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tlog.ingest import kineto_read
from tlog.ingest.errors import TraceError

from benchmarks._memory import PEAK_BYTES_SRC

ROOT = Path(__file__).resolve().parents[2]

#: Depth of the hostile event's ``args`` (the file is 400 KB).
DEEP = 200_000
#: Most the deep file's peak may exceed the plain one's, bytes. Measured
#: 2026-12-07: 15.6 MiB against 15.0 MiB for the reader alone, and a difference
#: under 1 MiB for ``convert_trace``; before, 22 GiB and the kernel's kill.
DEEP_EXTRA_BYTES = 16 * 1024**2

HEAD = ('{"schemaVersion": 1, "traceEvents": [\n'
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, '
        '"dur": 20.0, "args": {"Input Dims": ')
TAIL = ('}},\n{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, '
        '"tid": 1, "ts": 0.0, "dur": 100.0, "args": {}}\n], '
        '"baseTimeNanoseconds": 1700000000000000000}\n')


def _trace(path: Path, depth: int) -> Path:
    path.write_text(HEAD + "[" * depth + "]" * depth + TAIL)
    return path


def _peak_of_convert(path: Path) -> tuple[int, list[str], int]:
    """(peak bytes, warnings, iterations) of ``convert_trace(path)`` in a fresh process."""
    code = (f"{PEAK_BYTES_SRC}\nimport json\nfrom tlog.ingest.kineto import convert_trace\n"
            f"c = convert_trace({str(path)!r})\n"
            "print(json.dumps([_peak_bytes(), c.warnings, len(c.records)]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=300)
    peak, warnings, iters = json.loads(out.stdout)
    return peak, warnings, iters


def test_an_event_nested_200000_deep_is_left_out_in_bounded_memory(tmp_path: Path) -> None:
    deep = _trace(tmp_path / "deep.json", DEEP)
    plain = _trace(tmp_path / "plain.json", 1)
    assert deep.stat().st_size > 400_000
    peak_deep, warnings, iters = _peak_of_convert(deep)
    peak_plain, plain_warnings, plain_iters = _peak_of_convert(plain)
    assert peak_deep - peak_plain < DEEP_EXTRA_BYTES, (peak_deep, peak_plain)
    assert warnings == [("1 event over the reader's limits was left out: 1 nested deeper "
                         "than 32 levels (docs/KINETO.md, Limits)")]
    assert (iters, plain_iters, plain_warnings) == (1, 1, [])


def test_the_cli_says_it_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _trace(run / "deep.pt.trace.json", DEEP)
    out = subprocess.run([sys.executable, "-m", "tlog", "ingest", str(run), "--db",
                          str(tmp_path / "t.duckdb")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    said = [line for line in (out.stdout + out.stderr).splitlines() if "limits" in line]
    assert said == [("  warning: deep.pt.trace.json: 1 event over the reader's limits was "
                     "left out: 1 nested deeper than 32 levels (docs/KINETO.md, Limits)")], said


def test_an_event_over_the_size_limit_is_skipped_unread(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An event of 3 MB (a 3 MB string in ``args``) with 1 MB chunks: skipped as
    it streams by, never held whole; the events around it are read."""
    big = '{"ph": "X", "cat": "cpu_op", "name": "big", "pid": 1, "tid": 1, "ts": 1.0, ' \
          '"dur": 1.0, "args": {"s": "' + "x" * 3_000_000 + '"}}'
    path = tmp_path / "big.json.gz"
    with gzip.open(path, "wt") as f:
        f.write('{"traceEvents": [' + big + "," + TAIL.removeprefix("}},\n"))
    cols = kineto_read.read_columns(path)
    assert cols.rejected == {"size": 1}
    assert cols.names == ["ProfilerStep#1"] and list(cols.h_ts) == [0.0]


def test_a_trace_cut_short_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text(HEAD + "[[1, 2")
    with pytest.raises(TraceError, match="is not valid JSON after 0 events"):
        kineto_read.read_columns(path)


# -- property test -----------------------------------------------------------------------

#: Limits made small so that hypothesis reaches each with small examples.
SMALL = {"MAX_EVENT_CHARS": 300, "MAX_NAME_CHARS": 24, "MAX_ID_CHARS": 6}
HOST_CATS = {"cpu_op": 0, "operator": 0, "user_annotation": 1, "cuda_runtime": 2}
DEVICE_CATS = {"kernel", "gpu_memcpy"}

# each limit's edge drawn on purpose: hypothesis favours small values and the ends
# (hypothesis favours a one_of's first branches: the choice of kind is a sampled_from)
ids = st.sampled_from(["t" * 5, "t" * 6, "t" * 7, "t" * 8, -5, 2**40, 1.5, None, True, [1],
                       {"a": 1}, ""])
times = st.sampled_from([0.5, 1e12, -3, 10**6, 10**400, math.inf, -math.inf, math.nan, "1",
                         None, [1.0]])


def nested(depth: int, leaf: object) -> object:
    out = leaf
    for k in range(depth):
        out = [out] if k % 2 else {"a": out}
    return out


@st.composite
def events(draw: st.DrawFn) -> dict:
    """A trace event, sound but for at most one field drawn from its hostile values."""
    bad = draw(st.sampled_from(["none", "ph", "cat", "name", "pid", "tid", "ts", "dur",
                                "depth", "size", "correlation"]))
    ev: dict = {"ph": draw(st.sampled_from(["i", "s"])) if bad == "ph" else "X"}
    ev["cat"] = draw(st.sampled_from(["python_function", 5, None]) if bad == "cat"
                     else st.sampled_from([*HOST_CATS, *DEVICE_CATS]))
    ev["name"] = draw(st.sampled_from(["n" * 23, "n" * 24, "n" * 25, "n" * 26, 7, None])
                      if bad == "name" else st.text(max_size=8))
    for key in ("pid", "tid"):
        if bad == key:
            ev[key] = draw(ids)
        elif draw(st.booleans()):
            ev[key] = draw(st.integers(0, 99))
    for key in ("ts", "dur"):
        if bad == key:
            if draw(st.integers(0, 4)):
                ev[key] = draw(times)
        else:
            ev[key] = draw(st.floats(0, 1e9))
    depth = draw(st.integers(28, 33) if bad == "depth" else st.integers(0, 5))
    args: dict = {"pad": "", "deep": nested(depth, 1)}
    if bad == "correlation":
        args["correlation"] = draw(st.sampled_from([-3, 2**63 - 1, 2**63, 2**70, "7", 1.0]))
    elif draw(st.booleans()):
        args["correlation"] = draw(st.integers(0, 10**6))
    ev["args"] = args
    if bad == "size":
        size = draw(st.one_of(st.integers(297, 303), st.integers(300, 900)))
        if size > len(json.dumps(ev)):
            args["pad"] = "p" * (size - len(json.dumps(ev)))
    return ev


def _depth(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def _id_ok(v: object) -> bool:
    return (type(v) in (int, str, float, bool, type(None))
            and (not isinstance(v, str) or len(v) <= SMALL["MAX_ID_CHARS"]))


def _time_ok(v: object) -> bool:
    if type(v) not in (int, float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def expected(texts: list[str]) -> tuple[list[tuple[str, float, float]], int, dict[str, int]]:
    """What the limits say of each event's text, read whole with ``json.loads``:
    the host spans kept (name, ts, dur), the device activities kept, the
    rejections by reason."""
    host, device, rejected = [], 0, {}

    def reject(why: str) -> None:
        rejected[why] = rejected.get(why, 0) + 1

    seen_names: set[str] = set()
    for text in texts:
        ev = json.loads(text)
        if len(text) > SMALL["MAX_EVENT_CHARS"]:
            reject("size")
            continue
        if _depth(ev) > kineto_read.MAX_DEPTH:
            reject("depth")
            continue
        cat = ev.get("cat")
        if ev.get("ph") != "X" or not isinstance(cat, str) or (
                cat not in HOST_CATS and cat not in DEVICE_CATS):
            continue
        if ev.get("ts") is None or ev.get("dur") is None:
            continue
        if not (_time_ok(ev["ts"]) and _time_ok(ev["dur"])):
            reject("field")
            continue
        if cat in DEVICE_CATS:
            if _id_ok(ev.get("pid")) and _id_ok(ev.get("tid")):
                device += 1
            else:
                reject("field")
            continue
        name = ev["name"] if isinstance(ev["name"], str) else str(ev["name"])
        if name not in seen_names and len(name) > SMALL["MAX_NAME_CHARS"]:
            reject("name")
            continue
        if not (_id_ok(ev.get("pid")) and _id_ok(ev.get("tid"))):
            seen_names.add(name)
            reject("field")
            continue
        seen_names.add(name)
        host.append((name, float(ev["ts"]), float(ev["dur"])))
    return host, device, rejected


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(evs=st.lists(events(), min_size=1, max_size=12), chunk=st.integers(1, 97),
       spaces=st.sampled_from(["", " ", "\n  ", "\t"]), bare=st.booleans(),
       gz=st.booleans())
def test_the_reader_keeps_exactly_what_the_limits_allow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, evs: list[dict], chunk: int,
        spaces: str, bare: bool, gz: bool) -> None:
    for name, value in SMALL.items():
        monkeypatch.setattr(kineto_read, name, value)
    monkeypatch.setattr(kineto_read, "CHUNK", chunk)
    texts = [json.dumps(ev) for ev in evs]
    body = "[" + spaces + ("," + spaces).join(texts) + spaces + "]"
    doc = body if bare else ('{"schemaVersion": 1,' + spaces + '"traceEvents": ' + body
                             + ', "baseTimeNanoseconds": 1700000000000000000}')
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(doc.encode()) if gz else doc.encode())

    cols = kineto_read.read_columns(path)

    host, device, rejected = expected(texts)
    got = [(cols.names[n], t, d) for n, t, d in zip(cols.h_name, cols.h_ts, cols.h_dur,
                                                     strict=True)]
    assert got == host
    assert cols.device_count == device
    assert cols.rejected == rejected
    assert cols.events_read == len(evs)
    assert cols.base_ns == (None if bare else 1700000000000000000)
    assert len(cols.notes) == (1 if rejected else 0)
