"""Fixtures of the whole suite.

``sys`` sampling off by default (``TLOG_SYS_INTERVAL=0``, inherited by the
subprocesses tests start): the shim writes a ``sys`` record every 2 s of wall
time, so their number in a run depends on how long it took, while most tests
assert the exact records and counts of the kinds they are about. Tests of the
sampler and of what is built on it turn it on themselves: ``Recorder(...,
sys_interval=...)`` (an argument wins over the environment) or
``monkeypatch.setenv("TLOG_SYS_INTERVAL", ...)``.

``db``: a fresh database (closed after the test). ``build``: a hand-made run (:class:`tests.support.runbuilder.RunBuilder`)
written into a fresh database (docs/TESTING.md lists the shared helpers).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import duckdb

    from tests.support.runbuilder import RunBuilder


def pytest_configure(config: pytest.Config) -> None:
    """Sampling off for module- and session-scoped fixtures too: they run before
    the function-scoped fixture below (a module fixture's loop recorded ``sys``
    samples at the default 2 s, and its run got the machine's findings).

    ``TLOG_DB``: a database of this test process's own, so that a command a test
    runs without ``--db`` never writes the user's database nor one another
    pytest-xdist worker holds open (DuckDB lets one process write a file)."""
    os.environ["TLOG_SYS_INTERVAL"] = "0"
    # A pytest-xdist worker (execnet) starts with SIGINT ignored, and a process it
    # starts inherits that: a `tlog ingest --follow` child never saw the test's
    # Ctrl-C, and an in-process interrupt never came. Tests run as a user's shell
    # runs tlog: SIGINT raises KeyboardInterrupt.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    own = Path(tempfile.mkdtemp(prefix="tlog-tests-"))
    config.add_cleanup(lambda: shutil.rmtree(own, ignore_errors=True))
    os.environ["TLOG_DB"] = str(own / "tlog.duckdb")


@pytest.fixture(autouse=True)
def _sys_sampling_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLOG_SYS_INTERVAL", "0")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh database, ``tmp_path/tlog.duckdb`` (closed after the test)."""
    from tlog.ingest import connect

    con = connect(tmp_path / "tlog.duckdb")
    yield con
    con.close()


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Callable[[RunBuilder], duckdb.DuckDBPyConnection]]:
    """``build(builder) -> connection``: write a :class:`~tests.support.runbuilder.RunBuilder`
    to a fresh database, closed after the test: ``tmp_path/<run id>.duckdb``, and
    ``<run id>-2.duckdb`` (and so on) for a later run of the same id."""
    cons = []

    def _build(builder: RunBuilder) -> duckdb.DuckDBPyConnection:
        path, k = tmp_path / f"{builder.run_id}.duckdb", 1
        while path.exists():
            k += 1
            path = tmp_path / f"{builder.run_id}-{k}.duckdb"
        con = builder.write(path)
        cons.append(con)
        return con

    yield _build
    for con in cons:
        con.close()
