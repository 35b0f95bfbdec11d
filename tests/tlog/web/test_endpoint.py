"""``tlog.web.endpoint``: a live service found by its announcement file and lock; a
stale file never trusted; a call made in the service (a small HTTP server on
loopback answering as ``tlog serve`` does)."""

from __future__ import annotations

import json
import os
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tlog.ingest.errors import DatabaseError, RunNotFoundError

from tlog.web.endpoint import (
    PICKLE_TYPE,
    Announcement,
    ServiceInfo,
    live_service,
    service_file,
)


def test_service_file_sits_beside_the_database(tmp_path: Path) -> None:
    assert service_file(tmp_path / "t.duckdb") == tmp_path / "t.duckdb.serve.json"


def test_an_announcement_is_live_while_held(tmp_path: Path) -> None:
    db = str(tmp_path / "t.duckdb")
    info = ServiceInfo(url="http://127.0.0.1:9", pid=os.getpid(), db=db, watch=["/runs"],
                       token="t" * 24)
    assert live_service(db) is None
    ann = Announcement(info)
    try:
        assert live_service(db) == info
        assert os.stat(service_file(db)).st_mode & 0o777 == 0o600   # the token: owner only
        with pytest.raises(DatabaseError, match="is already served by another 'tlog serve' "
                                                r"\(pid \d+, http://127.0.0.1:9\)"):
            Announcement(info)
    finally:
        ann.close()
    assert live_service(db) is None and not service_file(db).exists()


def test_a_file_nobody_holds_is_stale(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    service_file(db).write_text(json.dumps({"url": "http://x", "pid": 1, "db": str(db)}))
    assert live_service(db) is None


class _Service(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((body, self.headers.get("Authorization")))
        if body["method"] == "diagnose":
            answer = ("error", RunNotFoundError(f"no run {body['kwargs']['run_id']!r}"))
        else:
            answer = ("ok", {"runs": ["a", "b"]})
        data = pickle.dumps(answer)
        self.send_response(200)
        self.send_header("Content-Type", PICKLE_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_call_made_in_the_service_returns_or_raises_as_there() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        info = ServiceInfo(url=f"http://127.0.0.1:{server.server_address[1]}", pid=1, db="d",
                           token="secret")
        assert info.call("runs", tags={"gpus": "8"}) == {"runs": ["a", "b"]}
        assert server.seen[0] == ({"method": "runs", "kwargs": {"tags": {"gpus": "8"}}},
                                  "Bearer secret")
        with pytest.raises(RunNotFoundError, match="no run 'x'"):
            info.call("diagnose", run_id="x")
    finally:
        server.shutdown()
        server.server_close()
    down = ServiceInfo(url=f"http://127.0.0.1:{server.server_address[1]}", pid=42, db="d")
    with pytest.raises(DatabaseError, match=r"tlog serve \(pid 42, .*\) holds the database but "
                                            r"does not answer"):
        down.call("runs")
