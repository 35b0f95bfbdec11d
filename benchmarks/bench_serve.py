"""``tlog serve`` under load: 32 concurrent clients against the run and diagnosis
endpoints for 20 s while a run is being ingested.

Run alone: ``python -m benchmarks.bench_serve`` (``--clients``, ``--seconds``,
``--json``); ``make bench`` runs it with the others.

Method: a real service (``python -m tlog serve --port 0``, loopback, ingest
every 0.5 s) watches a temporary directory; this process appends a run there
(``grow``: one worker, 200 iterations per second in batches of 20, each
iteration numbered) for the whole measurement. ``--clients`` threads, each
with its own keep-alive HTTP connection, alternate ``GET /api/runs/grow``
(the run's summary and high-water mark) and ``GET /api/runs/grow/diagnosis``
(``tlog diagnose --json``). Every answer must be 200 and its iteration count
may never go down nor pass what was written (a lost or doubled record would
show). Side by side in the same run, the same clients first load
``/api/openapi.json`` (no database) for a quarter of the time: the floor of
the HTTP stack on this machine; the ratio of the two medians is printed.
After the writer stops, the service must hold exactly the iterations written,
each once (``count(*) = count(DISTINCT iter) = written``).

Budget: no error, no lost or doubled record, and p99 latency of the run and
diagnosis endpoints within :data:`BUDGET_P99_S`. Exit 1 if missed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

#: p99 latency the run and diagnosis endpoints must stay within under the load.
#: Source: tlog's choice: the run page polls every 2 s, so an answer within
#: that keeps it live; the figure allows a shared 2-core machine.
BUDGET_P99_S = 2.0

#: Iterations appended per second, and per write.
RATE = 200
BATCH = 20
#: One iteration: load 1 ms + forward 4 ms, 32 tokens (dur = 5 ms).
ITER = {"load": 0.001, "forward": 0.004}


class Writer(threading.Thread):
    """Appends the run ``grow`` under ``runs`` at :data:`RATE` iterations/s until stopped."""

    def __init__(self, runs: Path) -> None:
        super().__init__(daemon=True)
        self.dir = runs / "grow"
        self.dir.mkdir(parents=True)
        (self.dir / "run.json").write_text(json.dumps(
            {"v": 1, "run_id": "grow", "started": 1_764_403_200.0, "world_size": 1,
             "tags": {"bench": "serve"}}), encoding="utf-8")
        self.path = self.dir / "rank0.main.jsonl"
        with self.path.open("w", encoding="utf-8") as fh:
            fh.write(json.dumps({"type": "meta", "v": 1, "rank": 0, "stage": "main",
                                 "worker": "main-0", "host": "bench", "pid": 1}) + "\n")
        self.written = 0
        self.halt = threading.Event()

    def write_batch(self) -> None:
        lines = []
        for _ in range(BATCH):
            i = self.written + len(lines)
            lines.append(json.dumps({"type": "iter", "iter": i, "ts": 1_764_403_200.0 + i * 0.005,
                                     "dur": 0.005, "tokens": 32, "phases": ITER}) + "\n")
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write("".join(lines))
        self.written += BATCH

    def run(self) -> None:
        while not self.halt.wait(BATCH / RATE):
            self.write_batch()


def _client(base: str, paths: list[str], until: float, token: str | None,
            out: dict[str, Any], written: Writer | None) -> None:
    u = urllib.parse.urlsplit(base)
    con = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    last = 0
    k = 0
    while time.monotonic() < until:
        path = paths[k % len(paths)]
        k += 1
        t = time.perf_counter()
        try:
            con.request("GET", path, headers=headers)
            resp = con.getresponse()
            body = resp.read()
            out["latency"].append(time.perf_counter() - t)
            if resp.status != 200:
                out["errors"].append(f"{path}: HTTP {resp.status} {body[:200]!r}")
                continue
            if written is not None:
                data = json.loads(body)
                n = data["iterations"]["total"]
                if n < last or n > written.written:
                    out["errors"].append(f"{path}: {n} iterations after {last} "
                                         f"(written {written.written})")
                last = max(last, n)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            out["errors"].append(f"{path}: {type(exc).__name__}: {exc}")
            con.close()
            con = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    con.close()


def _load(base: str, paths: list[str], clients: int, seconds: float, token: str | None,
          writer: Writer | None) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": [], "errors": []}
    until = time.monotonic() + seconds
    threads = [threading.Thread(target=_client, args=(base, paths, until, token, out, writer))
               for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(out["latency"])
    return {"requests": len(lat), "per_s": len(lat) / wall, "p50_s": quantile(lat, 0.50),
            "p99_s": quantile(lat, 0.99), "max_s": lat[-1] if lat else float("nan"),
            "errors": out["errors"]}


def quantile(ordered: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of the sorted list ``ordered`` (nearest rank); NaN if empty."""
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def get_json(base: str, path: str, token: str | None, timeout: float = 60.0) -> tuple[int, Any]:
    """``GET base + path`` (with the token): ``(status, JSON body or None)``."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(base + path)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


def _stored(base: str, token: str | None) -> tuple[int, int]:
    q = urllib.parse.quote("SELECT count(*) AS n, count(DISTINCT iter) AS d FROM iterations "
                           "WHERE run_id = 'grow'")
    _, rows = get_json(base, f"/api/sql?q={q}", token)
    return int(rows[0]["n"]), int(rows[0]["d"])


def run_load(base: str, runs: Path, *, clients: int = 32, seconds: float = 20.0,
             token: str | None = None, floor: bool = True) -> dict[str, Any]:
    """Load the service at ``base`` (watching ``runs``) as the module docstring says.

    Returns:
        ``{"clients", "seconds", "load": {requests, per_s, p50_s, p99_s, max_s,
        errors}, "floor": same for /api/openapi.json (or None), "written",
        "stored", "distinct"}``.
    """
    writer = Writer(runs)
    writer.write_batch()
    deadline = time.monotonic() + 60
    while get_json(base, "/api/runs/grow/diagnosis", token)[0] != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the service did not ingest the run within 60 s")
        time.sleep(0.1)
    base_floor = (_load(base, ["/api/openapi.json"], clients, seconds / 4, token, None)
                  if floor else None)
    writer.start()
    try:
        load = _load(base, ["/api/runs/grow", "/api/runs/grow/diagnosis"], clients, seconds,
                     token, writer)
    finally:
        writer.halt.set()
        writer.join()
    deadline = time.monotonic() + 60
    stored, distinct = _stored(base, token)
    while stored < writer.written and time.monotonic() < deadline:
        time.sleep(0.2)
        stored, distinct = _stored(base, token)
    return {"clients": clients, "seconds": seconds, "load": load, "floor": base_floor,
            "written": writer.written, "stored": stored, "distinct": distinct}


def start_service(tmp: Path, *, interval: float = 0.5, extra: list[str] | None = None,
                  stderr: Path | None = None) -> tuple[subprocess.Popen, str]:
    """``python -m tlog serve`` on 127.0.0.1 (any port) watching ``tmp/runs``, an
    ingest round every ``interval`` s, ``extra`` options: (process, URL).
    Its stderr (its own log) goes to the file ``stderr``, else nowhere."""
    (tmp / "runs").mkdir()
    db = tmp / "bench.duckdb"
    err = stderr.open("wb") if stderr is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tlog", "serve", "--db", str(db),
                                 "--watch", str(tmp / "runs"), "--port", "0", "--interval",
                                 str(interval), *(extra or [])],
                                stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        if stderr is not None:
            err.close()
    announce = db.with_name(db.name + ".serve.json")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            return proc, json.loads(announce.read_text())["url"]
        except (OSError, ValueError, KeyError):
            if proc.poll() is not None:
                raise RuntimeError(f"tlog serve exited {proc.returncode}") from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("tlog serve did not start within 60 s")


def problems(r: dict[str, Any]) -> list[str]:
    """What broke the budget (module docstring), in words; empty when nothing."""
    out = [f"error: {e}" for e in r["load"]["errors"][:5]]
    if r["stored"] != r["written"] or r["distinct"] != r["written"]:
        out.append(f"records: written {r['written']}, stored {r['stored']}, distinct "
                   f"{r['distinct']}")
    if not r["load"]["p99_s"] <= BUDGET_P99_S:
        out.append(f"p99 {r['load']['p99_s']:.3f} s over the budget {BUDGET_P99_S} s")
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure, print the figures; 1 if the budget is missed."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_serve",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tlog-bench-serve-") as tmp:
        proc, url = start_service(Path(tmp))
        try:
            r = run_load(url, Path(tmp) / "runs", clients=args.clients, seconds=args.seconds)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    if args.json:
        print(json.dumps(r, indent=2, default=str))
    else:
        ld, fl = r["load"], r["floor"]
        print(f"tlog serve, {r['clients']} clients for {r['seconds']:g} s on the run and "
              f"diagnosis endpoints while a run grows by {RATE} iterations/s:")
        print(f"  {ld['requests']:,} requests, {ld['per_s']:,.0f}/s; latency p50 "
              f"{ld['p50_s'] * 1e3:.1f} ms, p99 {ld['p99_s'] * 1e3:.1f} ms, max "
              f"{ld['max_s'] * 1e3:.1f} ms; {len(ld['errors'])} errors")
        print(f"  floor (/api/openapi.json, no database, same clients): {fl['per_s']:,.0f}/s, "
              f"p50 {fl['p50_s'] * 1e3:.1f} ms, p99 {fl['p99_s'] * 1e3:.1f} ms; run+diagnosis "
              f"p50 / floor p50 = {ld['p50_s'] / fl['p50_s']:.1f}x")
        print(f"  records: written {r['written']:,}, stored {r['stored']:,}, distinct "
              f"{r['distinct']:,} (p99 budget {BUDGET_P99_S} s)")
    bad = problems(r)
    for line in bad:
        print(f"  MISSED: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
