"""Public traces of every PyTorch generation (../shared/traces, README there):
what tlog makes of them against the truth computed here from each trace's own
events, with a plain JSON load and a walk written for the test.

The truth per iteration, on the stepping thread: the DataLoader fetch's time;
the thread's idle gaps (not covered by any of its spans); of those, the gaps
during which the autograd thread (the thread with ``...Backward`` /
``AccumulateGrad`` ops) works - the thread is blocked in ``backward()`` - and
the moments of a gap during which a collective runs on another thread; and the
host-blocking copies (an async copy call that returned after its copy ended).
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from bisect import bisect_left, bisect_right
from itertools import pairwise
from pathlib import Path

import pytest
from tlog.ingest.errors import TraceError
from tlog.ingest.kineto import convert_trace, looks_like_trace, stored_warnings

from tests.support.cli import invoke
from tlog import analyze, ingest

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces"
needs_shared = pytest.mark.skipif(not (TRACES / "kineto").is_dir() or not (TRACES / "hta").is_dir(),
                                  reason=f"shared traces not found at {TRACES}")
pytestmark = needs_shared

BWD = re.compile(r"Backward\d*$|AccumulateGrad$|^autograd::engine::evaluate_function")
HOST_CATS = {"cpu_op", "operator", "user_annotation", "cuda_runtime", "runtime"}


@pytest.fixture
def con(tmp_path: Path):
    c = ingest.connect(tmp_path / "tlog.duckdb")
    yield c
    c.close()


def _events(rel: str) -> list[dict]:
    path = TRACES / rel
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    evs = doc if isinstance(doc, list) else doc["traceEvents"]
    return [e for e in evs if e.get("ph") == "X" and str(e.get("cat", "")).lower() in HOST_CATS
            and e.get("cat") != "python_function"]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


class _Merged:
    """Spans merged once (``_union``), their overlap with any ``[a, b)`` found by bisection.

    ``covered(a, b)`` equals ``sum(max(0, min(b, y) - max(a, x)))`` over the merged
    spans, term for term in the same order: the spans it skips add exactly 0.
    (Merging per query made the truth walk quadratic: ~30 s CPU per 2021 trace.)
    """

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self.spans = _union(spans)
        self.ends = [y for _, y in self.spans]

    def covered(self, a: float, b: float) -> float:
        total: float = 0
        for x, y in self.spans[bisect_right(self.ends, a):]:
            if x >= b:
                break
            total += max(0.0, min(b, y) - max(a, x))
        return total


def _truth(evs: list[dict], windows: list[tuple[float, float]], main) -> list[dict]:
    """Per window: ``loader``, ``backward`` (gaps with autograd work), ``collective``
    (other gap moments while a collective runs elsewhere), ``idle`` (the rest), µs."""
    mine = [e for e in evs if e["tid"] == main and not e["name"].startswith("ProfilerStep#")]
    autograd = {e["tid"] for e in evs if e["tid"] != main and BWD.search(e["name"])}
    bwd = _Merged([(e["ts"], e["ts"] + e["dur"]) for e in evs if e["tid"] in autograd])
    coll = _Merged([(e["ts"], e["ts"] + e["dur"]) for e in evs
                    if e["tid"] != main and e["tid"] not in autograd
                    and re.match(r"(gloo|nccl):|c10d::|record_param_comms$", e["name"])])
    # Sorted once; a window's events are the slice w0 <= ts < w1, in the same order.
    mine.sort(key=lambda e: (e["ts"], -e["dur"]))
    starts = [e["ts"] for e in mine]
    out = []
    for w0, w1 in windows:
        inside = mine[bisect_left(starts, w0):bisect_left(starts, w1)]
        tops, end = [], float("-inf")
        for e in inside:
            if e["ts"] >= end - 0.002:
                tops.append(e)
                end = e["ts"] + e["dur"]
        busy = _union([(e["ts"], min(e["ts"] + e["dur"], w1)) for e in tops])
        gaps, prev = [], w0
        for a, b in [*busy, (w1, w1)]:
            if a > prev:
                gaps.append((prev, a))
            prev = max(prev, b)
        t = {"loader": sum(e["dur"] for e in tops if e["name"].startswith("enumerate(DataLoader)")),
             "backward": 0.0, "collective": 0.0, "idle": 0.0, "dur": w1 - w0}
        for a, b in gaps:
            if bwd.covered(a, b) > 0:
                t["backward"] += b - a
            else:
                c = coll.covered(a, b)
                t["collective"] += c
                t["idle"] += b - a - c
        out.append(t)
    return out


def _profiler_steps(evs: list[dict]) -> tuple[object, list[tuple[float, float]]]:
    steps = [e for e in evs if e["name"].startswith("ProfilerStep#")]
    main = steps[0]["tid"]
    return main, sorted((e["ts"], e["ts"] + e["dur"]) for e in steps if e["tid"] == main)


def _loader_steps(evs: list[dict]) -> tuple[object, list[tuple[float, float]]]:
    """Windows from one DataLoader fetch to the next; the last ends with the thread's last span."""
    fetch = sorted((e for e in evs if e["name"].startswith("enumerate(DataLoader)")),
                   key=lambda e: e["ts"])
    main = fetch[0]["tid"]
    last = max(e["ts"] + e["dur"] for e in evs if e["tid"] == main)
    bounds = [e["ts"] for e in fetch] + [last]
    return main, list(pairwise(bounds))


def _shares(truth: list[dict]) -> dict[str, float]:
    total = sum(t["dur"] for t in truth)
    return {k: sum(t[k] for t in truth) / total for k in ("loader", "backward", "collective",
                                                           "idle")}


def _tlog_shares(recs: list[dict]) -> dict[str, float]:
    total = sum(r["dur"] for r in recs)
    phases: dict[str, float] = {}
    for r in recs:
        for k, v in r["phases"].items():
            phases[k] = phases.get(k, 0.0) + v
    return {"loader": phases.get("data_loader_next", 0.0) / total,
            "backward": phases.get("backward", 0.0) / total,
            "collective": phases.get("collective_wait", 0.0) / total,
            "idle": (total - sum(phases.values())) / total}


# The README's independently measured truth: (file, verdict, loader, backward, idle).
GENERATIONS = [
    ("kineto/profiler_api_nw0/worker0.pt.trace.json.gz", "starvation", 0.30, 0.23, 0.06),
    ("kineto/profiler_api_nw4/worker0.pt.trace.json.gz", "compute", 0.01, 0.29, None),
    ("kineto/array_nw0/worker0.pt.trace.json.gz", "starvation", 0.24, 0.20, None),
    ("kineto/array_nw4/worker0.pt.trace.json.gz", "compute", 0.01, 0.24, None),
    ("kineto/autograd_api_nw0/worker0.pt.trace.json.gz", "starvation", 0.33, 0.22, None),
    ("kineto/autograd_api_nw4/worker0.pt.trace.json.gz", "compute", 0.013, 0.33, None),
]


@pytest.mark.parametrize(("rel", "verdict", "loader", "backward", "idle"), GENERATIONS)
def test_2021_traces_credit_the_autograd_thread_to_backward(rel, verdict, loader, backward, idle,
                                                            con, tmp_path: Path) -> None:
    """2021 ResNet-50 traces: only ``XxxBackward`` ops on the autograd thread, no
    evaluate_function spans; some without ProfilerStep (cut at the DataLoader
    fetch), some a bare JSON array."""
    evs = _events(rel)
    has_steps = any(e["name"].startswith("ProfilerStep#") for e in evs)
    main, windows = (_profiler_steps if has_steps else _loader_steps)(evs)
    conv = convert_trace(TRACES / rel)
    if not has_steps:   # the first fetch-to-fetch window is the 4-5 s warm-up: left out
        assert windows[0][1] - windows[0][0] > 3 * sorted(b - a for a, b in windows)[3]
        windows = windows[1:]
        assert conv.windows == "loop"
        assert any("DataLoader fetch" in w for w in conv.warnings)
        assert any("warm-up" in w for w in conv.warnings)
    assert [r["dur"] for r in conv.records] == pytest.approx([(b - a) / 1e6 for a, b in windows],
                                                            abs=1e-9)
    truth, got = _shares(_truth(evs, windows, main)), _tlog_shares(conv.records)
    for key in ("loader", "backward", "idle"):
        assert got[key] == pytest.approx(truth[key], abs=0.005), key
    # ... and the README's figures, measured by others.
    assert got["loader"] == pytest.approx(loader, abs=0.02)
    assert got["backward"] == pytest.approx(backward, abs=0.03)
    if idle is not None:
        assert got["idle"] == pytest.approx(idle, abs=0.02)
    run = tmp_path / rel.split("/")[1]
    run.mkdir()
    shutil.copy(TRACES / rel, run / "trace.json.gz")   # a link out of the run is not read
    ingest.ingest_run(con, run)
    d = analyze.diagnose(con, run.name).to_dict()
    assert d["bottleneck"]["category"] == verdict
    assert d["categories"]["unaccounted"] == pytest.approx(truth["idle"], abs=0.10)


def test_bare_array_trace_is_recognised(tmp_path: Path) -> None:
    assert looks_like_trace(TRACES / "kineto/array_nw0/worker0.pt.trace.json.gz")
    other = tmp_path / "numbers.json"
    other.write_text("[1, 2, 3]")
    assert not looks_like_trace(other)


def test_steps_without_profiler_step_are_cut_at_zero_grad_not_at_the_annotations(con) -> None:
    """HTA's step_based trace: 5 loop iterations of ~1.5 ms (README: ~660 it/s),
    not the 10 optimizer annotations (7918 it/s before)."""
    rel = "hta/with_gpu_user_annotation/step_based_trace_2543932.json.gz"
    evs = _events(rel)
    zero = sorted((e for e in evs if e["name"].startswith("Optimizer.zero_grad#")),
                  key=lambda e: e["ts"])
    main = zero[0]["tid"]
    last = max(e["ts"] + e["dur"] for e in evs if e["tid"] == main)
    bounds = [e["ts"] for e in zero] + [last]
    windows = list(pairwise(bounds))
    conv = convert_trace(TRACES / rel)
    assert len(conv.records) == len(zero) == 5
    assert [r["dur"] for r in conv.records] == pytest.approx([(b - a) / 1e6 for a, b in windows],
                                                            abs=1e-9)
    truth, got = _shares(_truth(evs, windows, main)), _tlog_shares(conv.records)
    assert got["backward"] == pytest.approx(truth["backward"], abs=0.005)
    assert got["idle"] == pytest.approx(truth["idle"], abs=0.005)
    assert got["backward"] == pytest.approx(0.46, abs=0.02)      # README
    assert got["idle"] == pytest.approx(0.10, abs=0.02)          # README
    ingest.ingest_run(con, TRACES / rel, run_id="sb")
    d = analyze.diagnose(con, "sb").to_dict()
    assert 600 < d["throughput"]["iters_per_s"] < 720
    assert any("Optimizer.zero_grad starts one" in w for w in stored_warnings(con, "sb"))


def test_cpu_only_gloo_wait_is_a_collective_wait_and_host_only(con) -> None:
    """HTA's cpu_only trace: the main thread records nothing while gloo:all_reduce
    runs on two other threads; the README says ~82% of the step."""
    rel = "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    evs = _events(rel)
    main, windows = _profiler_steps(evs)
    truth = _shares(_truth(evs, windows, main))
    got = _tlog_shares(convert_trace(TRACES / rel).records)
    assert got["collective"] == pytest.approx(truth["collective"], abs=1e-6)
    assert got["collective"] == pytest.approx(0.82, abs=0.05)
    assert got["idle"] == pytest.approx(truth["idle"], abs=1e-6)
    ingest.ingest_run(con, TRACES / rel, run_id="cpu")
    d = analyze.diagnose(con, "cpu").to_dict()
    assert d["bottleneck"]["category"] == "sync"
    assert d["host_only"] is True
    assert d["categories"]["unaccounted"] == pytest.approx(truth["idle"], abs=0.10)


def _blocking_copies(rel: str) -> tuple[list[tuple[float, float]], dict[int, float]]:
    """Per ProfilerStep: µs of host-blocking calls on the stepping thread (the
    CUDA sync calls, and async copies of >= 50 µs that returned after their
    copy ended), and the copies' device ends by correlation id."""
    path = TRACES / rel
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    copy_end: dict[int, float] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy":
            c = e["args"]["correlation"]
            copy_end[c] = max(copy_end.get(c, 0.0), e["ts"] + e["dur"])
    return doc["traceEvents"], copy_end


@pytest.mark.parametrize("rel", ["hta/trace_diff/test/test.json.gz",
                                 "hta/trace_diff/control/control.json.gz"])
def test_blocking_copies_are_host_blocks_and_torchrec_is_not_input_bound(rel, con) -> None:
    """torchrec traces: the host waits 37-150 ms per step in pageable device-to-host
    cudaMemcpyAsync calls inside ``## sparse_data_dist ##``. Each step's
    ``*_sync`` phases equal the blocking calls found here; ``load_batch`` stays
    ~1%, so the run is not input-bound."""
    events, copy_end = _blocking_copies(rel)
    evs = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in evs if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    main = steps[0]["tid"]
    sync_calls = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                  "cudaMemcpy"}
    blocking = [e for e in evs if e["tid"] == main and e.get("cat") == "cuda_runtime" and (
        e["name"] in sync_calls or (e["name"] == "cudaMemcpyAsync" and e["dur"] >= 50
                                    and copy_end.get(e["args"].get("correlation"), 1e30)
                                    <= e["ts"] + e["dur"] + 5))]
    conv = convert_trace(TRACES / rel)
    total_sync = total = 0.0
    for step, rec in zip(steps, conv.records, strict=True):
        s0, s1 = step["ts"], step["ts"] + step["dur"]
        want = sum(min(e["ts"] + e["dur"], s1) - e["ts"] for e in blocking if s0 <= e["ts"] < s1)
        got = sum(v for k, v in rec["phases"].items() if k.endswith("_sync") or k == "sync")
        assert got == pytest.approx(want / 1e6, abs=1e-6)
        total_sync += got
        total += rec["dur"]
    ingest.ingest_run(con, TRACES / rel, run_id="tr")
    d = analyze.diagnose(con, "tr").to_dict()
    assert d["bottleneck"]["category"] != "starvation"
    assert d["categories"]["starvation"] < 0.03
    # The blocking copies sit in collective phases (sparse_data_dist): the
    # backlog walk leaves them whole, so the diagnosed sync share is the
    # blocked share measured from the trace's events (steady iterations may
    # leave one step out, hence the tolerance).
    assert d["categories"]["sync"] == pytest.approx(total_sync / total, abs=0.04)
    if "test" in rel:    # README: ~37 ms blocking copy + ~16 ms wait_sparse_data_dist of ~124 ms
        assert total_sync / total == pytest.approx(0.43, abs=0.06)
        assert d["bottleneck"]["category"] == "sync"
        assert d["bottleneck"]["phase"] == "sparse_data_dist_sync"
    else:                # README: control is compute-bound, blocking copy ~16%
        assert d["bottleneck"]["category"] == "compute"
        assert total_sync / total == pytest.approx(0.16, abs=0.05)


def test_uint64_trace_parses_then_says_it_has_no_iterations(tmp_path: Path) -> None:
    path = TRACES / "hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"
    with pytest.raises(TraceError, match="has no ProfilerStep#N spans") as exc:
        convert_trace(path)
    assert "not valid JSON" not in str(exc.value)
    res = invoke(["ingest", str(path), "--db", str(tmp_path / "t.duckdb")])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("tlog: error: trace ")


def test_ingest_prints_each_converter_fallback(tmp_path: Path) -> None:
    path = TRACES / "kineto/autograd_api_nw0/worker0.pt.trace.json.gz"
    res = invoke(["ingest", str(path), "--db", str(tmp_path / "t.duckdb"),
                  "--run-id", "ag"])
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.output.splitlines() if ln.strip().startswith("warning: ")]
    assert len(warned) == 2
    assert any("warm-up" in ln for ln in warned) and any("DataLoader" in ln for ln in warned)
    with ingest.connect(tmp_path / "t.duckdb") as c:
        kept = stored_warnings(c, "ag")
    assert [ln.strip().removeprefix("warning: ") for ln in warned] == kept
    # diagnose notes each fallback the converter took (they never reached the user)
    res = invoke(["diagnose", "--run", "ag", "--db", str(tmp_path / "t.duckdb"),
                  "--json"])
    assert res.exit_code == 0, res.output
    notes = json.loads(res.output)["notes"]
    assert [n.removeprefix("trace conversion: ") for n in notes
            if n.startswith("trace conversion: ")] == kept
