"""Time the stored queries over a run lake on DuckDB and on Spark, and the Spark diagnosis.

Run alone: ``python -m benchmarks.bench_lake`` (``--runs N``, ``--iterations N``
per run, ``--big N`` iterations of the diagnosed run, ``--ranks N``, ``--json``);
``make bench`` runs it with the others. Needs pyspark and a Java runtime
(``make setup``; ``.ci/run`` installs the JRE); without them it prints why and
passes.

The lake: one synthetic run of ``--iterations`` iteration records
(``benchmarks.bench_diagnose.build_sql``: 2 target and 6 drafter workers) is
diagnosed and published, then cloned into ``--runs`` runs (its files hard-linked
under each run's folder and manifest; each clone's ``runs`` row rewritten with
its own start, a week apart, and ``config`` tag, one of five), so the lake
holds ``runs x iterations`` rows of ``iterations`` and of ``attribution``
without diagnosing every clone. Each stored query runs once on each engine
(Spark: ``local[*]``, the JVM already started and the query's views read, so
the figure is the query's) and its seconds are printed, with the row counts.

The big run: ``--ranks`` drafter ranks (and 2 target ranks) of ``--big``
iterations in all, published, then diagnosed by ``tlog.analyze.diagnose`` and by
``tlog.queries.lake_diagnose.diagnose_on_spark``, each in a child process:
wall seconds and the peak memory of the child's whole process tree (sampled
every 0.2 s with psutil: the driver, Spark's JVM and its Python workers).

The defaults are the scale a team's lake reaches: 1,000 runs of 10^5
iterations (10^8 rows) and a 64-rank run of 10^7 iterations (about 15 minutes
on a 2-core machine). No budget: docs/LAKE.md records what was measured and at
which scale; the exit status is 1 only when the two diagnoses disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_diagnose import build_sql

#: Parameters each stored query is timed with (the run-scoped ones: the first clone).
PARAMS: dict[str, dict[str, Any]] = {
    "phase_breakdown": {"run_id": "lake-0000"}, "queue_occupancy": {"run_id": "lake-0000"},
    "rank_skew": {"run_id": "lake-0000"}, "stage_utilization": {"run_id": "lake-0000"},
    "throughput_over_time": {"run_id": "lake-0000"},
    "stage_shares_by_month": {"tag_key": "config"}, "throughput_regressions": {"tag_key": "config"},
}
_WEEK_S = 7 * 86400.0


def build_lake(tmp: Path, runs: int, iterations: int) -> Path:
    """A lake of ``runs`` clones of one published synthetic run (module docstring)."""
    import duckdb
    from tlog.analyze.persist import ensure_attribution
    from tlog.ingest.db import connect
    from tlog.queries.lake import LAKE_TABLES, META_DIR, encode_run_id, publish_run

    db = tmp / "template.duckdb"
    run_id = build_sql(db, iterations, run_id="template")
    with connect(db) as con:
        con.execute("UPDATE runs SET started = 1.7e9, tags = '{\"config\": \"c0\"}'")
        ensure_attribution(con)
        report = publish_run(con, run_id, tmp / "template-lake")
    src = tmp / "template-lake"
    manifest = json.loads((src / META_DIR / "runs" / run_id / f"{report.publish_id}.json")
                          .read_text())
    lake = tmp / "lake"
    (lake / META_DIR / "runs").mkdir(parents=True)
    shutil.copy(src / META_DIR / "lake.json", lake / META_DIR / "lake.json")
    rewrite = duckdb.connect()
    for k in range(runs):
        rid = f"lake-{k:04d}"
        pid = f"{k:020d}-00000000"
        tables = {}
        for table in LAKE_TABLES:
            part = lake / table / f"run_id={encode_run_id(rid)}"
            part.mkdir(parents=True)
            out = part / f"part-{pid}.parquet"
            origin = src / manifest["tables"][table]["file"]
            if table == "runs":
                rewrite.execute(
                    "COPY (SELECT * REPLACE (1.7e9 + $k * $week AS started, "
                    "json_object('config', 'c' || ($k % 5)::VARCHAR) AS tags) "
                    "FROM read_parquet($src)) TO $out (FORMAT parquet)",
                    {"k": k, "week": _WEEK_S, "src": str(origin), "out": str(out)})
            else:
                os.link(origin, out)
            tables[table] = {**manifest["tables"][table], "file": str(out.relative_to(lake))}
        folder = lake / META_DIR / "runs" / encode_run_id(rid)
        folder.mkdir()
        (folder / f"{pid}.json").write_text(json.dumps(
            {**manifest, "run_id": rid, "publish_id": pid, "tables": tables}))
    rewrite.close()
    return lake


def time_queries(lake: Path) -> list[dict[str, Any]]:
    """Each stored query on DuckDB and on Spark over ``lake``: seconds and rows."""
    from tlog.queries import list_queries
    from tlog.queries.lake import read_lake
    from tlog.queries.lake_sql import (
        register_spark_lake,
        run_lake_query,
        spark_session,
        tables_read,
    )
    from tlog.queries.runner import load_query

    spark = spark_session()
    snap = read_lake(lake)
    out = []
    for name in list_queries():
        params = PARAMS.get(name, {})
        register_spark_lake(spark, snap, tables_read(load_query(name).sql))
        row: dict[str, Any] = {"query": name}
        for engine in ("duckdb", "spark"):
            t = time.perf_counter()
            frame = run_lake_query(lake, name, params, engine=engine, spark=spark)
            row[f"{engine}_s"] = time.perf_counter() - t
            row["rows"] = frame.height
        out.append(row)
        print(f"  {name:<24} duckdb {row['duckdb_s']:7.2f} s   spark {row['spark_s']:7.2f} s"
              f"   {row['rows']:>6} rows", flush=True)
    return out


_CHILD = """
import json, sys, time
how, lake, db, run_id = sys.argv[1:5]
t = time.perf_counter()
if how == "local":
    from tlog.analyze import diagnose
    from tlog.ingest.db import connect
    with connect(db, read_only=True) as con:
        d = diagnose(con, run_id)
else:
    from tlog.queries.lake_diagnose import diagnose_on_spark
    from tlog.queries.lake_sql import spark_session
    spark = spark_session()
    t = time.perf_counter()
    d = diagnose_on_spark(spark, lake, run_id)
print(json.dumps({"seconds": time.perf_counter() - t, "verdict": d.verdict}))
"""


def measure_tree(args: list[str]) -> dict[str, Any]:
    """Run a child (``_CHILD`` with ``args``): its answer and the peak RSS of its tree."""
    import psutil

    root = Path(__file__).resolve().parents[1]
    err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - Spark's log, read after the child
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, *args], cwd=root,
                            stdout=subprocess.PIPE, stderr=err, text=True)
    peak = 0
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            procs = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.2)
    out = proc.stdout.read() if proc.stdout else ""
    err.seek(0)
    log = err.read()
    err.close()
    if proc.returncode:
        tail = "\n".join(line for line in log.splitlines()
                         if not line.startswith(("\tat ", "WARN", "Using", "Setting")))[-3000:]
        msg = f"child {args[0]} failed with exit {proc.returncode}:\n{tail}"
        raise RuntimeError(msg)
    return {**json.loads(out.strip().splitlines()[-1]), "peak_bytes": peak}


def big_run(tmp: Path, iterations: int, ranks: int) -> dict[str, Any]:
    """Diagnose a run of ``ranks`` drafter ranks locally and on Spark (module docstring)."""
    from tlog.analyze.persist import ensure_attribution
    from tlog.ingest.db import connect
    from tlog.queries.lake import publish_run

    db = tmp / "big.duckdb"
    run_id = build_sql(db, iterations, run_id="big", drafters=ranks)
    with connect(db) as con:
        ensure_attribution(con)
        publish_run(con, run_id, tmp / "big-lake")
    local = measure_tree(["local", str(tmp / "big-lake"), str(db), run_id])
    spark = measure_tree(["spark", str(tmp / "big-lake"), str(db), run_id])
    for name, m in (("local", local), ("spark", spark)):
        print(f"  diagnose {name:<6} {m['seconds']:7.1f} s   peak {m['peak_bytes'] / 2**20:7.0f} MiB",
              flush=True)
    same = local["verdict"] == spark["verdict"]
    print(f"  the same verdict on both: {'yes' if same else 'NO'}", flush=True)
    return {"iterations": iterations, "ranks": ranks + 2, "local": local, "spark": spark,
            "same_verdict": same}


def main(argv: list[str] | None = None) -> int:
    """Build the lake, time the queries and the big run's diagnosis; 0 unless one fails."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_lake")
    parser.add_argument("--runs", type=int, default=1000, help="runs in the lake")
    parser.add_argument("--iterations", type=int, default=100_000,
                        help="iteration records per run")
    parser.add_argument("--big", type=int, default=10_000_000,
                        help="iteration records of the diagnosed run (0 skips it)")
    parser.add_argument("--ranks", type=int, default=62, help="drafter ranks of the big run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    from tlog.queries.lake_sql import spark_missing

    why = spark_missing()
    if why:
        print(f"  skipped: {why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="tlog-bench-lake-") as tmp_s:
        tmp = Path(tmp_s)
        t = time.perf_counter()
        lake = build_lake(tmp, args.runs, args.iterations)
        print(f"  lake: {args.runs} runs x {args.iterations:,} iterations "
              f"({args.runs * args.iterations:,} iteration rows) built in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        queries = time_queries(lake)
        big = big_run(tmp, args.big, args.ranks) if args.big else None
    if args.json:
        print(json.dumps({"runs": args.runs, "iterations_per_run": args.iterations,
                          "queries": queries, "big": big}, indent=2))
    return 0 if big is None or big["same_verdict"] else 1


if __name__ == "__main__":
    sys.exit(main())
