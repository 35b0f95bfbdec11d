"""``ingest.threads.threads_from_env``: ``$TLOG_THREADS`` read and checked (the
threads DuckDB and polars then use: tests/ingest/test_threads_env.py)."""

from __future__ import annotations

import pytest
from tlog.ingest.threads import THREADS_ENV, threads_from_env


@pytest.mark.parametrize(("value", "threads"), [(None, None), ("", None), ("  ", None),
                                                ("1", 1), (" 12 ", 12)])
def test_a_whole_number_or_unset(monkeypatch, value, threads) -> None:
    if value is None:
        monkeypatch.delenv(THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(THREADS_ENV, value)
    assert threads_from_env() == threads


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two", "+3"])
def test_anything_else_is_one_line(monkeypatch, value) -> None:
    monkeypatch.setenv(THREADS_ENV, value)
    with pytest.raises(ValueError) as info:
        threads_from_env()
    assert str(info.value) == (f"$TLOG_THREADS is {value!r}: give a whole number of threads "
                               f">= 1, or unset it")
