"""``dflash_runtime.ship``: the sender's side of ``tlog ship``, against a small
service on loopback that keeps the protocol's rules (append only where its copy
ends, 409 with its size and fingerprint otherwise, ``replace=1`` starts afresh).
The real service (``tlog serve``) is tests/serve/test_ship_protocol.py's."""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dflash_runtime.ship import (
    HEAD_BYTES,
    STATE_FILE,
    ServiceDown,
    Shipper,
    ShipRefused,
    default_run_name,
    head_digest,
    is_log,
    safe_name,
)

TOKEN = "t" * 24


class _Service(BaseHTTPRequestHandler):
    """``GET/POST /api/ship``: the copies in ``self.server.copies[run][path]``."""

    def log_message(self, *args) -> None:
        pass

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        held = self.server.copies.get(q["run"], {})
        self._answer(200, {"files": {p: {"size": len(b), "head": _head(b)}
                                     for p, b in held.items()}})

    def do_POST(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._answer(403, {"error": "bad token"})
            return
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        data = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.posts.append((q["path"], int(q["offset"]), q.get("replace"), len(data)))
        files = self.server.copies.setdefault(q["run"], {})
        have = b"" if q.get("replace") else files.get(q["path"], b"")
        if int(q["offset"]) != len(have):
            self._answer(409, {"size": len(have), "head": _head(have)})
            return
        files[q["path"]] = have + data
        self._answer(200, {"size": len(files[q["path"]])})


def _head(b: bytes) -> str:
    return hashlib.sha256(b[:HEAD_BYTES]).hexdigest()


@pytest.fixture
def service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    server.copies, server.posts = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def test_names_and_fingerprints(tmp_path: Path) -> None:
    assert is_log("rank0.jsonl") and is_log("sub/trace.JSON.gz") and is_log("job.out")
    assert not is_log("model.pt") and not is_log("ckpt.bin")
    # letters (é is one), digits and _.+=@- kept; the rest "_"; no leading dot
    assert safe_name("../my run/é:1") == "_my_run_é_1"
    assert safe_name(".hidden run") == "hidden_run"
    assert safe_name("a" * 200) == "a" * 128
    f = tmp_path / "x"
    f.write_bytes(b"abcdef")
    assert head_digest(f, 3) == hashlib.sha256(b"abc").hexdigest()
    run = tmp_path / "run dir"
    run.mkdir()
    assert default_run_name(run) == "run_dir"
    (run / "run.json").write_text('{"run_id": "nightly/42"}')
    assert default_run_name(run) == "nightly_42"
    (run / "run.json").write_text("not json")
    assert default_run_name(run) == "run_dir"


def test_ships_the_logs_once_and_goes_on_from_what_was_acknowledged(service, tmp_path) -> None:
    run = tmp_path / "r1"
    run.mkdir()
    (run / "rank0.jsonl").write_bytes(b'{"iter": 0}\n')
    (run / "model.pt").write_bytes(b"\0" * 100)          # not a log: stays home
    s = Shipper(run, _url(service), TOKEN)
    assert s.ship_once() == 12
    assert service.copies == {"r1": {"rank0.jsonl": b'{"iter": 0}\n'}}
    assert s.ship_once() == 0                             # nothing new: no request
    with (run / "rank0.jsonl").open("ab") as f:
        f.write(b'{"iter": 1}\n')
    assert s.unsent() == {"rank0.jsonl": 12}
    assert s.ship_once() == 12
    assert service.copies["r1"]["rank0.jsonl"] == (run / "rank0.jsonl").read_bytes()
    assert service.posts == [("rank0.jsonl", 0, None, 12), ("rank0.jsonl", 12, None, 12)]
    # the offsets kept on disk: a new sender (a restart) sends only what is new
    state = json.loads((run / STATE_FILE).read_text())
    assert state["run"] == "r1" and state["files"]["rank0.jsonl"]["sent"] == 24
    again = Shipper(run, _url(service), TOKEN)
    assert again.ship_once() == 0 and again.unsent() == {}


def test_a_rewritten_file_is_sent_again_whole(service, tmp_path) -> None:
    run = tmp_path / "r2"
    run.mkdir()
    log = run / "rank0.jsonl"
    log.write_bytes(b'{"iter": 0}\n{"iter": 1}\n')
    s = Shipper(run, _url(service), TOKEN)
    s.ship_once()
    log.write_bytes(b'{"iter": 9}\n')                    # shorter: replaced in place
    assert s.ship_once() == 12
    assert service.copies["r2"]["rank0.jsonl"] == b'{"iter": 9}\n'
    assert service.posts[-1] == ("rank0.jsonl", 0, "1", 12)


def test_refused_and_down(service, tmp_path) -> None:
    run = tmp_path / "r3"
    run.mkdir()
    (run / "rank0.jsonl").write_bytes(b"{}\n")
    with pytest.raises(ShipRefused, match=r"refused the run: bad token \(HTTP 403\)"):
        Shipper(run, _url(service), "wrong").ship_once()
    port = service.server_address[1]
    service.shutdown()
    service.server_close()
    with pytest.raises(ServiceDown):
        Shipper(run, f"http://127.0.0.1:{port}", TOKEN, run="other").ship_once()
