"""Exceptions raised by tlog's library layers (ingest, analyze, queries, reports).

Every user-facing failure is a subclass of :class:`TlogError`; the CLI turns
each into a one-line ``tlog: error: ...`` message and a non-zero exit code in
one place (``tlog.app``), never a traceback.
"""

from __future__ import annotations


class TlogError(Exception):
    """A user-facing failure: the message says what is wrong and what to do."""

    exit_code = 1


class UsageError(TlogError):
    """The caller asked for something that cannot be (bad argument or option)."""

    exit_code = 2


class RunNotFoundError(TlogError):
    """No run with the given id is in the database."""


class RunDirError(TlogError):
    """A run directory (or trace file) is missing, unreadable or holds no logs."""


class DatabaseError(TlogError):
    """The database cannot be opened, is locked by another process, or is too new."""


class DatabaseLockedError(DatabaseError):
    """Another process holds the database's write lock (DuckDB: one writer per file)."""


class QueryError(TlogError):
    """A stored or ad-hoc SQL query is unknown, badly parameterised or refused."""


class QueryArgumentError(QueryError):
    """A query parameter given on the command line is unknown, missing or does
    not parse as its type: a bad argument (exit 2, like :class:`UsageError`)."""

    exit_code = 2


class TraceError(TlogError):
    """A profiler trace cannot be turned into iterations."""
