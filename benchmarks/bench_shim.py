"""Cost of the timing shim per recorded phase, as ratios measured side by side.

Run alone: ``python -m benchmarks.bench_shim`` (``--json`` for machine-readable output);
``make bench`` runs it with the others.

Method (timeit-style, everything in this one process):

- Every variant runs the same loop: ``iters`` iterations of ``PHASES`` = 10 phases.
  Its cost per phase is ``(loop time - empty loop time) / (iters * 10)``, the empty loop
  being the same two nested loops with no body, so per-iteration work (``rec.iteration()``
  and the handoff of the iteration to the writer's deque) is amortised over 10 phases.
- Variants: ``bare`` (two ``time.perf_counter()`` calls and a dict store per phase, a
  new dict per iteration: the hand-written timing DESIGN.md names), ``bare_local`` (the
  same with ``perf_counter`` bound to a local name, ~10% cheaper: printed as a second,
  stricter column ``x local`` so the margin is visible), ``lap`` (``it.lap(name)``), ``phase`` (``with
  it.phase(name): pass``), ``disabled`` (``it.lap`` on a disabled recorder),
  ``disabled_phase`` and the reference ``torch.profiler.record_function`` (no profiler
  running; fewer iterations as it is ~100x slower).
- Repeats are interleaved across variants and the minimum of each is kept (the
  least-disturbed run; this machine is shared). Between repeats the recorder is flushed
  *outside* the timed region, so the writer thread's serialisation does not steal the
  GIL from the timed loop; its cost is measured and printed separately (writer
  microseconds per iteration record), since it runs on the writer thread.

Budgets (DESIGN.md "Budgets"): ``lap`` <= 1.2x bare, ``phase`` <= 4x bare,
``disabled`` <= 0.3x bare. Exit status 1 if any is missed.

The writer's throughput (:func:`measure_writer`): ``--writer-records``
iterations of 10 laps are queued (nothing written meanwhile: the recorder's
flush interval is its longest and the writer thread is kept out by holding the
sink's lock while queueing), then one ``flush()`` serialises and writes them
all; its wall time per record, best of ``--writer-repeats``. Budget: at least
:data:`WRITER_RECORDS_PER_S` records a second to disk (5 us a record), so a
loop recording 100,000 iterations a second leaves the writer half its time.

Second case, the shim under an unbounded loop (:func:`measure_unbounded`): a
loop of 10-lap iterations with no work runs for a few seconds as fast as it can, first
with bare timers (one ``perf_counter()`` read and a dict store per phase, as a lap
reads one), then recorded (default ``flush_interval`` and ``max_pending``), far
faster than the writer thread can serialise. Printed side by side: iterations per
second of each, records per second written, the flush latency p100 (the longest gap
between two writes of the file while recording, from the loop's start to its end;
write times are taken by wrapping the writer's ``os.write``), and the records dropped:
counted by the shim, and checked against the loop's own count (on disk + dropped ==
made). Exit status 1 if a record is unaccounted for or the longest gap exceeds the
flush interval plus :data:`GAP_SLACK_S`.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from dflash_runtime import Recorder, writer

#: Phases per iteration over which per-iteration work is amortised.
PHASES = 10
#: Budgets as ratios to the bare pair (docs: "Cost").
BUDGETS = {"lap": 1.2, "phase": 4.0, "disabled": 0.3}
#: Budget: records (10-lap iterations) the writer puts on disk per second.
WRITER_RECORDS_PER_S = 200_000

NAMES = [f"phase_{i}" for i in range(PHASES)]

#: Allowed excess of the longest gap between writes over the flush interval (seconds;
#: tlog's choice: a batch of at most 50 ms of serialising plus scheduling on a busy machine).
GAP_SLACK_S = 0.5


def _empty(rec, n):
    pc = time.perf_counter
    names = NAMES
    t = pc()
    for _ in range(n):
        for _name in names:
            pass
    return pc() - t


def _bare(rec, n):
    names = NAMES
    t = time.perf_counter()
    for _ in range(n):
        d = {}
        for name in names:
            t0 = time.perf_counter()
            t1 = time.perf_counter()
            d[name] = t1 - t0
    return time.perf_counter() - t


def _bare_local(rec, n):
    pc = time.perf_counter
    names = NAMES
    t = pc()
    for _ in range(n):
        d = {}
        for name in names:
            t0 = pc()
            t1 = pc()
            d[name] = t1 - t0
    return pc() - t


def _lap(rec, n):
    pc = time.perf_counter
    names = NAMES
    t = pc()
    for _ in range(n):
        with rec.iteration() as it:
            for name in names:
                it.lap(name)
    return pc() - t


def _phase(rec, n):
    pc = time.perf_counter
    names = NAMES
    t = pc()
    for _ in range(n):
        with rec.iteration() as it:
            for name in names:
                with it.phase(name):
                    pass
    return pc() - t


def _record_function(rec, n):
    from torch.profiler import record_function

    pc = time.perf_counter
    names = NAMES
    t = pc()
    for _ in range(n):
        for name in names:
            with record_function(name):
                pass
    return pc() - t


def measure(iters: int = 1000, repeats: int = 40) -> dict:
    """Per-phase costs (seconds) and ratios to ``bare``; see the module docstring.

    Returns ``{"per_phase_ns": {variant: ns}, "ratios": {variant: x}, "budgets": ...,
    "writer_us_per_iter": us, "ok": bool, ...}``.
    """
    try:
        import torch  # noqa: F401 - the reference only; the shim never imports torch

        have_torch = True
    except ImportError:
        have_torch = False
    gc.collect()  # start clean after other benchmarks run in this process
    with tempfile.TemporaryDirectory(prefix="tlog-bench-") as tmp:
        on = Recorder(tmp, stage="bench", rank=0, install_handlers=False)  # defaults otherwise
        off = Recorder(tmp, stage="bench_off", rank=1, enabled=False)
        variants = {
            "empty": (_empty, on, iters),
            "bare": (_bare, on, iters),
            "bare_local": (_bare_local, on, iters),
            "lap": (_lap, on, iters),
            "phase": (_phase, on, iters),
            "disabled": (_lap, off, iters),
            "disabled_phase": (_phase, off, iters),
        }
        if have_torch:
            variants["record_function"] = (_record_function, on, max(iters // 40, 10))
        best = {k: float("inf") for k in variants}
        writer_s = 0.0
        writer_records = 0
        for _ in range(2):  # warm-up: specialise the bytecode, grow the deque once
            for fn, rec, n in variants.values():
                fn(rec, n)
            on.flush()
        for _ in range(repeats):
            for k, (fn, rec, n) in variants.items():
                best[k] = min(best[k], fn(rec, n) / n)
                pending = len(on._q)
                if pending:
                    t0 = time.perf_counter()
                    on.flush()
                    writer_s += time.perf_counter() - t0
                    writer_records += pending
        stats = on.stats()
        on.close()
        off.close()
    per_phase = {k: max(v - best["empty"], 0.0) / PHASES for k, v in best.items() if k != "empty"}
    bare = per_phase["bare"]
    local = per_phase["bare_local"]
    ratios = {k: v / bare for k, v in per_phase.items() if k not in ("bare", "bare_local")}
    strict = {k: v / local for k, v in per_phase.items() if k not in ("bare", "bare_local")}
    ok = all(ratios[k] <= b for k, b in BUDGETS.items())
    return {
        "iters": iters, "repeats": repeats, "phases_per_iter": PHASES,
        "per_phase_ns": {k: round(v * 1e9, 1) for k, v in per_phase.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "ratios_vs_local_alias": {k: round(v, 3) for k, v in strict.items()},
        "budgets": BUDGETS,
        "writer_us_per_iter": round(writer_s / max(writer_records, 1) * 1e6, 2),
        "records_dropped": stats["records_dropped"],
        "ok": ok,
    }


def measure_writer(records: int = 20_000, repeats: int = 5) -> dict:
    """Seconds the writer takes per queued 10-lap iteration record, serialised and
    written to disk by one ``flush()`` (best of ``repeats``); see the module docstring.

    Returns ``{"records", "us_per_record", "records_per_s", "bytes_per_record", "ok"}``.
    """
    gc.collect()
    best = float("inf")
    size = 0
    with tempfile.TemporaryDirectory(prefix="tlog-bench-") as tmp:
        rec = Recorder(tmp, stage="writer", rank=0, install_handlers=False, mem_every=0,
                       max_pending=records + 1000, flush_interval=1.0)
        names = NAMES
        rec.flush()                     # the meta line: not a record
        for _ in range(repeats):
            with rec._sink.lock:        # the writer thread waits: all of them queued
                for _ in range(records):
                    with rec.iteration() as it:
                        for name in names:
                            it.lap(name)
            queued = len(rec._q)
            before = os.path.getsize(rec.path)
            t0 = time.perf_counter()
            rec.flush()
            took = time.perf_counter() - t0
            if queued:
                best = min(best, took / queued)
                size = (os.path.getsize(rec.path) - before) / queued
        rec.close()
    return {"records": records, "us_per_record": round(best * 1e6, 3),
            "records_per_s": round(1 / best), "bytes_per_record": round(size, 1),
            "ok": 1 / best >= WRITER_RECORDS_PER_S}


def render_writer(w: dict) -> str:
    """The human line of :func:`measure_writer`'s result."""
    return (f"writer: {w['records']:,} queued 10-lap iterations flushed: "
            f"{w['us_per_record']:.2f} us a record = {w['records_per_s']:,} records/s to "
            f"disk ({w['bytes_per_record']:.0f} bytes each; budget >= "
            f"{WRITER_RECORDS_PER_S:,}/s)  " + ("ok" if w["ok"] else "MISS"))


def _bare_for(seconds: float) -> tuple[int, float]:
    """Bare-timer iterations of PHASES phases run in ``seconds``: (iterations, seconds)."""
    pc = time.perf_counter
    names = NAMES
    n = 0
    t0 = pc()
    end = t0 + seconds
    while pc() < end:
        for _ in range(100):
            d = {}
            t = pc()
            for name in names:
                t1 = pc()
                d[name] = t1 - t
                t = t1
        n += 100
    return n, pc() - t0


def measure_unbounded(seconds: float = 3.0) -> dict:
    """The shim under an unbounded loop vs a bare loop; see the module docstring.

    Returns ``{"seconds", "flush_interval_s", "max_pending", "bare_iters_per_s",
    "shim_iters_per_s", "written_per_s", "flush_latency_p100_s", "writes", "made",
    "on_disk", "dropped", "accounted", "ok"}`` (rates per second, latency in seconds).
    """
    gc.collect()
    bare_n, bare_s = _bare_for(seconds)
    writes: list[float] = []
    real_write = writer._os_write

    def timed_write(fd, data):
        n = real_write(fd, data)
        writes.append(time.perf_counter())
        return n

    with tempfile.TemporaryDirectory(prefix="tlog-bench-") as tmp:
        rec = Recorder(tmp, stage="unbounded", rank=1, install_handlers=False, mem_every=0)
        interval = rec._sink.interval
        writer._os_write = timed_write
        try:
            pc = time.perf_counter
            names = NAMES
            made = 0
            t0 = pc()
            end = t0 + seconds
            while pc() < end:
                for _ in range(100):
                    with rec.iteration() as it:
                        for name in names:
                            it.lap(name)
                made += 100
            t1 = pc()
            rec.close(timeout=60)  # writes what is queued; nothing dropped at close here
        finally:
            writer._os_write = real_write
        stats = rec.stats()
        on_disk = samples = 0
        with Path(rec.path).open("rb") as f:
            for line in f:
                on_disk += line.startswith(b'{"type":"iter"')
                samples += line.startswith(b'{"type":"sys"')   # the writer's own records
        os.unlink(rec.path)
    marks = [t0] + [t for t in writes if t0 < t <= t1] + [t1]
    p100 = max(b - a for a, b in itertools.pairwise(marks))
    accounted = (on_disk + stats["iters_dropped"] == made
                 and stats["records_written"] == on_disk + samples)
    return {
        "seconds": round(t1 - t0, 3), "flush_interval_s": interval,
        "max_pending": rec._max_pending,
        "bare_iters_per_s": round(bare_n / bare_s), "shim_iters_per_s": round(made / (t1 - t0)),
        "written_per_s": round(on_disk / (t1 - t0)),
        "flush_latency_p100_s": round(p100, 4), "writes": len(marks) - 2,
        "made": made, "on_disk": on_disk, "dropped": stats["iters_dropped"],
        "accounted": accounted, "ok": accounted and p100 <= interval + GAP_SLACK_S,
    }


def render_unbounded(u: dict) -> str:
    """The human lines of :func:`measure_unbounded`'s result."""
    ratio = u["shim_iters_per_s"] / max(u["bare_iters_per_s"], 1)
    return "\n".join([
        (f"shim under an unbounded loop ({u['seconds']:.1f} s of {PHASES}-lap iterations, "
         f"flush_interval {u['flush_interval_s']:g} s, max_pending {u['max_pending']:,})"),
        (f"  {'bare loop':<20} {u['bare_iters_per_s']:>12,} iterations/s "
         "(one clock read + dict store per phase)"),
        (f"  {'shim loop':<20} {u['shim_iters_per_s']:>12,} records/s recorded "
         f"({ratio:.2f}x bare), {u['written_per_s']:,}/s written"),
        (f"  {'flush latency p100':<20} {u['flush_latency_p100_s']:>12.3f} s  (longest gap "
         f"between writes while recording; {u['writes']} writes; budget "
         f"{u['flush_interval_s'] + GAP_SLACK_S:g} s)"),
        (f"  {'records dropped':<20} {u['dropped']:>12,}  counted; on disk {u['on_disk']:,} "
         f"+ dropped = {u['on_disk'] + u['dropped']:,}, made {u['made']:,}: "
         + ("all accounted for" if u["accounted"] else "UNACCOUNTED RECORDS")),
        "unbounded loop: " + ("ok" if u["ok"] else "MISSED"),
    ])


def render(res: dict) -> str:
    """The human table of :func:`measure`'s result."""
    lines = [
        (f"shim overhead per phase ({res['iters']} iterations x {res['phases_per_iter']} phases, "
        f"best of {res['repeats']}; empty loop subtracted)"),
        f"  {'variant':<16} {'ns/phase':>9} {'x bare':>7} {'x local':>8}  budget (x bare)",
        (f"  {'bare':<16} {res['per_phase_ns']['bare']:>9.1f} {1.0:>7.2f} "
        f"{res['per_phase_ns']['bare'] / res['per_phase_ns']['bare_local']:>8.2f}"),
        (f"  {'bare_local':<16} {res['per_phase_ns']['bare_local']:>9.1f} "
        f"{res['per_phase_ns']['bare_local'] / res['per_phase_ns']['bare']:>7.2f} {1.0:>8.2f}"),
    ]
    for k, r in res["ratios"].items():
        b = res["budgets"].get(k)
        mark = "" if b is None else (f"<= {b:g}" + (" ok" if r <= b else " MISS"))
        lines.append(f"  {k:<16} {res['per_phase_ns'][k]:>9.1f} {r:>7.2f} "
                     f"{res['ratios_vs_local_alias'][k]:>8.2f}  {mark}")
    lines.append(f"  writer thread: {res['writer_us_per_iter']:.1f} us per iteration record "
                 "(serialisation, off the training thread)")
    lines.append("shim budgets: " + ("met" if res["ok"] else "MISSED"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the ratios; return 1 if a budget is missed."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_shim", description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=1000, help="iterations per repeat (10 phases each)")
    ap.add_argument("--repeats", type=int, default=40, help="interleaved repeats; the best is kept")
    ap.add_argument("--unbounded-seconds", type=float, default=3.0,
                    help="seconds of the unbounded-loop case (0 skips it)")
    ap.add_argument("--writer-records", type=int, default=20_000,
                    help="iterations queued for the writer's throughput (0 skips it)")
    ap.add_argument("--writer-repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    res = measure(args.iters, args.repeats)
    if args.writer_records > 0:
        res["writer"] = measure_writer(args.writer_records, args.writer_repeats)
    if args.unbounded_seconds > 0:
        res["unbounded"] = measure_unbounded(args.unbounded_seconds)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(render(res))
        if "writer" in res:
            print(render_writer(res["writer"]))
        if "unbounded" in res:
            print(render_unbounded(res["unbounded"]))
    return 0 if res["ok"] and all(res.get(k, {"ok": True})["ok"]
                                  for k in ("writer", "unbounded")) else 1


if __name__ == "__main__":
    sys.exit(main())
