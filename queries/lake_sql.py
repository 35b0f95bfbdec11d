"""The stored queries over a run lake, on DuckDB or on Spark SQL, with the database's rows.

One SQL text per query: the ``queries/*.sql`` files are DuckDB SQL, run as
they are by DuckDB over the lake's Parquet files, and turned into Spark SQL by
sqlglot (:func:`to_spark_sql`, tobymao/sqlglot's DuckDB reader and Spark
writer) with a few rewrites sqlglot leaves to the caller:

- the private table macro ``_run_throughput(x)`` (``tlog.ingest.db``; Spark
  has no table macros) is inlined as a subquery of ``RUN_THROUGHPUT_SQL``;
- ``error(msg)`` becomes ``raise_error(msg)``; ``WITH x AS MATERIALIZED`` loses
  the hint (Spark plans CTEs itself);
- ``tags ->> $key`` (a JSON key from a parameter) becomes
  ``get_json_object(tags, '$.' || :key)``; ``from_json(x, '<DuckDB structure>')``
  gets the structure as Spark's DDL type;
- decimal literals (``1.0``) become DOUBLE, as DuckDB computes with them (Spark
  would carry DECIMAL through averages).

Parameters reach both engines as bound parameters (DuckDB ``$name``, Spark
``:name`` through ``spark.sql(text, args=...)``), never through the text.

Each table of the lake is a view over exactly the files its manifests name
(:func:`tlog.queries.lake.read_lake`), so a query sees each run whole; when a
file vanishes under it (a publish replaced the run) it is run again on the
manifests read anew (:data:`tlog.queries.lake.READ_RETRIES`).

Results are polars frames with the columns of the query's header; timestamps
are naive UTC on both engines.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import polars as pl
from tlog.ingest.db import RUN_THROUGHPUT_SQL
from tlog.ingest.errors import QueryArgumentError, QueryError, RunNotFoundError, UsageError
from tlog.queries.lake import LAKE_TABLES, READ_RETRIES, LakeError, LakeSnapshot, read_lake
from tlog.queries.runner import Query, checked_query, query_failure

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The engines a lake is queried with.
ENGINES: tuple[str, ...] = ("duckdb", "spark")

#: What Spark's default local master is (all cores), and tlog's loopback settings for it.
DEFAULT_MASTER = "local[*]"

_DUCK_TO_SPARK_TYPES = {"VARCHAR": "string", "INTEGER": "int", "BIGINT": "bigint",
                        "DOUBLE": "double", "BOOLEAN": "boolean", "FLOAT": "float"}
#: Messages of a file that vanished under a running query (DuckDB, Spark).
_GONE_RE = re.compile(r"No such file|No files found|FileNotFoundException|does not exist|"
                      r"PATH_NOT_FOUND|Cannot open file", re.IGNORECASE)


class _FileGone(Exception):
    """A file a manifest named was removed by a publish while the query ran."""


def _literal(text: str) -> str:
    """A SQL string literal of ``text`` (quotes doubled): file paths from the manifests."""
    return "'" + text.replace("'", "''") + "'"


# --------------------------------------------------------------------- DuckDB

def duckdb_lake(snapshot: LakeSnapshot) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection whose views ``runs``, ``iterations``, ... are the
    lake's tables (the files of ``snapshot`` only), with the ``_run_throughput`` macro.

    The connection reads files; close it when done.
    """
    from tlog.ingest.db import query_threads

    con = duckdb.connect(":memory:")
    threads = query_threads()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    for table in LAKE_TABLES:
        files = ", ".join(_literal(f) for f in snapshot.files(table))
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{files}], "
                    f"hive_partitioning = true, hive_types = {{'run_id': 'VARCHAR'}})")
    con.execute("CREATE MACRO _run_throughput(warmup_iters) AS TABLE " + RUN_THROUGHPUT_SQL)
    return con


def _run_duckdb(snapshot: LakeSnapshot, query: Query, bound: dict[str, Any]) -> pl.DataFrame:
    con = None
    try:
        con = duckdb_lake(snapshot)      # the views read the files' footers already
        return con.sql(query.sql, params=bound).pl()
    except duckdb.Error as exc:
        if _GONE_RE.search(str(exc)):
            raise _FileGone(str(exc)) from exc
        raise query_failure(query, exc) from exc
    finally:
        if con is not None:
            con.close()


# --------------------------------------------------------------------- Spark SQL

@cache
def _run_throughput_tree() -> Any:
    import sqlglot

    return sqlglot.parse_one(RUN_THROUGHPUT_SQL, read="duckdb")


def _spark_struct(spec: Any) -> str:
    """A DuckDB ``from_json`` structure (``[{"a": "VARCHAR"}]``) as Spark's DDL type."""
    if isinstance(spec, list):
        return f"array<{_spark_struct(spec[0])}>"
    if isinstance(spec, dict):
        return "struct<" + ",".join(f"{k}:{_spark_struct(v)}" for k, v in spec.items()) + ">"
    try:
        return _DUCK_TO_SPARK_TYPES[str(spec).upper()]
    except KeyError:
        msg = f"from_json type {spec!r} has no Spark counterpart in tlog's rewrites"
        raise QueryError(msg) from None


def _rewrite_for_spark(node: Any) -> Any:
    from sqlglot import exp

    if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous) \
            and node.this.name.lower() == "_run_throughput":
        (arg,) = node.this.expressions
        body = _run_throughput_tree().copy()
        for col in list(body.find_all(exp.Column)):
            if col.name == "warmup_iters" and not col.table:
                col.replace(arg.copy())
        return exp.Subquery(this=body, alias=node.args.get("alias"))
    if isinstance(node, exp.Anonymous) and node.name.lower() == "error":
        return exp.Anonymous(this="raise_error", expressions=node.expressions)
    if isinstance(node, exp.FromJson) and isinstance(node.expression, exp.Literal) \
            and node.expression.is_string and node.expression.name.lstrip()[:1] in "[{":
        spec = json.loads(node.expression.name)
        return exp.FromJson(this=node.this, expression=exp.Literal.string(_spark_struct(spec)))
    if isinstance(node, exp.CTE) and node.args.get("materialized"):
        node.set("materialized", None)
        return node
    if isinstance(node, exp.JSONExtractScalar | exp.JSONExtract) \
            and not isinstance(node.expression, exp.JSONPath):
        path = exp.DPipe(this=exp.Literal.string("$."), expression=node.expression.copy())
        return exp.Anonymous(this="get_json_object", expressions=[node.this, path])
    if isinstance(node, exp.Literal) and not node.is_string and "." in node.this \
            and "e" not in node.this.lower():
        return exp.Cast(this=node.copy(), to=exp.DataType.build("DOUBLE"))
    return node


@cache
def to_spark_sql(sql: str) -> str:
    """A stored query's DuckDB SQL as Spark SQL (module docstring: sqlglot and tlog's
    rewrites); parameters stay named (``:name``).

    Raises:
        QueryError: sqlglot cannot read the text.
    """
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
        return tree.transform(_rewrite_for_spark).sql(dialect="spark", comments=False)
    except SqlglotError as exc:
        raise QueryError(f"cannot turn the query into Spark SQL: {str(exc).splitlines()[0]}"
                         ) from exc


def spark_missing() -> str | None:
    """Why a local Spark cannot start here, in one line (None: it can): pyspark not
    installed, or no working ``java`` on the PATH."""
    import importlib.util
    import shutil
    import subprocess

    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install 'tlog[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (Debian: apt-get install openjdk-17-jre-headless)"
    java = shutil.which("java") or str(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    try:
        subprocess.run([java, "-version"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"java does not run: {exc}"
    return None


def local_driver_memory() -> str:
    """The JVM heap of a local Spark (``spark.driver.memory``; in local mode the one
    executor is the driver): ``$TLOG_SPARK_DRIVER_MEMORY`` (e.g. ``8g``), else a
    quarter of the machine's memory between 1 and 8 GiB. Spark's own default of
    1 GiB ran out of heap collecting the walk of a 64-rank run of 10^7 iterations
    (480 MB of per-iteration figures); the quarter is tlog's choice."""
    given = os.environ.get("TLOG_SPARK_DRIVER_MEMORY")
    if given:
        return given
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "1g"
    return f"{max(1, min(8, total // 4 // 2**30))}g"


def spark_session(master: str | None = None) -> SparkSession:
    """A SparkSession for the lake's queries: ``master`` (a Spark master URL), else
    a Spark Connect server named by ``$SPARK_REMOTE``, else ``local[*]``.

    A local master is bound to the loopback interface (``SPARK_LOCAL_IP`` and
    ``spark.driver.host`` = 127.0.0.1) with its web UI off and its heap from
    :func:`local_driver_memory`; every session runs in
    UTC (``spark.sql.session.timeZone``) and reads partition values as strings.
    An existing session of this process is reused (Spark's ``getOrCreate``).

    Raises:
        UsageError: pyspark is not installed.
        LakeError: Spark could not start (no Java runtime, or the master cannot be reached).
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        msg = "--engine spark needs pyspark: pip install 'tlog[spark]' (and a Java runtime)"
        raise UsageError(msg) from exc
    builder = SparkSession.builder.appName("tlog")
    remote = os.environ.get("SPARK_REMOTE")
    if master is None and remote:
        builder = builder.remote(remote)
    else:
        master = master or DEFAULT_MASTER
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # the Python workers (the Spark diagnosis' walk) run this interpreter, with tlog
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            # one machine: as many shuffle partitions as cores, not Spark's 200
            cores = os.cpu_count() or 2
            inside = master.removeprefix("local").strip("[]")
            parts = int(inside) if inside.isdigit() else cores
            builder = (builder.config("spark.driver.host", "127.0.0.1")
                       .config("spark.driver.bindAddress", "127.0.0.1")
                       .config("spark.ui.enabled", "false")
                       .config("spark.ui.showConsoleProgress", "false")
                       .config("spark.sql.shuffle.partitions", str(max(parts, 1)))
                       .config("spark.driver.memory", local_driver_memory()))
        builder = builder.master(master)
    builder = (builder.config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false"))
    import signal
    import threading

    # SparkContext puts its own SIGINT handler in (cancelling jobs, then raising
    # KeyboardInterrupt); tlog's commands stop at their own waits, so keep theirs
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # py4j / pyspark raise many kinds here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LakeError(f"Spark could not start ({first}); is a Java runtime (17 or 21) "
                        f"installed and the master reachable?") from exc
    finally:
        if main and before is not None:
            signal.signal(signal.SIGINT, before)
    if master is not None and master.startswith("local"):
        spark.sparkContext.setLogLevel("ERROR")   # tlog reports the failures itself
    return spark


#: What each SparkSession's temporary views show now: (session id, table) -> files.
_REGISTERED: dict[tuple[int, str], tuple[str, ...]] = {}


def register_spark_lake(spark: SparkSession, snapshot: LakeSnapshot,
                        tables: Iterable[str] | None = None) -> None:
    """Make lake tables temporary views of ``spark`` over the files of ``snapshot``
    (``run_id`` from the ``run_id=`` folders, as a string): ``tables`` (default: all).
    A view already showing the same files is kept (Spark reads each file's footer
    to make one)."""
    for table in LAKE_TABLES if tables is None else tables:
        files = tuple(snapshot.files(table))
        key = (id(spark), table)
        if _REGISTERED.get(key) == files:
            continue
        base = str(snapshot.directory / table)
        spark.read.option("basePath", base).parquet(*files).createOrReplaceTempView(table)
        _REGISTERED[key] = files


@cache
def tables_read(sql: str) -> tuple[str, ...]:
    """The lake tables a stored query's Spark SQL reads (:func:`to_spark_sql`)."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(to_spark_sql(sql), read="spark")
    names = {t.name for t in tree.find_all(exp.Table)}
    return tuple(t for t in LAKE_TABLES if t in names)


def _run_spark(snapshot: LakeSnapshot, query: Query, bound: dict[str, Any],
               spark: SparkSession) -> pl.DataFrame:
    text = to_spark_sql(query.sql)
    try:
        register_spark_lake(spark, snapshot, tables_read(query.sql))
        table = spark.sql(text, args=bound).toArrow()
    except Exception as exc:  # pyspark's and py4j's errors share no base class but this
        said = str(exc).strip()
        if _GONE_RE.search(said):
            raise _FileGone(said) from exc
        first = said.splitlines()[0] if said else type(exc).__name__
        if "USER_RAISED_EXCEPTION" in first and "$" in first:
            # a stored query's own check of a parameter: error('... $name ...')
            msg = re.sub(r"^\[USER_RAISED_EXCEPTION\]\s*", "", first)
            raise QueryArgumentError(f"query {query.name!r}: {msg}") from exc
        raise QueryError(f"query {query.name!r} failed on Spark: {first}") from exc
    return _normalise(pl.DataFrame(pl.from_arrow(table)))


def _normalise(frame: pl.DataFrame) -> pl.DataFrame:
    """Spark's Arrow as DuckDB's: timestamps naive UTC, decimals as doubles."""
    fixes = []
    for name, dtype in frame.schema.items():
        if isinstance(dtype, pl.Datetime) and dtype.time_zone is not None:
            fixes.append(pl.col(name).dt.convert_time_zone("UTC").dt.replace_time_zone(None))
        elif isinstance(dtype, pl.Decimal):
            fixes.append(pl.col(name).cast(pl.Float64))
    return frame.with_columns(fixes) if fixes else frame


# --------------------------------------------------------------------- both

def run_lake_sql(lake_dir: str | Path, sql: str, params: Mapping[str, Any] | None = None
                 ) -> pl.DataFrame:
    """Run one ad-hoc read-only statement over a run lake on DuckDB (the tables as
    views of the lake's current files; read again when a publish replaced a file
    meanwhile, as :func:`run_lake_query`).

    Raises:
        WriteRefusedError, UsageError: the statement is not one read
            (``tlog.queries.check_read_only``).
        LakeError: as :func:`tlog.queries.lake.read_lake`, or files that stay missing.
        QueryError: DuckDB rejects the statement (its first line).
    """
    from tlog.queries.runner import check_read_only

    text = check_read_only(sql)
    last = ""
    for _ in range(READ_RETRIES + 1):
        snapshot = read_lake(lake_dir)
        con = None
        try:
            con = duckdb_lake(snapshot)
            return con.sql(text, params=dict(params or {})).pl()
        except duckdb.Error as exc:
            if not _GONE_RE.search(str(exc)):
                raise QueryError(f"SQL failed: {str(exc).strip().splitlines()[0]}") from exc
            last = str(exc).strip().splitlines()[0]
        finally:
            if con is not None:
                con.close()
    raise LakeError(f"files of the lake {lake_dir} kept vanishing while the SQL ran "
                    f"(publishes replacing runs): {last}")



def run_lake_query(lake_dir: str | Path, name: str | Query,
                   params: Mapping[str, Any] | None = None, *, engine: str = "duckdb",
                   spark: SparkSession | None = None, master: str | None = None
                   ) -> pl.DataFrame:
    """Run a stored query over a run lake, on DuckDB or on Spark SQL.

    The rows equal those of :func:`tlog.queries.run_query` on a database
    holding the same runs (tests/lake/test_lake_queries.py: sorted, floats to
    1e-9 relative).

    Args:
        lake_dir: the lake folder (``tlog publish`` writes it).
        name: a stored query name, or a :class:`~tlog.queries.runner.Query`.
        params: parameter values by name, as :func:`tlog.queries.run_query`.
        engine: ``"duckdb"`` (in memory, over the files) or ``"spark"``.
        spark: the SparkSession to use (default: :func:`spark_session` of ``master``).
        master: a Spark master URL when no session is given.

    Returns:
        The query's rows as a polars DataFrame.

    Raises:
        UsageError: an unknown engine, or pyspark missing for ``spark``.
        LakeError: no lake there, no run in it, or files that stay missing.
        RunNotFoundError: the query takes ``$run_id`` and the lake has no such run.
        QueryError: as :func:`tlog.queries.run_query`, or the engine rejects the query.
    """
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    query = checked_query(name)
    bound = query.bind(params)
    if engine == "spark" and spark is None:
        spark = spark_session(master)
    last = ""
    for _ in range(READ_RETRIES + 1):
        snapshot = read_lake(lake_dir)
        run_id = bound.get("run_id")
        if run_id is not None and run_id not in snapshot.manifests:
            raise RunNotFoundError(f"no run {run_id!r} in the lake {snapshot.directory}: "
                                   f"'tlog publish' adds runs to it")
        try:
            if engine == "duckdb":
                return _run_duckdb(snapshot, query, bound)
            return _run_spark(snapshot, query, bound, spark)
        except _FileGone as gone:
            last = str(gone).splitlines()[0]
    raise LakeError(f"files of the lake {lake_dir} kept vanishing while query {query.name!r} "
                    f"ran (publishes replacing runs): {last}")
