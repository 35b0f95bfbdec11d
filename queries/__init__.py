"""Named, parameterised SQL over tlog's stable tables, and read-only ad-hoc SQL.

The stored queries are the ``*.sql`` files of this package (package data), one
query per file named after what it returns; ``docs/QUERIES.md`` describes each.

>>> from tlog.queries import list_queries, load_query, run_query, run_sql  # doctest: +SKIP
>>> run_query(con, "phase_breakdown", {"run_id": "r1"})  # doctest: +SKIP
>>> run_sql("SELECT run_id FROM runs")  # doctest: +SKIP
"""

from __future__ import annotations

from tlog.queries.export import ExportReport, export_parquet
from tlog.queries.runner import (
    QUERY_DIR,
    REQUIRED,
    Column,
    Parameter,
    Query,
    WriteRefusedError,
    check_read_only,
    check_run,
    list_queries,
    load_query,
    parse_query,
    read_only_connection,
    run_query,
    run_sql,
)
from tlog.queries.sqltext import blank_comments_and_strings, find_parameters

__all__ = [
    "QUERY_DIR",
    "REQUIRED",
    "Column",
    "ExportReport",
    "Parameter",
    "Query",
    "WriteRefusedError",
    "blank_comments_and_strings",
    "check_read_only",
    "check_run",
    "export_parquet",
    "find_parameters",
    "list_queries",
    "load_query",
    "parse_query",
    "read_only_connection",
    "run_query",
    "run_sql",
]
