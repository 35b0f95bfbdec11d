"""A real ``tlog serve`` process on 127.0.0.1 (an ephemeral port) for the service tests.

:func:`start_service` runs ``python -m tlog serve`` as a child process, waits
until it announces itself (``<db>.serve.json``, held) and answers, and stops
it with SIGTERM at the end. Requests go over real HTTP (urllib).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Served:
    """A running service: its URL, token, database, watched directory and process."""

    url: str
    token: str | None
    db: Path
    runs: Path
    proc: subprocess.Popen
    stderr: Path

    def get(self, path: str, *, token: str | None = "own", headers: dict | None = None,
            timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
        """GET ``path``; ``(status, headers, body)``. ``token="own"``: the service's."""
        return self.request("GET", path, token=token, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = "own",
                headers: dict | None = None, timeout: float = 30.0,
                raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        """``method path`` with ``body`` as JSON (or the bytes ``raw``);
        ``(status, headers, body)``."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        tok = self.token if token == "own" else token
        if tok:
            req.add_header("Authorization", f"Bearer {tok}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=timeout) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()

    def json(self, path: str, **kw: Any) -> Any:
        status, _, body = self.get(path, **kw)
        assert status == 200, (status, body[:500])
        return json.loads(body)

    def wait_for_runs(self, run_ids: set[str], timeout_s: float = 30.0) -> list[dict]:
        """Wait until ``/api/runs`` lists every id of ``run_ids``; return the list."""
        deadline = time.monotonic() + timeout_s
        while True:
            runs = self.json("/api/runs")
            if run_ids <= {r["run_id"] for r in runs}:
                return runs
            if time.monotonic() > deadline:
                raise AssertionError(f"runs {run_ids} not ingested; have {runs}")
            time.sleep(0.2)

    def stop(self) -> str:
        """SIGTERM, wait; return what it wrote on stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.stderr.read_text(encoding="utf-8", errors="replace")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def tlog_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TLOG_DB", None)
    return env


def start_service(tmp: Path, *, extra: list[str] | None = None, interval: float = 0.3,
                  host: str = "127.0.0.1") -> Served:
    """Start ``tlog serve --db tmp/tlog.duckdb --watch tmp/runs --port 0`` and wait for it."""
    runs = tmp / "runs"
    runs.mkdir(exist_ok=True)
    db = tmp / "tlog.duckdb"
    out, err = tmp / "serve.out", tmp / "serve.err"
    cmd = [sys.executable, "-m", "tlog", "serve", "--db", str(db), "--watch", str(runs),
           "--host", host, "--port", "0", "--interval", str(interval), *(extra or [])]
    proc = subprocess.Popen(cmd, stdout=out.open("w"), stderr=err.open("w"), cwd=tmp,
                            env=tlog_env())
    announce = db.with_name(db.name + ".serve.json")
    deadline = time.monotonic() + 60
    info = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"tlog serve exited {proc.returncode}: "
                                 f"{err.read_text()}{out.read_text()}")
        try:
            info = json.loads(announce.read_text())
            break
        except (OSError, ValueError):
            time.sleep(0.1)
    assert info is not None, "tlog serve did not announce itself"
    served = Served(url=info["url"], token=info["token"], db=db, runs=runs, proc=proc,
                    stderr=err)
    while time.monotonic() < deadline:
        try:
            if served.get("/api/openapi.json", timeout=5)[0] == 200:
                return served
        except OSError:
            pass
        time.sleep(0.1)
    served.stop()
    raise AssertionError("tlog serve did not answer")
