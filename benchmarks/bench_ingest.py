"""Ingest throughput, re-ingest cost and memory, side by side with DuckDB's own reader.

Run alone: ``python -m benchmarks.bench_ingest`` (``--ranks``, ``--iters``,
``--repeat``, ``--mem-records``, ``--many-files``, ``--json``); ``make bench`` runs it with the others.

Budgets (DESIGN.md "Budgets"), measured in one process, best of
``--repeat`` alternating runs each (the machine is shared; the best run is the
least disturbed one):

- first ingest of a run of 4 ranks x 75,000 iteration records (6 phases
  each), into a fresh database file, at least :data:`RATIO_BUDGET` x the
  throughput of DuckDB's own ``CREATE TABLE AS SELECT * FROM read_json(...)``
  over the same files into a fresh database file (not the
  0.8x of before: the parse + store floor alone is about 0.95x);
- ingesting the unchanged run again costs under :data:`REINGEST_BUDGET` of the
  first ingest (both: open the database, ``ingest_run``, close; the re-ingest
  best of :data:`REINGEST_TRIES` per round);
- peak RSS of a process ingesting a larger run (``--mem-records``) under
  :data:`RSS_BUDGET_BYTES` (the 2 GB-class check is the slow test
  ``tests/ingest/test_memory.py``);
- many small files (``--many-files``, ``--many-records``): 10,000
  logs of 6 lines each (60,000 lines) ingested into a fresh database in a
  child process, time and peak RSS (best time and highest peak of the runs),
  side by side with the same lines concatenated into 4 files: peak RSS under
  :data:`MANY_RSS_BUDGET_BYTES`, time under :data:`MANY_TIME_BUDGET` x the
  4-file time, every line loaded in both.

Also printed, not budgeted (the fixed cost of an ingest): a small run
(1 rank, a meta line and 244 iter records: :data:`SMALL_RECORDS` lines) into a
fresh database file (connect, ``ingest_run``, close) against ``read_json`` of
the same file into a fresh database file, as a ratio; and a ``--follow`` poll:
10 lines appended to that run and ingested again on the open connection
(milliseconds). Also printed: polars' NDJSON reader over the same files; the
time of the parse alone (DuckDB ``json_transform`` of every line, typed), the
floor of a reader that checks types; and the time of storing the loaded rows
again (``iterations`` copied into a new table), the floor of writing them.
Their sum against ``read_json`` shows how much of the budget is left for the
checks, line numbers, duplicate keys and commits (docs/DATABASE.md).

Exit status 1 when a budget is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._memory import PEAK_BYTES_SRC

#: Budget: ingest throughput / raw read_json throughput (lowered from 0.8:
#: parsing and storing alone cost about 0.95x read_json).
RATIO_BUDGET = 0.5
#: Lines of the small run (a meta line and 244 iter records).
SMALL_RECORDS = 245
#: Lines appended per ``--follow`` poll in the small-run figure.
POLL_LINES = 10
#: Budget: second ingest of an unchanged run / first ingest.
REINGEST_BUDGET = 0.05
#: Re-ingests timed per round (the best of all rounds is kept): one takes about
#: 30 ms, where the shared machine's noise is a larger share than for the first
#: ingest's 0.7 s.
REINGEST_TRIES = 3
#: Budget: peak RSS while ingesting (under 1 GB for a 2 GB run directory).
RSS_BUDGET_BYTES = 1 << 30

#: Budget: peak RSS of ingesting 10,000 small files (they ran out of
#: memory at 1.7 GB). Measured about 230 MiB, of which about 140 MiB is the
#: interpreter with DuckDB, pyarrow and numpy loaded; tlog's choice of margin.
MANY_RSS_BUDGET_BYTES = 512 << 20
#: Budget: the 10,000-file ingest takes under this many times the ingest of the
#: same lines in 4 files (a file costs a stat, an open and a ``files`` row; the
#: rest is batching). tlog's choice.
MANY_TIME_BUDGET = 8.0

PHASES = ("hs_get", "mask_build", "draft_forward", "backward", "grad_norm_item", "optimizer")


def generate(root: Path, *, ranks: int = 4, iters: int = 75_000, seed: int = 0) -> int:
    """Write ``ranks`` files ``rank{r}.drafter.jsonl`` of a meta line and ``iters``
    iter records with 6 phases each, in the shim's compact form. Returns bytes written."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    total = 0
    for r in range(ranks):
        lines = [json.dumps({"type": "meta", "v": 1, "rank": r, "stage": "drafter",
                             "worker": f"drafter-{r}", "host": "node-1", "pid": 1000 + r,
                             "clock": {"wall": 1764403200.0, "mono": 1000.0}},
                            separators=(",", ":"))]
        ts = 1764403200.0
        for i in range(iters):
            ph = {k: round(rng.uniform(0.0005, 0.02), 6) for k in PHASES}
            dur = round(sum(ph.values()) + 0.001, 6)
            lines.append(json.dumps({"type": "iter", "v": 1, "iter": i, "ts": round(ts, 6),
                                     "dur": dur, "phases": ph, "cpu": round(dur * 0.6, 6),
                                     "tokens": 16384, "samples": 8}, separators=(",", ":")))
            ts += dur
        data = ("\n".join(lines) + "\n").encode()
        (root / f"rank{r}.drafter.jsonl").write_bytes(data)
        total += len(data)
    return total


def _fresh(path: Path) -> None:
    for p in (path, Path(str(path) + ".wal")):
        if p.exists():
            p.unlink()


def time_raw(run: Path, db: Path) -> float:
    """Seconds for DuckDB's own ``read_json`` of every file into a table of a fresh db."""
    import duckdb

    _fresh(db)
    t = time.perf_counter()
    con = duckdb.connect(str(db))
    con.execute(f"CREATE TABLE raw AS SELECT * FROM read_json('{run}/*.jsonl', "
                f"format='newline_delimited')")
    con.close()
    return time.perf_counter() - t


def time_ingest(run: Path, db: Path, *, fresh: bool = True) -> tuple[float, dict]:
    """Seconds for connect + ``ingest_run`` + close (a fresh db unless ``fresh=False``)."""
    from tlog.ingest import connect, ingest_run

    if fresh:
        _fresh(db)
    t = time.perf_counter()
    con = connect(db)
    report = ingest_run(con, run)
    con.close()
    return time.perf_counter() - t, report.to_dict()


def time_polars(run: Path) -> float:
    import polars as pl

    t = time.perf_counter()
    pl.read_ndjson(sorted(run.glob("*.jsonl")))
    return time.perf_counter() - t


def time_parse_floor(run: Path) -> float:
    """Seconds for DuckDB to read every line and ``json_transform`` it into typed
    columns (phases a STRUCT), nothing else: the floor of a type-checking reader."""
    import duckdb

    con = duckdb.connect()
    struct = json.dumps({"type": "VARCHAR", "v": "BIGINT", "iter": "BIGINT", "ts": "DOUBLE",
                         "dur": "DOUBLE", "cpu": "DOUBLE", "tokens": "BIGINT",
                         "samples": "BIGINT", "phases": dict.fromkeys(PHASES, "DOUBLE")})
    t = time.perf_counter()
    con.execute(f"""CREATE TABLE t AS SELECT json_transform(json, '{struct}') AS j
        FROM read_json_objects('{run}/*.jsonl', format='newline_delimited')""")
    con.close()
    return time.perf_counter() - t


def time_store_floor(db: Path) -> float:
    """Seconds to store the rows a tlog ingest loaded into ``iterations`` again,
    as a new table of the same database file (nothing parsed or checked): the
    floor of writing them. ``db`` holds an ingested run."""
    import duckdb

    con = duckdb.connect(str(db))
    try:
        con.execute("DROP TABLE IF EXISTS _bench_copy")
        con.execute("CHECKPOINT")
        t = time.perf_counter()
        con.execute("CREATE TABLE _bench_copy AS SELECT * FROM iterations")
        con.execute("CHECKPOINT")
        took = time.perf_counter() - t
        con.execute("DROP TABLE _bench_copy")
        return took
    finally:
        con.close()


def peak_rss_of_ingest(run: Path, db: Path) -> int:
    """Peak RSS (bytes) of a child process that ingests ``run`` into a fresh ``db``."""
    return ingest_in_child(run, db)[2]


def ingest_in_child(run: Path, db: Path) -> tuple[float, int, int]:
    """Ingest ``run`` into a fresh ``db`` in a child process: ``(seconds of
    connect + ingest_run + close, records loaded (all kinds), the child's peak
    RSS in bytes)``."""
    _fresh(db)
    code = ("import sys, time\n"
            f"{PEAK_BYTES_SRC}\n"
            "from tlog.ingest import connect, ingest_run\n"
            "t = time.perf_counter()\n"
            "con = connect(sys.argv[2]); r = ingest_run(con, sys.argv[1]); con.close()\n"
            "print(time.perf_counter() - t)\n"
            "print(r.records_total)\n"
            "print(_peak_bytes())\n")
    out = subprocess.run([sys.executable, "-c", code, str(run), str(db)], check=True,
                         capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout.split()
    return float(out[-3]), int(out[-2]), int(out[-1])


def generate_many(root: Path, *, files: int = 10_000, records: int = 60_000,
                  seed: int = 2) -> int:
    """Write ``files`` small logs ``d{k // 100}/worker{k}.jsonl`` (a meta line,
    then iter records: ``records`` lines in all, meta lines included, spread
    evenly), as many DataLoader workers or short jobs leave. Returns bytes written."""
    rng = random.Random(seed)
    total = 0
    for k in range(files):
        n = records // files + (1 if k < records % files else 0)
        lines = [json.dumps({"type": "meta", "v": 1, "rank": k % 8, "stage": "loader",
                             "worker": f"loader-{k}", "host": f"node-{k // 800}",
                             "pid": 5000 + k}, separators=(",", ":"))]
        ts = 1764403200.0 + k
        for i in range(n - 1):
            ph = {p: round(rng.uniform(0.0005, 0.02), 6) for p in PHASES}
            dur = round(sum(ph.values()) + 0.001, 6)
            lines.append(json.dumps({"type": "iter", "v": 1, "iter": i, "ts": round(ts, 6),
                                     "dur": dur, "phases": ph}, separators=(",", ":")))
            ts += dur
        data = ("\n".join(lines) + "\n").encode()
        path = root / f"d{k // 100}" / f"worker{k}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        total += len(data)
    return total


def merged_copy(src: Path, dst: Path, *, files: int = 4) -> None:
    """The logs of ``src`` concatenated into ``files`` files under ``dst``
    (the same lines; meta lines stay at the head of their records' segment)."""
    dst.mkdir(parents=True, exist_ok=True)
    paths = sorted(src.rglob("*.jsonl"))
    for j in range(files):
        with open(dst / f"merged{j}.jsonl", "wb") as out:
            out.writelines(p.read_bytes() for p in paths[j::files])


def time_small(root: Path, *, repeat: int = 7) -> dict:
    """The fixed cost of an ingest, on a run of :data:`SMALL_RECORDS` lines.

    Returns ``{"records", "loaded", "raw_s", "ingest_s", "ratio", "poll_s", "poll_lines"}``:
    best of ``repeat`` fresh-database ingests (connect + ``ingest_run`` + close)
    and ``read_json`` copies (connect + ``CREATE TABLE AS`` + close), their
    ratio (read_json time / ingest time), and the best of ``repeat`` polls
    (:data:`POLL_LINES` new lines appended, ``ingest_run`` again on one open
    connection), in seconds.
    """
    from tlog.ingest import connect, ingest_run

    run = root / "small"
    generate(run, ranks=1, iters=SMALL_RECORDS - 1, seed=2)
    raw_t, ing_t = [], []
    loaded = 0
    for i in range(repeat):
        raw_t.append(time_raw(run, root / "small_raw.duckdb"))
        t, report = time_ingest(run, root / f"small_{i % 2}.duckdb")
        ing_t.append(t)
        loaded = sum(report["records_loaded"].values())
    log = run / "rank0.drafter.jsonl"
    con = connect(root / "small_poll.duckdb")
    ingest_run(con, run)
    polls = []
    nxt = SMALL_RECORDS
    for _ in range(repeat):
        with log.open("a") as fh:
            for _ in range(POLL_LINES):
                fh.write(json.dumps({"type": "iter", "v": 1, "iter": nxt, "ts": 1764500000.0 + nxt,
                                     "dur": 0.02, "phases": {k: 0.003 for k in PHASES},
                                     "cpu": 0.01, "tokens": 16384, "samples": 8},
                                    separators=(",", ":")) + "\n")
                nxt += 1
        t = time.perf_counter()
        report = ingest_run(con, run)
        polls.append(time.perf_counter() - t)
        assert report.records_loaded["iter"] == POLL_LINES, report.records_loaded
    con.close()
    raw, ing = min(raw_t), min(ing_t)
    return {"records": SMALL_RECORDS, "loaded": loaded, "raw_s": raw, "ingest_s": ing, "ratio": raw / ing,
            "poll_s": min(polls), "poll_lines": POLL_LINES}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 1 if a budget is missed."""
    ap = argparse.ArgumentParser(prog="bench_ingest", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iters", type=int, default=75_000, help="iter records per rank")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mem-records", type=int, default=1_000_000,
                    help="iter records of the run whose peak RSS is measured (0: skip)")
    ap.add_argument("--many-files", type=int, default=10_000,
                    help="files of the many-small-files case (0: skip)")
    ap.add_argument("--many-records", type=int, default=60_000,
                    help="records (lines) in all of the many-small-files case")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tlog-bench-ingest-"))
    try:
        run = tmp / "run"
        size = generate(run, ranks=args.ranks, iters=args.iters)
        records = args.ranks * (args.iters + 1)
        raw_t, ing_t, re_t = [], [], []
        report: dict = {}
        for _ in range(args.repeat):
            raw_t.append(time_raw(run, tmp / "raw.duckdb"))
            t, report = time_ingest(run, tmp / "tlog.duckdb")
            ing_t.append(t)
            # ~30 ms, where a scheduling hiccup is a large share: best of 3 a round
            re_t.extend(time_ingest(run, tmp / "tlog.duckdb", fresh=False)[0]
                        for _ in range(REINGEST_TRIES))
        polars_t = min(time_polars(run) for _ in range(args.repeat))
        floor_t = min(time_parse_floor(run) for _ in range(args.repeat))
        store_t = min(time_store_floor(tmp / "tlog.duckdb") for _ in range(args.repeat))
        raw, ing, again = min(raw_t), min(ing_t), min(re_t)
        small = time_small(tmp, repeat=max(3, 2 * args.repeat + 1))
        rss = None
        if args.mem_records:
            big = tmp / "big"
            per_rank = max(1, args.mem_records // args.ranks)
            big_size = generate(big, ranks=args.ranks, iters=per_rank, seed=1)
            shutil.rmtree(run)
            rss = peak_rss_of_ingest(big, tmp / "big.duckdb")
            shutil.rmtree(big)
        many = None
        if args.many_files:
            many_dir = tmp / "many"
            many_bytes = generate_many(many_dir, files=args.many_files,
                                       records=args.many_records)
            merged_copy(many_dir, tmp / "few")
            best: dict[str, tuple[float, int, int]] = {}
            for _ in range(max(1, min(args.repeat, 2))):
                for name in ("many", "few"):
                    got = ingest_in_child(tmp / name, tmp / f"{name}.duckdb")
                    if name not in best or got[0] < best[name][0]:
                        best[name] = (got[0], got[1], max(got[2], best.get(name, got)[2]))
            many = {"files": args.many_files, "records": args.many_records,
                    "bytes": many_bytes,
                    "many_s": best["many"][0], "many_loaded": best["many"][1],
                    "many_peak_rss_bytes": best["many"][2],
                    "few_s": best["few"][0], "few_loaded": best["few"][1],
                    "few_peak_rss_bytes": best["few"][2]}
        figures = {
            "records": records, "bytes": size,
            "raw_read_json_s": raw, "ingest_s": ing, "reingest_s": again,
            "polars_ndjson_s": polars_t, "duckdb_parse_floor_s": floor_t,
            "store_floor_s": store_t,
            "raw_records_per_s": records / raw, "ingest_records_per_s": records / ing,
            "ratio": raw / ing, "reingest_share": again / ing,
            "loaded": report.get("records_loaded"),
            "peak_rss_bytes": rss,
            "mem_run_bytes": big_size if args.mem_records else None,
            "runs": {"raw": raw_t, "ingest": ing_t, "reingest": re_t},
            "many_files": many,
            "small": small,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ok_ratio = figures["ratio"] >= RATIO_BUDGET
    ok_re = figures["reingest_share"] < REINGEST_BUDGET
    ok_rss = rss is None or rss < RSS_BUDGET_BYTES
    ok_many = many is None or (
        many["many_peak_rss_bytes"] < MANY_RSS_BUDGET_BYTES
        and many["many_loaded"] == many["few_loaded"] == many["records"]
        and many["many_s"] < MANY_TIME_BUDGET * many["few_s"])
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        mb = size / 1e6
        print(f"run: {args.ranks} ranks x {args.iters:,} iter records ({len(PHASES)} phases), "
              f"{records:,} lines, {mb:.1f} MB; best of {args.repeat}")
        print(f"  DuckDB read_json -> table : {raw:6.3f} s  {records / raw:>12,.0f} records/s")
        print(f"  tlog ingest_run -> db     : {ing:6.3f} s  {records / ing:>12,.0f} records/s")
        print(f"  ratio ingest / read_json  : {figures['ratio']:.2f}x  (budget >= {RATIO_BUDGET}x)"
              f"  {'ok' if ok_ratio else 'MISSED'}")
        print(f"  re-ingest unchanged run   : {again * 1000:6.1f} ms = "
              f"{figures['reingest_share'] * 100:.1f}% of the first (budget < "
              f"{REINGEST_BUDGET * 100:.0f}%)  {'ok' if ok_re else 'MISSED'}")
        print(f"  polars read_ndjson        : {polars_t:6.3f} s  {records / polars_t:>12,.0f} "
              f"records/s (not budgeted)")
        print(f"  DuckDB typed parse floor  : {floor_t:6.3f} s  (read + json_transform only)")
        print(f"  store floor               : {store_t:6.3f} s  (the loaded iterations copied "
              f"into a new table)")
        print(f"  parse + store floors      : {floor_t + store_t:6.3f} s = "
              f"{raw / (floor_t + store_t):.2f}x read_json before any check, line number, "
              f"duplicate or commit")
        print(f"  small run ({small['records']} lines), fresh db: tlog ingest "
              f"{small['ingest_s'] * 1000:.0f} ms, read_json {small['raw_s'] * 1000:.0f} ms, "
              f"ratio {small['ratio']:.2f}x (not budgeted); a --follow poll of "
              f"{small['poll_lines']} lines: {small['poll_s'] * 1000:.0f} ms")
        if rss is not None:
            print(f"  peak RSS, {args.mem_records:,}-record run ({figures['mem_run_bytes'] / 1e6:.0f}"
                  f" MB): {rss / 2**20:.0f} MiB (budget < {RSS_BUDGET_BYTES / 2**30:.0f} GiB)"
                  f"  {'ok' if ok_rss else 'MISSED'}")
        if many is not None:
            print(f"  {many['files']:,} small files ({many['records']:,} lines, "
                  f"{many['bytes'] / 1e6:.1f} MB), fresh db, in a child process:")
            print(f"    {many['files']:>6,} files : {many['many_s']:6.2f} s  "
                  f"{many['records'] / many['many_s']:>9,.0f} records/s  peak RSS "
                  f"{many['many_peak_rss_bytes'] / 2**20:5.0f} MiB  "
                  f"loaded {many['many_loaded']:,}")
            print(f"    {4:>6} files : {many['few_s']:6.2f} s  "
                  f"{many['records'] / many['few_s']:>9,.0f} records/s  peak RSS "
                  f"{many['few_peak_rss_bytes'] / 2**20:5.0f} MiB  (the same lines "
                  f"concatenated)")
            print(f"    budget: peak RSS < {MANY_RSS_BUDGET_BYTES / 2**20:.0f} MiB, time < "
                  f"{MANY_TIME_BUDGET:.0f}x the 4-file time, every line loaded  "
                  f"{'ok' if ok_many else 'MISSED'}")
    return 0 if (ok_ratio and ok_re and ok_rss and ok_many) else 1


if __name__ == "__main__":
    sys.exit(main())
