"""What the shim writes is what ingest reads: every record kind, no rejects, exact values."""

from __future__ import annotations

import pytest
from runtime_helpers import WALL0

from dflash_runtime import Recorder, TimedQueue

ingest = pytest.importorskip("ingest")
if not hasattr(ingest, "ingest_run"):
    pytest.skip("ingest.ingest_run not built yet", allow_module_level=True)

from tlog.ingest.db import connect


def test_a_shim_run_ingests_without_rejects(tmp_path, clock) -> None:
    run = tmp_path / "run-a"
    rec = Recorder(run, stage="drafter", rank=0, world_size=1, run_id="run-a",
                   phase_kinds={"doc_ids": "compute"})
    q = TimedQueue(4, name="hs_queue", get_phase="hs_get", recorder=rec, sample_interval=0.0)
    for i in range(4):
        clock.t = 10.0 * i
        q.put(i)  # a depth sample; the get below takes another
        with rec.iteration(tokens=1024, samples=2) as it:
            clock.t += 1.0       # 10 i + 1: unaccounted 1 s
            q.get()              # no wait: hs_get 0 s
            clock.t += 1.0
            it.lap("doc_ids")    # 1 s
            with it.phase("draft_forward"):
                clock.t += 2.0
                it.lap("mask_build")
            with it.phase("grad_norm_item", kind="sync"):
                clock.t += 0.5
            clock.t += 0.5
    with rec.event("checkpoint", step=4):
        clock.t += 3.0
    rec.close()
    con = connect(tmp_path / "t.duckdb")
    report = ingest.ingest_run(con, run).to_dict()
    assert report["run_id"] == "run-a"
    assert report["records_loaded"] == {"meta": 1, "iter": 4, "queue": 8, "event": 1}
    assert report["records_rejected"] == 0 and report["errors"] == []
    rows = con.execute(
        "select iter, ts, dur from iterations where run_id = 'run-a' order by iter").fetchall()
    assert rows == [(i, WALL0 + 10.0 * i, 5.0) for i in range(4)]
    phases = con.execute(
        "select phase, host_s, category from phases where run_id = 'run-a' and iter = 0 "
        "order by seq").fetchall()
    assert phases == [("hs_get", 0.0, "starvation"), ("doc_ids", 1.0, "compute"),
                      ("draft_forward", 2.0, "compute"),
                      ("draft_forward/mask_build", 2.0, "compute"),
                      ("grad_norm_item", 0.5, "sync")]
    again = ingest.ingest_run(con, run).to_dict()
    assert sum(again["records_loaded"].values()) == 0


def test_a_measured_ddp_wait_ingests_as_a_sync_child(tmp_path, clock) -> None:
    from dflash_runtime.collectives import CollectiveSlot

    run = tmp_path / "run-w"
    rec = Recorder(run, rank=0, world_size=1, run_id="run-w", cpu=False, mem_every=0)
    rec._coll = slot = CollectiveSlot()     # what watch_ddp installs
    clock.t = 10.0
    with rec.iteration() as it:
        with it.phase("forward"):
            clock.t = 11.0
        with it.phase("backward"):          # 11.0 .. 13.0
            slot.ready(11.5, True)
            slot.done(12.75)                # wait 1.25
            clock.t = 13.0
    rec.close()
    con = connect(tmp_path / "t.duckdb")
    report = ingest.ingest_run(con, run).to_dict()
    assert report["records_rejected"] == 0 and report["errors"] == []
    phases = con.execute(
        "select phase, host_s, category from phases where run_id = 'run-w' and iter = 0 "
        "order by seq").fetchall()
    assert phases == [("forward", 1.0, "compute"), ("backward", 2.0, "compute"),
                      ("backward/ddp_allreduce_wait", 1.25, "sync")]


def test_drop_count_lines_load_as_meta_without_rejects(tmp_path, clock) -> None:
    """A file with drop-count lines (FORMAT.md "Drop counts") loads cleanly in a reader
    that does not know the fields: every written iteration, its worker kept, no reject."""
    from dflash_runtime import writer

    run = tmp_path / "run-d"
    rec = Recorder(run, stage="loader", rank=2, world_size=3, run_id="run-d", cpu=False,
                   mem_every=0, max_pending=3)
    writer._sinks.remove(rec._sink)         # only the flushes below write
    for batch in range(3):                  # 5 iterations per batch, 3 fit: 2 dropped each
        for i in range(5):
            clock.t = 100.0 * batch + i
            with rec.iteration() as it:
                clock.t += 0.5
                it.lap("fetch")
        rec._sink.drops_due = 0.0           # a drop-count line at every flush here
        rec.flush()
    rec.close()
    lines = (run / "rank2.loader.jsonl").read_text().splitlines()
    drops = [x for x in lines if '"records_dropped"' in x]
    assert drops == ['{"type":"meta","v":1,"records_dropped":2,"iters_dropped":2}',
                     '{"type":"meta","v":1,"records_dropped":4,"iters_dropped":4}',
                     '{"type":"meta","v":1,"records_dropped":6,"iters_dropped":6}']
    con = connect(tmp_path / "t.duckdb")
    report = ingest.ingest_run(con, run).to_dict()
    assert report["records_loaded"]["iter"] == 9
    assert report["records_rejected"] == 0 and report["errors"] == []
    rows = con.execute("select distinct rank, stage, worker from iterations "
                       "where run_id = 'run-d'").fetchall()
    assert rows == [(2, "loader", "loader-2")]
    assert rec.stats()["iters_dropped"] == 6
    # ingest and diagnose say what was dropped (the last, cumulative line: 6 and 6)
    said = ("rank2.loader.jsonl: the shim dropped 6 records (6 iterations) of this log (its "
            "queue was full or its file could not be written): figures rest on the records "
            "it kept")
    assert said in report["warnings"]
    from tlog.analyze import diagnose

    assert said in diagnose(con, "run-d").notes
    # a later ingest (nothing new) keeps saying it in diagnose, not twice
    ingest.ingest_run(con, run)
    assert diagnose(con, "run-d").notes.count(said) == 1
