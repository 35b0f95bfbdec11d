"""ingest.kineto_find/kineto_map: torch.profiler traces -> v1 records (docs/KINETO.md).

Hand-made traces in tests/data/kineto_* carry their expected figures (worked
out in each README); the real traces in ../shared/traces are checked against
figures computed independently here, straight from the JSON.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest
from tlog.ingest.errors import TraceError
from tlog.ingest.kineto_find import find_traces, plan_traces, rank_from_name, trace_stem
from tlog.ingest.kineto_map import annotation_phase, convert_trace
from tlog.ingest.kineto_read import looks_like_trace

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SHARED = ROOT.parent / "shared" / "traces" / "hta"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason=f"shared traces not found at {SHARED}")

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
#: NCCL point-to-point kernels, written out here from NCCL's kernel names
P2P_KERNEL = re.compile(r"^nccl(Dev)?Kernel_(SendRecv|Send|Recv)")
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}


def _approx_record(rec: dict) -> dict:
    out = dict(rec)
    for key in ("ts", "dur"):
        if key in out:
            out[key] = pytest.approx(out[key], abs=1e-9)
    for key in ("phases", "gpu"):
        if key in out:
            out[key] = {k: pytest.approx(v, abs=1e-9) for k, v in out[key].items()}
    return out


# --------------------------------------------------------------- hand-made traces


def test_rules_trace_gives_the_hand_worked_records() -> None:
    conv = convert_trace(DATA / "kineto_rules" / "trace.json")
    expected = json.loads((DATA / "kineto_rules" / "expected.json").read_text())
    assert conv.meta == expected["meta"]
    assert conv.records == [_approx_record(r) for r in expected["records"]]
    # Phase order is the order of first appearance (the device-backlog walk needs it),
    # each _sync right after its phase.
    assert list(conv.records[0]["phases"]) == [
        "data_loader_next", "h2d", "h2d_sync", "forward", "backward", "optimizer_step",
        "optimizer_step_sync", "sync"]
    assert conv.rank == 3 and conv.rank_source == "distributedInfo" and conv.world_size == 4
    assert conv.warnings == []


def test_rules_trace_figures_by_hand() -> None:
    """The README's arithmetic, asserted figure by figure."""
    rec = convert_trace(DATA / "kineto_rules" / "trace.json").records[0]
    assert rec["ts"] == pytest.approx(1_700_000_000.001, abs=1e-6)
    assert rec["dur"] == 0.01
    ph, gpu = rec["phases"], rec["gpu"]
    assert ph["data_loader_next"] == 0.002
    assert (ph["h2d"], ph["h2d_sync"]) == (0.0002, 0.0003)          # 500 us - 300 us sync
    assert ph["forward"] == 0.0011                                   # linear 1000 + ones_like 100
    assert ph["backward"] == 0.0032                                  # idle gap 4800-8000
    assert (ph["optimizer_step"], ph["optimizer_step_sync"]) == (0.0011, 0.0004)
    assert ph["sync"] == 0.0002
    assert rec["dur"] - sum(ph.values()) == pytest.approx(0.0015, abs=1e-12)
    assert gpu["forward"] == 0.00063      # union 3720-4300 on stream 7 + 50 on stream 8
    assert gpu["backward"] == 0.0015      # launched by the autograd thread
    assert gpu["h2d"] == 0.0001 and gpu["optimizer_step"] == 0.0002
    assert gpu["other_threads"] == 0.00003
    assert rec["kinds"]["data_loader_next"] == "starvation"
    assert rec["kinds"]["h2d_sync"] == "sync" and rec["kinds"]["backward"] == "compute"
    assert rec["mem"] == {"allocated": 1048576, "reserved": 2097152}


def test_lines_are_meta_first_then_iterations() -> None:
    conv = convert_trace(DATA / "kineto_rules" / "trace.json")
    lines = list(conv.lines())
    assert len(lines) == 4
    assert json.loads(lines[0])["type"] == "meta"
    assert [json.loads(line)["iter"] for line in lines[1:3]] == [1, 2]
    # then the device [memory] event (ts 10500 us, inside step 1 [1000, 11000) us)
    # as a sys record on the iterations' time base (baseTimeNanoseconds 1.7e18)
    (sample,) = map(json.loads, lines[3:])
    assert sample == {"type": "sys", "ts": pytest.approx(1_700_000_000.0105, abs=1e-6),
                      "iter": 1, "cuda": {"allocated": 1048576, "reserved": 2097152}}
    assert conv.to_jsonl() == "".join(line + "\n" for line in lines)


def test_gzip_is_detected_by_content_not_name(tmp_path: Path) -> None:
    src = DATA / "kineto_rules" / "trace.json"
    odd = tmp_path / "profile.bin"
    odd.write_bytes(gzip.compress(src.read_bytes()))
    assert looks_like_trace(odd)
    assert convert_trace(odd).records == convert_trace(src).records


def test_looks_like_trace_rejects_other_files(tmp_path: Path) -> None:
    jsonl = tmp_path / "rank0.jsonl"
    jsonl.write_text('{"type": "meta", "rank": 0}\n{"iter": 0, "ts": 1.0, "dur": 0.1, "phases": {}}\n')
    manifest = tmp_path / "run.json"
    manifest.write_text('{"v": 1, "run_id": "x"}')
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    binary = tmp_path / "weights.pt"
    binary.write_bytes(bytes(range(256)) * 10)
    for p in (jsonl, manifest, empty, binary):
        assert not looks_like_trace(p), p.name
    assert looks_like_trace(DATA / "kineto_rules" / "trace.json")
    assert looks_like_trace(DATA / "kineto_annotations" / "trace.json")


def test_find_traces_skips_jsonl_manifest_and_hidden(tmp_path: Path) -> None:
    src = DATA / "kineto_rules" / "trace.json"
    (tmp_path / "sub").mkdir()
    shutil.copy(src, tmp_path / "sub" / "host1.pt.trace.json")
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(src.read_bytes()))
    (tmp_path / "rank0.jsonl").write_text('{"iter": 0, "ts": 1.0, "dur": 0.1, "phases": {}}\n')
    (tmp_path / "run.json").write_text('{"run_id": "x"}')
    (tmp_path / ".hidden.json").write_bytes(src.read_bytes())
    found = [p.relative_to(tmp_path).as_posix() for p in find_traces(tmp_path)]
    assert found == ["b.json.gz", "sub/host1.pt.trace.json"]


def test_rank_from_distributed_info_then_file_name_then_zero(tmp_path: Path) -> None:
    data = json.loads((DATA / "kineto_rules" / "trace.json").read_text())
    del data["distributedInfo"]
    named = tmp_path / "job_rank-7.pt.trace.json"
    named.write_text(json.dumps(data))
    conv = convert_trace(named)
    assert (conv.rank, conv.rank_source, conv.meta["rank"]) == (7, "file name", 7)
    plain = tmp_path / "trace.json"
    plain.write_text(json.dumps(data))
    conv = convert_trace(plain)
    assert (conv.rank, conv.rank_source) == (0, "default")
    assert "world_size" not in conv.meta
    assert convert_trace(plain, rank=5).meta["rank"] == 5


@pytest.mark.parametrize(("name", "rank"), [
    ("rank3.json", 3), ("sampled_rank-1.json.gz", 1), ("RANK_12.trace.json", 12),
    ("rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 0), ("trace.json", None),
])
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_timestamps_without_base_are_epoch_microseconds(tmp_path: Path) -> None:
    data = json.loads((DATA / "kineto_rules" / "trace.json").read_text())
    del data["baseTimeNanoseconds"]
    for ev in data["traceEvents"]:
        if "ts" in ev:
            ev["ts"] += 1_600_000_000_000_000  # epoch µs, as traces without a base have them
    p = tmp_path / "old.json"
    p.write_text(json.dumps(data))
    conv = convert_trace(p)
    assert conv.records[0]["ts"] == pytest.approx(1_600_000_000.001, abs=1e-6)
    assert conv.records[0]["phases"]["backward"] == 0.0032
    assert conv.warnings == []


def test_trace_relative_timestamps_are_flagged(tmp_path: Path) -> None:
    data = json.loads((DATA / "kineto_rules" / "trace.json").read_text())
    del data["baseTimeNanoseconds"]
    p = tmp_path / "relative.json"
    p.write_text(json.dumps(data))
    conv = convert_trace(p)
    assert conv.records[0]["ts"] == pytest.approx(0.001)
    assert any("not on the wall clock" in w for w in conv.warnings)


def test_no_steps_no_annotations_says_how_to_profile() -> None:
    with pytest.raises(TraceError) as err:
        convert_trace(DATA / "kineto_no_steps" / "trace.json")
    text = str(err.value)
    assert "no ProfilerStep#N spans" in text
    assert "schedule=torch.profiler.schedule(" in text and "prof.step()" in text
    assert "kineto_no_steps" in text


def test_without_steps_each_top_level_annotation_is_an_iteration() -> None:
    conv = convert_trace(DATA / "kineto_annotations" / "trace.json")
    assert conv.windows == "annotation"
    # The lone enclosing "benchmark" annotation is descended into.
    assert [(r["iter"], r["name"], r["dur"]) for r in conv.records] == [
        (0, "run_a", 0.02), (1, "run_b", 0.03)]
    assert conv.records[0]["phases"] == {"load_batch": 0.005, "forward": 0.01}
    assert conv.records[1]["phases"] == {"forward": 0.025}
    assert "gpu" not in conv.records[0]   # no device activity in the trace
    assert any("prof.step()" in w for w in conv.warnings)


def test_truncated_trace_is_a_clear_error(tmp_path: Path) -> None:
    text = (DATA / "kineto_rules" / "trace.json").read_text()
    p = tmp_path / "cut.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(TraceError, match=r"cut\.json is not valid JSON"):
        convert_trace(p)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        convert_trace(tmp_path / "nope.json")


@pytest.mark.parametrize(("raw", "phase"), [
    ("## forward ##", "forward"), ("## data_load ##", "data_load"),
    ("a/b", "a_b"), ("  step  ", "step"), ("###", "###"),
])
def test_annotation_phase_names(raw: str, phase: str) -> None:
    assert annotation_phase(raw) == phase


def test_loader_traces() -> None:
    heavy = convert_trace(DATA / "kineto_loader_40" / "trace.json").records
    light = convert_trace(DATA / "kineto_loader_1" / "trace.json").records
    assert len(heavy) == len(light) == 5
    rest = {"h2d": 0.001, "forward": 0.02, "backward": 0.029, "optimizer_step": 0.009}
    for rec in heavy:
        assert rec["dur"] == 0.1
        assert rec["phases"] == {"data_loader_next": 0.04, **rest}
        assert rec["gpu"] == {"data_loader_next": 0.0, "h2d": 0.0005, "forward": 0.019,
                              "backward": 0.027, "optimizer_step": 0.005}
    for rec in light:
        assert rec["dur"] == 0.0606
        assert rec["phases"] == {"data_loader_next": 0.0006, **rest}


# ------------------------------------------------------------------ shared traces

SHARED_STEPPED = [
    "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "nccl_parser_config/nccl_data.json.gz",
    "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "trace_filter/sampled_rank-0.json.gz",
    "trace_filter/sampled_rank-1.json.gz",
]


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _union_per_stream_us(intervals: dict[tuple, list[tuple[float, float]]]) -> float:
    total = 0.0
    for ivs in intervals.values():
        ivs.sort()
        a, b = ivs[0]
        for x, y in ivs[1:]:
            if x > b:
                total += b - a
                a, b = x, y
            else:
                b = max(b, y)
        total += b - a
    return total


@needs_shared
@pytest.mark.parametrize("rel", SHARED_STEPPED)
def test_steps_and_device_time_match_the_trace(rel: str) -> None:
    path = SHARED / rel
    events = _events(path)
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")
                    and e["cat"] == "user_annotation"), key=lambda e: e["ts"])
    device = [e for e in events if e["cat"] in DEVICE_CATS]
    runtime = [e for e in events if e["cat"] in RUNTIME_CATS and "correlation" in e.get("args", {})]
    conv = convert_trace(path)
    assert conv.windows == "ProfilerStep"
    assert [r["iter"] for r in conv.records] == [int(s["name"].split("#")[1]) for s in steps]
    for step, rec in zip(steps, conv.records, strict=True):
        assert rec["dur"] == pytest.approx(step["dur"] / 1e6, abs=1e-9)
        # Top-level phases never overlap: they sum to at most the step.
        assert sum(rec["phases"].values()) <= rec["dur"] + 1e-9
        # Device time: per-stream union of what was launched (any thread) in the step.
        s0, s1 = step["ts"], step["ts"] + step["dur"]
        corrs = {e["args"]["correlation"] for e in runtime if s0 <= e["ts"] < s1}
        per_stream: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        for e in device:
            # NCCL's send/recv kernels wait for a peer: not the phase's compute (KINETO.md)
            if e["args"].get("correlation") in corrs and not P2P_KERNEL.match(e["name"]):
                key = (e["args"].get("device"), e["args"].get("stream"))
                per_stream[key].append((e["ts"], e["ts"] + e["dur"]))
        expected = _union_per_stream_us(per_stream) / 1e6 if per_stream else 0.0
        # Each phase is rounded to 1 ns, hence a few ns of slack.
        gpu = rec.get("gpu", {})
        assert sum(gpu.values()) == pytest.approx(expected, abs=len(gpu) * 1e-9)


@needs_shared
def test_wall_clock_from_base_time_nanoseconds() -> None:
    """nccl_data has baseTimeNanoseconds 1711964646e9 and step 4 at ts 4458676416788.066 µs."""
    rec = convert_trace(SHARED / "nccl_parser_config/nccl_data.json.gz").records[0]
    assert rec["ts"] == pytest.approx(1711964646 + 4458676.416788066, abs=1e-6)


@needs_shared
def test_nanosecond_trace_keeps_its_resolution() -> None:
    conv = convert_trace(SHARED / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    assert [r["dur"] for r in conv.records][:2] == [0.035115869, 0.072077474]
    assert conv.meta["host"] == "twshared39868.02.pnb3.facebook.com"
    rec = conv.records[1]
    assert list(rec["phases"]) == ["zero_grad", "forward", "backward", "optimizer"]
    assert rec["kinds"] == {"zero_grad": "compute"}


@needs_shared
def test_trace_filter_pair_has_ranks_0_and_1() -> None:
    convs = [convert_trace(p) for p in find_traces(SHARED / "trace_filter")]
    assert [(c.rank, c.rank_source, c.world_size) for c in convs] == [
        (0, "distributedInfo", 128), (1, "distributedInfo", 128)]
    assert [len(c.records) for c in convs] == [2, 2]


@needs_shared
def test_rocm_trace_maps_hip_calls() -> None:
    conv = convert_trace(SHARED / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    rec = conv.records[0]
    assert conv.rank_source == "default"
    # hipMemcpyWithStream (blocking) nested in aten::to -> h2d_sync; backward on thread 598009.
    assert list(rec["phases"]) == ["forward", "h2d", "h2d_sync", "backward", "optimizer_step"]
    assert rec["phases"]["h2d_sync"] == pytest.approx((60.204 + 35.568) / 1e6, abs=1e-9)
    assert rec["gpu"]["backward"] > 0
    # Wall clock: baseTimeNanoseconds 1735632360e9 + ts 4203669603187.439 µs.
    assert rec["ts"] == pytest.approx(1735632360 + 4203669.603187439, abs=1e-6)


@needs_shared
def test_alexnet_without_steps_uses_its_annotations() -> None:
    conv = convert_trace(SHARED / "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    assert conv.windows == "annotation"
    assert [(r["iter"], r["name"], r["dur"]) for r in conv.records] == [
        (0, "[param|pytorch.model.alex_net|0|0|0|warmup|forward]", 12.757093),
        (1, "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 0.079678)]
    assert any("prof.step()" in w for w in conv.warnings)


def test_every_phase_of_a_record_has_a_gpu_entry() -> None:
    for rec in convert_trace(DATA / "kineto_rules" / "trace.json").records:
        assert set(rec["phases"]) <= set(rec["gpu"])


@pytest.mark.parametrize(("name", "stem"), [
    ("rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "rank-0.Apr_03_18_51_38.1102"),
    ("sampled_rank-1.json.gz", "sampled_rank-1"), ("trace.json", "trace"), ("job.bin", "job.bin"),
])
def test_trace_stem(name: str, stem: str) -> None:
    assert trace_stem(name) == stem


def test_plan_gives_colliding_ranks_their_file_as_worker(tmp_path: Path) -> None:
    data = json.loads((DATA / "kineto_rules" / "trace.json").read_text())
    (tmp_path / "a_rank3.json").write_text(json.dumps(data))            # distributedInfo: 3
    del data["distributedInfo"]
    (tmp_path / "host1.pt.trace.json").write_text(json.dumps(data))     # default 0
    (tmp_path / "host2.pt.trace.json").write_text(json.dumps(data))     # default 0
    (tmp_path / "rank_5.json").write_text(json.dumps(data))             # file name: 5
    plans = plan_traces(sorted(tmp_path.iterdir()))
    assert [(p.path.name, p.rank, p.rank_source, p.worker) for p in plans] == [
        ("a_rank3.json", 3, "distributedInfo", None),
        ("host1.pt.trace.json", 0, "default", "host1"),
        ("host2.pt.trace.json", 0, "default", "host2"),
        ("rank_5.json", 5, "file name", None),
    ]
    conv = convert_trace(plans[1].path, rank=plans[1].rank, worker=plans[1].worker)
    assert conv.meta["worker"] == "host1" and conv.meta["rank"] == 0


def test_memory_comes_from_the_device_with_most_samples(tmp_path: Path) -> None:
    data = json.loads((DATA / "kineto_rules" / "trace.json").read_text())
    sample = next(e for e in data["traceEvents"] if e.get("name") == "[memory]")
    more = [dict(sample, ts=10600, args={**sample["args"], "Total Allocated": 3 << 20}),
            dict(sample, ts=10700, args={**sample["args"], "Device Id": 1, "Total Allocated": 7}),
            dict(sample, ts=10800, args={**sample["args"], "Device Type": 0, "Device Id": -1,
                                         "Total Allocated": 9})]   # host memory: ignored
    data["traceEvents"].extend(more)
    p = tmp_path / "mem.json"
    p.write_text(json.dumps(data))
    recs = convert_trace(p).records
    assert [r["mem"]["allocated"] for r in recs] == [3 << 20, 3 << 20]


def test_real_torch_cpu_trace_maps_every_top_level_span() -> None:
    """A trace torch 2.13 wrote (tests/data/kineto_torch_cpu): phases equal the
    top-level spans of each step, found here by a plain nesting walk, plus the
    gaps between consecutive autograd nodes (inside backward())."""
    path = DATA / "kineto_torch_cpu" / "vm_468.pt.trace.json.gz"
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"
              and e.get("cat") in ("cpu_op", "user_annotation")]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    conv = convert_trace(path)
    assert conv.meta["host"] == "vm" and conv.rank_source == "default"
    assert [r["iter"] for r in conv.records] == [2, 3, 4, 5]
    base = doc["baseTimeNanoseconds"] / 1e9
    for step, rec in zip(steps, conv.records, strict=True):
        s0, s1 = step["ts"], step["ts"] + step["dur"]
        inside = sorted((e for e in events if s0 <= e["ts"] < s1 and e is not step),
                        key=lambda e: (e["ts"], -e["dur"]))
        tops, end = [], float("-inf")
        for e in inside:
            if e["ts"] >= end:
                tops.append(e)
                end = e["ts"] + e["dur"]
        expected: dict[str, float] = {}
        for e in tops:
            name = e["name"]
            if name.startswith("enumerate(DataLoader)#"):
                phase = "data_loader_next"
            elif name.startswith("autograd::engine::evaluate_function"):
                phase = "backward"
            elif name.startswith("Optimizer.step#"):
                phase = "optimizer_step"
            elif name.startswith("Optimizer.zero_grad#"):
                phase = "zero_grad"
            else:   # "## forward ##" and the aten::ones_like of backward()
                phase = "forward"
            expected[phase] = expected.get(phase, 0.0) + e["dur"] / 1e6
        # The thread is inside backward() between two of its autograd nodes: a
        # gap between two consecutive backward spans is backward time too.
        for a, b in pairwise(tops):
            if all(x["name"].startswith("autograd::engine::evaluate_function") for x in (a, b)):
                expected["backward"] += (b["ts"] - (a["ts"] + a["dur"])) / 1e6
        assert rec["ts"] == pytest.approx(base + s0 / 1e6, abs=1e-6)
        assert rec["dur"] == pytest.approx(step["dur"] / 1e6, abs=1e-9)
        assert list(rec["phases"]) == ["data_loader_next", "forward", "zero_grad", "backward",
                                       "optimizer_step"]
        assert rec["phases"] == pytest.approx(expected, abs=1e-8)
        assert "gpu" not in rec   # a CPU-only trace measures no device time


def test_memory_events_become_sys_samples_one_per_slot(tmp_path: Path) -> None:
    """Device ``[memory]`` events -> ``sys`` records: of the device with the most
    events, the last of each 10 ms slot (MEMORY_SLOT_S); another device's and the
    host's (Device Type 0) events are left out. By hand: slot 0 [0, 10000) us
    holds 2000 and 2500 (2500 kept, alloc 3 MiB, no reserved), slot 1 holds the
    trace's own 10500 (1 MiB / 2 MiB); both inside step 1 [1000, 11000) us."""
    from tlog.ingest.kineto_map import MEMORY_SLOT_S

    assert MEMORY_SLOT_S == 0.01
    data = json.loads((DATA / "kineto_rules" / "trace.json").read_text())

    def mem(ts: int, dev_type: int, dev: int, alloc: int, reserved: int | None = None) -> dict:
        args = {"Device Type": dev_type, "Device Id": dev, "Bytes": 1,
                "Total Allocated": alloc}
        if reserved is not None:
            args["Total Reserved"] = reserved
        return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 100,
                "tid": 100, "ts": ts, "s": "t", "args": args}

    data["traceEvents"] += [mem(2000, 1, 0, 2 << 20, 4 << 20), mem(2500, 1, 0, 3 << 20),
                            mem(3000, 1, 1, 9 << 20, 9 << 20), mem(4000, 0, 0, 7 << 20, 7)]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(data))
    conv = convert_trace(path)
    base = 1_700_000_000.0
    assert conv.samples == [
        {"type": "sys", "ts": pytest.approx(base + 0.0025, abs=1e-6), "iter": 1,
         "cuda": {"allocated": 3 << 20}},
        {"type": "sys", "ts": pytest.approx(base + 0.0105, abs=1e-6), "iter": 1,
         "cuda": {"allocated": 1048576, "reserved": 2097152}}]


def test_ddp_gloo_exposed_wait_matches_the_timers() -> None:
    """A real gloo DDP trace (tests/data/kineto_ddp_gloo, 6 steps of rank 0) against
    the bare timers of the same process: per step, ``collective_wait`` is the
    exposed all-reduce wait the script's comm hook measured (backward's return -
    the last bucket's hook call), and the rank's own work (what the straggler
    check uses: the step less the data fetch and the wait) is the timers' step -
    data - wait. The stepping thread launched the last bucket from inside
    backward and then sat in the ``c10d::allreduce_`` call, in the rest of the
    launching ``AccumulateGrad``, in DDP's copies back and in idle gaps (step 29:
    20.5 ms inside the call): all of it is the wait (docs/KINETO.md, gaps rule 5).

    The wait within 0.5 ms per step (-0.04 to +0.16 ms here since it starts at
    the bucket's copy, below; -0.27 to -0.05 from the call): the timers' edges
    are the hook's Python entry and backward's return, not spans; own work within 1.5 ms (the spans' and
    the timers' edges also differ: the step by 0.05-0.07 ms, the data fetch by
    0.02 ms and, in step 12, 0.86 ms). Before rule 5 the wait read 0.7-21 ms
    short (idle gaps only) and own work as much over.
    """
    conv = convert_trace(DATA / "kineto_ddp_gloo" / "rank0.pt.trace.json.gz")
    truth = json.loads((DATA / "kineto_ddp_gloo" / "truth-rank0.json").read_text())["per_step"]
    assert [r["iter"] for r in conv.records] == [s["step"] for s in truth]
    for rec, st in zip(conv.records, truth, strict=True):
        ph = rec["phases"]
        assert ph["collective_wait"] == pytest.approx(st["comm_wait_s"], abs=5e-4), rec["iter"]
        own = rec["dur"] - ph["data_loader_next"] - ph["collective_wait"]
        assert own == pytest.approx(st["step_s"] - st["data_s"] - st["comm_wait_s"],
                                    abs=1.5e-3), rec["iter"]
        assert rec["kinds"]["collective_wait"] == "sync"


def _stepping_spans(path: Path, step: int) -> list[dict]:
    """The complete spans of ``ProfilerStep#step``'s thread inside that step, by start."""
    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    s = next(e for e in ev if e["name"] == f"ProfilerStep#{step}")
    return sorted((e for e in ev if e["tid"] == s["tid"] and s["ts"] <= e["ts"] < s["ts"] + s["dur"]
                   and e is not s), key=lambda e: e["ts"])


def test_ddp_gloo_wait_starts_when_the_last_bucket_is_ready() -> None:
    """DDP's exposed wait starts when its last bucket is ready, not at the collective
    call: rank 1 of an input_straggler trace run (tests/data/kineto_ddp_gloo,
    ``rank1-input_straggler``, steps 16, 20, 36) on two busy cores.

    In step 20 the stepping thread sat 4.3 ms between DDP's copy of the last
    gradient into its bucket (``torch::distributed::reducer::copy_``, after which
    DDP calls the comm hook) and the hook's ``c10d::allreduce_`` call: the comm
    hook's timer counts it as the wait, as ``rec.watch_ddp`` does; from the call the
    wait read 5.5 ms of the timers' 10.0 (the rest own work). In step 16 it sat
    12.2 ms after DDP's last copy back with nothing in the trace until
    ``Optimizer.step`` (still inside ``backward()`` by the timers, which count it as
    the wait): the trace cannot tell that from the loop's own code, so it stays
    time in no phase, and the wait is the timers' less that stretch. Each within
    0.5 ms (the spans' and the timers' edges, as in the test above).
    """
    path = DATA / "kineto_ddp_gloo" / "rank1-input_straggler.pt.trace.json.gz"
    conv = convert_trace(path)
    truth = {s["step"]: s for s in json.loads(
        (DATA / "kineto_ddp_gloo" / "truth-rank1-input_straggler.json").read_text())["per_step"]}
    wait = {r["iter"]: r["phases"]["collective_wait"] for r in conv.records}
    assert sorted(wait) == [16, 20, 36]

    spans = _stepping_spans(path, 20)
    call = max(e["ts"] for e in spans if e["name"] == "c10d::allreduce_")
    filled = max(e["ts"] + e["dur"] for e in spans
                 if e["name"] == "torch::distributed::reducer::copy_" and e["ts"] < call)
    assert call - filled > 4000, "the fixture holds a stretch between bucket ready and the call"
    assert wait[20] == pytest.approx(truth[20]["comm_wait_s"], abs=5e-4)
    assert wait[36] == pytest.approx(truth[36]["comm_wait_s"], abs=5e-4)

    spans = _stepping_spans(path, 16)
    copied = max(e["ts"] + e["dur"] for e in spans if "copy_bucket_to_grad" in e["name"])
    opt = min(e["ts"] for e in spans if e["name"].startswith("Optimizer.step#"))
    assert opt - copied > 10_000, "the fixture holds an idle stretch after the copies back"
    assert wait[16] == pytest.approx(truth[16]["comm_wait_s"] - (opt - copied) / 1e6, abs=5e-4)


def test_ddp_gloo_wait_without_bucket_copy_starts_at_the_call(tmp_path: Path) -> None:
    """Without DDP's reducer span before the collective call (a torch that does not
    record it), the exposed wait starts at the call: step 20 of the trace above with
    its ``torch::distributed::reducer::copy_`` spans removed reads the timers' wait
    less the 4.3 ms between the bucket's copy and the call (within 0.5 ms)."""
    src = DATA / "kineto_ddp_gloo" / "rank1-input_straggler.pt.trace.json.gz"
    spans = _stepping_spans(src, 20)
    call = max(e["ts"] for e in spans if e["name"] == "c10d::allreduce_")
    filled = max(e["ts"] + e["dur"] for e in spans
                 if e["name"] == "torch::distributed::reducer::copy_" and e["ts"] < call)
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if e.get("name") != "torch::distributed::reducer::copy_"]
    path = tmp_path / "rank1.pt.trace.json"
    path.write_text(json.dumps(doc))
    truth = {s["step"]: s for s in json.loads(
        (DATA / "kineto_ddp_gloo" / "truth-rank1-input_straggler.json").read_text())["per_step"]}
    wait = {r["iter"]: r["phases"]["collective_wait"] for r in convert_trace(path).records}
    assert wait[20] == pytest.approx(truth[20]["comm_wait_s"] - (call - filled) / 1e6, abs=5e-4)


def _span(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur}


def test_p2p_spans_in_flight_while_the_thread_idles_are_waits(tmp_path: Path) -> None:
    """A pipeline stage's step, by hand (KINETO.md "Point-to-point waits"): inside
    ``Forward 0`` (1000-5000 µs) the thread is in ``c10d::recv_`` 1000-1100 (a
    point-to-point call: 100 µs of recv_wait), then runs nothing until ``aten::mm``
    at 4000 while its ``gloo:recv`` is in flight to 4000 (2900 µs more); so
    Forward 0 keeps 4000 - 3000 = 1000 µs. At top level, ``c10d::send``
    (5000-5050, 50 µs of send_wait), then the thread idles while its
    ``gloo:send`` is in flight to 8000 (2950 µs more); 8000-9000 idle, no transfer
    ending in it, stays in no phase."""
    events = [
        _span("ProfilerStep#1", 0, 10_000, "user_annotation"),
        _span("Forward 0", 1000, 4000, "user_annotation"),
        _span("c10d::recv_", 1000, 100),
        _span("gloo:recv", 1050, 2950, "user_annotation"),
        _span("aten::mm", 4000, 800),
        _span("c10d::send", 5000, 50),
        _span("gloo:send", 5010, 2990, "user_annotation"),
        _span("Optimizer.step#SGD.step", 9000, 500, "user_annotation"),
    ]
    p = tmp_path / "rank0.pt.trace.json"
    p.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
                             "traceEvents": events}))
    (rec,) = convert_trace(p).records
    ph = rec["phases"]
    assert ph["Forward 0"] == pytest.approx(0.0010, abs=1e-9)
    assert ph["recv_wait"] == pytest.approx(0.0030, abs=1e-9)
    assert ph["send_wait"] == pytest.approx(0.0030, abs=1e-9)
    assert ph["optimizer_step"] == pytest.approx(0.0005, abs=1e-9)
    assert set(ph) == {"Forward 0", "recv_wait", "send_wait", "optimizer_step"}
    assert rec["kinds"]["recv_wait"] == "sync" and rec["kinds"]["send_wait"] == "sync"
    # in no phase: 0-1000, 8000-9000 and 9500-10000 (4800-5000 is Forward 0's own time)
    assert rec["dur"] - sum(ph.values()) == pytest.approx(0.0025, abs=1e-9)
