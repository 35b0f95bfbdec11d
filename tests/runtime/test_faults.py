"""Faults never take training down and never corrupt a file (docs: "Faults").

Crashes, signals and forks run in child processes; full disks are simulated by making
the writer's ``os.write`` fail with ENOSPC.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time

import pytest
from runtime_helpers import read_lines, records, run_child

from dflash_runtime import Recorder, writer


def _detach(rec: Recorder) -> Recorder:
    """Keep the background writer off this recorder: only the test's flush() writes."""
    writer._sinks.remove(rec._sink)
    return rec


def _enospc(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_warns_once_counts_drops_and_recovers(tmp_path, monkeypatch) -> None:
    rec = _detach(Recorder(tmp_path, install_handlers=False))
    with rec.iteration():
        pass
    rec.flush()  # meta + iteration 0 on disk
    monkeypatch.setattr(writer, "_os_write", _enospc)

    def three_failing_flushes() -> None:
        for _ in range(3):
            with rec.iteration() as it:
                it.lap("step")
            rec.flush()

    with pytest.warns(RuntimeWarning, match="No space left on device") as warned:
        three_failing_flushes()
    assert len(warned) == 1  # three failed writes, one warning
    stats = rec.stats()
    assert stats["records_dropped"] == 3
    assert stats["write_errors"] == 3
    monkeypatch.setattr(writer, "_os_write", os.write)  # space again
    with rec.iteration():
        pass
    rec.close()
    assert [r["iter"] for r in records(rec.path)] == [0, 4]
    assert rec.stats()["records_written"] == 2


def test_a_partial_write_costs_only_the_broken_line(tmp_path, monkeypatch) -> None:
    rec = _detach(Recorder(tmp_path, install_handlers=False))
    rec.flush()  # the meta line

    def half_then_full(fd, data):
        monkeypatch.setattr(writer, "_os_write", _enospc)
        data = bytes(data)
        return os.write(fd, data[: data.index(b"\n") + 10])  # first line + 10 bytes

    for _ in range(2):
        with rec.iteration():
            pass
    monkeypatch.setattr(writer, "_os_write", half_then_full)
    with pytest.warns(RuntimeWarning):
        rec.flush()
    monkeypatch.setattr(writer, "_os_write", os.write)
    with rec.iteration():
        pass
    rec.close()
    raw = rec.path.read_text().split("\n")
    assert raw[-1] == ""
    good = []
    bad = 0
    for line in raw[:-1]:
        try:
            good.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    assert bad == 1  # the line cut by the failed write, alone on its line
    # meta, iteration 0 (whole), iteration 1 (cut), iteration 2 on a fresh line, and
    # the drop count written at close
    assert [r["type"] for r in good] == ["meta", "iter", "iter", "meta"]
    assert [r["iter"] for r in good[1:3]] == [0, 2]
    assert good[-1] == {"type": "meta", "v": 1, "records_dropped": 1, "iters_dropped": 1}
    assert rec.stats()["records_dropped"] == 1


def test_an_unwritable_directory_warns_and_training_goes_on(tmp_path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="cannot open a timing log"):
        rec = Recorder(blocker / "run", install_handlers=False)
    for _ in range(5):
        with rec.iteration() as it:
            it.lap("step")
    rec.close()
    assert rec.stats()["records_dropped"] == 5
    assert not (blocker / "run").exists()


def test_records_beyond_max_pending_are_dropped_and_counted(tmp_path) -> None:
    rec = _detach(Recorder(tmp_path, install_handlers=False, max_pending=5))
    for _ in range(20):
        with rec.iteration():
            pass
    rec.close()
    assert [r["iter"] for r in records(rec.path)] == [0, 1, 2, 3, 4]
    assert rec.stats()["records_dropped"] == 15


def test_the_writer_flushes_within_a_second_unasked(tmp_path) -> None:
    rec = Recorder(tmp_path, install_handlers=False, flush_interval=1.0)
    with rec.iteration():
        pass
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not records(rec.path):
        time.sleep(0.05)
    waited = time.monotonic() - (deadline - 3.0)
    assert len(records(rec.path)) == 1, "writer did not flush within 3 s"
    assert waited < 2.0  # at most the 1 s interval plus scheduling on a busy machine
    rec.close()


def test_eight_threads_never_interleave_bytes(tmp_path) -> None:
    rec = Recorder(tmp_path, install_handlers=False, flush_interval=0.05)
    per_thread = 400

    def work(k: int) -> None:
        for i in range(per_thread):
            with rec.iteration(tokens=k) as it:
                it.lap(f"t{k}_load")
                with it.phase(f"t{k}_forward"):
                    it.lap(f"t{k}_inner")
                if i % 50 == 0:
                    rec.queue_sample(f"q{k}", i, per_thread)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.close()
    lines = read_lines(rec.path)  # every line parses
    its = [r for r in lines if r["type"] == "iter"]
    assert sorted(r["iter"] for r in its) == list(range(8 * per_thread))
    for r in its:
        k = r["tokens"]
        assert list(r["phases"]) == [f"t{k}_load", f"t{k}_forward", f"t{k}_forward/t{k}_inner"]
    assert len([r for r in lines if r["type"] == "queue"]) == 8 * (per_thread // 50)


KILL_CHILD = """
import sys, time
from dflash_runtime import Recorder
rec = Recorder(sys.argv[1], stage="drafter", rank=1, flush_interval=0.01)
i = 0
while True:
    with rec.iteration(tokens=128) as it:
        it.lap("hs_get")
        with it.phase("draft_forward"):
            it.lap("mask_build")
        it.lap("backward" * (1 + i % 50))  # lines of varied length
    i += 1
    if i % 20 == 0:
        time.sleep(0.001)
"""


def test_kill_9_leaves_whole_lines_and_at_most_one_partial_tail(tmp_path) -> None:
    path = tmp_path / "rank1.drafter.jsonl"
    for _ in range(3):  # a few kills at random points of the write cycle
        if path.exists():
            path.unlink()
        child = run_child(KILL_CHILD, str(tmp_path), wait=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 50_000):
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL
        data = path.read_bytes()
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        parsed = [json.loads(line) for line in lines]  # every complete line is whole
        assert parsed[0]["type"] == "meta"
        its = [r["iter"] for r in parsed[1:]]
        assert its == list(range(len(its)))
        if tail:
            with pytest.raises(json.JSONDecodeError):
                json.loads(tail)


def test_kill_9_tail_is_left_for_later_by_ingest(tmp_path) -> None:
    ingest = pytest.importorskip("ingest")
    if not hasattr(ingest, "ingest_run"):
        pytest.skip("ingest.ingest_run not built yet")
    from tlog.ingest.db import connect

    run = tmp_path / "run"
    path = run / "rank1.drafter.jsonl"
    child = run_child(KILL_CHILD, str(run), wait=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 20_000):
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    with path.open("ab") as f:  # make sure there is a partial last line
        f.write(b'{"type": "iter", "iter": 99999, "ts": 1.0, "du')
    complete = [json.loads(x) for x in path.read_bytes().split(b"\n")[:-1]]
    n_iter = sum(1 for r in complete if r.get("type") == "iter")
    con = connect(tmp_path / "t.duckdb")
    report = ingest.ingest_run(con, run).to_dict()
    assert report["records_loaded"]["iter"] == n_iter
    assert report["records_rejected"] == 0
    assert report["errors"] == []


SIGTERM_CHILD = """
import os, signal, sys, time
from dflash_runtime import Recorder
chain = sys.argv[2] == "chain"
if chain:
    def previous(signum, frame):
        open(sys.argv[1] + "/previous_handler_ran", "w").close()
        sys.exit(3)
    signal.signal(signal.SIGTERM, previous)
rec = Recorder(sys.argv[1], flush_interval=1.0)
for i in range(50):
    with rec.iteration() as it:
        it.lap("step")
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["default", "chain"])
def test_sigterm_flushes_then_runs_the_previous_handler(tmp_path, mode) -> None:
    child = run_child(SIGTERM_CHILD, str(tmp_path), mode, wait=False)
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=30)
    if mode == "default":
        assert child.returncode == -signal.SIGTERM  # the default action still kills it
    else:
        assert child.returncode == 3
        assert (tmp_path / "previous_handler_ran").exists()
    assert [r["iter"] for r in records(tmp_path / "rank0.main.jsonl")] == list(range(50))


def test_normal_exit_flushes_at_exit(tmp_path) -> None:
    done = run_child("""
        import sys
        from dflash_runtime import Recorder
        rec = Recorder(sys.argv[1], flush_interval=1.0)
        for i in range(30):
            with rec.iteration() as it:
                it.lap("step")
        # no close(): atexit flushes
    """, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert len(records(tmp_path / "rank0.main.jsonl")) == 30


FORK_CHILD = """
import json, os, sys
from dflash_runtime import Recorder
run = sys.argv[1]
rec = Recorder(run, flush_interval=1.0)
for i in range(5):
    with rec.iteration() as it:
        it.lap("parent_step")
pid = os.fork()  # records 0-4 are still waiting for the writer
if pid == 0:
    # a DataLoader worker: the inherited recorder is inert
    with rec.iteration() as it:
        it.lap("child_step")
    rec.flush()
    own = Recorder(run, stage="loader", rank=0)  # a recorder of its own works
    with own.iteration() as it:
        it.lap("child_own")
    own.close()
    print(json.dumps({"child_enabled": rec.enabled, "child_path": str(rec.path)}), flush=True)
    sys.exit(0)  # normal exit: atexit must not write the parent's records
os.waitpid(pid, 0)
for i in range(2):
    with rec.iteration() as it:
        it.lap("parent_step")
rec.close()
"""


FORK_MID_IMPORT = """
import os, pathlib, sys, time
mods = pathlib.Path(sys.argv[1]) / "mods"
mods.mkdir()
(mods / "slow_import.py").write_text("import time\\ntime.sleep(0.6)\\n")
sys.path.insert(0, str(mods))
from dflash_runtime import Recorder, writer
serve = writer.Sink.serve
def importing_serve(self):  # the writer's turn imports, as its first turns do (sysinfo...)
    import slow_import
    return serve(self)
writer.Sink.serve = importing_serve
rec = Recorder(sys.argv[1], flush_interval=1.0)
time.sleep(0.2)        # the writer thread is inside the import now
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    import slow_import  # the module's import lock, held by a thread the child lacks
    os._exit(0)
waited = time.monotonic() - t0
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    status = 9
print("child", os.waitstatus_to_exitcode(status) if done else "hung", "fork waited", round(waited, 2))
rec.close()
"""


def test_a_fork_waits_for_the_writers_import_so_the_child_can_import(tmp_path) -> None:
    # A fork that cut the writer thread's import in half left the child that module's
    # lock, held for good: the child's own import of it hung (1 run in 4 of the test
    # below once timing shifted). Now the fork waits for the writer's turn.
    done = run_child(FORK_MID_IMPORT, str(tmp_path))
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:2] == ["child", "0"], done.stdout
    assert 0.2 <= float(words[-1]) <= 2.0  # the import's remaining ~0.4 s, not FORK_WAIT_S


def test_after_fork_the_child_does_not_write_the_parents_file(tmp_path) -> None:
    done = run_child(FORK_CHILD, str(tmp_path))
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child == {"child_enabled": False, "child_path": "None"}
    lines = read_lines(tmp_path / "rank0.main.jsonl")
    assert [r["type"] for r in lines].count("meta") == 1
    its = [r for r in lines if r["type"] == "iter"]
    assert [r["iter"] for r in its] == list(range(7))
    assert all(list(r["phases"]) == ["parent_step"] for r in its)
    own = records(tmp_path / "rank0.loader.jsonl")
    assert [list(r["phases"]) for r in own] == [["child_own"]]
