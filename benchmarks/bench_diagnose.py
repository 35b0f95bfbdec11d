"""Time ``analyze.diagnose`` on a run of 1M iteration records once ingested.

Run alone: ``python -m benchmarks.bench_diagnose`` (``--iterations N``,
``--json``); ``make bench`` runs it with the others.

Budget (DESIGN.md "Budgets"): diagnose answers in under 1 s for 1M
iteration records. Exit status 1 if the best of ``--repeat`` runs misses it.

The run is a DFlash-style pipeline written straight into a fresh database in
the order ingest writes it (file by file, record by record, phases in
``seq`` order): 2 target workers (``batch_get, target_forward, hs_extract,
hs_put``, device times on the forward) and 6 drafter ranks (``hs_get,
mask_build, draft_forward, backward, grad_allreduce, grad_norm_item,
optimizer``, device times on the compute phases, so the device-backlog walk
runs over every drafter iteration). Ingest's own speed is
``benchmarks.bench_ingest``'s business; building the database here takes a
few seconds and is not timed. Alongside diagnose, the time DuckDB takes just
to scan the same rows into Arrow is printed, as the floor to compare, and
diagnose's CPU time over all threads (less sensitive than wall time to other
jobs on a shared machine).

Scale: the same pipeline at ``--scale`` iterations (default 10M;
0 skips it), built with DuckDB SQL (``range``, no Python loop), is diagnosed in
a child process beside the 1M run, each printing wall time and peak memory
(the child's ``VmHWM``, ``benchmarks._memory``). Budget: 10M
within 2 GB (:data:`SCALE_BUDGET_BYTES`; about 1.93 GiB measured,
docs/DIAGNOSIS.md section 11); exit status 1 if the scale run misses it. Step
numbers in phase names: 5,000 iterations of two ranks whose phases are
``step_{i}_fwd``/``step_{i}_get`` (a new layout per iteration) against the
same run with fixed names, cost per iteration of each.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks._memory import PEAK_BYTES_SRC

#: Budget: seconds for diagnose on 1M iteration records.
BUDGET_S = 1.0
#: Budget: peak resident memory of diagnose on 10M iteration records, bytes.
SCALE_BUDGET_BYTES = 2 * 2**30

_TARGET = [("batch_get", "starvation", 0.004, None), ("target_forward", "compute", 0.030, 0.045),
           ("hs_extract", "compute", 0.003, 0.002), ("hs_put", "backpressure", 0.010, None)]
_DRAFTER = [("hs_get", "starvation", 0.006, None), ("mask_build", "compute", 0.004, None),
            ("draft_forward", "compute", 0.012, 0.020), ("backward", "compute", 0.018, 0.035),
            ("grad_allreduce", "sync", 0.008, None), ("grad_norm_item", "sync", 0.020, None),
            ("optimizer", "compute", 0.004, 0.003)]


def build(path: Path, iterations: int = 1_000_000, *, seed: int = 0) -> str:
    """Write a synthetic run of about ``iterations`` iteration records; return its id."""
    from tlog.ingest.db import connect

    rng = np.random.default_rng(seed)
    run_id = "bench-diagnose"
    con = connect(path)
    con.execute("INSERT INTO runs (run_id, name) VALUES (?, ?)", [run_id, "synthetic"])
    workers = [("target", r, _TARGET) for r in range(2)] + \
              [("drafter", r, _DRAFTER) for r in range(6)]
    layouts = {"target": 0, "drafter": 1}
    for stage, spec in (("target", _TARGET), ("drafter", _DRAFTER)):
        con.executemany("INSERT INTO phase_layouts (run_id, layout, seq, phase, parent, "
                        "category) VALUES (?, ?, ?, ?, NULL, ?)",
                        [(run_id, layouts[stage], seq, name, cat)
                         for seq, (name, cat, _, _) in enumerate(spec)])
    weights = np.array([1.0 if s == "target" else 4 / 3 for s, _, _ in workers])
    per_worker = np.floor(iterations * weights / weights.sum()).astype(int)
    per_worker[-1] += iterations - per_worker.sum()
    for (stage, rank, spec), n in zip(workers, per_worker, strict=True):
        k = len(spec)
        host = np.empty((n, k))
        gpu = np.full((n, k), np.nan)
        for j, (_, _, h, g) in enumerate(spec):
            host[:, j] = h * rng.uniform(0.8, 1.2, n)
            if g is not None:
                gpu[:, j] = g * rng.uniform(0.9, 1.1, n)
        dur = host.sum(axis=1) + rng.uniform(0.0005, 0.002, n)
        ts = 1.7e9 + np.concatenate([[0.0], np.cumsum(dur)[:-1]])
        offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
        gflat = gpu.ravel()
        table = pa.table({
            "run_id": pa.array([run_id] * n), "rank": pa.array(np.full(n, rank, np.int32)),
            "stage": pa.array([stage] * n), "worker": pa.array([f"{stage}-{rank}"] * n),
            "iter": np.arange(n), "ts": ts, "dur": dur, "cpu": dur * 0.5,
            "tokens": np.full(n, 8192), "samples": np.full(n, 4),
            "layout": pa.array(np.full(n, layouts[stage], np.int32)),
            "phase_host_s": pa.ListArray.from_arrays(offsets, pa.array(host.ravel())),
            "phase_gpu_s": pa.ListArray.from_arrays(
                offsets, pa.array(gflat, mask=np.isnan(gflat))),
        })
        con.register("bench_iteration_rows", table)
        con.execute("INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, cpu, "
                    "tokens, samples, layout, phase_host_s, phase_gpu_s) "
                    "SELECT * FROM bench_iteration_rows")
        con.unregister("bench_iteration_rows")
    con.execute("CHECKPOINT")  # as after an ingest: the rows in the file, not the WAL
    con.close()
    return run_id


def build_sql(path: Path, iterations: int, *, run_id: str = "bench-diagnose",
              drafters: int = 6) -> str:
    """The :func:`build` pipeline written with DuckDB SQL (seconds at 10M): same
    workers (``drafters`` drafter ranks), layouts and phase means, uniform jitter
    from DuckDB's ``random()``."""
    from tlog.ingest.db import connect

    con = connect(path)
    con.execute("INSERT INTO runs (run_id, name) VALUES (?, ?)", [run_id, "synthetic"])
    workers = [("target", r, 0, _TARGET) for r in range(2)] + \
              [("drafter", r, 1, _DRAFTER) for r in range(drafters)]
    for lid, spec in ((0, _TARGET), (1, _DRAFTER)):
        con.executemany("INSERT INTO phase_layouts (run_id, layout, seq, phase, parent, "
                        "category) VALUES (?, ?, ?, ?, NULL, ?)",
                        [(run_id, lid, seq, name, cat) for seq, (name, cat, _, _) in
                         enumerate(spec)])
    weights = np.array([1.0 if s == "target" else 4 / 3 for s, _, _, _ in workers])
    per_worker = np.floor(iterations * weights / weights.sum()).astype(int)
    per_worker[-1] += iterations - per_worker.sum()
    for (stage, rank, lid, spec), n in zip(workers, per_worker, strict=True):
        host = ", ".join(f"{h} * (0.8 + 0.4 * random())" for _, _, h, _ in spec)
        gpu = ", ".join("NULL::DOUBLE" if g is None else f"{g} * (0.9 + 0.1 * random())"
                        for _, _, _, g in spec)
        mean = sum(h for _, _, h, _ in spec) + 0.00125
        con.execute(f"""INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur, cpu,
                            tokens, samples, layout, phase_host_s, phase_gpu_s)
            SELECT '{run_id}', {rank}, '{stage}', '{stage}-{rank}', i, 1.7e9 + i * {mean},
                   list_sum(h) + 0.0005 + 0.0015 * random(), 0.5 * list_sum(h), 8192, 4,
                   {lid}, h, g
            FROM (SELECT i, [{host}] AS h, [{gpu}] AS g FROM range({int(n)}) t(i))""")
    con.execute("CHECKPOINT")
    con.close()
    return run_id


_CHILD = PEAK_BYTES_SRC + """
import json, sys, time
from tlog.analyze import diagnose
from tlog.ingest.db import connect
con = connect(sys.argv[1], read_only=True)
t = time.perf_counter()
d = diagnose(con, sys.argv[2])
print(json.dumps({"diagnose_s": time.perf_counter() - t, "peak_bytes": _peak_bytes(),
                  "verdict": d.verdict}))
"""


def measure_child(path: Path, run_id: str) -> dict:
    """Diagnose ``run_id`` in a fresh child process: wall seconds and peak RSS (bytes)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), run_id], cwd=root,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_named(tmp: Path, n: int = 5000) -> dict[str, float]:
    """Seconds per iteration of diagnose: fixed phase names vs a step number in
    each name (one layout per iteration), two ranks of ``n`` iterations each."""
    from tlog.analyze import diagnose
    from tlog.ingest.db import connect

    out = {}
    for kind in ("fixed", "step"):
        con = connect(tmp / f"names-{kind}.duckdb")
        con.execute("INSERT INTO runs (run_id) VALUES ('names')")
        lay = "i" if kind == "step" else "0"
        name = "'step_' || i || '_'" if kind == "step" else "''"
        con.execute(f"""INSERT INTO phase_layouts (run_id, layout, seq, phase, parent, category)
            SELECT DISTINCT 'names', {lay}, s, {name} || CASE s WHEN 0 THEN 'fwd' ELSE 'get' END,
                   NULL, CASE s WHEN 0 THEN 'compute' ELSE 'starvation' END
            FROM range({n}) a(i), range(2) b(s)""")
        con.execute(f"""INSERT INTO iterations (run_id, rank, stage, worker, iter, ts, dur,
                                              layout, phase_host_s)
            SELECT 'names', r, 'main', 'main-' || r, i, 1000.0 + 0.05 * i, 0.05, {lay},
                   [0.03, 0.01] FROM range(2) a(r), range({n}) b(i) ORDER BY r, i""")
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            diagnose(con, "names")
            best = min(best, time.perf_counter() - t)
        con.close()
        out[kind] = best / (2 * n)
    return out


def _cpu() -> float:
    """CPU seconds of this process, every thread (DuckDB's and polars' too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    """Build the synthetic run, time diagnose on it, print the figures."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_diagnose",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", type=Path, default=None,
                        help="reuse (or create) this database file instead of a temporary one")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--scale", type=int, default=10_000_000,
                        help="iterations of the scale case (0: skip it)")
    args = parser.parse_args(argv)

    from tlog.analyze import diagnose
    from tlog.ingest.db import connect

    with tempfile.TemporaryDirectory(prefix="tlog-bench-") as tmp:
        path = args.db or Path(tmp) / "bench.duckdb"
        t0 = time.perf_counter()
        if not path.exists():
            run_id = build(path, args.iterations)
        else:
            run_id = "bench-diagnose"
        build_s = time.perf_counter() - t0
        con = connect(path, read_only=True)
        n_iter, n_phase = con.sql(
            "SELECT (SELECT count(*) FROM iterations WHERE run_id = $r), "
            "(SELECT count(*) FROM phases WHERE run_id = $r)", params={"r": run_id}).fetchall()[0]
        scans, runs, cpus = [], [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            con.sql("SELECT iter, ts, dur, phase_host_s, phase_gpu_s FROM iterations "
                    "WHERE run_id = $r", params={"r": run_id}).to_arrow_table()
            scans.append(time.perf_counter() - t)
            c, t = _cpu(), time.perf_counter()
            d = diagnose(con, run_id)
            runs.append(time.perf_counter() - t)
            cpus.append(_cpu() - c)
        con.close()
        mem = {"base": measure_child(path, run_id)}
        scale_build_s = None
        if args.scale:
            t0 = time.perf_counter()
            big = Path(tmp) / "scale.duckdb"
            build_sql(big, args.scale)
            scale_build_s = time.perf_counter() - t0
            try:
                mem["scale"] = measure_child(big, "bench-diagnose")
            except Exception as exc:  # noqa: BLE001 - out of memory is a figure too
                mem["scale"] = {"error": str(exc)[-300:]}
            big.unlink()
        names = step_named(Path(tmp))
    best = min(runs)
    result = {"iterations": n_iter, "phase_rows": n_phase, "build_s": build_s,
              "diagnose_s": best, "diagnose_runs_s": runs, "cpu_s": min(cpus),
              "scan_s": min(scans),
              "ratio_to_scan": best / min(scans), "budget_s": BUDGET_S,
              "within_budget": best < BUDGET_S, "verdict": d.verdict,
              "scale_budget_bytes": SCALE_BUDGET_BYTES,
              "scale_within_budget": _scale_ok(mem) if args.scale else None,
              "child": mem, "scale_iterations": args.scale, "scale_build_s": scale_build_s,
              "per_iteration_s": names}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"diagnose: {n_iter:,} iteration records, {n_phase:,} phase rows")
        print(f"  best of {len(runs)}: {best:.3f} s (runs: {', '.join(f'{r:.3f}' for r in runs)})"
              f"; budget {BUDGET_S:.1f} s -> {'OK' if best < BUDGET_S else 'MISSED'}")
        print(f"  CPU time of diagnose (all threads, least of the runs): {min(cpus):.3f} s")
        print(f"  DuckDB scan of the iteration rows (with their phase lists) to Arrow: {min(scans):.3f} s "
              f"(diagnose = {best / min(scans):.1f}x that)")
        print(f"  verdict: {d.verdict}")
        for label, m in mem.items():
            what = f"{n_iter:,}" if label == "base" else f"{args.scale:,}"
            if "error" in m:
                print(f"  child process, {what} iterations: failed ({m['error']})")
            else:
                print(f"  child process, {what} iterations: {m['diagnose_s']:.2f} s, "
                      f"peak memory {m['peak_bytes'] / 2**20:,.0f} MiB"
                      + ("" if label == "base" else
                         f"; budget {SCALE_BUDGET_BYTES / 2**20:,.0f} MiB -> "
                         f"{'OK' if _scale_ok(mem) else 'MISSED'}"))
        if scale_build_s is not None:
            print(f"  (scale run built with DuckDB SQL in {scale_build_s:.1f} s)")
        print(f"  per iteration: fixed phase names {names['fixed'] * 1e6:.0f} us, a step "
              f"number in each name {names['step'] * 1e6:.0f} us (2 ranks x 5,000 iterations)")
    return 0 if best < BUDGET_S and (not args.scale or _scale_ok(mem)) else 1


def _scale_ok(mem: dict) -> bool:
    """Whether the scale run's child stayed within :data:`SCALE_BUDGET_BYTES`."""
    m = mem.get("scale", {})
    return "peak_bytes" in m and m["peak_bytes"] < SCALE_BUDGET_BYTES


if __name__ == "__main__":
    sys.exit(main())
