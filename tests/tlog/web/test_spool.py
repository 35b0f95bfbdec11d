"""``tlog.web.spool``: shipped ranges appended once, names that cannot escape the
spool, gzip bounded (files in a temporary spool)."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest
from tlog.ingest.errors import UsageError

from tlog.web.spool import (
    MAX_DEPTH,
    Copy,
    ShipConflict,
    Spool,
    check_name,
    check_rel,
    gunzip,
    head_of,
)


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_a_range_is_written_where_the_copy_ends_only(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    assert spool.append("r1", "logs/rank0.jsonl", 0, b"abc\n") == Copy(4, _sha(b"abc\n"))
    assert spool.append("r1", "logs/rank0.jsonl", 4, b"def\n") == Copy(8, _sha(b"abc\ndef\n"))
    with pytest.raises(ShipConflict) as info:          # sent twice: nothing written
        spool.append("r1", "logs/rank0.jsonl", 4, b"def\n")
    assert (info.value.size, info.value.head) == (8, _sha(b"abc\ndef\n"))
    assert (tmp_path / "spool" / "r1" / "logs" / "rank0.jsonl").read_bytes() == b"abc\ndef\n"
    with pytest.raises(ShipConflict) as info:
        spool.append("r1", "new.jsonl", 5, b"x")
    assert (info.value.size, info.value.head) == (0, _sha(b""))


def test_replace_starts_the_copy_anew(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append("r", "run.json", 0, b'{"v": 1, "long": true}')
    assert spool.append("r", "run.json", 0, b'{"v": 1}', replace=True) == Copy(8,
                                                                               _sha(b'{"v": 1}'))
    with pytest.raises(UsageError, match="replace=1 sends a file from its start"):
        spool.append("r", "run.json", 3, b"x", replace=True)
    assert spool.files("r") == {"run.json": Copy(8, _sha(b'{"v": 1}'))}
    assert spool.files("nothing") == {}


@pytest.mark.parametrize("bad", ["..", ".hidden", "a/b", "", "x" * 129, "é", "a b"])
def test_names_that_could_escape_are_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="use letters, digits and _.+=@-"):
        check_name(bad, "run")


def test_relative_paths() -> None:
    assert check_rel("logs/rank0.jsonl") == ("logs", "rank0.jsonl")
    with pytest.raises(UsageError):
        check_rel("../etc/passwd")
    with pytest.raises(UsageError, match=f"a relative path of 1 to {MAX_DEPTH} parts"):
        check_rel("/".join(["d"] * (MAX_DEPTH + 1)))
    with pytest.raises(UsageError):
        Spool(Path("/tmp")).append("r", "a//b", 0, b"")


def test_gunzip_is_bounded() -> None:
    assert gunzip(gzip.compress(b"hello")) == b"hello"
    with pytest.raises(UsageError, match="more than 10 bytes once decompressed"):
        gunzip(gzip.compress(b"x" * 11), limit=10)
    with pytest.raises(UsageError, match="not gzip data"):
        gunzip(b"plain text")
    with pytest.raises(UsageError, match="cut short"):
        gunzip(gzip.compress(b"hello world")[:-8])


def test_head_of_is_the_senders_fingerprint(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 2000)
    assert head_of(f) == _sha(b"x" * 1024)
    assert head_of(f, 10) == _sha(b"x" * 10)
