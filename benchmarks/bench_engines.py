"""tlog's two bespoke engines against the simpler way a library offers, side by side.

Run alone: ``python -m benchmarks.bench_engines`` (``--iters N`` iteration records
per rank of the ingest run, ``--walk N`` iterations of the attribution run,
``--json``); ``make bench`` runs it with the others. docs/DESIGN.md ("Two bespoke
engines, measured") keeps the figures and the decision.

1. **Ingest**: tlog's parser (line templates and generated SQL, ``ingest_run``)
   against DuckDB's ``read_json`` with the columns given explicitly (the
   simpler way), over the benchmark run of ``benchmarks.bench_ingest``. Then
   the price of the strictness tlog keeps: ten hostile lines (a number written
   as a string, a duplicate key, a boolean for a count, a fraction for a count,
   a negative or NaN duration, a phase time as a string, an out-of-range count,
   trailing text, phases as a list), each counted as stored silently
   wrong or lost by ``read_json`` (``ignore_errors``: else one bad line fails
   the file), and rejected by tlog with a reason; and the time Python's
   ``json.loads`` takes to look at every line, the least a strict check of
   the lines ``read_json`` takes would cost when nothing marks them.
2. **Attribution's device-backlog walk**: tlog's numpy walk
   (``tlog.analyze.attribution.attribute_run``, after ``load_run``) against
   the same Lindley recursion written as DuckDB window SQL over the
   ``phases`` view (closed form ``b_i = S_i - min(0, min_{j<=i} S_j)`` with
   ``S`` the running sum of ``gpu - host``), on the synthetic pipeline of
   ``benchmarks.bench_diagnose.build_sql``. Both give per-iteration compute
   and sync seconds; the benchmark checks they agree (max abs difference).

No budget: it prints the ratios; the decision and its reason are in docs/DESIGN.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

#: (description, line) of the hostile lines: each is a fault tlog rejects.
HOSTILE: list[tuple[str, str]] = [
    ("count as a string", '"iter": "1"'),
    ("duplicate key", '"iter": 2, "iter": 3'),
    ("boolean for a count", '"iter": true'),
    ("fraction for a count", '"iter": 8.5'),
]
_LINE = ('{{"type": "iter", "v": 1, {it}, "ts": 1764403200.0, "dur": {dur}, "tokens": {tok}, '
         '"phases": {{"load": {load}, "forward": 0.03}}}}{tail}')


def hostile_lines() -> list[tuple[str, str]]:
    """The ten hostile iteration lines (description, line), each one fault."""
    base = {"it": '"iter": 0', "dur": "0.04", "tok": "100", "load": "0.01", "tail": ""}
    out = [(d, _LINE.format(**{**base, "it": it})) for d, it in HOSTILE]
    out += [("negative duration", _LINE.format(**{**base, "it": '"iter": 6', "dur": "-0.04"})),
            ("NaN duration", _LINE.format(**{**base, "it": '"iter": 7', "dur": "NaN"})),
            ("phase time as a string",
             _LINE.format(**{**base, "it": '"iter": 9', "load": '"0.01"'})),
            ("count out of range", _LINE.format(**{**base, "it": '"iter": 10', "tok": "1e300"})),
            ("trailing text", _LINE.format(**{**base, "it": '"iter": 11', "tail": " trailing"})),
            ("phases as a list", ('{"type": "iter", "v": 1, "iter": 4, "ts": 1764403200.0, '
                                  '"dur": 0.04, "tokens": 100, "phases": [0.01, 0.03]}'))]
    return out


#: The explicit columns ``read_json`` is given (the iteration record's fields).
READ_JSON_COLUMNS = ("{'type': 'VARCHAR', 'v': 'UTINYINT', 'iter': 'UBIGINT', 'ts': 'DOUBLE', "
                     "'dur': 'DOUBLE', 'cpu': 'DOUBLE', 'tokens': 'UBIGINT', "
                     "'samples': 'UBIGINT', 'phases': 'MAP(VARCHAR, DOUBLE)'}")


def hostile_outcomes(tmp: Path) -> dict[str, Any]:
    """Each hostile line between two good ones: what ``read_json`` (explicit columns,
    ignore_errors) stores for it, and whether tlog rejects it."""
    import duckdb
    from tlog.ingest import connect, ingest_run

    good = [_LINE.format(it=f'"iter": {100 + k}', dur="0.04", tok="100", load="0.01", tail="")
            for k in range(2)]
    rows = []
    for n, (what, line) in enumerate(hostile_lines()):
        run = tmp / f"hostile{n}"
        run.mkdir()
        meta = json.dumps({"type": "meta", "v": 1, "rank": 0, "stage": "s", "worker": "s-0"})
        (run / "rank0.s.jsonl").write_text("\n".join([meta, good[0], line, good[1]]) + "\n")
        con = duckdb.connect()
        got = con.execute(f"SELECT count(*) FILTER (WHERE type = 'iter') FROM read_json("
                          f"'{run}/rank0.s.jsonl', format='newline_delimited', "
                          f"ignore_errors=true, columns={READ_JSON_COLUMNS})").fetchall()[0][0]
        con.close()
        db = connect(tmp / f"hostile{n}.duckdb")
        try:
            report = ingest_run(db, run)
        finally:
            db.close()
        # read_json keeps the line as a row (3 iteration rows) with a value made up,
        # or drops a field, or turns it into a row of NULLs: stored wrong either way.
        rows.append({"fault": what, "read_json_rows": int(got),
                     "read_json_silent": int(got) == 3 or int(got) == 2,
                     "tlog_rejected": report.records_rejected == 1})
    return {"lines": rows,
            "read_json_silent": sum(r["read_json_silent"] for r in rows),
            "tlog_rejected": sum(r["tlog_rejected"] for r in rows), "of": len(rows)}


def time_ingest_engines(tmp: Path, iters: int) -> dict[str, float]:
    """Seconds of tlog's ingest, ``read_json`` with explicit columns, and ``json.loads``
    of every line, over the benchmark run (best of 3 each)."""
    import duckdb
    from tlog.ingest import connect, ingest_run

    from benchmarks.bench_ingest import generate

    run = tmp / "run"
    size = generate(run, iters=iters)
    best: dict[str, float] = {}

    def keep(name: str, secs: float) -> None:
        best[name] = min(best.get(name, float("inf")), secs)

    for k in range(3):
        db = tmp / f"tlog{k}.duckdb"
        t = time.perf_counter()
        con = connect(db)
        ingest_run(con, run)
        con.close()
        keep("tlog_ingest_s", time.perf_counter() - t)
        db2 = tmp / f"rj{k}.duckdb"
        t = time.perf_counter()
        con = duckdb.connect(str(db2))
        con.execute(f"CREATE TABLE it AS SELECT * FROM read_json('{run}/*.jsonl', "
                    f"format='newline_delimited', ignore_errors=true, "
                    f"columns={READ_JSON_COLUMNS})")
        con.close()
        keep("read_json_s", time.perf_counter() - t)
        t = time.perf_counter()
        for f in sorted(run.glob("*.jsonl")):
            with f.open("rb") as fh:
                for line in fh:
                    json.loads(line)
        keep("json_loads_s", time.perf_counter() - t)
    best["bytes"] = size
    return best


#: The device-backlog walk as window SQL (module docstring): per iteration, compute
#: and sync seconds of the top-level phases; a sync phase not named as a collective
#: has its drained device seconds moved to compute.
WALK_SQL = """
WITH p AS (
  SELECT worker, iter, seq, phase, category, host_s AS h, coalesce(gpu_s, 0) AS g
  FROM phases WHERE run_id = $run AND parent IS NULL),
c AS (
  SELECT *, sum(g - h) OVER w AS s_i
  FROM p WINDOW w AS (PARTITION BY worker, iter ORDER BY seq ROWS UNBOUNDED PRECEDING)),
s AS (
  SELECT *, least(0, min(s_i) OVER w) AS m_i
  FROM c WINDOW w AS (PARTITION BY worker, iter ORDER BY seq ROWS UNBOUNDED PRECEDING)),
b AS (SELECT *, s_i - m_i AS b_i FROM s),
d AS (SELECT *, coalesce(lag(b_i) OVER (PARTITION BY worker, iter ORDER BY seq), 0) + g - b_i
                AS drained FROM b)
SELECT worker, iter,
       sum(CASE WHEN category = 'compute' THEN h
                WHEN category = 'sync' AND NOT $collective(phase) THEN drained ELSE 0 END)
         AS compute_s,
       sum(CASE WHEN category = 'sync' AND $collective(phase) THEN h
                WHEN category = 'sync' THEN h - drained ELSE 0 END) AS sync_s
FROM d GROUP BY worker, iter ORDER BY worker, iter
"""


def time_walk_engines(tmp: Path, iterations: int) -> dict[str, float]:
    """Seconds of tlog's numpy walk (load + attribute_run) and of the SQL walk, and the
    largest difference of their per-iteration compute and sync seconds."""
    import duckdb
    import numpy as np
    import polars as pl
    from tlog.analyze.attribution import attribute_run
    from tlog.analyze.load import load_run

    from benchmarks.bench_diagnose import build_sql
    from dflash_runtime.format import is_collective

    db = tmp / "walk.duckdb"
    run_id = build_sql(db, iterations)
    names = [r[0] for r in duckdb.connect(str(db), read_only=True).execute(
        "SELECT DISTINCT phase FROM phase_layouts").fetchall()]
    collective = [n for n in names if is_collective(n)]
    sql = WALK_SQL.replace("$collective(phase)",
                           "phase IN (" + ", ".join(f"'{n}'" for n in collective) + ")"
                           if collective else "false")
    best_np = best_sql = float("inf")
    for _ in range(3):
        con = duckdb.connect(str(db), read_only=True)
        t = time.perf_counter()
        data = load_run(con, run_id)
        n = data.iterations.height
        att = attribute_run(data, np.zeros(n, dtype=np.int32), 1)
        best_np = min(best_np, time.perf_counter() - t)
        t = time.perf_counter()
        got = con.sql(sql, params={"run": run_id}).pl()
        best_sql = min(best_sql, time.perf_counter() - t)
        con.close()
    mine = pl.DataFrame({"worker": data.iterations["worker"].cast(pl.String),
                         "iter": data.iterations["iter"].cast(got["iter"].dtype),
                         "compute_np": att.iteration[2], "sync_np": att.iteration[3]})
    both = mine.join(got, on=["worker", "iter"], how="inner")
    diff = float(max((both["compute_np"] - both["compute_s"]).abs().max(),
                     (both["sync_np"] - both["sync_s"]).abs().max()))
    return {"numpy_walk_s": best_np, "sql_walk_s": best_sql, "iterations": n,
            "rows_matched": both.height, "max_abs_diff_s": diff}


def main(argv: list[str] | None = None) -> int:
    """Print both comparisons (module docstring); 0 unless the two walks disagree."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_engines")
    parser.add_argument("--iters", type=int, default=75_000,
                        help="iteration records per rank of the ingest run (4 ranks)")
    parser.add_argument("--walk", type=int, default=1_000_000,
                        help="iterations of the attribution run")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tlog-bench-engines-") as tmp_s:
        tmp = Path(tmp_s)
        ingest = time_ingest_engines(tmp, args.iters)
        hostile = hostile_outcomes(tmp)
        walk = time_walk_engines(tmp, args.walk)
    if args.json:
        print(json.dumps({"ingest": ingest, "hostile": hostile, "walk": walk}, indent=2))
    else:
        mb = ingest["bytes"] / 1e6
        print(f"  ingest of {mb:.0f} MB ({4 * args.iters:,} iterations), best of 3:")
        print(f"    tlog ingest_run            {ingest['tlog_ingest_s']:6.2f} s")
        print(f"    read_json, explicit columns {ingest['read_json_s']:5.2f} s "
              f"({ingest['tlog_ingest_s'] / ingest['read_json_s']:.2f}x faster than tlog)")
        print(f"    json.loads of every line   {ingest['json_loads_s']:6.2f} s "
              f"(the least a strict check of every line costs)")
        print(f"  hostile lines: read_json stores {hostile['read_json_silent']} of "
              f"{hostile['of']} silently wrong or as NULLs; tlog rejects "
              f"{hostile['tlog_rejected']} of {hostile['of']} with a reason")
        for r in hostile["lines"]:
            print(f"    {r['fault']:<24} read_json rows {r['read_json_rows']}  "
                  f"tlog {'rejected' if r['tlog_rejected'] else 'STORED'}")
        print(f"  device-backlog walk, {walk['iterations']:,} iterations, best of 3:")
        print(f"    numpy (load_run + attribute_run) {walk['numpy_walk_s']:6.2f} s")
        print(f"    DuckDB window SQL                {walk['sql_walk_s']:6.2f} s "
              f"({walk['sql_walk_s'] / walk['numpy_walk_s']:.2f}x numpy)")
        print(f"    same figures: {walk['rows_matched']:,} iterations, largest difference "
              f"{walk['max_abs_diff_s']:.2e} s")
    return 0 if walk["max_abs_diff_s"] < 1e-9 else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
