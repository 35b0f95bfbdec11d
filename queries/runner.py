"""Stored queries (``queries/*.sql``) and read-only ad-hoc SQL.

Stored queries
--------------
One query per ``.sql`` file in this package, named after what it returns
(google/perfetto's ``perfetto_sql/stdlib`` habit); files starting with ``_``
are private and not listed. Each file opens with a header comment::

    -- Runs ordered by steady throughput, fastest first.
    --
    -- Parameters:
    --   $limit INTEGER = 20: the most runs returned.
    --   $run_id VARCHAR: the run (no default: required).
    --
    -- Columns:
    --   run_id VARCHAR: the run.
    --   tokens_per_s DOUBLE (tokens/s): steady tokens per second.

The text before ``Parameters:`` is the query's purpose (its first sentence is
what ``tlog query --list`` shows). A parameter line is ``$name TYPE [= default]:
description``; the default is ``NULL``, a number, ``true``/``false`` or a
``'quoted string'``. A column line is ``name TYPE [(unit)]: description``.

Queries of one's own: a ``.sql`` file in the same form in a folder named by
the environment variable ``TLOG_QUERIES`` (several folders separated by
``os.pathsep``) is listed and run like tlog's (``tlog query --list``,
``tlog query NAME``); tlog's own come first, so a file of one's own cannot
replace one of them (:func:`query_dirs`).

Parameters are found in the body after comments and string literals are
removed (:mod:`queries.sqltext`); a missing or unknown parameter is a
:class:`~ingest.errors.QueryError` before DuckDB sees the query, and values only
ever reach DuckDB as bound parameters (``$name``), never through string
formatting (simonw/datasette's rule).

Ad-hoc SQL
----------
:func:`run_sql` runs one statement over a connection that cannot write, with
two independent guards:

1. Before execution the statement is parsed by DuckDB
   (``duckdb.extract_statements``) and refused unless it is a query
   (``SELECT``, ``WITH ... SELECT``, ``FROM``, ``VALUES``, ``TABLE``,
   ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``, ``PIVOT ... IN``, ``UNPIVOT``) or
   ``EXPLAIN [ANALYZE]`` of one; a data-modifying CTE
   (``WITH x AS (INSERT ... RETURNING *) SELECT ...``, which DuckDB parses as a
   ``SELECT``) is refused too.
2. The connection is opened with ``read_only=True`` and then locked down with
   ``SET enable_external_access = false`` and ``SET lock_configuration = true``:
   DuckDB's read-only mode alone still lets ``COPY ... TO``, ``EXPORT
   DATABASE``, ``ATTACH``, ``SET`` and ``LOAD`` through (checked against DuckDB
   2.0.1), and external access off blocks every file read or write outside the
   database. Whatever still fails as a write is reported as a refusal.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
from tlog.analyze.persist import ensure_attribution
from tlog.ingest.db import SCHEMA_VERSION, connect, schema_version
from tlog.ingest.errors import QueryArgumentError, QueryError, RunNotFoundError, UsageError
from tlog.queries.sqltext import blank_comments_and_strings, find_parameters

from dflash_runtime.format import INT32_MAX

#: Where the stored ``.sql`` files live (package data).
QUERY_DIR = Path(__file__).resolve().parent

#: Environment variable naming folders of one's own stored queries
#: (``os.pathsep``-separated), searched after :data:`QUERY_DIR`.
QUERIES_ENV = "TLOG_QUERIES"

#: Parameter types a stored query may declare, and how a text value becomes one.
PARAMETER_TYPES: tuple[str, ...] = ("VARCHAR", "INTEGER", "BIGINT", "DOUBLE", "BOOLEAN",
                                    "DATE", "TIMESTAMP")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")
_PARAM_LINE_RE = re.compile(
    r"^\$(?P<name>[A-Za-z_]\w*)\s+(?P<type>[A-Z]+)"
    r"(?:\s*=\s*(?P<default>'(?:[^']|'')*'|[^\s:]+))?\s*:\s*(?P<doc>.+)$")
_COLUMN_LINE_RE = re.compile(
    r"^(?P<name>[A-Za-z_]\w*)\s+(?P<type>[A-Z][A-Z0-9_\[\]]*)"
    r"(?:\s*\((?P<unit>[^)]*)\))?\s*:\s*(?P<doc>.+)$")
_TRUE = frozenset({"true", "t", "yes", "y", "1", "on"})
_FALSE = frozenset({"false", "f", "no", "n", "0", "off"})


class _Required:
    """Marker: a parameter without a default must be given."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a parameter that has none (it must be given).
REQUIRED: Any = _Required()


class WriteRefusedError(QueryError):
    """Ad-hoc SQL that would write (to the database or a file) was refused."""

    exit_code = 2


@dataclass(frozen=True)
class Parameter:
    """A named parameter declared in a stored query's header.

    ``default`` is :data:`REQUIRED` when the parameter must be given, else the
    converted default value (``None`` for ``NULL``).
    """

    name: str
    type: str
    default: Any
    description: str

    @property
    def required(self) -> bool:
        """True when the caller must give a value."""
        return self.default is REQUIRED

    def convert(self, value: Any) -> Any:
        """Turn ``value`` into this parameter's type.

        A ``str`` (as typed on the command line) is parsed by :attr:`type`;
        other Python values are passed on for DuckDB to bind as they are.

        Raises:
            QueryError: the text is not a value of the declared type.
        """
        if not isinstance(value, str):
            return value
        return _parse_value(value, self.type, what=f"parameter ${self.name}")

    def to_dict(self) -> dict[str, Any]:
        """JSON form: name, type, required, default, description."""
        return {"name": self.name, "type": self.type, "required": self.required,
                "default": None if self.required else _jsonable(self.default),
                "description": self.description}


@dataclass(frozen=True)
class Column:
    """An output column declared in a stored query's header (unit may be empty)."""

    name: str
    type: str
    unit: str
    description: str

    def to_dict(self) -> dict[str, str]:
        """JSON form: name, type, unit, description."""
        return {"name": self.name, "type": self.type, "unit": self.unit,
                "description": self.description}


@dataclass(frozen=True)
class Query:
    """A stored query: its header (purpose, parameters, columns) and its SQL.

    ``used`` lists the parameters the SQL body uses (comments and strings
    removed), in order of first use.
    """

    name: str
    path: Path
    purpose: str
    parameters: tuple[Parameter, ...]
    columns: tuple[Column, ...]
    sql: str
    used: tuple[str, ...] = field(default=())

    @property
    def summary(self) -> str:
        """The purpose's first sentence (what ``tlog query --list`` shows)."""
        first = re.split(r"(?<=[.!?])\s", self.purpose, maxsplit=1)[0]
        return first.strip()

    def parameter(self, name: str) -> Parameter | None:
        """The declared parameter ``name`` (without ``$``), or None."""
        return next((p for p in self.parameters if p.name == name), None)

    def bind(self, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The bound-parameter dict for DuckDB: given values converted, defaults filled.

        Raises:
            QueryArgumentError: a value names a parameter the query does not take,
                a required parameter is missing, or a value does not parse as its
                type (exit 2: a bad argument).
        """
        values = dict(values or {})
        known = {p.name for p in self.parameters}
        unknown = sorted(k for k in values if k.lstrip("$") not in known)
        if unknown:
            takes = ", ".join(f"${p.name}" for p in self.parameters) or "no parameters"
            raise QueryArgumentError(f"query {self.name!r} has no parameter "
                             f"{', '.join('$' + u.lstrip('$') for u in unknown)}; it takes: {takes}")
        given = {k.lstrip("$"): v for k, v in values.items()}
        missing = [p for p in self.parameters if p.required and p.name not in given]
        if missing:
            p = missing[0]
            raise QueryArgumentError(f"query {self.name!r} needs parameter ${p.name} ({p.type}: "
                                     f"{p.description.rstrip('.')}); give it with -p "
                                     f"{p.name}=VALUE")
        bound: dict[str, Any] = {}
        for p in self.parameters:
            if p.name in self.used:
                bound[p.name] = p.convert(given[p.name]) if p.name in given else p.default
        return bound

    def to_dict(self) -> dict[str, Any]:
        """JSON form: name, purpose, parameters, columns (not the SQL)."""
        return {"name": self.name, "purpose": self.purpose,
                "parameters": [p.to_dict() for p in self.parameters],
                "columns": [c.to_dict() for c in self.columns]}


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, date | datetime) else value


def _parse_value(text: str, type_: str, *, what: str) -> Any:
    """Parse ``text`` as a value of SQL type ``type_`` (see :data:`PARAMETER_TYPES`)."""
    try:
        if type_ == "VARCHAR":
            return text
        if type_ == "INTEGER":        # the stored queries' INTEGERs are counts
            value = int(text.strip())
            if not 0 <= value <= INT32_MAX:
                msg = f"{what} must be a count from 0 to {INT32_MAX:,}, got {text!r}"
                raise QueryArgumentError(msg)
            return value
        if type_ == "BIGINT":
            return int(text.strip())
        if type_ == "DOUBLE":
            value = float(text.strip())
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        if type_ == "BOOLEAN":
            low = text.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(text)
        if type_ == "DATE":
            return date.fromisoformat(text.strip())
        if type_ == "TIMESTAMP":
            return datetime.fromisoformat(text.strip())
    except ValueError:
        article = "an" if type_[0] in "AEIOU" else "a"
        msg = f"{what} must be {article} {type_}, got {text!r}"
        raise QueryArgumentError(msg) from None
    msg = f"{what} has type {type_}; stored queries may use {', '.join(PARAMETER_TYPES)}"
    raise QueryError(msg)


def _parse_default(text: str, type_: str, *, what: str) -> Any:
    if text.upper() == "NULL":
        return None
    if text.startswith("'") and text.endswith("'") and len(text) >= 2:
        text = text[1:-1].replace("''", "'")
    return _parse_value(text, type_, what=what)


def parse_query(name: str, text: str, *, path: Path | None = None) -> Query:
    """Parse a stored query file's text: its header comment and body.

    Args:
        name: the query name (the file name without ``.sql``).
        text: the whole file.
        path: where it came from (for messages).

    Raises:
        QueryError: the header has no purpose, a malformed parameter or column
            line, an unknown parameter type, or declares parameters that differ
            from those the body uses.
    """
    where = str(path) if path else name
    header: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped.startswith("--"):
            if stripped:
                break
            continue
        header.append((lineno, stripped[2:].strip()))
    purpose_lines: list[str] = []
    params: list[Parameter] = []
    columns: list[Column] = []
    section = "purpose"
    for lineno, line in header:
        low = line.lower()
        if low.startswith("parameters:"):
            section = "parameters"
            rest = line.split(":", 1)[1].strip()
            if rest and rest.lower() not in ("none", "none."):
                raise QueryError(f"{where}:{lineno}: write parameters one per line below 'Parameters:'")
            continue
        if low.startswith("columns:"):
            section = "columns"
            continue
        if not line:
            continue
        if section == "purpose":
            purpose_lines.append(line)
        elif section == "parameters":
            m = _PARAM_LINE_RE.match(line)
            if not m:
                raise QueryError(f"{where}:{lineno}: parameter line must read "
                                 f"'$name TYPE [= default]: description', got {line!r}")
            type_ = m["type"]
            if type_ not in PARAMETER_TYPES:
                raise QueryError(f"{where}:{lineno}: parameter ${m['name']} has type {type_}; "
                                 f"use one of {', '.join(PARAMETER_TYPES)}")
            default = (REQUIRED if m["default"] is None
                       else _parse_default(m["default"], type_, what=f"{where}:{lineno}: default"))
            params.append(Parameter(m["name"], type_, default, m["doc"].strip()))
        else:
            m = _COLUMN_LINE_RE.match(line)
            if not m:
                raise QueryError(f"{where}:{lineno}: column line must read "
                                 f"'name TYPE [(unit)]: description', got {line!r}")
            columns.append(Column(m["name"], m["type"], (m["unit"] or "").strip(), m["doc"].strip()))
    if not purpose_lines:
        raise QueryError(f"{where}: the header comment must start with the query's purpose")
    if not columns:
        raise QueryError(f"{where}: the header comment must list the output columns under 'Columns:'")
    used = find_parameters(text)
    declared = [p.name for p in params]
    if sorted(used) != sorted(declared):
        extra = sorted(set(used) - set(declared))
        unused = sorted(set(declared) - set(used))
        parts = []
        if extra:
            parts.append("uses undeclared " + ", ".join("$" + x for x in extra))
        if unused:
            parts.append("declares unused " + ", ".join("$" + x for x in unused))
        raise QueryError(f"{where}: header and body disagree: {'; '.join(parts)}")
    return Query(name=name, path=path or QUERY_DIR / f"{name}.sql", purpose=" ".join(purpose_lines),
                 parameters=tuple(params), columns=tuple(columns), sql=text, used=tuple(used))


def query_dirs() -> tuple[Path, ...]:
    """Where stored queries are looked for, in order: :data:`QUERY_DIR` (tlog's),
    then each folder named by ``$TLOG_QUERIES`` (:data:`QUERIES_ENV`).

    Raises:
        QueryError: a folder named by ``$TLOG_QUERIES`` is not a folder.
    """
    extra = [Path(p).expanduser() for p in os.environ.get(QUERIES_ENV, "").split(os.pathsep)
             if p.strip()]
    for folder in extra:
        if not folder.is_dir():
            raise QueryError(f"{QUERIES_ENV} names {str(folder)!r}, which is not a folder")
    return (QUERY_DIR, *extra)


def _search(directory: Path | None) -> tuple[Path, ...]:
    return query_dirs() if directory is None else (directory,)


#: Query files already warned about as hidden by an earlier folder's query of
#: the same name (one warning per file per process).
_WARNED_SHADOWED: set[Path] = set()


def _warn_shadowed(folders: tuple[Path, ...]) -> None:
    """One ``RuntimeWarning`` per query file that an earlier folder's query of the
    same name hides (a ``$TLOG_QUERIES`` file named like one of tlog's): it never runs."""
    seen: dict[str, Path] = {}
    for folder in folders:
        for p in sorted(folder.glob("*.sql")):
            if p.name.startswith("_"):
                continue
            if p.stem in seen:
                if p not in _WARNED_SHADOWED:
                    _WARNED_SHADOWED.add(p)
                    warnings.warn(f"tlog: stored query {p} is never used: {seen[p.stem]} has "
                                  f"the same name and comes first (tlog's queries, then "
                                  f"${QUERIES_ENV} in order); rename it", RuntimeWarning,
                                  stacklevel=3)
            else:
                seen[p.stem] = p


def list_queries(directory: Path | None = None) -> list[str]:
    """Names of the public stored queries (``*.sql`` not starting with ``_``), sorted,
    each once: those of ``directory``, or (``None``) of every folder of :func:`query_dirs`.
    A query file hidden by an earlier folder's of the same name is a
    ``RuntimeWarning`` naming it (once per process).

    Raises:
        QueryError: as :func:`query_dirs`.
    """
    folders = _search(directory)
    _warn_shadowed(folders)
    return sorted({p.stem for folder in folders for p in folder.glob("*.sql")
                   if not p.name.startswith("_")})


def load_queries(directory: Path | None = None) -> list[Query]:
    """Every query of :func:`list_queries`, loaded, by name (``tlog query --list``).
    A file that cannot be loaded (not UTF-8 text, a malformed header) is left
    out with a ``RuntimeWarning`` naming it and why: one bad file of one's own
    never hides the others.

    Raises:
        QueryError: as :func:`query_dirs`.
    """
    out = []
    for name in list_queries(directory):
        try:
            out.append(load_query(name, directory))
        except QueryError as exc:
            warnings.warn(f"tlog: stored query {name!r} left out: {exc}", RuntimeWarning,
                          stacklevel=2)
    return out


def load_query(name: str, directory: Path | None = None) -> Query:
    """Load and parse the stored query ``name`` (without ``.sql``), from
    ``directory``, or (``None``) from the first folder of :func:`query_dirs` that holds it.

    Raises:
        QueryError: no such query (the message lists the known ones), its
            header is malformed (see :func:`parse_query`), or as :func:`query_dirs`.
    """
    stem = name.removesuffix(".sql")
    folders = _search(directory)
    _warn_shadowed(folders)
    paths = [folder / f"{stem}.sql" for folder in folders]
    path = next((p for p in paths if p.is_file()), None)
    if not _NAME_RE.match(stem) or path is None:
        known = ", ".join(list_queries(directory)) or "none"
        raise QueryError(f"unknown query {name!r}; known queries: {known} (see 'tlog query --list')")
    return _load_cached(path, path.stat().st_mtime_ns)


@cache
def _load_cached(path: Path, _mtime_ns: int) -> Query:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise QueryError(f"stored query file {path} is not UTF-8 text (byte "
                         f"{exc.start}: {exc.object[exc.start:exc.start + 1]!r}); save it "
                         f"as UTF-8") from exc
    except OSError as exc:
        raise QueryError(f"cannot read stored query file {path}: "
                         f"{exc.strerror or exc}") from exc
    return parse_query(path.stem, text, path=path)


def run_query(con: duckdb.DuckDBPyConnection, name: str | Query,
              params: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """Run a stored query and return its rows as a polars DataFrame.

    Args:
        con: an open tlog database connection (read-only is enough). The
            query must be one statement that only reads (:func:`check_read_only`,
            the guard of ``tlog sql``), also on a writable connection: a query
            file from a shared ``$TLOG_QUERIES`` folder never writes.
        name: a stored query name, or a :class:`Query`.
        params: parameter values by name (``"run_id"`` or ``"$run_id"``);
            strings are parsed by the declared type, other values bound as given.

    Returns:
        One row per result row, columns as in the query header.

    Raises:
        QueryError: unknown query or parameter, missing parameter, bad value,
            or DuckDB rejects the query (message: its first line).
        RunNotFoundError: the query takes ``$run_id`` and no such run is stored.
        WriteRefusedError: the query's text is not one read-only statement.
    """
    query = checked_query(name)
    bound = query.bind(params)
    if bound.get("run_id") is not None:
        check_run(con, bound["run_id"])
    if reads_diagnosis(query.sql):
        # the stored diagnosis of the runs the query reads, fresh (tlog.analyze.persist)
        ensure_attribution(con, None if "run_id" not in bound else [bound["run_id"]])
    try:
        return con.sql(query.sql, params=bound).pl()
    except duckdb.Error as exc:
        old = isinstance(exc, duckdb.CatalogException) and schema_version(con) < SCHEMA_VERSION
        hint = (f" (the database is at schema version {schema_version(con)}, older than "
                f"{SCHEMA_VERSION}: run 'tlog ingest' on it once to migrate it)") if old else ""
        raise query_failure(query, exc, hint=hint) from exc


def query_failure(query: Query, exc: duckdb.Error, *, hint: str = "") -> QueryError:
    """The one-line error for DuckDB's ``exc`` running stored ``query``: a
    :class:`~ingest.errors.QueryArgumentError` for the query's own check of a
    parameter (``error('... $name ...')``), else a :class:`~ingest.errors.QueryError`
    with DuckDB's first line and ``hint``."""
    said = _first_line(exc)
    if isinstance(exc, duckdb.InvalidInputException) and "$" in said and \
            said.startswith("Invalid Input Error: "):
        return QueryArgumentError(f"query {query.name!r}: "
                                  f"{said.removeprefix('Invalid Input Error: ')}")
    return QueryError(f"query {query.name!r} failed: {said}{hint}")


def checked_query(name: str | Query) -> Query:
    """The stored query ``name`` (loaded) after the guard of ``tlog sql``: one
    statement that only reads (:func:`check_read_only`).

    Raises:
        QueryError, UsageError, WriteRefusedError: as :func:`load_query` and
            :func:`check_read_only`, the message naming the query and its file.
    """
    query = name if isinstance(name, Query) else load_query(name)
    try:
        check_read_only(query.sql)   # the guard of tlog sql, whatever the connection
    except (QueryError, UsageError) as exc:
        where = f" ({query.path})" if getattr(query, "path", None) else ""
        raise type(exc)(f"query {query.name!r}{where}: {exc}") from exc
    return query


def reads_diagnosis(sql: str) -> bool:
    """Whether SQL text reads the stored diagnosis (the ``attribution*`` tables or
    the ``_run_throughput`` macro over them), outside comments and strings."""
    text = blank_comments_and_strings(sql).lower()
    return "attribution" in text or "_run_throughput" in text


def check_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Raise :class:`~ingest.errors.RunNotFoundError` unless ``run_id`` has a
    ``runs`` row or iterations in the database."""
    found = con.sql("SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = $r) "
                    "OR EXISTS (SELECT 1 FROM iterations WHERE run_id = $r)",
                    params={"r": run_id}).fetchall()[0][0]
    if not found:
        msg = f"no run {run_id!r} in the database: 'tlog runs' lists the run ids"
        raise RunNotFoundError(msg)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- read-only ad-hoc SQL ----------------------------------------------------

#: Statement types that only read. DESCRIBE/SHOW/SUMMARIZE, FROM-first, VALUES,
#: TABLE, UNPIVOT and PIVOT with an IN list all parse as SELECT in DuckDB 2.0.
READ_STATEMENTS: frozenset[str] = frozenset({"SELECT"})
_EXPLAIN_RE = re.compile(r"^\s*EXPLAIN\b(?:\s+ANALY[SZ]E\b)?(?:\s*\([^)]*\))?", re.IGNORECASE)
#: A data-modifying CTE: DuckDB runs ``WITH x AS (INSERT ... RETURNING *) SELECT``.
_DML_IN_PARENS_RE = re.compile(r"\(\s*(INSERT|UPDATE|DELETE|MERGE|COPY)\b", re.IGNORECASE)
_ONLY_READS = ("tlog sql only reads: SELECT (WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE) "
               "or EXPLAIN of one; runs are written by 'tlog ingest'")


def _statement_kind(stmt: Any) -> str:
    kind = stmt.type
    return getattr(kind, "name", str(kind)).upper()


def check_read_only(sql: str) -> str:
    """Check that ``sql`` is exactly one statement that only reads; return it.

    Uses DuckDB's own parser, so a statement behind a comment
    (``-- SELECT\\nDROP TABLE runs``) or after another
    (``SELECT 1; DELETE FROM runs``) is seen for what it is.

    Returns:
        The statement's text (DuckDB's normalised form is not used; comments stay).

    Raises:
        UsageError: the text holds no statement.
        WriteRefusedError: a statement is not a read (``INSERT``, ``DROP``,
            ``ATTACH``, ``COPY``, ``SET``, ``PRAGMA``, ``CALL``, ``LOAD`` ...), a
            CTE modifies data, or there is more than one statement.
        QueryError: DuckDB cannot parse the text (its message's first line).
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse the SQL: {_first_line(exc)}") from exc
    if not statements:
        raise UsageError("no SQL statement given")
    for number, stmt in enumerate(statements, 1):
        kind = _statement_kind(stmt)
        if kind == "EXPLAIN":
            kind = _explained_kind(stmt.query)
        if kind not in READ_STATEMENTS:
            where = f"statement {number} of {len(statements)}" if len(statements) > 1 else "the statement"
            raise WriteRefusedError(f"refused: {where} is {kind}, not a read; {_ONLY_READS}")
        code = blank_comments_and_strings(stmt.query)
        if m := _DML_IN_PARENS_RE.search(code):
            raise WriteRefusedError(f"refused: the query runs {m.group(1).upper()} inside a "
                                    f"WITH clause; {_ONLY_READS}")
    if len(statements) > 1:
        raise WriteRefusedError(f"refused: {len(statements)} statements given; tlog sql runs one "
                                "statement at a time")
    return statements[0].query


def _explained_kind(text: str) -> str:
    code = blank_comments_and_strings(text)
    m = _EXPLAIN_RE.match(code)
    if not m:
        return "EXPLAIN"
    try:
        inner = duckdb.extract_statements(text[m.end():])
    except duckdb.Error:
        return "EXPLAIN"
    if len(inner) != 1:
        return "EXPLAIN"
    kind = _statement_kind(inner[0])
    return kind if kind != "EXPLAIN" else "EXPLAIN"


@contextmanager
def read_only_connection(db: str | Path | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """Open the tlog database so that nothing run on it can write anywhere.

    ``read_only=True`` (no change to the database), then
    ``enable_external_access = false`` (no file read or written outside it:
    ``COPY ... TO``, ``EXPORT DATABASE``, ``ATTACH``, ``read_csv`` ...) and
    ``lock_configuration = true`` (no ``SET`` can undo that). The connection is
    closed on exit.

    Note: DuckDB refuses a read-only connection to a file that this same
    process holds open read-write; close that one first.

    Raises:
        DatabaseError: no database at the path, or it is locked or too new.
    """
    con = connect(db, read_only=True)
    try:
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        yield con
    finally:
        con.close()


def run_sql(sql: str, *, db: str | Path | None = None,
            con: duckdb.DuckDBPyConnection | None = None,
            max_rows: int | None = None) -> pl.DataFrame:
    """Run one ad-hoc read-only SQL statement; return its rows as a polars DataFrame.

    Args:
        sql: one statement (see :func:`check_read_only` for what is allowed).
        db: the database file (default: ``$TLOG_DB``, else the user data dir).
        con: a connection from :func:`read_only_connection` to use instead of
            opening one (``db`` is then ignored).
        max_rows: fetch at most this many rows (None: all); the rest are never
            materialised (``tlog serve`` asks for one more than it shows, to
            know the result was cut).

    Raises:
        WriteRefusedError: the statement would write (checked before execution,
            and again by the read-only, no-external-access connection).
        QueryError: DuckDB rejects the statement (its message's first line).
        DatabaseError: the database cannot be opened.

    >>> run_sql("SELECT count(*) AS n FROM runs")  # doctest: +SKIP
    """
    text = check_read_only(sql)
    if con is None:
        with read_only_connection(db) as own:
            return _execute_read(own, text, max_rows)
    return _execute_read(con, text, max_rows)


def _execute_read(con: duckdb.DuckDBPyConnection, text: str,
                  max_rows: int | None = None) -> pl.DataFrame:
    if reads_diagnosis(text):
        ensure_attribution(con)   # the stored diagnosis, fresh for every run
    try:
        rel = con.sql(text)
        if rel is None:  # not a query (cannot happen after check_read_only)
            return pl.DataFrame()
        return (rel if max_rows is None else rel.limit(max_rows)).pl()
    except (duckdb.PermissionException, duckdb.InvalidInputException) as exc:
        first = _first_line(exc)
        if "read-only" in first or "disabled by configuration" in first or "locked" in first:
            raise WriteRefusedError(f"refused: {first}") from exc
        raise QueryError(f"SQL failed: {first}") from exc
    except duckdb.Error as exc:
        raise QueryError(f"SQL failed: {_first_line(exc)}") from exc
