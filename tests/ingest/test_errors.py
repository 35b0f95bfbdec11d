"""``ingest.errors``: one family of user-facing errors, each with its exit code
(the CLI prints any of them as one line, tests/support/cli.py)."""

from __future__ import annotations

import pytest
from tlog.ingest.errors import (
    DatabaseError,
    DatabaseLockedError,
    QueryArgumentError,
    QueryError,
    RunDirError,
    RunNotFoundError,
    TlogError,
    TraceError,
    UsageError,
)

from tests.support.cli import assert_one_line_error, invoke


@pytest.mark.parametrize(("error", "parent", "code"), [
    (UsageError, TlogError, 2),
    (RunNotFoundError, TlogError, 1),
    (RunDirError, TlogError, 1),
    (DatabaseError, TlogError, 1),
    (DatabaseLockedError, DatabaseError, 1),
    (QueryError, TlogError, 1),
    (QueryArgumentError, QueryError, 2),     # a bad argument, as a usage error
    (TraceError, TlogError, 1),
])
def test_the_family_and_its_exit_codes(error: type, parent: type, code: int) -> None:
    assert issubclass(error, parent) and issubclass(error, TlogError)
    assert error.exit_code == code
    assert str(error("what is wrong; what to do")) == "what is wrong; what to do"


def test_the_cli_prints_one_as_its_line_and_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import tlog.cli  # noqa: F401  (registers every command)
    from tlog import api

    def refuse(*args, **kwargs):
        raise QueryArgumentError("parameter $x must be a number; give -p x=3")

    monkeypatch.setattr(api, "open", refuse)
    monkeypatch.setattr(api.Database, "__init__", refuse)
    line = assert_one_line_error(invoke(["runs", "--db", "nowhere.duckdb"]), 2)
    assert line == "tlog: error: parameter $x must be a number; give -p x=3"
