"""Megatron-LM and DeepSpeed timer logs ingest through the ``timer_log`` source
: the sample logs in tests/data/timer_logs (formats and provenance in
its README) load with the figures read off their lines by hand, and
``tlog diagnose`` names the bottleneck the lines show. GPT-NeoX, DeepSpeed's
pipeline engine, NeMo 2, Megatron-LM of 2020 and a key=value fork are
written in the tests by tests/ingest/framework_logs.py, with the projects'
own format strings (its docstring names each source).

Every expected number below is computed in the test from the values printed
in the sample lines (milliseconds in the logs, seconds in tlog).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import framework_logs
import pytest
from tlog.ingest.sources import discover, installed_sources
from tlog.ingest.timer_logs import (
    decode_timer_log,
    find_timer_logs,
    parse_lines,
    place_megatron,
)

from tests.support.cli import invoke
from tlog import analyze, ingest

DATA = Path(__file__).resolve().parents[1] / "data" / "timer_logs"
KINETO = Path(__file__).resolve().parents[1] / "data" / "kineto_loader_1"


@pytest.fixture
def con(tmp_path: Path):
    c = ingest.connect(tmp_path / "tlog.duckdb")
    yield c
    c.close()


def _phase_sums(con, run: str) -> dict[str, tuple[float, str, str | None]]:
    rows = con.execute("SELECT phase, sum(host_s), any_value(category), any_value(parent) "
                       "FROM phases WHERE run_id = ? GROUP BY phase", [run]).fetchall()
    return {p: (s, c, parent) for p, s, c, parent in rows}


def _iters(con, run: str) -> list[tuple]:
    return con.execute("SELECT worker, rank, iter, dur, samples, tokens FROM iterations "
                       "WHERE run_id = ? ORDER BY worker, iter", [run]).fetchall()


def test_the_source_is_declared_as_an_entry_point() -> None:
    assert "timer_log" in [s.kind for s in installed_sources()]


def test_megatron_minmax_block_under_torchrun_tee(con) -> None:
    """Megatron-LM 2024 layout, last rank (``[default3]:``) printing, another
    rank's text interleaved, even inside a timer block; log_interval 5 with the
    newer first-iteration line at iteration 1."""
    rep = ingest.ingest_run(con, DATA / "megatron_starved", run_id="mg")
    # 11 start-up lines, 1 memory line, 1 c10d warning inside the iteration-10
    # block, 3 lines after training
    assert rep.lines_skipped == 16
    assert rep.records_rejected == 0
    rows = _iters(con, "mg")
    # intervals end at iterations 1, 5, 10, 15, 20: 1 + 4 + 5 + 5 + 5 rows
    assert [r[2] for r in rows] == list(range(1, 21))
    assert {(r[0], r[1]) for r in rows} == {("megatron-3", 3)}
    elapsed = [2500.0, 1000.0, 1100.0, 1000.0, 1000.0]          # "elapsed time per iteration (ms)"
    counts = [1, 4, 5, 5, 5]
    assert sum(r[3] for r in rows) == pytest.approx(sum(n * e for n, e in zip(counts, elapsed,
                                                                               strict=True)) / 1e3)
    assert [r[3] for r in rows[1:5]] == pytest.approx([1.0] * 4)
    assert [r[3] for r in rows[5:10]] == pytest.approx([1.1] * 5)
    # "global batch size: 32" per iteration adds up to the last line's "consumed samples: 640"
    assert sum(r[4] for r in rows) == 640
    # tokens: samples x the argument dump's "seq_length ... 2048"
    assert {r[5] for r in rows} == {32 * 2048}
    sums = _phase_sums(con, "mg")
    bg_max = [1200.0, 450.0, 550.0, 450.0, 450.0]               # batch-generator (min, max): max
    assert sums["forward-backward/batch-generator"] == pytest.approx(
        (sum(n * v for n, v in zip(counts, bg_max, strict=True)) / 1e3, "starvation",
         "forward-backward"))
    assert sums["forward-backward/all-grads-sync"][:2] == pytest.approx(
        ((80.0 + 19 * 40.0) / 1e3, "sync"))
    assert sums["optimizer/params-all-gather"][1:] == ("sync", "optimizer")
    assert sums["optimizer"][0] == pytest.approx((250.0 + 19 * 150.0) / 1e3)
    assert sums["forward-backward/forward-compute"][1] == "compute"

    d = analyze.diagnose(con, "mg").to_dict()
    assert d["bottleneck"]["category"] == "starvation"
    assert d["bottleneck"]["phase"] == "forward-backward/batch-generator"
    # steady state leaves out the first (warm-up) iteration: iterations 2..20
    steady_dur = 4 * 1.0 + 5 * 1.1 + 10 * 1.0
    assert d["throughput"]["iters_per_s"] == pytest.approx(19 / steady_dur)
    assert d["throughput"]["samples_per_s"] == pytest.approx(19 * 32 / steady_dur)
    assert d["throughput"]["tokens_per_s"] == pytest.approx(19 * 32 * 2048 / steady_dur)
    assert d["categories"]["starvation"] == pytest.approx(
        (4 * 0.450 + 5 * 0.550 + 10 * 0.450) / steady_dur)
    assert any("averages over its iterations" in n for n in d["notes"])


def test_megatron_2021_single_line_resumed_from_a_checkpoint(con) -> None:
    """Megatron-LM before August 2022: ``time (ms) | ...`` after each iteration
    line, no timestamps, resumed at iteration 1000 (so the first interval is
    1001-1010), ``backward-reduce-model-grads`` holding the three reductions."""
    rep = ingest.ingest_run(con, DATA / "megatron_2021", run_id="old")
    assert rep.lines_skipped == 7      # incl. the set-up "time (ms)" line
    rows = _iters(con, "old")
    assert [r[2] for r in rows] == list(range(1001, 1031))
    assert [r[3] for r in rows] == pytest.approx([0.2] * 10 + [0.21] * 10 + [0.4] * 10)
    assert {r[4] for r in rows} == {8}
    sums = _phase_sums(con, "old")
    assert sums["backward-reduce-model-grads"] == pytest.approx(
        (10 * (30.0 + 31.0 + 230.0) / 1e3, "sync", None))
    assert sums["backward-reduce-model-grads/backward-params-all-reduce"][2] == \
        "backward-reduce-model-grads"
    assert sums["forward-compute/batch-generator"] == pytest.approx(
        (30 * 3.0 / 1e3, "starvation", "forward-compute"))
    assert sums["optimizer/optimizer-inner-step"][2] == "optimizer"
    d = analyze.diagnose(con, "old").to_dict()
    assert d["bottleneck"]["category"] == "sync"
    assert d["bottleneck"]["phase"] == "backward-reduce-model-grads"


def test_deepspeed_2023_log_dist_lines_behind_a_progress_bar(con) -> None:
    """DeepSpeed before July 2023 under the Hugging Face Trainer, gradient
    accumulation 2: two micro-step lines, a ZeRO optimizer line and a boundary
    line per step, the first behind a tqdm bar; timestamps from log_dist."""
    rep = ingest.ingest_run(con, DATA / "deepspeed_2023", run_id="ds1")
    assert rep.lines_skipped == 5
    rows = _iters(con, "ds1")
    assert [r[2] for r in rows] == [0, 1, 2]              # one per boundary line
    # forward + backward + step of each boundary line
    engine = [55.0 + 147.0 + 72.0, 54.0 + 148.0 + 70.0, 56.0 + 150.0 + 71.0]
    assert [r[3] for r in rows] == pytest.approx([e / 1e3 for e in engine])
    sums = _phase_sums(con, "ds1")
    assert sums["backward/allreduce"] == pytest.approx(((44.0 + 45.0 + 45.0) / 1e3, "sync",
                                                        "backward"))
    assert sums["optimizer/allgather"] == pytest.approx((3 * 7.5 / 1e3, "sync", "optimizer"))
    assert sums["forward"][0] == pytest.approx((55.0 + 54.0 + 56.0) / 1e3)
    d = analyze.diagnose(con, "ds1").to_dict()
    # the boundary lines are stamped 07:39:10.500, 11.000 and 11.500; the time
    # between engine calls is part of the iterations (tlog's absorbed gaps)
    # (the first starts its own engine time before its stamp): 3 iterations in
    span = (11.5 - 10.5) + engine[0] / 1e3
    assert d["throughput"]["iters_per_s"] == pytest.approx(3 / span)
    assert d["categories"]["sync"] == pytest.approx((44.0 + 45.0 + 45.0 + 3 * 7.5) / 1e3 / span)
    assert any("DeepSpeed timer log: phases are the engine's timers" in n for n in d["notes"])


def test_deepspeed_2024_two_hosts_behind_pdsh(con) -> None:
    """DeepSpeed after July 2023 (``[Rank N] time (ms) | fwd: ...``), lines of
    ranks 0 and 4 on two hosts behind pdsh's ``host: `` tag, no timestamps on
    the timer lines."""
    rep = ingest.ingest_run(con, DATA / "deepspeed_2024", run_id="ds2")
    assert rep.lines_skipped == 6
    rows = _iters(con, "ds2")
    assert [(r[0], r[1], r[2]) for r in rows] == (
        [("deepspeed-node-a-0", 0, i) for i in range(4)] + [("deepspeed-node-b-4", 4, i) for i in range(4)])
    a = 20.0 + (45.0 + 40.0 + 1.0) + 15.0
    b = 20.0 + (45.0 + 90.0 + 1.0) + 15.0
    assert [r[3] for r in rows] == pytest.approx([a / 1e3] * 4 + [b / 1e3] * 4)
    d = analyze.diagnose(con, "ds2").to_dict()
    assert d["bottleneck"]["phase"] == "backward/allreduce"
    assert d["bottleneck"]["category"] == "sync"
    assert any("without timestamps" in n and "upper bound" in n for n in d["notes"])


def test_timer_logs_are_claimed_by_content_and_steal_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(DATA / "megatron_2021" / "pretrain_bert.out", run / "train.log")
    (run / "notes.txt").write_text("time (ms) is what we measure\nnothing else\n")
    # a shim log whose text mentions a Megatron line is still the shim's
    (run / "rank0.jsonl").write_text(json.dumps(
        {"type": "iter", "iter": 0, "ts": 1.7e9, "dur": 0.1,
         "phases": {"elapsed time per iteration (ms)": 0.1}}) + "\n")
    for trace in KINETO.iterdir():
        if trace.is_file() and trace.name != "README.md":
            shutil.copy(trace, run / trace.name)
    assert find_timer_logs(run) == [run / "train.log"]
    kinds = {p.name: s.kind for p, s in discover(run)}
    assert kinds["train.log"] == "timer_log"
    assert kinds["rank0.jsonl"] == "jsonl"
    assert "notes.txt" not in kinds
    assert [k for n, k in kinds.items() if n not in ("train.log", "rank0.jsonl")] and all(
        k == "kineto" for n, k in kinds.items() if n not in ("train.log", "rank0.jsonl"))


def test_a_growing_log_is_loaded_again_whole(con, tmp_path: Path) -> None:
    """A log read while the job runs: the records of a grown file are decoded
    anew (its first interval's length depends on what follows), so the second
    ingest replaces the first's rows instead of appending to them."""
    lines = (DATA / "megatron_2021" / "pretrain_bert.out").read_text().splitlines(keepends=True)
    run = tmp_path / "live"
    run.mkdir()
    log = run / "train.log"
    cut = next(i for i, line in enumerate(lines) if "iteration     1020/" in line)
    log.write_text("".join(lines[:cut]) + lines[cut][:40])     # a half-written line last
    first = ingest.ingest_run(con, run, run_id="live")
    assert first.records_loaded["iter"] == 10
    with open(log, "w") as fh:
        fh.write("".join(lines))
    os.utime(log, (log.stat().st_atime, log.stat().st_mtime + 5))
    ingest.ingest_run(con, run, run_id="live")
    rows = _iters(con, "live")
    assert [r[2] for r in rows] == list(range(1001, 1031))


def test_max_only_and_per_rank_blocks() -> None:
    """``--timing-log-option max`` (one figure) and ``all`` (a figure per rank:
    one worker per rank), written with Megatron's format strings."""
    it = (f" iteration {4:8d}/{8:8d} |" + f" consumed samples: {16:12d} |"
          + f" elapsed time per iteration (ms): {500.0:.1f} |")
    mx = ["max time across ranks (ms):",
          "    {}: {:.2f}".format("forward-backward ".ljust(48, "."), 300.0),
          "    {}: {:.2f}".format("batch-generator ".ljust(48, "."), 120.0)]
    got = parse_lines([it, *mx])
    assert [r["iter"] for r in got.records[1:]] == [1, 2, 3, 4]
    assert got.records[1]["phases"] == {"forward-backward": 0.3,
                                        "forward-backward/batch-generator": 0.12}
    # the same lines behind srun --label's "7: " and pdsh's "gpu-node-2: ",
    # with another task's text between the header and its rows
    for tag, rank, worker in (("7: ", 7, "megatron-7"), ("gpu-node-2: ", 0, "megatron-gpu-node-2-0")):
        got = parse_lines([tag + it, tag + mx[0], "0: unrelated text", *(tag + m for m in mx[1:])])
        assert {(r["rank"], r["worker"]) for r in got.records[1:]} == {(rank, worker)}
        assert got.records[1]["phases"]["forward-backward/batch-generator"] == 0.12
        assert got.lines_skipped == 1
    per = ["times across ranks (ms):", "  forward-backward:", "     rank  0: 300.00",
           "     rank  1: 410.00", "  optimizer:", "     rank  0: 50.00", "     rank  1: 51.00"]
    got = parse_lines([it, *per])
    by_rank = {(r["rank"], r["iter"]): r["phases"] for r in got.records[1:]}
    assert by_rank[(1, 4)] == {"forward-backward": 0.41, "optimizer": 0.051}
    assert by_rank[(0, 1)] == {"forward-backward": 0.3, "optimizer": 0.05}
    assert got.lines_skipped == 0


def test_a_child_longer_than_its_parent_is_placed_top_level() -> None:
    phases, _, left = place_megatron({"optimizer": 10.0, "optimizer-inner-step": 8.0,
                                      "params-all-gather": 30.0, "all-grads-sync": 5.0,
                                      "data-iterator": 1.0})
    assert "params-all-gather" in phases and "optimizer/optimizer-inner-step" in phases
    assert left == ["data-iterator"]


def test_cli_ingest_summary_counts_the_skipped_lines(tmp_path: Path) -> None:
    res = invoke(["ingest", "--db", str(tmp_path / "t.duckdb"),
                  str(DATA / "deepspeed_2024")])
    assert res.exit_code == 0, res.output
    assert "skipped 6 lines of other text in timer logs" in res.output
    text = "".join(decode_timer_log(DATA / "deepspeed_2024" / "job.out"))
    assert json.loads(text.splitlines()[0])["lines_skipped"] == 6


def test_iteration_lines_alone_and_a_checkpoint_block_after_one() -> None:
    """``--timing-log-level 0``: iteration lines only; the ``save-checkpoint``
    block Megatron logs after an iteration line is not that interval's timers
    (and counts as skipped text: 2 lines)."""
    def line(i: int, ms: float) -> str:
        return (f" iteration {i:8d}/{100:8d} |" + f" consumed samples: {i * 4:12d} |"
                + f" elapsed time per iteration (ms): {ms:.1f} |" + f" global batch size: {4:5d} |")
    save = ["(min, max) time across ranks (ms):",
            "    {}: ({:.2f}, {:.2f})".format("save-checkpoint ".ljust(48, "."), 900.0, 950.0)]
    got = parse_lines([line(10, 100.0), *save, line(20, 120.0)])
    iters = got.records[1:]
    assert [r["iter"] for r in iters] == list(range(1, 21))
    assert [r["dur"] for r in iters] == [0.1] * 10 + [0.12] * 10
    assert all(r["phases"] == {} for r in iters)
    assert sum(r["samples"] for r in iters) == 80          # consumed samples at iteration 20
    assert got.lines_skipped == 2
    assert got.warnings == []


def test_deepspeed_micro_step_lines_alone_are_iterations() -> None:
    """A log with micro-step lines and no boundary line (as in
    deepspeedai/DeepSpeed#255's excerpt): each micro-step is an iteration, said
    in a warning."""
    lines = ["time (ms) | " + " | ".join(f"{n}: {v:.2f}" for n, v in (
        ("forward_microstep", f), ("backward_microstep", 330.0),
        ("backward_inner_microstep", 329.0), ("backward_allreduce_microstep", 0.5),
        ("step_microstep", 1.0))) for f in (190.0, 200.0)]
    got = parse_lines(["Epoch 0 starts", *lines])
    iters = got.records[1:]
    assert [r["dur"] for r in iters] == pytest.approx([0.521, 0.531])
    assert iters[0]["phases"]["backward/allreduce"] == pytest.approx(0.0005)
    assert got.lines_skipped == 1
    assert got.warnings and "micro-step" in got.warnings[0]


def test_a_second_resume_in_the_same_log_counts_from_its_checkpoint() -> None:
    def line(i: int) -> str:
        return (f" iteration {i:8d}/{100:8d} |" + f" consumed samples: {i:12d} |"
                + f" elapsed time per iteration (ms): {100.0:.1f} |")
    got = parse_lines(["  successfully loaded checkpoint from /c at iteration 40", line(50),
                       line(60), "  successfully loaded checkpoint from /c at iteration 55",
                       line(58)])
    assert [r["iter"] for r in got.records[1:]] == [*range(41, 61), 56, 57, 58]


def test_a_timer_log_run_has_exact_sync(tmp_path: Path) -> None:
    """A Megatron-LM log written by hand: Megatron's timers synchronise the
    device at start and stop, so the diagnosis calls sync exact (no
    ``no_device_times`` finding, no advice to record phases with a stream),
    and the shares are the lines' own figures over the elapsed time."""
    lines = ["  seq_length ...................................... 2048"]
    for it in range(10, 210, 10):                      # log_interval 10, 20 intervals
        lines += [(f" [2024-05-01 12:{it // 60:02d}:{it % 60:02d}.000000] iteration {it:8d}/"
                   f"     200 | consumed samples: {it * 32:10d} | elapsed time per iteration "
                   f"(ms): 1000.0 | global batch size:    32 | lm loss: 7.0E+00 |"),
                  "(min, max) time across ranks (ms):",
                  "    forward-backward ...............................: (780.00, 800.00)",
                  "    forward-compute ................................: (200.00, 210.00)",
                  "    backward-compute ...............................: (250.00, 260.00)",
                  "    batch-generator ................................: (290.00, 300.00)",
                  "    all-grads-sync .................................: (20.00, 25.00)",
                  "    optimizer ......................................: (140.00, 150.00)"]
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.log").write_text("\n".join(lines) + "\n")
    db = tmp_path / "t.duckdb"
    assert invoke(["ingest", str(tmp_path / "job"), "--run-id", "mgs",
                   "--db", str(db)]).exit_code == 0
    c = ingest.connect(db)
    try:
        d = analyze.diagnose(c, "mgs").to_dict()
    finally:
        c.close()
    assert d["timers_synced"] is True and d["host_only"] is False and d["device_times"] is False
    assert "no_device_times" not in [f["code"] for f in d["findings"]]
    cats = d["categories"]
    # max figures over the 1000 ms iteration: batch-generator 300 and all-grads-sync 25
    # carved out of forward-backward 800; optimizer 150; 1000 - 800 - 150 unaccounted
    assert cats["starvation"] == pytest.approx(0.300)
    assert cats["sync"] == pytest.approx(0.025)
    assert cats["compute"] == pytest.approx((800 - 300 - 25 + 150) / 1000)
    assert cats["unaccounted"] == pytest.approx(0.050)
    out = invoke(["diagnose", "--run", "mgs", "--db", str(db)]).output
    assert "sync is an upper bound" not in out and "stream=" not in out
    assert "timers synchronise the device" in " ".join(out.split())


def test_iteration_lines_far_apart_or_garbled_do_not_explode() -> None:
    """A log cut mid-run (lines 10, 20, then 900,000), one that starts at
    iteration 5,000,000 without its ``loaded checkpoint`` line, and a garbled
    iteration beyond ``--train-iters``: no interval stands for more than
    MAX_INTERVAL_ITERS rows (before the fix: 900,000 and 5,000,000 rows, and
    a garbled 10**21 never finished)."""
    import time

    def line(i: int, total: int = 1_000_000) -> str:
        return (f" iteration {i:8d}/{total:8d} |" + f" consumed samples: {i:12d} |"
                + f" elapsed time per iteration (ms): {100.0:.1f} | global batch size: {4:5d} |")
    t0 = time.perf_counter()
    cut = parse_lines([line(10), line(20), line(900_000)])
    iters = cut.records[1:]
    # 1-10, 11-20, then the far line counts as one interval of the previous length (10)
    assert [r["iter"] for r in iters] == [*range(1, 21), *range(899_991, 900_001)]
    assert len(cut.warnings) == 1 and "899,980 iterations since the previous" in cut.warnings[0]
    assert "counted as 10" in cut.warnings[0]
    alone = parse_lines([line(5_000_000, 10_000_000)])
    assert [r["iter"] for r in alone.records[1:]] == [5_000_000]
    bad = " iteration 999999999999999999999/      20 | elapsed time per iteration (ms): 5.0 |"
    garbled = parse_lines([line(10), bad, line(20)])
    assert [r["iter"] for r in garbled.records[1:]] == list(range(1, 21))
    assert garbled.lines_skipped == 1
    assert time.perf_counter() - t0 < 5.0


def test_a_big_log_is_read_line_by_line(tmp_path: Path) -> None:
    """A 16 MB log of other text around two DeepSpeed lines: decoding it holds
    no copy of the file (before: the bytes, their text and the list of lines,
    over 40 MB at the peak; a 200 MB log took 1.7 GB in tlog ingest)."""
    import tracemalloc

    line = "[Rank 0] time (ms) | fwd: 10.00 | bwd: 20.00 | bwd_inner: 15.00 | step: 2.00\n"
    # ~1 KB lines: the megabytes matter here, and fewer lines keep tracemalloc's
    # own cost down
    bar = "epoch 0: 50%|#####     | 5/10 [00:01<00:01, 4.2it/s] loss=1.234 other text " * 13
    noise = (bar + "\n") * 160
    path = tmp_path / "train.log"
    with open(path, "w") as fh:
        fh.write(line)
        fh.writelines(noise for _ in range(16 * 1024 * 1024 // len(noise)))
        fh.write(line)
        fh.write("[Rank 0] time (ms) | fwd: 1")      # still being written: left out
    tracemalloc.start()
    try:
        out = [json.loads(x) for x in decode_timer_log(path)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r["dur"] for r in out if r["type"] == "iter"] == [pytest.approx(0.032)] * 2
    assert out[0]["lines_skipped"] == 16 * 1024 * 1024 // len(noise) * 160
    assert peak < 4 * 1024 * 1024, peak


def test_files_that_are_not_timer_logs_are_not_read_again(tmp_path: Path, monkeypatch) -> None:
    """A follow round (tlog watch, tlog serve: every 2 s) sniffs each ``*.out``
    once while it stays the same (before: the first 8 MiB of each, every round:
    20 Slurm outputs took 0.8 s a round); one that gains a timer line is found."""
    from tlog.ingest import timer_logs

    searched: list[int] = []
    real = timer_logs._SNIFF

    class Counting:
        def search(self, data: bytes):
            searched.append(len(data))
            return real.search(data)

    monkeypatch.setattr(timer_logs, "_SNIFF", Counting())
    monkeypatch.setattr(timer_logs, "_NOT_TIMER", {})
    run = tmp_path / "run"
    run.mkdir()
    for i in range(5):
        (run / f"slurm-{i}.out").write_text("loading data ...\n" * 20_000)
    assert find_timer_logs(run) == [] and len(searched) == 5
    assert find_timer_logs(run) == [] and len(searched) == 5       # not read again
    grown = run / "slurm-3.out"
    with open(grown, "a") as fh:
        fh.write("[Rank 0] time (ms) | fwd: 10.00 | bwd: 20.00 | step: 2.00\n")
    assert find_timer_logs(run) == [grown] and len(searched) == 6
    replaced = run / "slurm-1.out"
    replaced.unlink()
    replaced.write_text("[Rank 0] time (ms) | fwd: 10.00 | bwd: 20.00 | step: 2.00\n")
    assert find_timer_logs(run) == [replaced, grown]


# --- the frameworks' own logs (tests/ingest/framework_logs.py) ------------------

def _ingest_lines(con, tmp_path: Path, lines: list[str], run: str, name: str = "train.log"):
    folder = tmp_path / run
    folder.mkdir()
    (folder / name).write_text("\n".join(lines) + "\n")
    return ingest.ingest_run(con, folder, run_id=run)


def _neox_log(intervals: int, log_interval: int = 10) -> tuple[list[str], dict[str, float]]:
    """GPT-NeoX on DeepSpeed's engine (no pipeline): every step the engine's two
    lines, every ``log_interval`` steps NeoX's iteration line and its timers."""
    fig = {"elapsed": 1000.0, "forward": 300.0, "batch generator": 120.0, "backward": 500.0,
           "backward-backward": 495.0, "optimizer": 150.0, "ds_allreduce": 200.0}
    lines = ["NeoXArgs.configure_distributed_args() using world size: 8 and model-parallel size: 1",
             "> building GPT2BPETokenizer tokenizer ...", "training ..."]
    step = 0
    for k in range(1, intervals + 1):
        for _ in range(log_interval):
            step += 1
            # the engine's own timers: fwd is NeoX's forward less its batch fetch
            lines += framework_logs.ds_engine_step(
                fig["forward"] - fig["batch generator"], fig["backward-backward"],
                fig["backward-backward"] - fig["ds_allreduce"], fig["ds_allreduce"],
                fig["optimizer"] - 2.0)
        lines.append(framework_logs.neox_iteration(
            k * log_interval, intervals * log_interval, 8 / 1.0, fig["elapsed"], 6e-4,
            120e12, 3.2))
        lines.append(framework_logs.timers_line(
            [("forward", fig["forward"]), ("backward", fig["backward"]),
             ("backward-backward", fig["backward-backward"]), ("backward-allreduce", 0.0),
             ("optimizer", fig["optimizer"]), ("batch generator", fig["batch generator"])]))
    return lines, fig


def test_gpt_neox_timers_with_deepspeed_lines(con, tmp_path: Path) -> None:
    """GPT-NeoX's own timers (forward, backward, optimizer, batch generator:
    unknown to a Megatron-only reader, which left 81% of the time in no
    phase) with DeepSpeed's engine lines between them: NeoX's timers are the
    phases, DeepSpeed's gradient all-reduce (inside NeoX's backward) is sync."""
    lines, fig = _neox_log(intervals=30)
    rep = _ingest_lines(con, tmp_path, lines, "neox")
    assert rep.lines_skipped == 3
    rows = _iters(con, "neox")
    assert [r[2] for r in rows] == list(range(1, 301))
    assert [r[3] for r in rows] == pytest.approx([1.0] * 300)
    sums = _phase_sums(con, "neox")
    assert sums["forward/batch generator"] == pytest.approx((300 * 0.120, "starvation", "forward"))
    assert sums["backward/bwd_allreduce"] == pytest.approx((300 * 0.200, "sync", "backward"))
    assert sums["optimizer"][:2] == pytest.approx((300 * 0.150, "compute"))
    d = analyze.diagnose(con, "neox").to_dict()
    cats = d["categories"]
    e = fig["elapsed"]
    assert cats["starvation"] == pytest.approx(fig["batch generator"] / e)
    assert cats["sync"] == pytest.approx(fig["ds_allreduce"] / e)
    assert cats["unaccounted"] == pytest.approx(
        (e - fig["forward"] - fig["backward"] - fig["optimizer"]) / e)
    assert cats["compute"] == pytest.approx(
        (fig["forward"] - fig["batch generator"] + fig["backward"] - fig["ds_allreduce"]
         + fig["optimizer"]) / e)
    assert not any(f["code"] == "unaccounted" and f["severity"] == "critical"
                   for f in d["findings"])


def test_confidence_counts_logged_intervals_not_their_rows(con, tmp_path: Path) -> None:
    """5 logged intervals of 10 iterations: 50 rows, but 5 observations (4 in
    the steady state, the first being warm-up): the verdict says so and is
    not confident; 30 intervals are enough."""
    lines, _ = _neox_log(intervals=5)
    _ingest_lines(con, tmp_path, lines, "few")
    d = analyze.diagnose(con, "few").to_dict()
    assert d["iterations"]["steady"] >= 20                 # enough rows...
    assert d["confidence"] == "low"                        # ...but few intervals
    assert any("logged interval" in r for r in d["confidence_reasons"])
    short = next(f for f in d["findings"] if f["code"] == "short_run")
    assert short["evidence"]["min_intervals_per_worker"] <= 5
    assert "(confidence: low)" in d["verdict"]
    lines, _ = _neox_log(intervals=30)
    _ingest_lines(con, tmp_path, lines, "many")
    d = analyze.diagnose(con, "many").to_dict()
    assert not any("logged interval" in r for r in d["confidence_reasons"])


def test_deepspeed_pipeline_engine_timers(con, tmp_path: Path) -> None:
    """DeepSpeed's pipeline engine, steps_per_print 10: its timers are sums over
    the 10 steps since the last print, the 'steps: N ... iter time (s)' line
    gives the step time; stage 0 (rank 0) waits in pipe_recv_grad."""
    per_step = {"batch_input": 20.0, "fwd": 150.0, "bwd": 300.0, "bwd_inner": 299.0,
                "bwd_allreduce": 0.0, "step": 40.0, "pipe_send_output": 5.0,
                "pipe_send_grad": 0.0, "pipe_recv_input": 0.0, "pipe_recv_grad": 260.0}
    iter_s = 0.800
    lines = ["[2024-03-02 10:00:00,000] [INFO] [engine.py:100:__init__] CONFIG: micro_batches=4"]
    for k in range(1, 26):
        lines += framework_logs.ds_pipe_print(k * 10, 2.5, iter_s, 32 / iter_s,
                                               {n: v * 10 for n, v in per_step.items()})
    rep = _ingest_lines(con, tmp_path, lines, "pipe")
    assert rep.lines_skipped == 1
    rows = _iters(con, "pipe")
    assert [r[2] for r in rows] == list(range(1, 251))
    assert [r[3] for r in rows] == pytest.approx([iter_s] * 250)
    sums = _phase_sums(con, "pipe")
    assert sums["pipe_recv_grad"] == pytest.approx((250 * 0.260, "sync", None))
    assert sums["batch_input"] == pytest.approx((250 * 0.020, "starvation", None))
    assert sums["backward/inner"][0] == pytest.approx(250 * 0.299)
    d = analyze.diagnose(con, "pipe").to_dict()
    assert d["categories"]["sync"] == pytest.approx((260.0 + 5.0) / 800.0)
    assert d["bottleneck"]["category"] == "sync"
    assert any("pipeline-engine" in n for n in d["notes"])
    # 25 logged intervals of 10 steps: enough observations, and so stored
    assert not any("logged interval" in r for r in d["confidence_reasons"])
    meta = json.loads(next(decode_timer_log(tmp_path / "pipe" / "train.log")))
    assert meta["interval_ends"] == {"deepspeed-0": list(range(10, 251, 10))}


def test_nemo2_step_timing_lines(con, tmp_path: Path) -> None:
    """NeMo 2's ProgressPrinter, log_interval 1, behind torchrun's tag and a
    nemo-run prefix: each line is one step, numbered by its global_step, its
    time the TimingCallback's ``train_step_timing in s``; the Megatron timer
    block NeMo prints after it gives the phases."""
    lines = ["[NeMo I 2025-06-18 21:41:53 nemo_logging:393] Experiments will be logged at /r"]
    times = [7.5 + 0.01 * (i % 3) for i in range(30)]
    for i, t in enumerate(times):
        lines.append("demo/0 [default0]:" + framework_logs.nemo_line(
            0, i + 1, 30, {"lr": 1.5e-7 * (i + 1), "global_batch_size": 512.0,
                           "global_step": float(i), "reduced_train_loss": 11.03,
                           "train_step_timing in s": t, "consumed_samples": 512.0 * (i + 1)}))
        lines += ["demo/0 [default0]:" + b for b in framework_logs.minmax_block(
            [("forward-backward", 6000.0, 6100.0), ("batch-generator", 1.0, 1.5),
             ("optimizer", 900.0, 950.0)])]
    rep = _ingest_lines(con, tmp_path, lines, "nemo")
    assert rep.lines_skipped == 1
    rows = _iters(con, "nemo")
    assert [r[2] for r in rows] == list(range(30))
    # NeMo prints {:.4}: 7.5, 7.51, 7.52
    assert [r[3] for r in rows] == pytest.approx([float(f"{t:.4}") for t in times])
    assert {r[4] for r in rows} == {512}
    assert _phase_sums(con, "nemo")["forward-backward"][0] == pytest.approx(30 * 6.1)


def test_nemo2_log_interval_averages(con) -> None:
    """log_interval 5: each line's timing is the mean of 5 steps and stands for them."""
    lines = [framework_logs.nemo_line(0, n, 20, {"global_step": float(n - 1),
                                                  "train_step_timing in s": 2.0 + n / 100})
             for n in (5, 10, 15, 20)]
    got = parse_lines(lines)
    iters = got.records[1:]
    assert [r["iter"] for r in iters] == list(range(20))
    assert [r["dur"] for r in iters] == pytest.approx(
        [2.05] * 5 + [2.1] * 5 + [2.15] * 5 + [2.2] * 5)
    assert got.records[0]["interval_ends"] == {"megatron-0": [4, 9, 14, 19]}


def test_megatron_2020_timers_with_and_without_iteration_lines(con, tmp_path: Path) -> None:
    """Megatron-LM of 2020: ``time (ms) | forward | backward | allreduce |
    optimizer | batch generator``; batch generator inside forward, allreduce
    inside backward. The same timer lines with no iteration line still load,
    one iteration each (a warning says the log interval is unknown)."""
    tl = framework_logs.timers_line([("forward", 40.0), ("backward", 80.0), ("allreduce", 30.0),
                                     ("optimizer", 20.0), ("batch generator", 10.0)])
    lines = [" > number of parameters on model parallel rank 0: 354871296"]
    for k in range(1, 26):
        lines += [framework_logs.megatron_2020_iteration(k * 100, 2500, 150.0, 1.5e-4, 3.1), tl]
    _ingest_lines(con, tmp_path, lines, "m2020")
    sums = _phase_sums(con, "m2020")
    assert sums["forward/batch generator"] == pytest.approx((2500 * 0.010, "starvation",
                                                             "forward"))
    assert sums["backward/allreduce"] == pytest.approx((2500 * 0.030, "sync", "backward"))
    d = analyze.diagnose(con, "m2020").to_dict()
    assert d["categories"]["sync"] == pytest.approx(30.0 / 150.0)
    assert d["categories"]["unaccounted"] == pytest.approx((150.0 - 140.0) / 150.0)

    only = parse_lines([tl] * 30)
    iters = only.records[1:]
    assert [r["iter"] for r in iters] == list(range(1, 31))
    assert [r["dur"] for r in iters] == pytest.approx([0.140] * 30)       # the top-level timers
    assert any("without iteration lines" in w for w in only.warnings)
    blocks = parse_lines([line for _ in range(3) for line in framework_logs.minmax_block(
        [("forward-backward", 700.0, 720.0), ("optimizer", 90.0, 100.0)])])
    assert [r["phases"] for r in blocks.records[1:]] == [
        {"forward-backward": 0.72, "optimizer": 0.1}] * 3


def test_keyvalue_fork_with_deepspeed_lines(con, tmp_path: Path) -> None:
    """argonne-lcf/Megatron-DeepSpeed: ``iteration=`` ... key=value lines, the
    (min, max) block, and DeepSpeed's engine lines, whose gradient all-reduce
    runs inside Megatron's forward-backward: it becomes that phase's sync child."""
    lines = []
    for k in range(1, 31):
        stamp = f"2025-11-10 09:{k // 60:02d}:{k % 60:02d},000000"
        lines += ["[" + stamp[:19] + ",149] [INFO] [logging.py:107:log_dist] " + x
                  for x in framework_logs.ds_engine_step(715.0, 2400.0, 1220.0, 1180.0, 160.0)]
        lines.append(framework_logs.keyvalue_iteration(
            stamp, 1000 + k, 2000, 6144 * (1000 + k), 6144 * 8192 * (1000 + k), 3400.0, 2e-5,
            6144, 12.3, 8192))
        lines += framework_logs.minmax_block([("forward-backward", 3190.0, 3200.0),
                                              ("optimizer", 160.0, 170.0)])
    _ingest_lines(con, tmp_path, lines, "kv")
    rows = _iters(con, "kv")
    # the first line (iteration 1001) starts the log: it counts as one iteration
    assert [r[2] for r in rows] == list(range(1001, 1031))
    assert [r[3] for r in rows] == pytest.approx([3.4] * 30)
    assert {(r[4], r[5]) for r in rows} == {(6144, 6144 * 8192)}
    sums = _phase_sums(con, "kv")
    assert sums["forward-backward/bwd_allreduce"] == pytest.approx(
        (30 * 1.180, "sync", "forward-backward"))
    d = analyze.diagnose(con, "kv").to_dict()
    assert d["categories"]["sync"] == pytest.approx(1180.0 / 3400.0)


def test_unknown_timers_are_kept_as_phases() -> None:
    got = parse_lines([framework_logs.megatron_2020_iteration(10, 100, 500.0, 1e-4, 2.0),
                       framework_logs.timers_line([("forward", 100.0), ("backward", 200.0),
                                                   ("rollout-generation", 150.0),
                                                   ("optimizer", 30.0)])])
    assert got.records[1]["phases"]["rollout-generation"] == pytest.approx(0.15)
    assert any("rollout-generation" in w for w in got.warnings)


def test_timer_lines_of_another_tag_beside_iteration_lines_are_not_intervals() -> None:
    """Timer blocks alone make intervals only in a log with no iteration line:
    beside another tag's iteration lines they are that rank's text (2 lines
    of the block, skipped), not a second worker."""
    it = framework_logs.megatron_2020_iteration(10, 100, 150.0, 1e-4, 3.0)
    block = framework_logs.minmax_block([("forward-backward", 100.0, 110.0)])
    got = parse_lines([f"[default3]:{it}", *(f"[default3]:{b}" for b in block),
                       *(f"[default0]:{b}" for b in block)])
    assert {r["worker"] for r in got.records[1:]} == {"megatron-3"}
    assert len(got.records) == 1 + 10
    assert got.lines_skipped == 2


def test_gpt_neox_on_the_pipeline_engine(con, tmp_path: Path) -> None:
    """GPT-NeoX's default (pipe_parallel_size 1 runs DeepSpeed's pipeline
    engine): NeoX logs no timers of its own (an empty ``time (ms)``), the
    engine's lines every steps_per_print (10) steps carry them: summed over
    the 10 steps, they become the interval's phases per step."""
    per_step = {"batch_input": 30.0, "fwd": 200.0, "bwd": 400.0, "bwd_inner": 399.0,
                "bwd_allreduce": 0.0, "step": 100.0, "pipe_send_output": 0.0,
                "pipe_send_grad": 0.0, "pipe_recv_input": 0.0, "pipe_recv_grad": 0.0}
    lines = []
    for k in range(1, 31):
        lines += framework_logs.ds_pipe_print(k * 10, 2.5, 0.8, 40.0,
                                               {n: v * 10 for n, v in per_step.items()})
        lines += [framework_logs.neox_iteration(k * 10, 300, 40.0, 800.0, 6e-4, 1e14, 2.5),
                  framework_logs.timers_line([])]
    rep = _ingest_lines(con, tmp_path, lines, "neoxpipe")
    assert rep.lines_skipped == 30                       # NeoX's empty "time (ms)" lines
    rows = _iters(con, "neoxpipe")
    assert [r[2] for r in rows] == list(range(1, 301))
    sums = _phase_sums(con, "neoxpipe")
    assert sums["batch_input"] == pytest.approx((300 * 0.030, "starvation", None))
    assert sums["forward"][0] == pytest.approx(300 * 0.200)
    assert sums["optimizer"][0] == pytest.approx(300 * 0.100)
    d = analyze.diagnose(con, "neoxpipe").to_dict()
    # 800 ms per step: 30 batch input, 200 + 400 + 100 engine, 70 outside every timer
    assert d["categories"]["starvation"] == pytest.approx(30.0 / 800.0)
    assert d["categories"]["unaccounted"] == pytest.approx(70.0 / 800.0)
