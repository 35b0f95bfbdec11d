"""``tlog.web.app``: JSON answers, errors as HTTP statuses, tokens out of logs, and
the guard in front of every request (ASGI calls made by hand: no HTTP client)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from tlog.analyze.baseline import NoBaselineError
from tlog.ingest.errors import RunNotFoundError, UsageError

from tlog.web.app import (
    CSP,
    TOKEN_COOKIE,
    Guard,
    RedactTokens,
    error_response,
    json_response,
)
from tlog.web.service import GateBusyError

TOKEN = "s3cret-token-0123456789"


def test_json_response_has_no_nan_and_no_cache() -> None:
    r = json_response({"share": float("nan"), "n": 3}, 201, headers={"x-a": "1"})
    assert r.status_code == 201 and json.loads(r.body) == {"share": None, "n": 3}
    assert r.headers["cache-control"] == "no-store" and r.headers["x-a"] == "1"
    assert r.media_type == "application/json"


@pytest.mark.parametrize(("exc", "status"), [
    (RunNotFoundError("no run 'x'"), 404), (NoBaselineError("none earlier"), 404),
    (GateBusyError("busy"), 503), (UsageError("bad\n  thing"), 400),
])
def test_library_errors_become_statuses(exc: Exception, status: int) -> None:
    r = error_response(exc)
    assert r.status_code == status
    assert json.loads(r.body) == {"error": " ".join(str(exc).split())}


def test_a_bug_is_not_turned_into_an_answer() -> None:
    with pytest.raises(ZeroDivisionError):
        error_response(ZeroDivisionError("x"))


@pytest.mark.parametrize(("line", "out"), [
    ("GET /runs?token=abc&x=1", "GET /runs?token=[redacted]&x=1"),
    ("GET /?%74oken=abc", "GET /?%74oken=[redacted]"),
    ("GET /?TOK%45N=abc", "GET /?TOK%45N=[redacted]"),
    ("GET /?x=1;token=abc", "GET /?x=1;token=[redacted]"),
    ("GET /?tokens=abc", "GET /?tokens=abc"),
])
def test_tokens_never_reach_a_log(line: str, out: str) -> None:
    assert RedactTokens().redact(line) == out
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s"',
                               ("127.0.0.1", line), None)
    assert RedactTokens().filter(record) and record.getMessage() == f'127.0.0.1 - "{out}"'


def _call(guard: Guard, path: str, *, headers: dict[str, str] | None = None,
          query: str = "", method: str = "GET") -> tuple[int, dict[str, str], bytes, bool]:
    """One request through ``guard``: (status, headers, body, reached the app)."""
    reached = []

    async def inner(scope, receive, send) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard.app = inner
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "query_string": query.encode(), "headers": [
                 (k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    asyncio.run(guard(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    hdrs = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], hdrs, body, bool(reached)


def test_without_a_token_only_loopback_host_names() -> None:
    g = Guard(None, token=None)
    status, hdrs, _, reached = _call(g, "/", headers={"host": "127.0.0.1:8765"})
    assert (status, reached) == (200, True)
    assert hdrs["content-security-policy"] == CSP and hdrs["x-frame-options"] == "DENY"
    status, _, body, reached = _call(g, "/", headers={"host": "evil.example:8765"})
    assert (status, reached) == (400, False)
    assert json.loads(body) == {"error": "this service answers only to a loopback Host name"}


def test_with_a_token_header_cookie_or_a_first_visit() -> None:
    g = Guard(None, token=TOKEN)
    assert _call(g, "/api/runs", headers={"host": "h"})[0] == 401
    ok = _call(g, "/api/runs", headers={"host": "h", "authorization": f"Bearer {TOKEN}"})
    assert ok[0] == 200 and ok[3]
    assert _call(g, "/", headers={"host": "h", "cookie": f"{TOKEN_COOKIE}={TOKEN}"})[0] == 200
    # ?token= once: a cookie, and the token dropped from the address bar
    status, hdrs, _, reached = _call(g, "/run/a", headers={"host": "h"},
                                     query=f"token={TOKEN}&x=1")
    assert (status, reached) == (303, False)
    assert hdrs["location"] == "/run/a?x=1" and f"{TOKEN_COOKIE}={TOKEN}" in hdrs["set-cookie"]
    assert _call(g, "/", headers={"host": "h", "authorization": "Bearer wrong"})[0] == 401


def test_writes_need_the_write_token_in_the_header() -> None:
    g = Guard(None, token=None, write_token=TOKEN)
    status, hdrs, body, _ = _call(g, "/api/call", headers={"host": "127.0.0.1"},
                                  method="POST")
    assert status == 401 and hdrs["www-authenticate"] == "Bearer"
    assert json.loads(body)["error"].startswith("a write needs the service's token")
    wrong = _call(g, "/api/call", headers={"host": "127.0.0.1", "authorization": "Bearer no"},
                  method="POST")
    assert json.loads(wrong[2])["error"].startswith("the token sent is not this service's")
    authorized = {"host": "127.0.0.1", "authorization": f"Bearer {TOKEN}"}
    # a POST must say it is JSON: another site's page cannot without a preflight
    status, _, body, reached = _call(g, "/api/call", headers=authorized, method="POST")
    assert (status, reached) == (403, False)
    assert json.loads(body) == {"error": "send the request body as Content-Type: "
                                         "application/json"}
    json_post = {**authorized, "content-type": "application/json"}
    assert _call(g, "/api/call", headers=json_post, method="POST")[0] == 200
    other_site = {**json_post, "origin": "http://evil.example"}
    assert _call(g, "/api/call", headers=other_site, method="POST")[0] == 403
