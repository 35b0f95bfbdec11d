"""The ``torchtitan`` source on files written by torchtitan's own writer code.

Every file here is written by ``titan_writer`` (torchtitan's structured logger,
copied; its docstring names the files and the commit), running a loop laid out
as torchtitan's ``Trainer.train_step`` with short real sleeps. The expected
figures are read back from the written records themselves (each span's
``_end`` ``value`` in ms, each record's ``time_us``), never from tlog.
"""

from __future__ import annotations

import json
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import titan_writer as sl
from tlog.ingest import torchtitan
from tlog.ingest.sources import claim_order, installed_sources

from tests.support.cli import invoke
from tlog import ingest


def write_run(out: Path, steps: int, *, rank: int = 0, accumulate: int = 1,
              save_at: tuple[int, ...] = (), log_freq: int = 2, tokens: int = 2048,
              extra=None) -> Path:
    """A training loop laid out as torchtitan's ``train_step`` (``fetching_batch``
    per micro-batch, ``fwd_bwd`` per micro-batch, ``optim``, ``collect_dist_metrics``
    on logging steps, ``checkpoint_save`` every step, saving at ``save_at``) written
    by torchtitan's writer to ``out/structured_logs/``; returns the file.
    ``extra(step)``, when given, runs inside each step span after ``optim``."""
    sl.reset()
    sl.init_structured_logger(source="training", output_dir=str(out), rank=rank)
    sl.log_trace_instant("structured_logger_started")
    with sl.log_trace_span("model_parallelism_init"):
        time.sleep(0.002)
    sl.log_trace_instant("training_start")
    for step in range(1, steps + 1):
        sl.set_step(step)
        with sl.log_trace_span("step"):
            with sl.log_trace_span("gc_collect"):
                pass
            for _ in range(accumulate):
                with sl.log_trace_span("fetching_batch"):
                    time.sleep(0.003)
            sl.log_trace_scalar({"local_valid_tokens": tokens})
            for _ in range(accumulate):
                with sl.log_trace_span("fwd_bwd"):
                    with sl.log_trace_span("post_dataloading_process"):
                        time.sleep(0.001)
                    time.sleep(0.002)
            with sl.log_trace_span("optim"):
                time.sleep(0.001)
            if step == 1 or step % log_freq == 0:
                with sl.log_trace_span("collect_dist_metrics"):
                    sl.log_trace_scalar({"global_valid_tokens": 2 * tokens})
            if extra is not None:
                extra(step)
            with sl.log_trace_span("checkpoint_save"):
                if step in save_at:
                    sl.add_step_tag("checkpoint_save")
                    time.sleep(0.004)
    with sl.log_trace_span("torch_distributed_teardown"):
        pass
    sl.reset()
    files = sorted((out / "structured_logs").glob(f"training.global_rank_{rank}.*.jsonl"))
    return files[-1]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def span_values(recs: list[dict], name: str) -> dict[int, float]:
    """Seconds of span ``name`` summed by step, from its ``_end`` records."""
    out: dict[int, float] = {}
    for r in recs:
        if r["log_type_name"] == f"{name}_end":
            out[r["step"]] = out.get(r["step"], 0.0) + r["value"] / 1e3
    return out


def test_the_source_is_an_entry_point_tried_before_jsonl() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="tlog.sources")}
    assert eps.get("torchtitan") == "tlog.ingest.torchtitan:source", (
        "the torchtitan entry point is not installed: pip install -e . again (make setup)")
    assert "torchtitan" in [s.kind for s in installed_sources()]
    kinds = [s.kind for s in claim_order()]
    assert kinds.index("torchtitan") < kinds.index("jsonl"), kinds


def test_steps_become_iterations_and_spans_phases(tmp_path: Path, db) -> None:
    path = write_run(tmp_path / "outputs", 4, accumulate=2, save_at=(3,))
    assert torchtitan.claims(path.name)
    recs = records(path)
    rep = ingest.ingest_run(db, tmp_path / "outputs", run_id="tt")
    assert rep.source == "torchtitan"
    assert rep.records_rejected == 0 and rep.warnings == []

    starts = {r["step"]: r["time_us"] for r in recs if r["log_type_name"] == "step_start"}
    rows = db.execute("SELECT worker, rank, stage, iter, ts, dur, tokens FROM iterations "
                      "WHERE run_id = 'tt' ORDER BY iter").fetchall()
    durs = span_values(recs, "step")
    assert [r[3] for r in rows] == [1, 2, 3, 4]
    assert {r[:3] for r in rows} == {("training-0", 0, "training")}
    for r in rows:
        assert r[4] == pytest.approx(starts[r[3]] / 1e6, abs=1e-6)
        assert r[5] == pytest.approx(durs[r[3]], abs=1e-6)
        assert r[6] == 2048

    phases = db.execute("SELECT iter, phase, parent, category, host_s, seq FROM phases "
                        "WHERE run_id = 'tt' ORDER BY iter, seq").fetchall()
    by = {(p[0], p[1]): p for p in phases}
    fetch = span_values(recs, "fetching_batch")          # two micro-batches a step, summed
    for step in range(1, 5):
        assert by[(step, "fetching_batch")][3:5] == ("starvation", pytest.approx(fetch[step],
                                                                                abs=2e-6))
        assert by[(step, "fwd_bwd")][3:5] == ("compute", pytest.approx(
            span_values(recs, "fwd_bwd")[step], abs=2e-6))
        assert by[(step, "fwd_bwd/post_dataloading_process")][2:4] == ("fwd_bwd", "compute")
        assert by[(step, "optim")][3] == "compute"
    # top-level phases in the order they ran
    assert [p[1] for p in phases if p[0] == 2 and p[2] is None] == [
        "gc_collect", "fetching_batch", "fwd_bwd", "optim", "collect_dist_metrics",
        "checkpoint_save"]
    assert by[(2, "collect_dist_metrics")][3] == "sync"
    assert (3, "collect_dist_metrics") not in by                 # not a logging step
    # the save at step 3 is an event, not a phase; the no-op calls are phases
    assert (3, "checkpoint_save") not in by and by[(4, "checkpoint_save")][3] == "compute"
    events = db.execute("SELECT name, ts, dur FROM events WHERE run_id = 'tt' "
                        "ORDER BY ts").fetchall()
    assert [e[0] for e in events] == ["structured_logger_started", "model_parallelism_init",
                                      "training_start", "checkpoint_save",
                                      "torch_distributed_teardown"]
    save = next(r for r in recs if r["log_type_name"] == "checkpoint_save_start"
                and r["step"] == 3)
    assert events[3][1:] == pytest.approx((save["time_us"] / 1e6,
                                           span_values(recs, "checkpoint_save")[3]), abs=1e-6)
    assert events[2][2] == 0.0


def test_bad_input_is_counted_and_named_one_line_each(tmp_path: Path, db) -> None:
    def extra(step: int) -> None:
        if step == 2:
            with sl.log_trace_span("my_prefetch"):    # unknown: a phase by the name rules
                time.sleep(0.001)
            sl.log_trace_scalar({"train.loss": 2.5})
            try:
                with sl.log_trace_span("grad_hook"):
                    raise RuntimeError("boom")
            except RuntimeError:
                pass

    path = write_run(tmp_path / "outputs", 3, extra=extra)
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    damaged = [
        "this is not json",
        "[1, 2, 3]",
        json.dumps({"time_us": head["time_us"]}),                     # no log_type_name
        json.dumps({"log_type": "event", "log_type_name": "x_start"}),  # no time_us
        "{" + "x" * (torchtitan.MAX_LINE_BYTES + 10) + "}",
        json.dumps({**head, "log_type": "event", "log_type_name": "ghost_end", "value": 1.0}),
    ]
    # a span started inside step 3 whose end is lost
    at = next(i for i, ln in enumerate(lines) if json.loads(ln)["log_type_name"] == "optim_end"
              and json.loads(ln)["step"] == 3)
    lost = {**json.loads(lines[at]), "log_type_name": "lost_start"}
    lost.pop("value")
    lines = damaged[:2] + lines[:at] + [json.dumps(lost)] + lines[at:] + damaged[2:]
    path.write_text("\n".join(lines) + "\n")

    rep = ingest.ingest_run(db, tmp_path / "outputs", run_id="bad")
    assert rep.records_rejected == 0          # nothing handed to the v1 reader is wrong
    rel = path.relative_to(tmp_path / "outputs").as_posix()
    assert [w.removeprefix(f"{rel}: ") for w in rep.warnings] == [
        ("5 line(s) are not torchtitan structured-log records and were skipped "
         "(first: line 1, not JSON)"),
        ("spans tlog does not know the place of, kept as phases categorised by their name "
         "(docs/FORMAT.md): grad_hook (1), my_prefetch (1)"),
        "span ends without their start (a file cut at its head?), not loaded: ghost (1)",
        "spans that never ended (their end record is missing), not loaded: lost (1)",
        "spans that raised (their _error record), loaded up to the exception: grad_hook (1)",
        "scalars not mapped (tlog keeps only local_valid_tokens as tokens): train.loss (1)",
    ]
    assert all(w.startswith(f"{rel}: ") for w in rep.warnings)
    assert db.execute("SELECT count(*) FROM iterations WHERE run_id = 'bad'").fetchone()[0] == 3
    cat = db.execute("SELECT category FROM phases WHERE run_id = 'bad' AND phase = "
                     "'my_prefetch'").fetchall()
    assert cat == [("starvation",)]           # 'prefetch' is an input word (docs/FORMAT.md)
    meta = json.loads(db.execute("SELECT meta FROM files WHERE run_id = 'bad'").fetchone()[0])
    assert meta["extra"]["torchtitan"] == {"steps": 3, "events": 4, "bad_lines": 5}

    res = invoke(["ingest", str(tmp_path / "outputs"), "--run-id", "bad2",
                  "--db", str(tmp_path / "cli.duckdb")])
    assert res.exit_code == 0, res.output
    assert "5 line(s) are not torchtitan structured-log records" in res.output
    assert "Traceback" not in res.output


def test_files_with_nothing_to_map_say_so(tmp_path: Path, db) -> None:
    logs = tmp_path / "outputs" / "structured_logs"
    logs.mkdir(parents=True)
    (logs / "training.global_rank_1.20260801-120000-ABCDEF.jsonl").write_text(
        "garbage\nmore garbage\n")
    # an RL actor's file: spans, no 'step' span
    sl.reset()
    sl.init_structured_logger(source="generator", output_dir=str(tmp_path / "outputs"), rank=0)
    sl.set_step(1)
    with sl.log_trace_span("generate"):
        pass
    sl.reset()
    rep = ingest.ingest_run(db, tmp_path / "outputs", run_id="empty")
    assert rep.records_rejected == 0
    assert db.execute("SELECT count(*) FROM iterations").fetchone()[0] == 0
    assert [w.split(": ", 1)[1] for w in rep.warnings] == [
        ("no 'step' spans: no iterations (the spans are loaded as events; only torchtitan's "
         "trainer logs are mapped to iterations)"),
        ("2 line(s) are not torchtitan structured-log records and were skipped "
         "(first: line 1, not JSON)"),
    ]
    assert db.execute("SELECT name, worker FROM events").fetchall() == [
        ("generate", "generator-0")]
    ranks = db.execute("SELECT path, json_extract(meta, '$.rank')::INT FROM files "
                       "ORDER BY path").fetchall()
    assert [r[1] for r in ranks] == [0, 1]          # the garbage file's rank: its name's


def test_a_restart_into_the_same_folder_is_a_second_attempt(tmp_path: Path, db) -> None:
    first = write_run(tmp_path / "outputs", 2)
    time.sleep(1.05)                # torchtitan's file name holds the second it was opened
    second = write_run(tmp_path / "outputs", 2)
    assert first != second and first.name < second.name
    ingest.ingest_run(db, tmp_path / "outputs", run_id="re")
    got = db.execute("SELECT worker, count(*) FROM iterations GROUP BY worker "
                     "ORDER BY worker").fetchall()
    assert got == [("training-0", 2), ("training-0.1", 2)]


def test_a_growing_file_loads_its_finished_steps(tmp_path: Path, db) -> None:
    path = write_run(tmp_path / "outputs", 3)
    full = path.read_bytes()
    lines = full.splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines)
               if json.loads(ln)["log_type_name"] == "fwd_bwd_start" and json.loads(ln)["step"] == 3)
    path.write_bytes(b"".join(lines[:cut]) + lines[cut][:40])   # a half-written line
    rep = ingest.ingest_run(db, tmp_path / "outputs", run_id="grow")
    assert rep.records_rejected == 0 and rep.warnings == []
    iters = "SELECT iter FROM iterations WHERE run_id = 'grow' ORDER BY iter"
    assert [r[0] for r in db.execute(iters).fetchall()] == [1, 2]
    path.write_bytes(full)
    rep = ingest.ingest_run(db, tmp_path / "outputs", run_id="grow")
    assert rep.records_rejected == 0 and rep.duplicates == 0
    assert [r[0] for r in db.execute(iters).fetchall()] == [1, 2, 3]


def test_shim_logs_beside_torchtitan_logs_keep_their_source(tmp_path: Path, db) -> None:
    write_run(tmp_path / "run", 2)
    shim = {"type": "iter", "rank": 0, "stage": "main", "iter": 0, "ts": 1.8e9, "dur": 0.1,
            "phases": {"data_wait": 0.02, "forward": 0.05}}
    (tmp_path / "run" / "rank0.main.jsonl").write_text(json.dumps(shim) + "\n")
    rep = ingest.ingest_run(db, tmp_path / "run", run_id="both")
    assert rep.records_rejected == 0
    got = dict(db.execute("SELECT source, count(*) FROM files GROUP BY source").fetchall())
    assert got == {"jsonl": 1, "torchtitan": 1}
    workers = db.execute("SELECT DISTINCT worker FROM iterations ORDER BY 1").fetchall()
    assert workers == [("main-0",), ("training-0",)]
