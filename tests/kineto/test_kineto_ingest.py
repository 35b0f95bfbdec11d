"""torch.profiler traces through ``tlog ingest`` into the database, then the
diagnosis and the comparison on them (docs: "Done when")."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from tlog.analyze.compare import compare
from tlog.ingest.errors import TraceError

from tests.support.cli import assert_one_line_error, invoke
from tlog import analyze, ingest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SHARED = ROOT.parent / "shared" / "traces" / "hta"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(),
                                  reason=f"shared traces not found at {SHARED}")


@pytest.fixture
def con(tmp_path: Path):
    c = ingest.connect(tmp_path / "tlog.duckdb")
    yield c
    c.close()


def _rows(con, sql: str, *params) -> list[tuple]:
    return con.execute(sql, list(params)).fetchall()


def test_rules_trace_lands_in_the_tables(con, tmp_path: Path) -> None:
    run = tmp_path / "hand"
    run.mkdir()
    shutil.copy(DATA / "kineto_rules" / "trace.json", run / "trace.json")
    rep = ingest.ingest_run(con, run)
    assert rep.run_id == "hand" and rep.source == "kineto"
    # sys 1: the trace's one device [memory] event (ts 10500 us, in step 1)
    assert rep.records_loaded == {"iter": 2, "queue": 0, "event": 0, "meta": 1, "sys": 1}
    assert rep.records_rejected == 0 and rep.duplicates == 0
    assert _rows(con, "SELECT source, world_size FROM runs WHERE run_id = 'hand'") == [("kineto", 4)]
    assert _rows(con, "SELECT worker, ts, iter, cuda_allocated, cuda_reserved, rss_bytes "
                      "FROM sys_samples WHERE run_id = 'hand'") == [
        ("main-3", pytest.approx(1_700_000_000.0105, abs=1e-6), 1, 1048576, 2097152, None)]
    phases = _rows(con, """SELECT seq, phase, parent, host_s, gpu_s, category FROM phases
                           WHERE run_id = 'hand' AND iter = 1 ORDER BY seq""")
    assert [(p[1], p[2], p[5]) for p in phases] == [
        ("data_loader_next", None, "starvation"), ("h2d", None, "compute"),
        ("h2d_sync", None, "sync"), ("forward", None, "compute"), ("backward", None, "compute"),
        ("optimizer_step", None, "compute"), ("optimizer_step_sync", None, "sync"),
        ("sync", None, "sync"), ("other_threads", None, "compute")]
    assert [p[0] for p in phases] == list(range(9))
    assert phases[-1][3] is None and phases[-1][4] == pytest.approx(3e-5)   # gpu-only key
    cats = _rows(con, """SELECT rank, worker, dur, starvation_s, compute_s, sync_s, unaccounted_s
                         FROM iteration_categories WHERE run_id = 'hand' AND iter = 1""")
    rank, worker, dur, starv, comp, sync, unacc = cats[0]
    assert (rank, worker, dur) == (3, "main-3", 0.01)
    assert starv == pytest.approx(0.002)
    assert sync == pytest.approx(0.0003 + 0.0004 + 0.0002)
    assert comp == pytest.approx(0.0002 + 0.0011 + 0.0032 + 0.0011)
    assert unacc == pytest.approx(0.0015)
    mem = _rows(con, "SELECT mem_allocated, mem_reserved FROM iterations "
                     "WHERE run_id = 'hand' ORDER BY iter")
    assert mem == [(1048576, 2097152)] * 2


def test_reingest_of_unchanged_traces_loads_nothing(con, tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    shutil.copy(DATA / "kineto_rules" / "trace.json", run / "trace.json")
    ingest.ingest_run(con, run)
    again = ingest.ingest_run(con, run)
    assert again.records_total == 0 and again.files_unchanged == 1 and again.duplicates == 0
    assert _rows(con, "SELECT count(*) FROM iterations") == [(2,)]


def test_traces_and_jsonl_mix_in_one_run(con, tmp_path: Path) -> None:
    run = tmp_path / "mixed"
    run.mkdir()
    (run / "trace.pt.trace.json.gz").write_bytes(
        gzip.compress((DATA / "kineto_rules" / "trace.json").read_bytes()))
    (run / "rank0.target.jsonl").write_text(
        '{"type": "meta", "rank": 0, "stage": "target"}\n'
        '{"iter": 0, "ts": 1700000000.0, "dur": 0.5, "phases": {"forward": 0.4}}\n')
    rep = ingest.ingest_run(con, run)
    assert rep.files == 2 and rep.records_loaded["iter"] == 3
    assert _rows(con, "SELECT DISTINCT rank, stage FROM iterations ORDER BY rank") == [
        (0, "target"), (3, "main")]
    # A run with both kinds of files is not a pure trace run.
    assert _rows(con, "SELECT source FROM runs") == [("jsonl",)]


def test_ranks_shared_by_several_traces_get_their_file_as_worker(con, tmp_path: Path) -> None:
    data = json.loads((DATA / "kineto_rules" / "trace.json").read_text())
    del data["distributedInfo"]
    run = tmp_path / "hosts"
    run.mkdir()
    for name in ("host1.pt.trace.json", "host2.pt.trace.json"):
        (run / name).write_text(json.dumps(data))
    rep = ingest.ingest_run(con, run)
    assert rep.duplicates == 0
    assert _rows(con, "SELECT rank, worker, count(*) FROM iterations GROUP BY ALL ORDER BY worker") \
        == [(0, "host1", 2), (0, "host2", 2)]


def test_trace_without_iterations_stops_the_ingest_with_the_how_to(con) -> None:
    with pytest.raises(TraceError, match=r"prof\.step\(\)"):
        ingest.ingest_run(con, DATA / "kineto_no_steps")


def test_cli_ingests_a_trace_file_with_run_id(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    res = invoke(["ingest", str(DATA / "kineto_rules" / "trace.json"),
                  "--run-id", "mine", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["run_id"] == "mine" and out["source"] == "kineto"
    assert out["records_loaded"]["iter"] == 2


def test_cli_no_steps_is_one_line_exit_1(tmp_path: Path) -> None:
    res = invoke(["ingest", str(DATA / "kineto_no_steps" / "trace.json"),
                  "--db", str(tmp_path / "t.duckdb")])
    line = assert_one_line_error(res, 1)
    assert line.startswith("tlog: error: trace ") and "schedule=" in line


def test_loader_at_40_percent_is_starvation_bound_and_at_1_percent_is_not(con) -> None:
    for case in ("kineto_loader_40", "kineto_loader_1"):
        ingest.ingest_run(con, DATA / case)
    heavy = analyze.diagnose(con, "kineto_loader_40").to_dict()
    light = analyze.diagnose(con, "kineto_loader_1").to_dict()
    assert heavy["bottleneck"]["category"] == "starvation"
    assert heavy["bottleneck"]["phase"] == "data_loader_next"
    assert heavy["categories"]["starvation"] == pytest.approx(0.40, abs=1e-6)
    assert heavy["device_times"] is True
    assert light["bottleneck"]["category"] == "compute"
    assert light["categories"]["starvation"] == pytest.approx(0.0006 / 0.0606, abs=1e-6)


def test_compare_names_the_loader_first(con) -> None:
    for case in ("kineto_loader_40", "kineto_loader_1"):
        ingest.ingest_run(con, DATA / case)
    c = compare(con, "kineto_loader_1", "kineto_loader_40")
    top = c.contributors[0]
    assert (top.phase, top.category) == ("data_loader_next", "starvation")
    assert top.delta_s_per_iter == pytest.approx(0.0394, abs=1e-9)
    assert top.share_of_gap == pytest.approx(1.0, abs=1e-6)
    assert c.throughput_ratio == pytest.approx(0.0606 / 0.1, abs=1e-6)


# ------------------------------------------------------------------ shared traces


@needs_shared
def test_trace_filter_pair_is_one_run_with_ranks_0_and_1(con) -> None:
    rep = ingest.ingest_run(con, SHARED / "trace_filter")
    assert rep.run_id == "trace_filter" and rep.source == "kineto" and rep.files == 2
    assert _rows(con, "SELECT source, world_size FROM runs") == [("kineto", 128)]
    assert _rows(con, "SELECT rank, iter, dur FROM iterations ORDER BY rank, iter") == [
        (0, 551, 0.607312), (0, 552, 0.622928), (1, 551, 0.607904), (1, 552, 0.630639)]


@needs_shared
def test_rocm_trace_ingests(con) -> None:
    path = SHARED / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    rep = ingest.ingest_run(con, path)
    assert rep.run_id == "mi250_minitoy_train_ROCm6_2_kineto" and rep.source == "kineto"
    assert rep.records_loaded["iter"] == 2 and rep.records_rejected == 0
    assert _rows(con, "SELECT iter, dur FROM iterations ORDER BY iter") == [
        (1, 0.009288291), (2, 4.9073e-05)]
    diag = analyze.diagnose(con, rep.run_id).to_dict()
    assert diag["device_times"] is True


@needs_shared
def test_alexnet_without_steps_ingests_one_iteration_per_annotation(con) -> None:
    rep = ingest.ingest_run(con, SHARED / "critical_path" / "alexnet", run_id="alex")
    assert rep.run_id == "alex" and rep.records_loaded["iter"] == 2
    # The conversion's warning is kept with the file's meta; each iteration keeps its name.
    meta = json.loads(_rows(con, "SELECT meta FROM files")[0][0])
    (warning,) = meta["extra"]["warnings"]
    assert warning.startswith("no ProfilerStep spans: the 2 top-level record_function")
    names = [json.loads(x)["name"] for (x,) in _rows(con, "SELECT extra FROM iterations ORDER BY iter")]
    assert names == ["[param|pytorch.model.alex_net|0|0|0|warmup|forward]",
                     "[param|pytorch.model.alex_net|0|0|0|measure|forward]"]


def test_real_torch_trace_of_a_sleeping_loader_is_starvation_bound(con) -> None:
    """tests/data/kineto_torch_cpu: a trace torch 2.13 wrote of a loop whose
    DataLoader sleeps 20 ms per batch (36-59% of each step)."""
    rep = ingest.ingest_run(con, DATA / "kineto_torch_cpu")
    assert rep.source == "kineto" and rep.records_loaded["iter"] == 4
    diag = analyze.diagnose(con, "kineto_torch_cpu").to_dict()
    assert diag["bottleneck"]["category"] == "starvation"
    assert diag["bottleneck"]["phase"] == "data_loader_next"
    assert diag["device_times"] is False


def test_a_trace_behind_a_link_out_of_the_run_is_never_read(tmp_path: Path) -> None:
    """Nothing outside the run directory is read. A link to a trace
    outside the run is not opened (ingest warns about it once); a link inside the
    run to a trace it holds reads that trace once, not twice."""
    src = Path(__file__).parents[1] / "data" / "kineto_loader_1" / "trace.json"
    outside = tmp_path / "elsewhere.json"
    shutil.copy(src, outside)
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(src, run / "trace.json")
    (run / "out.json").symlink_to(outside)
    (run / "again.json").symlink_to(run / "trace.json")
    assert ingest.kineto.find_traces(run) == [run / "trace.json"]
    db = tmp_path / "t.duckdb"
    res = invoke(["ingest", str(run), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["files_read"] == 1
    assert sum("out.json" in w and "symbolic link out of the run" in w
               for w in report["warnings"]) == 1
    with ingest.connect(db) as con:
        assert con.execute("SELECT path FROM files").fetchall() == [("trace.json",)]


def test_a_trace_read_counts_its_size_on_disk(tmp_path: Path) -> None:
    """What `tlog ingest` says it read of a trace is the trace file (a new user saw
    '0.0 MB' for 77 MB of traces: the converted records were counted)."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(DATA / "kineto_loader_1" / "trace.json", run / "trace.json")
    with ingest.connect(tmp_path / "t.duckdb") as con:
        report = ingest.ingest_run(con, run)
        assert report.bytes_read == (run / "trace.json").stat().st_size
        assert ingest.ingest_run(con, run).bytes_read == 0      # unchanged: nothing read
