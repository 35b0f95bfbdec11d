"""Named, parameterised SQL over tlog's stable tables, and read-only ad-hoc SQL.

The stored queries are the ``*.sql`` files of this package (package data), one
query per file named after what it returns; ``docs/QUERIES.md`` describes each.

>>> from tlog.queries import list_queries, load_query, run_query, run_sql  # doctest: +SKIP
>>> run_query(con, "phase_breakdown", {"run_id": "r1"})  # doctest: +SKIP
>>> run_sql("SELECT run_id FROM runs")  # doctest: +SKIP
"""

from __future__ import annotations

from dflash_runtime.lazy import lazy_exports

#: Public name -> its module, imported on first use (module ``__getattr__``:
#: the CLI's start-up loads no polars).
_EXPORTS = {
    "ExportReport": "export", "export_parquet": "export",
    "LakeError": "lake", "PublishReport": "lake", "publish_run": "lake", "publish_runs": "lake",
    "read_lake": "lake", "run_lake_query": "lake_sql", "run_lake_sql": "lake_sql",
    "blank_comments_and_strings": "sqltext", "find_parameters": "sqltext",
    **{name: "runner" for name in (
        "QUERIES_ENV", "QUERY_DIR", "REQUIRED", "Column", "Parameter", "Query",
        "WriteRefusedError", "check_read_only", "check_run", "list_queries", "load_queries",
        "load_query", "parse_query", "query_dirs", "read_only_connection", "run_query", "run_sql")},
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "QUERIES_ENV",
    "QUERY_DIR",
    "REQUIRED",
    "Column",
    "ExportReport",
    "LakeError",
    "Parameter",
    "PublishReport",
    "Query",
    "WriteRefusedError",
    "blank_comments_and_strings",
    "check_read_only",
    "check_run",
    "export_parquet",
    "find_parameters",
    "list_queries",
    "load_queries",
    "load_query",
    "parse_query",
    "publish_run",
    "publish_runs",
    "query_dirs",
    "read_lake",
    "read_only_connection",
    "run_lake_query",
    "run_lake_sql",
    "run_query",
    "run_sql",
]
