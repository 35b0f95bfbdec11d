"""The shipping protocol's corners against a real service: a file rewritten in
place, a sender that lost its state, a log rotated under the same name, a
refused token (the shim goes on training and says it once).

Truth: the bytes of the sender's files, compared with the service's copies
(``GET /api/ship``: size and SHA-256 of the first KiB) and the spool files.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_runtime.ship import HEAD_BYTES, Shipper, ShipRefused
from tests.serve.served import start_service, tlog_env

pytest.importorskip("uvicorn")
HERE = Path(__file__).resolve().parent
TOKEN = "s" * 24


def _head(data: bytes) -> str:
    return hashlib.sha256(data[:HEAD_BYTES]).hexdigest()


def test_rewrites_lost_state_and_rotation(tmp_path: Path) -> None:
    served = start_service(tmp_path, extra=["--token", TOKEN])
    spool = tmp_path / "tlog.duckdb.spool" / "r1"
    run = tmp_path / "remote" / "r1"
    run.mkdir(parents=True)
    try:
        (run / "run.json").write_text(json.dumps({"v": 1, "run_id": "r1", "note": "x" * 50}))
        log = run / "rank0.main.jsonl"
        log.write_bytes(b"".join(b'{"n": %d}\n' % i for i in range(3000)))
        (run / "model.pt").write_bytes(b"\0" * 4096)       # not a log: stays home
        s = Shipper(run, served.url, TOKEN)
        assert s.ship_once() == log.stat().st_size + (run / "run.json").stat().st_size
        assert s.ship_once() == 0                            # nothing new
        assert (spool / "rank0.main.jsonl").read_bytes() == log.read_bytes()
        assert not (spool / "model.pt").exists()
        # run.json rewritten shorter, in place: sent again whole
        (run / "run.json").write_text(json.dumps({"v": 1, "run_id": "r1"}))
        s.ship_once()
        assert (spool / "run.json").read_bytes() == (run / "run.json").read_bytes()
        # a sender that lost its state asks the service and sends only what is new
        (run / ".tlog-ship.json").unlink()
        with log.open("ab") as fh:
            fh.write(b'{"n": "new"}\n')
        s2 = Shipper(run, served.url, TOKEN)
        assert s2.ship_once() == len(b'{"n": "new"}\n')
        # the log rotated: a new file under the old name replaces the copy
        log.write_bytes(b'{"rotated": 1}\n' * 10)
        s2.ship_once()
        assert (spool / "rank0.main.jsonl").read_bytes() == log.read_bytes()
        held = served.json("/api/ship?run=r1")["files"]
        assert held["rank0.main.jsonl"] == {"size": 150, "head": _head(log.read_bytes())}
        # another job's log under the same run name: refused, never replaced
        other = tmp_path / "elsewhere" / "r1"
        other.mkdir(parents=True)
        (other / "rank0.main.jsonl").write_bytes(b'{"other": 1}\n' * 5)
        with pytest.raises(ShipRefused, match="holds another rank0.main.jsonl for run r1"):
            Shipper(other, served.url, TOKEN, run="r1").ship_once()
        assert (spool / "rank0.main.jsonl").read_bytes() == log.read_bytes()
        # a wrong token: refused for good, one line
        with pytest.raises(ShipRefused, match="HTTP 401"):
            Shipper(run, served.url, "w" * 24, state_path=tmp_path / "other.json").ship_once()
    finally:
        err = served.stop()
    assert "Traceback" not in err


def test_the_shim_refused_trains_on_and_says_it_once(tmp_path: Path) -> None:
    served = start_service(tmp_path, extra=["--token", TOKEN])
    try:
        env = {**tlog_env(), "TLOG_SERVER": served.url, "TLOG_TOKEN": "w" * 24}
        r = subprocess.run([sys.executable, str(HERE / "ship_job.py"), str(tmp_path / "job"),
                            "0", "1", "2", str(tmp_path / "overhead.txt")], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    finally:
        served.stop()
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("tlog:")]
    assert len(lines) == 1 and "refused the run" in lines[0] and "HTTP 401" in lines[0], lines
    assert len((tmp_path / "job" / "rank0.main.jsonl").read_text().splitlines()) > 100
