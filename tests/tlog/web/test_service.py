"""``tlog.web.service``: the service's one connection shared by readers and one
writer at a time, and what it watches (databases and run folders made here)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tests.support.runbuilder import RunBuilder, loop
from tests.support.runs import iter_line, write_lines
from tlog.web.service import Gate, GateBusyError, files_state, run_dirs


def test_run_dirs_under_the_watched_roots(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_lines(runs / "b" / "rank0.jsonl", [iter_line(0)])
    (runs / "a").mkdir()
    (runs / ".hidden").mkdir()
    os.symlink(runs / "a", runs / "link")
    single = write_lines(tmp_path / "one" / "rank0.jsonl", [iter_line(0)]).parent
    assert run_dirs([runs, single, tmp_path / "missing"]) == [runs / "a", runs / "b", single]


def test_files_state_changes_when_a_file_grows(tmp_path: Path) -> None:
    log = write_lines(tmp_path / "r" / "sub" / "rank0.jsonl", [iter_line(0)])
    write_lines(tmp_path / "r" / "a" / "b" / "c" / "deep.jsonl", [iter_line(0)])   # depth 4
    before = files_state(tmp_path / "r")
    assert [(Path(p).name, size) for p, size, _ in before] == [("rank0.jsonl",
                                                                log.stat().st_size)]
    assert files_state(tmp_path / "r") == before
    with log.open("a") as f:
        f.write(iter_line(1) + "\n")
    assert files_state(tmp_path / "r") != before


def test_readers_see_a_snapshot_and_writers_go_one_at_a_time(tmp_path: Path) -> None:
    b = RunBuilder("r")
    loop(b, 3, [("forward", 0.1)])
    b.write(tmp_path / "t.duckdb").close()
    gate = Gate(tmp_path / "t.duckdb")
    try:
        with gate.reader() as reader:
            before = reader.execute("SELECT count(*) FROM iterations").fetchall()[0][0]
            with gate.use(write=True) as writer:
                writer.execute("DELETE FROM iterations WHERE iter = 0")
            assert reader.execute("SELECT count(*) FROM iterations").fetchall()[0][0] == before
        with gate.use() as cur:
            assert cur.execute("SELECT count(*) FROM iterations").fetchall()[0][0] == 2
            with pytest.raises(Exception, match="(?i)external access|permission"):
                cur.execute(f"COPY iterations TO '{tmp_path / 'out.csv'}'")
        held = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with gate.use(write=True):
                held.set()
                release.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        held.wait(10)
        t0 = time.monotonic()
        with pytest.raises(GateBusyError, match="busy writing"), \
                gate.use(write=True, wait_s=0.2):
            pass
        assert time.monotonic() - t0 >= 0.2
        release.set()
        t.join()
    finally:
        gate.close()
    with pytest.raises(GateBusyError, match="stopping"), gate.use():
        pass
