"""Who may talk to ``tlog serve``: a token on any address but the loopback.

Started with ``--host 0.0.0.0`` and no ``--token``, the service makes one,
prints it once and writes it (mode 0600) to ``<db>.serve.json``; requests
without it, or with another, get 401; ``?token=`` in a browser becomes an
HttpOnly cookie and never reaches the access log. (The loopback default
without a token, and the Host check: tests/serve/test_serve_api.py.)
"""

from __future__ import annotations

import json
import stat

from tests.serve.served import start_service


def test_other_address_needs_the_generated_token(tmp_path) -> None:
    s = start_service(tmp_path, host="0.0.0.0")
    try:
        token = s.token
        assert token and len(token) >= 16
        announce = s.db.with_name(s.db.name + ".serve.json")
        assert stat.S_IMODE(announce.stat().st_mode) == 0o600
        status, headers, body = s.get("/api/runs", token=None)
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        assert "token" in json.loads(body)["error"]
        assert s.get("/api/runs", token="x" * len(token))[0] == 401
        assert s.get("/", token=None)[0] == 401
        assert s.get("/api/runs")[0] == 200
        # a browser's first visit: the token moves into a cookie, out of the address
        status, headers, _ = s.get(f"/?token={token}&q=small", token=None)
        assert status == 303 and headers["location"] == "/?q=small"
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"tlog_token={token};")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        status, _, page = s.get("/?q=small", token=None,
                                headers={"Cookie": f"tlog_token={token}"})
        assert status == 200 and b"<h1>Runs</h1>" in page
        # the name percent-encoded: accepted as the token, and redacted in the log too
        for name in ("%74oken", "tok%65n", "TOK%45N", "%2574oken"):
            s.get(f"/api/runs?{name}={token}", token=None)
    finally:
        log = s.stop()
    out = (tmp_path / "serve.out").read_text()         # uvicorn's access log goes here
    assert out.count(token) == 1                       # printed once, at the start
    assert token not in log + out.split(token, 1)[1]   # never in a log line
    assert '"GET /?token=[redacted]&q=small HTTP/1.1" 303' in out
    for name in ("%74oken", "tok%65n", "TOK%45N", "%2574oken"):
        assert f"/api/runs?{name}=[redacted] HTTP/1.1" in out


def test_redaction_by_hand() -> None:
    from tlog.web.app import RedactTokens

    r = RedactTokens()
    assert r.redact("GET /?q=a&token=s3cret&x=1") == "GET /?q=a&token=[redacted]&x=1"
    assert r.redact("GET /?%74oken=s3cret") == "GET /?%74oken=[redacted]"
    assert r.redact("GET /?a=tok&tokens=keep") == "GET /?a=tok&tokens=keep"
    assert r.redact("GET /?T%4fKEN=s3cret;x=1") == "GET /?T%4fKEN=[redacted];x=1"
