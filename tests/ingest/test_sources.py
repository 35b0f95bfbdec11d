"""``ingest.sources``: which files of a run directory are logs of which source,
what a walk of it warns about, and the byte-level helpers of the reader."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from tlog.ingest.sources import (
    JSONL,
    JSONL_GZ,
    Source,
    active_sources,
    char_counts,
    digest,
    discover,
    installed_sources,
    line_offsets,
    line_offsets_quotes,
    register_source,
    stat,
    survey,
    unregister_source,
)

from tests.support.runs import iter_line, write_lines


def test_installed_sources_begin_with_tlogs_own() -> None:
    kinds = [s.kind for s in installed_sources()]
    assert kinds[:3] == ["jsonl", "jsonl.gz", "kineto"] and "timer_log" in kinds
    assert JSONL.describe() == "*.jsonl" and JSONL_GZ.seekable is False


def test_discover_each_log_once_by_its_source(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_lines(run / "rank0.jsonl", [iter_line(0)])
    (run / "sub").mkdir()
    (run / "sub" / "rank1.jsonl.gz").write_bytes(gzip.compress(iter_line(0).encode() + b"\n"))
    (run / "run.json").write_text("{}")                     # the manifest: not a log
    write_lines(run / ".hidden" / "rank9.jsonl", [iter_line(0)])
    os.symlink(run / "rank0.jsonl", run / "again.jsonl")    # read once, by its own name
    outside = write_lines(tmp_path / "elsewhere.jsonl", [iter_line(0)])
    os.symlink(outside, run / "out.jsonl")                  # out of the run: not followed
    warnings: list[str] = []
    found = discover(run, warnings)
    assert [(p.relative_to(run).as_posix(), s.kind) for p, s in found] == [
        ("rank0.jsonl", "jsonl"), ("sub/rank1.jsonl.gz", "jsonl.gz")]
    assert len(warnings) == 1 and "out.jsonl" in warnings[0]


def test_survey_sees_links_and_unreadable_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_lines(run / "a.jsonl", [iter_line(0)])
    os.symlink(run / "a.jsonl", run / "b.jsonl")
    s = survey(run)
    assert s.files == {"a.jsonl"} and s.links_in == {"b.jsonl": "a.jsonl"}
    assert s.links_out == [] and s.unreadable == {}
    with pytest.raises(OSError):
        survey(tmp_path / "missing")


def test_a_registered_source_comes_after_the_installed_ones(tmp_path: Path) -> None:
    mine = Source(kind="mine", find=lambda root: sorted(root.glob("*.mine")),
                  decode=lambda p: [iter_line(0) + "\n"], label="*.mine")
    register_source(mine)
    try:
        assert active_sources()[-1] is mine
        run = tmp_path / "run"
        run.mkdir()
        (run / "x.mine").write_text("anything")
        assert [(p.name, s.kind) for p, s in discover(run)] == [("x.mine", "mine")]
    finally:
        unregister_source("mine")
    assert all(s.kind != "mine" for s in active_sources())
    unregister_source("mine")          # nothing registered: nothing happens


def test_line_offsets_and_counts() -> None:
    data = b'{"a": "x"}\n\n{"b": 1}\n'
    offs = line_offsets(data)
    assert offs.tolist() == [0, 11, 12, 21]
    offs2, quotes = line_offsets_quotes(data)
    assert offs2.tolist() == offs.tolist() and quotes.tolist() == [4, 0, 2]
    assert char_counts(data, offs, b":").tolist() == [1, 0, 1]
    assert quotes.dtype == np.int32


def test_digest_and_stat(tmp_path: Path) -> None:
    assert digest(b"head") == hashlib.blake2b(b"head", digest_size=16).hexdigest()
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    size, mtime, ident = stat(f)
    st = os.stat(f)
    assert (size, mtime, ident) == (5, st.st_mtime, (st.st_dev, st.st_ino))
