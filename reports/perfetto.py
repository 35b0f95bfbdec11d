"""tlog's own measurement of a run as a timeline for Perfetto (ui.perfetto.dev) or chrome://tracing.

The file is the Trace Event Format's JSON object form
(``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``),
which Perfetto opens as it is:

- one **process track per worker** (``pid`` 1, 2, ... in stage, rank, worker
  order; its ``process_name`` metadata event names stage, rank, worker and
  host), with two threads: ``iterations`` (``tid`` 1) and ``events`` (2);
- each **iteration** a complete event (``ph: "X"``, ``name: "iter N"``,
  ``cat: "iteration"``, ``ts``/``dur`` in microseconds from the run's first
  record) with its **phases** nested inside it as complete events of their
  own (``cat``: the phase's category: ``starvation``, ``backpressure``,
  ``compute``, ``sync`` ...; a collective wait is a ``sync`` slice). The shim
  records each phase's duration, not its start, so the phases are laid out
  back to back in recorded order from the iteration's start, a nested
  phase at its parent's start; the time in no phase shows as the gap at
  the iteration's end;
- **events** (checkpoint, eval ...) as complete events on thread 2;
- **counters** (``ph: "C"``): each queue's depth (``queue NAME``, args
  ``depth``, ``capacity``) on the track of the worker that sampled it, and
  per worker its process CPU in cores, the share of time its training
  thread waited for a core (both from the cumulative ``sys`` figures: rise
  per second between samples) and its RSS in MiB.

Source of the format: the Trace Event Format document (Google, "Trace Event
Format", the JSON object format; ``X``, ``C`` and ``M`` events).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tlog.ingest.errors import RunNotFoundError, UsageError

if TYPE_CHECKING:
    import duckdb

US = 1e6


@dataclass(frozen=True)
class PerfettoTrace:
    """A run's timeline (module docstring).

    Attributes:
        run_id: the run.
        trace: the JSON object (``traceEvents`` ...), ready for ``json.dump``.
        iterations, phases, counters: how many of each event it holds.
    """

    run_id: str
    trace: dict[str, Any]
    iterations: int
    phases: int
    counters: int

    def write(self, path: str | Path) -> Path:
        """Write the trace to ``path`` (parents created); return it.

        Raises:
            UsageError: the file cannot be written.
        """
        out = Path(path)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("w", encoding="utf-8") as fh:
                json.dump(self.trace, fh, separators=(",", ":"), allow_nan=False)
        except OSError as exc:
            raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
        return out


def _iter_window(con: duckdb.DuckDBPyConnection, run_id: str,
                 iters: tuple[int, int] | None) -> tuple[str, list[Any]]:
    if iters is None:
        return "run_id = ?", [run_id]
    return "run_id = ? AND iter BETWEEN ? AND ?", [run_id, iters[0], iters[1]]


def perfetto_trace(con: duckdb.DuckDBPyConnection, run_id: str, *,
                   iters: tuple[int, int] | None = None) -> PerfettoTrace:
    """The timeline of ``run_id`` (module docstring); ``iters``: only the
    iterations numbered ``first`` to ``last`` (both included) of every worker,
    and the events, samples and counters inside their time span.

    Raises:
        RunNotFoundError: no such run, or no iteration (in the window).
        UsageError: ``iters`` is not (first, last) with first <= last.
    """
    if iters is not None and not (len(iters) == 2 and 0 <= iters[0] <= iters[1]):
        raise UsageError(f"iterations {iters!r}: give FIRST:LAST, 0 <= FIRST <= LAST")
    where, params = _iter_window(con, run_id, iters)
    its = con.execute(f"SELECT stage, rank, worker, iter, ts, dur, tokens FROM iterations "
                      f"WHERE {where} AND dur IS NOT NULL ORDER BY stage, rank, worker, ts",
                      params).fetchall()
    if not its:
        raise RunNotFoundError(f"no iterations of run {run_id!r}"
                               + (f" numbered {iters[0]} to {iters[1]}" if iters else "")
                               + " in the database (tlog runs lists the runs)")
    t0 = min(r[4] for r in its)
    t1 = max(r[4] + r[5] for r in its)
    phases = con.execute(f"SELECT stage, rank, worker, iter, seq, phase, parent, host_s, "
                         f"category FROM phases WHERE {where} AND host_s IS NOT NULL "
                         f"ORDER BY stage, rank, worker, iter, seq", params).fetchall()
    hosts = {(s, r, w): h for s, r, w, h in con.execute(
        "SELECT stage, rank, worker, any_value(host) FROM workers WHERE run_id = ? "
        "GROUP BY ALL", [run_id]).fetchall()}
    pids: dict[tuple[str, int, str], int] = {}
    for s, r, w, *_ in its:
        pids.setdefault((s, r, w), len(pids) + 1)
    by_worker_name = {w: p for (_, _, w), p in pids.items()}

    def us(t: float) -> float:
        return round((t - t0) * US, 3)

    events: list[dict[str, Any]] = []
    for (s, r, w), pid in pids.items():
        host = hosts.get((s, r, w))
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {
            "name": f"{s} rank {r} ({w}" + (f" on {host}" if host else "") + ")"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        for tid, name in ((1, "iterations"), (2, "events")):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": name}})
    starts: dict[tuple[str, int, str, int], float] = {}
    for s, r, w, it, ts, dur, tokens in its:
        pid = pids[(s, r, w)]
        starts[(s, r, w, it)] = ts
        args: dict[str, Any] = {"dur_ms": round(dur * 1e3, 3)}
        if tokens is not None:
            args["tokens"] = tokens
        events.append({"name": f"iter {it}", "cat": "iteration", "ph": "X", "pid": pid,
                       "tid": 1, "ts": us(ts), "dur": round(dur * US, 3), "args": args})
    n_phases = 0
    cursor: dict[Any, float] = {}    # where the next phase starts: per iteration or parent
    place: dict[Any, float] = {}     # each placed phase's start, for its children
    for s, r, w, it, seq, phase, parent, host_s, category in phases:
        start = starts.get((s, r, w, it))
        if start is None:
            continue
        key = (s, r, w, it)
        slot = (key, parent) if parent is not None and (key, parent) in place else key
        at = cursor.get(slot, place.get(slot, 0.0))     # seconds from the iteration's start
        cursor[slot] = at + host_s
        place[(key, phase)] = at
        events.append({"name": phase, "cat": category or "unknown", "ph": "X",
                       "pid": pids[(s, r, w)], "tid": 1, "ts": round(us(start) + at * US, 3),
                       "dur": round(host_s * US, 3), "args": {"category": category}})
        n_phases += 1
    for s, r, w, name, ts, dur in con.execute(
            "SELECT stage, rank, worker, name, ts, dur FROM events WHERE run_id = ? "
            "AND ts <= ? AND ts + coalesce(dur, 0) >= ? ORDER BY ts",
            [run_id, t1, t0]).fetchall():
        pid = pids.get((s, r, w))
        if pid is None:
            continue
        events.append({"name": name, "cat": "event", "ph": "X", "pid": pid, "tid": 2,
                       "ts": us(max(ts, t0)), "dur": round((dur or 0.0) * US, 3)})
    n_counters = 0
    for s, r, w, name, ts, depth, capacity in con.execute(
            "SELECT stage, rank, worker, name, ts, depth, capacity FROM queue_samples "
            "WHERE run_id = ? AND ts BETWEEN ? AND ? ORDER BY ts", [run_id, t0, t1]).fetchall():
        pid = pids.get((s, r, w))
        if pid is None or depth is None:
            continue
        args = {"depth": depth} if capacity is None else {"depth": depth, "capacity": capacity}
        events.append({"name": f"queue {name}", "ph": "C", "pid": pid, "ts": us(ts),
                       "args": args})
        n_counters += 1
    prev: dict[str, tuple[float, float | None, float | None]] = {}
    for w, ts, cpu_s, wait_s, rss in con.execute(
            "SELECT worker, ts, cpu_s, cpu_wait_s, rss_bytes FROM sys_samples WHERE run_id = ? "
            "AND ts BETWEEN ? AND ? ORDER BY worker, ts", [run_id, t0, t1]).fetchall():
        pid = by_worker_name.get(w)
        if pid is None:
            continue
        if rss is not None:
            events.append({"name": "RSS (MiB)", "ph": "C", "pid": pid, "ts": us(ts),
                           "args": {"MiB": round(rss / 2**20, 3)}})
            n_counters += 1
        last = prev.get(w)
        if last is not None and ts > last[0]:
            span = ts - last[0]
            if cpu_s is not None and last[1] is not None:
                events.append({"name": "process CPU (cores)", "ph": "C", "pid": pid,
                               "ts": us(ts), "args": {"cores": round((cpu_s - last[1]) / span, 4)}})
                n_counters += 1
            if wait_s is not None and last[2] is not None:
                events.append({"name": "waiting for a core (share)", "ph": "C", "pid": pid,
                               "ts": us(ts),
                               "args": {"share": round((wait_s - last[2]) / span, 4)}})
                n_counters += 1
        prev[w] = (ts, cpu_s, wait_s)
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"run_id": run_id, "t0_epoch_s": t0, "source": "tlog",
                           "iterations": list(iters) if iters else None}}
    return PerfettoTrace(run_id=run_id, trace=trace, iterations=len(its), phases=n_phases,
                         counters=n_counters)
