"""``tlog serve`` for a team: 16 runs of 4 ranks shipped from "other hosts" at
1,000 lines/s per rank for 60 s, while 8 readers poll the run and diagnosis API.

Run alone: ``python -m benchmarks.bench_team`` (``--senders``, ``--ranks``,
``--rate``, ``--seconds``, ``--readers``, ``--interval``, ``--json``);
``make bench`` runs it with the others at the default size.

Method: a real service (``python -m tlog serve --token T --port 0``, loopback,
an ingest round every :data:`tlog.web.service.SERVE_INTERVAL_S` s, its
default) with nothing under ``--watch``: every line reaches it through
``POST /api/ship``. Before the clock starts, each run's ``run.json`` and
``meta`` lines are shipped and ingested (the service is warm). Then, in this
process, for each of ``--senders`` runs:

- a generator thread appends to the run's ``--ranks`` files
  (``rank<r>.main.jsonl``, the shim's v1 format, docs/FORMAT.md: a ``meta``
  line with rank ``r`` and stage ``main``, then ``iter`` records numbered
  from 0) at ``--rate`` lines/s per rank, in batches every
  :data:`BATCH_S` s (behind schedule, the next batch catches up);
- a :class:`dflash_runtime.ship.Shipper` thread sends the run's new bytes
  (gzip ranges, the token) every :data:`SHIP_EVERY_S` s, as ``tlog ship
  --follow`` does.

``--readers`` threads, each with its own keep-alive connection, pick a random
run among those holding an iteration and ``GET /api/runs/ID`` then ``GET
/api/runs/ID/diagnosis``, back to back, from the clock's start until the
drain ends (at most :data:`DRAIN_LIMIT_S` after the writers stop); every answer
must be 200, and a run's iteration count may never go down (per reader and
endpoint) nor pass the lines written.

Figures: lines/s written and ingested (over the second half of the writing,
the steady state), the backlog when writing stops and the drain time (from
the writers' stop until the service's log has counted every line), p50/p99
of the reads, the service's peak RSS (psutil, sampled every
:data:`SAMPLE_S` s) and its CPU (cores busy on average). Ingest progress is
read from the service's own log (``ingested N records of run R``, one line
per run and round), which costs the service nothing; the gaps between those
lines give the time of one run's ingest and of a round. After the drain,
one ``GET /api/sql`` checks every run: ``count(*) = count(DISTINCT (rank,
iter)) = lines written`` (a run with fewer, equal counts: lines missing,
lost or still not ingested; more, or unequal: doubled).

Budget (exit 1 when missed): the load applied (at least :data:`MIN_LOAD`
of the lines due written), no error, no line lost or doubled in any run,
the drain within :data:`BUDGET_DRAIN_S`, p99 of the reads within
:data:`bench_serve.BUDGET_P99_S`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_serve import BUDGET_P99_S, get_json, quantile, start_service

#: Seconds from the writers' stop until the service holds every line. A
#: service that keeps up is behind by one ship pass and an ingest round or two
#: (about 5 s at the defaults: 0.5 s + 2 x 2 s); 3x that for a shared machine.
#: Source: tlog's choice.
BUDGET_DRAIN_S = 15.0

#: Share of the lines due (``rate x seconds`` per rank) the generators must have
#: written, else the load was not applied (the bench process was short of CPU).
#: Source: tlog's choice.
MIN_LOAD = 0.95

#: Seconds between two batches of a generator (each rank's lines of that time).
BATCH_S = 0.1

#: Seconds between two passes of a sender (``ship_once``).
SHIP_EVERY_S = 0.5

#: Seconds between two samples of the service's RSS and log.
SAMPLE_S = 0.2

#: Longest wait for the drain (4x its budget) before the exact check is made
#: anyway: a line still missing then is missing (lost, or very late).
DRAIN_LIMIT_S = 4 * BUDGET_DRAIN_S

#: The run's start (epoch seconds); one iteration lasts 1/rate s: load 20%, forward 80%.
T0 = 1_764_403_200.0

_INGESTED = re.compile(rb"ingested (\d+) records of run (\S+)")


@dataclass
class Sender:
    """One "remote" run: its directory, lines written per rank, and its shipper."""

    run: str
    dir: Path
    ranks: int
    rate: float
    written: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    down: int = 0
    shipper: Any = None

    def create(self) -> None:
        """``run.json`` and each rank file's ``meta`` line."""
        self.dir.mkdir(parents=True)
        (self.dir / "run.json").write_text(json.dumps(
            {"v": 1, "run_id": self.run, "name": "team", "started": T0,
             "world_size": self.ranks, "tags": {"bench": "team"}}), encoding="utf-8")
        for r in range(self.ranks):
            (self.dir / f"rank{r}.main.jsonl").write_text(json.dumps(
                {"type": "meta", "v": 1, "rank": r, "stage": "main", "worker": f"main-{r}",
                 "host": f"node-{self.run}", "pid": 1000 + r}) + "\n", encoding="utf-8")
        self.written = [0] * self.ranks

    def generate(self, start: float, seconds: float) -> None:
        """Append each rank's lines due since ``start`` (monotonic) for ``seconds``:
        ``round(rate x seconds)`` lines per rank in the end."""
        dt = 1.0 / self.rate
        load, fwd = round(0.2 * dt, 9), round(0.8 * dt, 9)
        files = [open(self.dir / f"rank{r}.main.jsonl", "a", encoding="utf-8")  # noqa: SIM115
                 for r in range(self.ranks)]
        try:
            while True:
                elapsed = time.monotonic() - start
                due = (int(self.rate * elapsed) if elapsed < seconds
                       else round(self.rate * seconds))
                for r, fh in enumerate(files):
                    first = self.written[r]
                    if due <= first:
                        continue
                    # counted before the write: a reader never sees more than this
                    self.written[r] = due
                    fh.write("".join(
                        f'{{"type": "iter", "iter": {i}, "ts": {T0 + i * dt:.6f}, "dur": {dt}, '
                        f'"tokens": 32, "phases": {{"load": {load}, "forward": {fwd}}}}}\n'
                        for i in range(first, due)))
                    fh.flush()
                if elapsed >= seconds:
                    return
                time.sleep(max(0.0, min(BATCH_S, start + seconds - time.monotonic())))
        finally:
            for fh in files:
                fh.close()

    def ship(self, halt: threading.Event) -> None:
        """``ship_once`` every :data:`SHIP_EVERY_S` s until ``halt``, then until
        nothing is left to send."""
        from dflash_runtime.ship import ServiceDown, ShipRefused

        while True:
            halting = halt.is_set()
            t = time.monotonic()
            try:
                sent = self.shipper.ship_once()
            except ServiceDown as exc:
                self.down += 1
                if self.down > 20:
                    self.errors.append(f"{self.run}: the service does not answer: {exc}")
                    return
                sent = 1
            except ShipRefused as exc:
                self.errors.append(f"{self.run}: {exc}")
                return
            if halting and sent == 0:
                return
            if not halting:
                halt.wait(max(0.0, SHIP_EVERY_S - (time.monotonic() - t)))


class LogWatch:
    """Reads the service's stderr log as it grows: records ingested per run and
    the arrival time of each ``ingested`` line (monotonic, within :data:`SAMPLE_S`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.tail = b""
        self.records: dict[str, int] = {}
        self.lines: list[tuple[float, str, int]] = []
        self._lock = threading.Lock()

    def poll(self) -> int:
        """Read what is new; return the records ingested so far, all runs together."""
        with self._lock:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.pos)
                    chunk = fh.read()
            except OSError:
                return self.total
            self.pos += len(chunk)
            *whole, self.tail = (self.tail + chunk).split(b"\n")
            now = time.monotonic()
            for line in whole:
                m = _INGESTED.search(line)
                if m:
                    run, n = m.group(2).decode(), int(m.group(1))
                    self.records[run] = self.records.get(run, 0) + n
                    self.lines.append((now, run, n))
            return self.total

    @property
    def total(self) -> int:
        return sum(self.records.values())

    def timings(self, interval: float) -> dict[str, float]:
        """Median seconds of one run's ingest (the gap between two ``ingested``
        lines closer than ``interval``: the same round) and of a round (from one
        line of a run to its next)."""
        gaps = sorted(b[0] - a[0] for a, b in zip(self.lines, self.lines[1:])
                      if b[0] - a[0] < interval)
        last: dict[str, float] = {}
        rounds = []
        for t, run, _ in self.lines:
            if run in last:
                rounds.append(t - last[run])
            last[run] = t
        return {"run_ingest_s": quantile(gaps, 0.5), "round_s": quantile(sorted(rounds), 0.5),
                "ingest_lines": len(self.lines)}


def _reader(base: str, token: str, readable: Callable[[], list[Sender]], seed: int,
            halt: threading.Event, out: dict[str, Any]) -> None:
    u = urllib.parse.urlsplit(base)
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {token}"}
    con = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    last: dict[str, int] = {}
    while not halt.is_set():
        senders = readable()
        if not senders:
            time.sleep(0.05)
            continue
        s = rng.choice(senders)
        for kind, path in (("run", f"/api/runs/{s.run}"), ("diagnosis",
                                                          f"/api/runs/{s.run}/diagnosis")):
            t = time.perf_counter()
            try:
                con.request("GET", path, headers=headers)
                resp = con.getresponse()
                body = resp.read()
                out[kind].append(time.perf_counter() - t)
                if resp.status != 200:
                    out["errors"].append(f"{path}: HTTP {resp.status} {body[:200]!r}")
                    continue
                n = json.loads(body)["iterations"]["total"]
                key = f"{kind}:{s.run}"
                if n < last.get(key, 0) or n > sum(s.written):
                    out["errors"].append(f"{path}: {n} iterations after {last.get(key, 0)} "
                                         f"(written {sum(s.written)})")
                last[key] = max(last.get(key, 0), n)
            except (OSError, http.client.HTTPException, ValueError, KeyError,
                    TypeError) as exc:
                out["errors"].append(f"{path}: {type(exc).__name__}: {exc}")
                con.close()
                con = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    con.close()


class Sampler(threading.Thread):
    """Every :data:`SAMPLE_S` s: the service's RSS (psutil) and the log's count,
    with the lines written by then."""

    def __init__(self, pid: int, log: LogWatch, senders: list[Sender]) -> None:
        import psutil

        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.log = log
        self.senders = senders
        self.halt = threading.Event()
        self.peak_rss = 0
        self.series: list[tuple[float, int, int]] = []    # (monotonic, written, ingested)

    def sample(self) -> None:
        import psutil

        try:
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        except psutil.Error:
            pass
        ingested = self.log.poll()
        self.series.append((time.monotonic(), sum(sum(s.written) for s in self.senders),
                            ingested))

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            self.sample()

    def at(self, t: float) -> tuple[float, int, int]:
        """The last sample taken at or before ``t`` (the first one if none)."""
        best = self.series[0]
        for row in self.series:
            if row[0] > t:
                break
            best = row
        return best


def _stored(base: str, token: str) -> dict[str, tuple[int, int]]:
    q = urllib.parse.quote("SELECT run_id, count(*) AS n, count(DISTINCT (rank, iter)) AS d "
                           "FROM iterations GROUP BY run_id ORDER BY run_id")
    status, rows = get_json(base, f"/api/sql?q={q}", token, timeout=600)
    if status != 200:
        raise RuntimeError(f"GET /api/sql answered {status}")
    return {r["run_id"]: (int(r["n"]), int(r["d"])) for r in rows}


def measure(root: Path, *, senders: int = 16, ranks: int = 4, rate: float = 1000.0,
            seconds: float = 60.0, readers: int = 8, interval: float | None = None
            ) -> dict[str, Any]:
    """Start a service under ``root`` and load it as the module docstring says.

    Args:
        root: an empty directory (the database, the spool, the senders' runs).
        senders, ranks: runs, and rank files per run.
        rate: lines per second per rank.
        seconds: how long the generators write.
        readers: reader threads.
        interval: seconds between the service's ingest rounds (None: its default).

    Returns:
        A dict of the figures (``written``, ``stored`` per run as ``[n,
        distinct]``, ``reads``, ``drain_s``, ``peak_rss``, ...; see
        :func:`problems` and :func:`main` for their use).

    Raises:
        RuntimeError: the service did not start or list every run within 120 s.
    """
    import psutil

    from dflash_runtime.ship import Shipper
    from tlog.web.service import SERVE_INTERVAL_S

    interval = SERVE_INTERVAL_S if interval is None else interval
    token = secrets.token_urlsafe(24)
    err_log = root / "serve.err"
    proc, url = start_service(root, interval=interval, extra=["--token", token],
                              stderr=err_log)
    log = LogWatch(err_log)
    team = [Sender(f"team{k:02d}", root / "remote" / f"team{k:02d}", ranks, rate)
            for k in range(senders)]
    halt_ship, halt_read = threading.Event(), threading.Event()
    reads: dict[str, Any] = {"run": [], "diagnosis": [], "errors": []}
    sampler = Sampler(proc.pid, log, team)
    try:
        # before the clock: every run created on the service (run.json and the
        # meta lines shipped and ingested), so the window measures a warm service
        t_prime = time.monotonic()
        for s in team:
            s.create()
            s.shipper = Shipper(s.dir, url, token, run=s.run)
            s.shipper.ship_once()
        while log.poll() < senders * ranks or any(log.records.get(s.run, 0) < ranks
                                                  for s in team):
            if time.monotonic() - t_prime > 120 or proc.poll() is not None:
                raise RuntimeError(f"the service did not take every run within 120 s "
                                   f"(has {sorted(log.records)}); its log: {err_log}")
            time.sleep(0.05)
        listed = time.monotonic() - t_prime
        service_ps, me = psutil.Process(proc.pid), psutil.Process()
        load_before = os.getloadavg()
        cpu0, my0 = service_ps.cpu_times(), me.cpu_times()
        start = time.monotonic()
        gens = [threading.Thread(target=s.generate, args=(start, seconds), daemon=True)
                for s in team]
        ships = [threading.Thread(target=s.ship, args=(halt_ship,), daemon=True) for s in team]
        # a run is read once it holds an iteration: more records than its meta lines
        rthreads = [threading.Thread(
            target=_reader, args=(url, token, lambda: [s for s in team if log.records.get(
                s.run, 0) > ranks], k, halt_read, reads), daemon=True) for k in range(readers)]
        sampler.start()
        for t in gens + ships + rthreads:
            t.start()
        for t in gens:
            t.join()
        stopped = time.monotonic()
        halt_ship.set()
        for t in ships:
            t.join()
        shipped = time.monotonic()
        written = sum(sum(s.written) for s in team)
        want = written + senders * ranks        # and one meta line per file
        while log.poll() < want and time.monotonic() - stopped < DRAIN_LIMIT_S:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        drained = time.monotonic()
        halt_read.set()
        for t in rthreads:
            t.join()
        sampler.halt.set()
        sampler.join()
        sampler.sample()
        cpu1, my1 = service_ps.cpu_times(), me.cpu_times()
        wall = time.monotonic() - start
        stored = _stored(url, token)
        check_s = time.monotonic() - start - wall
        err_text = err_log.read_text(encoding="utf-8", errors="replace")
    finally:
        halt_ship.set()
        halt_read.set()
        sampler.halt.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except Exception:   # noqa: BLE001 - a service that will not stop is killed
            proc.kill()
    half = start + seconds / 2
    (ta, wa, ia), (tb, wb, ib) = sampler.at(half), sampler.at(stopped)
    lat = {k: sorted(reads[k]) for k in ("run", "diagnosis")}
    both = sorted(lat["run"] + lat["diagnosis"])
    return {
        "senders": senders, "ranks": ranks, "rate": rate, "seconds": seconds,
        "readers": readers, "interval_s": interval,
        "written": {s.run: sum(s.written) for s in team},
        "written_total": written, "due_total": round(rate * seconds) * senders * ranks,
        "written_per_s": written / (stopped - start),
        "steady_written_per_s": (wb - wa) / (tb - ta) if tb > ta else float("nan"),
        "steady_ingested_per_s": (ib - ia) / (tb - ta) if tb > ta else float("nan"),
        "backlog_at_stop": max(0, want - ib),
        "ship_s": shipped - stopped, "drain_s": drained - stopped, "check_s": check_s,
        "drained": log.total >= want, "listed_s": listed,
        "ingested_log": log.total - senders * ranks,
        "stored": {k: list(v) for k, v in stored.items()},
        "reads": {k: {"requests": len(v), "p50_s": quantile(v, 0.5),
                      "p99_s": quantile(v, 0.99), "max_s": v[-1] if v else float("nan")}
                  for k, v in {**lat, "all": both}.items()},
        "read_errors": reads["errors"],
        "ship_errors": [e for s in team for e in s.errors],
        "ship_retries": sum(s.down for s in team),
        "bytes_shipped": sum(s.shipper.bytes_sent for s in team),
        "ship_requests": sum(s.shipper.requests for s in team),
        "peak_rss": sampler.peak_rss,
        "service_cores": ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / wall,
        "bench_cores": ((my1.user + my1.system) - (my0.user + my0.system)) / wall,
        "load_before": load_before, "load_after": os.getloadavg(),
        "log_timings": log.timings(interval),
        "tracebacks": err_text.count("Traceback"),
    }


def problems(r: dict[str, Any]) -> list[str]:
    """What broke the budget (module docstring), in words; empty when nothing."""
    out = [f"error: {e}" for e in (r["ship_errors"] + r["read_errors"])[:5]]
    if r["tracebacks"]:
        out.append(f"the service's log holds {r['tracebacks']} traceback(s)")
    if r["written_total"] < MIN_LOAD * r["due_total"]:
        out.append(f"load not applied: {r['written_total']:,} lines written of "
                   f"{r['due_total']:,} due (the bench process was short of CPU)")
    have = {run: r["stored"].get(run, [0, 0]) for run in r["written"]}
    doubled = [f"{run}: written {r['written'][run]}, stored {n}, distinct {d}"
               for run, (n, d) in have.items() if n != d or n > r["written"][run]]
    missing = [f"{run}: {r['written'][run] - n:,} of {r['written'][run]:,}"
               for run, (n, d) in have.items() if n == d and n < r["written"][run]]
    if doubled:
        out.append(f"doubled lines in {len(doubled)} run(s): {'; '.join(doubled[:4])}")
    if missing:
        out.append(f"lines missing {r['drain_s']:.0f} s after the writers stopped (lost, or "
                   f"not ingested yet) in {len(missing)} run(s): {'; '.join(missing[:4])}")
    if not r["drained"] or not r["drain_s"] <= BUDGET_DRAIN_S:
        out.append(f"drain {r['drain_s']:.1f} s over the budget {BUDGET_DRAIN_S:g} s"
                   + ("" if r["drained"] else " (not every line ingested by then)"))
    if r["reads"]["all"]["requests"] and not r["reads"]["all"]["p99_s"] <= BUDGET_P99_S:
        out.append(f"read p99 {r['reads']['all']['p99_s']:.2f} s over the budget "
                   f"{BUDGET_P99_S:g} s")
    return out


def report(r: dict[str, Any]) -> list[str]:
    """The figures of :func:`measure`, as lines of text."""
    rd, lt = r["reads"], r["log_timings"]
    ok = sum(1 for run, n in r["written"].items() if r["stored"].get(run) == [n, n])
    return [
        (f"tlog serve for a team: {r['senders']} senders x {r['ranks']} ranks at "
        f"{r['rate']:,.0f} lines/s each for {r['seconds']:g} s (token, loopback, gzip ranges "
        f"every {SHIP_EVERY_S} s, ingest every {r['interval_s']:g} s), {r['readers']} readers:"),
        (f"  lines/s: written {r['written_per_s']:,.0f} ({r['written_total']:,} lines); steady "
        f"state (second half of the writing): written {r['steady_written_per_s']:,.0f}, "
        f"ingested {r['steady_ingested_per_s']:,.0f} "
        f"({r['steady_ingested_per_s'] / r['steady_written_per_s']:.2f}x)"),
        (f"  when writing stopped: {r['backlog_at_stop']:,} lines not yet ingested; last ranges "
        f"sent {r['ship_s']:.1f} s later, every line ingested {r['drain_s']:.1f} s later "
        f"(drain); before the clock, the {r['senders']} runs took {r['listed_s']:.1f} s to appear"),
        (f"  shipped {r['bytes_shipped'] / 2**20:,.0f} MiB in {r['ship_requests']:,} requests, "
        f"{r['ship_retries']} retries; the service's log: one run's ingest {lt['run_ingest_s']:.2f}"
        f" s, a round over all runs {lt['round_s']:.2f} s (medians)"),
        (f"  reads: {rd['run']['requests']:,} run + {rd['diagnosis']['requests']:,} diagnosis; "
        f"run p50 {rd['run']['p50_s'] * 1e3:.0f} ms p99 {rd['run']['p99_s'] * 1e3:.0f} ms; "
        f"diagnosis p50 {rd['diagnosis']['p50_s'] * 1e3:.0f} ms p99 "
        f"{rd['diagnosis']['p99_s'] * 1e3:.0f} ms; all p50 {rd['all']['p50_s'] * 1e3:.0f} ms "
        f"p99 {rd['all']['p99_s'] * 1e3:.0f} ms max {rd['all']['max_s'] * 1e3:.0f} ms; "
        f"{len(r['read_errors'])} errors"),
        (f"  service: peak RSS {r['peak_rss'] / 2**20:,.0f} MiB, {r['service_cores']:.2f} cores "
        f"busy on average; this process {r['bench_cores']:.2f} cores; load average "
        f"{r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after "
        f"({os.cpu_count()} cores)"),
        (f"  exactly once: {ok} of {len(r['written'])} runs hold count(*) = count(DISTINCT "
        f"(rank, iter)) = lines written (GET /api/sql, {r['check_s']:.1f} s; budget: drain "
         f"{BUDGET_DRAIN_S:g} s, read p99 "
        f"{BUDGET_P99_S:g} s)"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Measure, print the figures; 1 if the budget is missed."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_team",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rate", type=float, default=1000.0, help="lines/s per rank")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--interval", type=float, default=None,
                        help="seconds between ingest rounds (default: the service's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tlog-bench-team-") as tmp:
        r = measure(Path(tmp), senders=args.senders, ranks=args.ranks, rate=args.rate,
                    seconds=args.seconds, readers=args.readers, interval=args.interval)
    if args.json:
        print(json.dumps(r, indent=2, default=str))
    else:
        print("\n".join(report(r)))
    bad = problems(r)
    for line in bad:
        print(f"  MISSED: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
