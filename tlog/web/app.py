"""The HTTP side of ``tlog serve``: a Starlette application (pages and JSON API).

Pages (Jinja2, autoescaped; their script and the Vega libraries are files
served by the service itself, ``/static/...``, never from the network):
``/`` the runs list, ``/run/{id}`` a run (updates while it grows: its script
polls the API), ``/compare`` two runs, ``/sql`` a read-only query.

JSON API, each answer the content of the matching CLI ``--json`` output
(:class:`tlog.web.service.Service`), documented by :data:`OPENAPI` at
``/api/openapi.json``. Errors are ``{"error": "<one line>"}`` with 400
(a bad request), 401 (no or wrong token), 404 (no such run) or 503 (the
database is leased).

Security (:class:`Guard`): with a token, every request must carry it
(``Authorization: Bearer T``, or the ``tlog_token`` cookie a browser gets
by opening any page once with ``?token=T``); compared in constant time.
Without one (loopback only), the ``Host`` header must name the loopback
(no DNS rebinding). Every response carries a Content-Security-Policy that
allows scripts from the service only (Vega needs ``'unsafe-eval'``, as the
offline report does), no inline script, and requests to the service only.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import re
from collections.abc import AsyncIterator
from functools import lru_cache
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from tlog.ingest.errors import DatabaseError, RunNotFoundError, TlogError, UsageError
from tlog.web.service import PAGE_RUNS, GateBusyError, ServeConfig, Service, Watcher, log
from tlog.web.spool import Spool

HERE = Path(__file__).resolve().parent

#: The Content-Security-Policy of every response (module docstring).
CSP = ("default-src 'none'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; font-src data:; connect-src 'self'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
TOKEN_COOKIE = "tlog_token"

#: Paths that write (or run the facade's calls): they need the service's write
#: token in the ``Authorization`` header, on the loopback too.
WRITE_PATHS = frozenset({"/api/call", "/api/ship"})

#: Most bytes of a request body, by path (413 past it): a SQL statement or a
#: call is small; a shipped range is at most 1 MiB before gzip. Source: tlog's choice.
BODY_LIMITS = {"/api/ship": 8 * 2**20}
DEFAULT_BODY_LIMIT = 2**20
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as JSON (NaN and infinities as null, as ``tlog ... --json``)."""
    from tlog.app import json_ready

    body = json.dumps(json_ready(data), default=str, allow_nan=False)
    return Response(body, status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store", **(headers or {})})


def error_response(exc: Exception) -> Response:
    """A library error as ``{"error": message}`` with its HTTP status."""
    from tlog.analyze.baseline import NoBaselineError

    if isinstance(exc, RunNotFoundError | NoBaselineError):
        status = 404
    elif isinstance(exc, GateBusyError):
        status = 503
    elif isinstance(exc, TlogError):
        status = 400
    else:
        raise exc
    return json_response({"error": " ".join(str(exc).split())}, status)


class Guard:
    """ASGI middleware: the token check, the loopback ``Host`` check and the
    security headers (module docstring)."""

    def __init__(self, app: Any, token: str | None, write_token: str | None = None) -> None:
        self.app = app
        self.token = token
        self.write_token = write_token or token

    def _authorized(self, scope: dict[str, Any]) -> tuple[bool, str | None]:
        """(allowed, token given in the query string)."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        if scope["path"] in WRITE_PATHS:     # the write token, in the header only
            auth = headers.get("authorization", "")
            given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            scope.setdefault("state", {})["tlog_token_given"] = bool(given)
            return (self.write_token is not None and hmac.compare_digest(
                given.encode(), self.write_token.encode())), None
        if self.token is None:
            host = headers.get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            return name in LOOPBACK_HOSTS, None
        given = []
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given.append(auth[7:].strip())
        cookie = SimpleCookie()
        with contextlib.suppress(Exception):
            cookie.load(headers.get("cookie", ""))
        if TOKEN_COOKIE in cookie:
            given.append(cookie[TOKEN_COOKIE].value)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        in_query = query.get("token")
        if in_query is not None:
            given.append(in_query)
        ok = any(hmac.compare_digest(g.encode(), self.token.encode()) for g in given)
        return ok, in_query if ok else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secure(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  *SECURITY_HEADERS]}
            await send(message)

        ok, in_query = self._authorized(scope)
        too_big = _too_big(scope)
        if too_big is not None:
            resp = json_response({"error": too_big}, 413)
            await resp(scope, receive, send_secure)
            return
        refused = _cross_site(scope) if ok else None
        if refused is not None:
            resp = json_response({"error": refused}, 403)
            await resp(scope, receive, send_secure)
            return
        if not ok:
            write = scope["path"] in WRITE_PATHS
            given = scope.get("state", {}).get("tlog_token_given")
            why = ("the token sent is not this service's (its --token or $TLOG_TOKEN; "
                   "else the one in <db>.serve.json)" if write and given else
                   "a write needs the service's token: send 'Authorization: Bearer TOKEN' "
                   "(its --token or $TLOG_TOKEN; else the one in <db>.serve.json)" if write else
                   "a token is required: send 'Authorization: Bearer TOKEN', or open the page "
                   "once with ?token=TOKEN" if self.token else
                   "this service answers only to a loopback Host name")
            auth = write or self.token
            resp = json_response({"error": why}, 401 if auth else 400,
                                 headers={"www-authenticate": "Bearer"} if auth else None)
            await resp(scope, receive, send_secure)
            return
        if in_query is not None and scope["method"] == "GET":
            # a browser's first visit: keep the token in an HttpOnly cookie and
            # drop it from the address bar (and from the next request lines)
            rest = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode())
                    if k != "token"]
            target = scope["path"] + ("?" + urlencode(rest) if rest else "")
            resp = RedirectResponse(target, status_code=303)
            resp.set_cookie(TOKEN_COOKIE, in_query, httponly=True, samesite="strict")
            await resp(scope, receive, send_secure)
            return
        await self.app(scope, receive, send_secure)


def _cross_site(scope: dict[str, Any]) -> str | None:
    """Why a request that changes something (not GET or HEAD) is refused, or None.

    A POST (a lease) must say it is JSON (``Content-Type:
    application/json``, which a page of another site cannot send without a
    CORS preflight this service never grants; other methods need one
    anyway), and any such request that names an ``Origin`` must come from
    this service's own. Without a token on the
    loopback this is what keeps another site's page out.
    """
    if scope["method"] in ("GET", "HEAD"):
        return None
    headers = {k.decode("latin-1").lower(): v.decode("latin-1")
               for k, v in scope.get("headers", [])}
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    wanted = "application/octet-stream" if scope["path"] == "/api/ship" else "application/json"
    if scope["method"] == "POST" and kind != wanted:
        return f"send the request body as Content-Type: {wanted}"
    origin = headers.get("origin")
    if origin is not None and origin != f"http://{headers.get('host', '')}":
        return "requests from another site's page are refused"
    return None


def _too_big(scope: dict[str, Any]) -> str | None:
    """Why a request body is refused before it is read (its ``Content-Length``
    above its path's :data:`BODY_LIMITS`), or None. A body sent without a
    length is counted as it is read (:func:`read_body`)."""
    if scope["method"] in ("GET", "HEAD"):
        return None
    length = next((v for k, v in scope.get("headers", []) if k.lower() == b"content-length"),
                  None)
    limit = BODY_LIMITS.get(scope["path"], DEFAULT_BODY_LIMIT)
    if length is not None and (not length.isdigit() or int(length) > limit):
        return f"the request body is larger than {limit:,} bytes"
    return None


class BodyTooLarge(Exception):
    """The body read so far is past its path's limit."""


async def read_body(request: Request) -> bytes:
    """The request body, at most its path's :data:`BODY_LIMITS` bytes.

    Raises:
        BodyTooLarge: it holds more.
    """
    limit = BODY_LIMITS.get(request.url.path, DEFAULT_BODY_LIMIT)
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise BodyTooLarge(f"the request body is larger than {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request) -> Any:
    """The request's JSON body (:func:`read_body`'s limit).

    Raises:
        BodyTooLarge: too large. UsageError: not JSON, or nested too deep
        (Python's parser stops at its recursion limit: refused, not a 500).
    """
    body = await read_body(request)
    try:
        return json.loads(body)
    except RecursionError:
        raise UsageError("the JSON body is nested too deeply") from None
    except ValueError:
        raise UsageError("the body is not JSON") from None


class RedactTokens:
    """A :mod:`logging` filter for uvicorn's access log: the value of every query
    parameter whose name is ``token`` once percent-decoded (``?token=``,
    ``?%74oken=``, ``?TOK%45N=``) is written ``[redacted]`` (the token never
    reaches a log)."""

    _PAIR = re.compile(r"([?&;])([^=&\s\"?;]+)=([^&\s\";]*)")

    @staticmethod
    def _sub(m: re.Match[str]) -> str:
        from urllib.parse import unquote_plus

        name = unquote_plus(unquote_plus(m.group(2)))     # a doubly encoded name too
        if name.strip().lower() == "token":
            return f"{m.group(1)}{m.group(2)}=[redacted]"
        return m.group(0)

    def redact(self, text: str) -> str:
        """``text`` with the tokens in it redacted."""
        return self._PAIR.sub(self._sub, text)

    def filter(self, record: Any) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a
                                for a in record.args)
        if isinstance(record.msg, str):
            record.msg = self.redact(record.msg)
        return True


@lru_cache(maxsize=1)
def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["rate"] = _rate
    env.filters["pct"] = _pct
    env.filters["bottleneck"] = _bottleneck
    return env


def _bottleneck(b: dict[str, Any] | None) -> str:
    from tlog.analyze.history import bottleneck_label

    return bottleneck_label(b)


def _rate(value: float | None, unit: str = "") -> str:
    from tlog.analyze.text import rate

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return rate(value, unit).strip()


def _pct(value: float | None) -> str:
    from tlog.analyze.text import pct

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return pct(value)


def page(name: str, **context: Any) -> Response:
    """Render template ``name`` (autoescaped) as an HTML response."""
    html = _templates().get_template(name).render(**context)
    return Response(html, media_type="text/html; charset=utf-8",
                    headers={"cache-control": "no-store"})


@lru_cache(maxsize=1)
def _vega() -> bytes:
    from tlog.reports.bundle import javascript_bundle

    return javascript_bundle().encode()


@lru_cache(maxsize=1)
def _css() -> bytes:
    from tlog.reports.html import _CSS

    return (_CSS + (HERE / "static" / "serve.css").read_text(encoding="utf-8")).encode()


STATIC = {"app.js": "text/javascript", "serve.css": "text/css", "vega.js": "text/javascript"}


def _loopback_client(request: Request) -> bool:
    """Whether the request comes from this host (a loopback peer address)."""
    import ipaddress

    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_app(config: ServeConfig, service: Service, watcher: Watcher | None = None,
              spool: Spool | None = None) -> Any:
    """The ASGI application of a service (wrapped in :class:`Guard`).

    ``watcher`` is started with the application and stopped (its last
    diagnoses stored) when it shuts down; the database is closed then.
    """

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(fn, *args, **kwargs)

    # --- pages ------------------------------------------------------------------------

    async def runs_page(request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        tag = request.query_params.get("tag", "").strip()
        page_no = request.query_params.get("page", "1")
        page_no = int(page_no) if page_no.isdigit() and int(page_no) > 0 else 1
        error = None
        rows: list[dict[str, Any]] = []
        total = 0
        marks: dict[str, dict[str, Any]] = {}
        try:
            from tlog.analyze.history import parse_tag_filters

            tags = parse_tag_filters([tag]) if tag else None
            rows, total = await call(service.runs_page, tags=tags, q=q,
                                     offset=(page_no - 1) * PAGE_RUNS, limit=PAGE_RUNS)
            marks = await call(service.high_water_marks, rows)
        except TlogError as exc:
            error = str(exc)
        pages = max(1, -(-total // PAGE_RUNS))
        link = {k: v for k, v in (("q", q), ("tag", tag)) if v}
        return page("runs.html", title="tlog: runs", rows=rows, marks=marks, q=q, tag=tag,
                    error=error, config=config, total=total, page_no=page_no, pages=pages,
                    first=(page_no - 1) * PAGE_RUNS + 1,
                    prev_url="/?" + urlencode({**link, "page": page_no - 1})
                    if page_no > 1 else None,
                    next_url="/?" + urlencode({**link, "page": page_no + 1})
                    if page_no < pages else None)

    async def run_page(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            summary = await call(service.run, run_id)
        except TlogError as exc:
            resp = page("error.html", title="tlog: no such run", message=str(exc))
            resp.status_code = 404
            return resp
        try:
            diagnosis, key = await call(service.diagnosis, run_id)
            live, _ = await call(service.live, run_id)
        except RunNotFoundError:     # a run whose first iterations are not in yet
            diagnosis, key, live = None, "", None
        return page("run.html", title=f"tlog: {run_id}", run_id=run_id, summary=summary,
                    d=diagnosis, key=key, poll_ms=int(config.poll_s * 1000), live=live)

    async def compare_page(request: Request) -> Response:
        a = request.query_params.get("a", "").strip() or None
        b = request.query_params.get("b", "").strip() or None
        runs = await call(service.runs)
        result = error = None
        if b is not None or a is not None:
            try:
                if b is None:     # one run: against its default baseline
                    a, b = None, a
                result = await call(service.compare, a, b)
            except TlogError as exc:
                error = str(exc)
        return page("compare.html", title="tlog: compare", runs=runs, a=a, b=b, c=result,
                    error=error)

    async def sql_page(request: Request) -> Response:
        statement = request.query_params.get("q", "").strip()
        rows = error = None
        more = False
        if statement:
            try:
                rows, more = await call(service.sql_rows, statement)
            except TlogError as exc:
                error = str(exc)
        columns = list(rows[0]) if rows else []
        return page("sql.html", title="tlog: SQL", q=statement, rows=rows, columns=columns,
                    error=error, cell=_cell, more=more)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return PlainTextResponse("not found", status_code=404)
        if name == "vega.js":
            body = await call(_vega)
        elif name == "serve.css":
            body = _css()
        else:
            body = (HERE / "static" / name).read_bytes()
        return Response(body, media_type=STATIC[name], headers={"cache-control": "max-age=3600"})

    # --- API --------------------------------------------------------------------------

    async def api_runs(request: Request) -> Response:
        from tlog.analyze.history import parse_since, parse_tag_filters

        p = request.query_params
        try:
            tags = parse_tag_filters(p.getlist("tag")) or None
            since = p.get("since")
            since_s = parse_since(since) if since else None
            offset, limit = p.get("offset", "0"), p.get("limit")
            if not offset.isdigit() or (limit is not None and not limit.isdigit()):
                raise UsageError("offset and limit are whole numbers of runs, 0 or more")
            rows, total = await call(service.runs_page, tags=tags, since=since_s,
                                     q=p.get("q", "").strip(), offset=int(offset),
                                     limit=None if limit is None else int(limit))
            return json_response(rows, headers={"x-tlog-total": str(total)})
        except Exception as exc:   # noqa: BLE001 - error_response re-raises what is not ours
            return error_response(exc)

    async def api_run(request: Request) -> Response:
        try:
            return json_response(await call(service.run, request.path_params["run_id"]))
        except Exception as exc:   # noqa: BLE001
            return error_response(exc)

    async def api_diagnosis(request: Request) -> Response:
        try:
            data, key = await call(service.diagnosis, request.path_params["run_id"])
        except Exception as exc:   # noqa: BLE001
            return error_response(exc)
        etag = f'"{key}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"etag": etag})
        return json_response(data, headers={"etag": etag})

    async def api_live(request: Request) -> Response:
        window = request.query_params.get("window")
        try:
            try:
                window_s = None if window is None else float(window)
            except ValueError:
                raise UsageError(f"window must be a number of seconds, got {window!r}") from None
            data, key = await call(service.live, request.path_params["run_id"], window_s)
        except Exception as exc:   # noqa: BLE001
            return error_response(exc)
        return json_response(data, headers={"etag": f'"{key}"'})

    async def api_charts(request: Request) -> Response:
        try:
            charts, key = await call(service.charts, request.path_params["run_id"])
        except Exception as exc:   # noqa: BLE001
            return error_response(exc)
        return json_response({"key": key, "charts": charts}, headers={"etag": f'"{key}"'})

    async def api_compare(request: Request) -> Response:
        a = request.query_params.get("a") or None
        b = request.query_params.get("b") or None
        match = request.query_params.get("match")
        try:
            if b is None and a is None:
                raise UsageError("give a=BASELINE&b=CANDIDATE, or b=CANDIDATE alone (against "
                                 "its default baseline)")
            if b is None:
                a, b = None, a
            keys = [k.strip() for k in match.split(",")] if match else None
            if keys is not None and a is not None:
                raise UsageError("match chooses the baseline; give it with b alone")
            return json_response(await call(service.compare, a, b, match=keys))
        except Exception as exc:   # noqa: BLE001
            return error_response(exc)

    async def api_sql(request: Request) -> Response:
        statement = request.query_params.get("q")
        if request.method == "POST":
            try:
                body = await read_json(request)
                statement = body.get("sql") if isinstance(body, dict) else None
            except BodyTooLarge as exc:
                return json_response({"error": str(exc)}, 413)
            except UsageError as exc:
                return json_response({"error": str(exc)}, 400)
        try:
            if not statement or not isinstance(statement, str):
                raise UsageError('give one SQL statement: ?q=SELECT... or POST {"sql": "..."}')
            rows, more = await call(service.sql_rows, statement)
            # more rows than SQL_MAX_ROWS: the first ones, and a header that says so
            return json_response(rows, headers={"x-tlog-rows-cut": str(len(rows))} if more
                                 else None)
        except Exception as exc:   # noqa: BLE001
            return error_response(exc)

    async def api_call(request: Request) -> Response:
        import pickle

        from tlog.web.endpoint import PICKLE_TYPE

        if not _loopback_client(request):
            return json_response({"error": "the facade's calls are taken from this host only; "
                                           "send runs from other hosts with tlog ship"}, 403)
        try:
            body = await read_json(request)
            if not (isinstance(body, dict) and isinstance(body.get("method"), str)
                    and isinstance(body.get("kwargs", {}), dict)):
                raise UsageError('give {"method": NAME, "kwargs": {...}}')
        except BodyTooLarge as exc:
            return json_response({"error": str(exc)}, 413)
        except UsageError as exc:
            return json_response({"error": str(exc)}, 400)

        def run() -> bytes:
            try:
                outcome = ("ok", service.call(body["method"], body.get("kwargs", {})))
            except TlogError as exc:
                outcome = ("error", exc)
            except Exception as exc:   # noqa: BLE001 - a bug here: logged, one line there
                log.exception("call %s failed", body["method"])
                outcome = ("error", DatabaseError(
                    f"tlog serve failed on {body['method']}: {type(exc).__name__}: {exc} "
                    f"(its log has the traceback)"))
            return pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)

        return Response(await call(run), media_type=PICKLE_TYPE,
                        headers={"cache-control": "no-store"})

    async def api_ship(request: Request) -> Response:
        from tlog.web.spool import ShipConflict, gunzip

        if spool is None:
            return json_response({"error": "this service takes no shipped runs"}, 404)
        q = request.query_params
        try:
            run = q.get("run") or ""
            if request.method == "GET":
                files = await call(spool.files, run)
                return json_response({"run": run, "files": {k: v.to_dict()
                                                            for k, v in files.items()}})
            body = await read_body(request)
            if request.headers.get("content-encoding", "").lower() != "gzip":
                raise UsageError("send the bytes gzip-compressed (Content-Encoding: gzip)")
            data = await call(gunzip, body)
            offset = q.get("offset", "")
            if not offset.isdigit():
                raise UsageError(f"bad offset {offset!r}: a byte offset, 0 or more")
            copy = await call(spool.append, run, q.get("path") or "", int(offset), data,
                              replace=q.get("replace") == "1")
            return json_response({"run": run, "path": q.get("path"), **copy.to_dict()})
        except ShipConflict as exc:
            return json_response({"error": str(exc), "size": exc.size, "head": exc.head}, 409)
        except BodyTooLarge as exc:
            return json_response({"error": str(exc)}, 413)
        except Exception as exc:   # noqa: BLE001
            return error_response(exc)

    async def api_openapi(request: Request) -> Response:
        return json_response(OPENAPI)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if watcher is not None:
            watcher.start()
        try:
            yield
        finally:
            if watcher is not None:
                await run_in_threadpool(watcher.stop)
            await run_in_threadpool(service.gate.close)

    routes = [
        Route("/", runs_page),
        Route("/run/{run_id:path}", run_page),
        Route("/compare", compare_page),
        Route("/sql", sql_page),
        Route("/static/{name}", static),
        Route("/api/openapi.json", api_openapi),
        Route("/api/runs", api_runs),
        Route("/api/runs/{run_id:path}/diagnosis", api_diagnosis),
        Route("/api/runs/{run_id:path}/charts", api_charts),
        Route("/api/runs/{run_id:path}/live", api_live),
        Route("/api/runs/{run_id:path}", api_run),
        Route("/api/compare", api_compare),
        Route("/api/sql", api_sql, methods=["GET", "POST"]),
        Route("/api/call", api_call, methods=["POST"]),
        Route("/api/ship", api_ship, methods=["GET", "POST"]),
    ]
    return Guard(Starlette(routes=routes, lifespan=lifespan), config.token, config.write_token)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _error_schema() -> dict[str, Any]:
    return {"description": "an error: {\"error\": \"one line\"}",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "the run id (percent-encoded)"}
_ERRORS = {"400": _error_schema(), "401": _error_schema(), "404": _error_schema(),
           "503": _error_schema()}

def _query(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": "string"},
            "description": description}


def _get(summary: str, params: list[dict[str, Any]], what: str, schema: str) -> dict[str, Any]:
    """An OpenAPI GET operation answering ``schema`` (a component name)."""
    return {"get": {"summary": summary, "parameters": params, "responses": {
        "200": _ok(what, {"$ref": f"#/components/schemas/{schema}"}), **_ERRORS}}}


def _run_get(summary: str, what: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenAPI operation of a GET of one run's ``/api/runs/{run_id}...`` path."""
    return {"get": {"summary": summary, "parameters": [_RUN_ID], "responses": {
        "200": _ok(what, {"$ref": "#/components/schemas/Object"}), **(extra or {}),
        **_ERRORS}}}


#: The OpenAPI 3.1 document of the JSON API (``/api/openapi.json``).
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "tlog serve", "version": "1",
             "description": "Where multi-GPU training pipelines lose their time: the runs, "
                            "diagnoses and comparisons of one tlog database. Each answer is "
                            "the content of the matching CLI --json output (docs/SERVE.md)."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {"Error": {"type": "object", "required": ["error"],
                              "properties": {"error": {"type": "string"}}},
                    "Object": {"type": "object"},
                    "Rows": {"type": "array", "items": {"type": "object"}}},
    },
    "security": [{"bearer": []}, {}],
    "paths": {
        "/api/runs": _get(
            "The runs, oldest first (tlog runs --json)",
            [_query("tag", "key=value; repeat: all must match"),
             _query("since", "ISO date or date-time (local time)"),
             _query("q", "only runs whose id, name or tags contain this text"),
             _query("offset", "skip this many runs (default 0)"),
             _query("limit", "at most this many runs (default all); the header "
                             "x-tlog-total gives how many match")], "one object per run",
            "Rows"),
        "/api/runs/{run_id}": _run_get(
            "One run's summary (a row of tlog runs --json) with its high_water_mark",
            "the run"),
        "/api/runs/{run_id}/diagnosis": _run_get(
            "The run's diagnosis (tlog diagnose --run RUN --json); ETag: the digest of the "
            "data read (If-None-Match gives 304 while unchanged)", "the diagnosis",
            {"304": {"description": "unchanged since the ETag given"}}),
        "/api/runs/{run_id}/charts": _run_get(
            "The run report's charts: {key, charts: [{key, title, caption, spec}]} with "
            "Vega-Lite specs", "the charts"),
        "/api/runs/{run_id}/live": {"get": {
            "summary": "The run now: tlog watch's view of its latest seconds (the window's "
                       "verdict and stragglers, throughput now; diagnosis: the window's "
                       "tlog diagnose --json)",
            "parameters": [_RUN_ID, _query("window", "seconds of the run's latest "
                                                     "iterations (default 30)")],
            "responses": {"200": _ok("the live view", {"$ref": "#/components/schemas/Object"}),
                          **_ERRORS}}},
        "/api/compare": _get(
            "Explain a throughput change (tlog compare [A] B --json)",
            [_query("a", "the baseline run (leave out: B's default baseline)"),
             _query("b", "the candidate run"),
             _query("match", "with b alone: tag keys the baseline must share, comma-separated")],
            "the comparison", "Object"),
        "/api/sql": {
            "get": {"summary": "One read-only SQL statement (tlog sql --format json)",
                    "parameters": [{"name": "q", "in": "query", "required": True,
                                    "schema": {"type": "string"}}],
                    "responses": {"200": _ok("the rows", {"$ref": "#/components/schemas/Rows"}),
                                  **_ERRORS}},
            "post": {"summary": "The same, the statement in the body",
                     "requestBody": {"content": {"application/json": {"schema": {
                         "type": "object", "required": ["sql"],
                         "properties": {"sql": {"type": "string"}}}}}},
                     "responses": {"200": _ok("the rows", {"$ref": "#/components/schemas/Rows"}),
                                   **_ERRORS}}},
        "/api/call": {"post": {
            "summary": "Make a tlog.api.Database call in the service (the CLI and tlog.open "
                       "on this host do; the answer is pickled); needs the write token",
            "requestBody": {"content": {"application/json": {"schema": {
                "type": "object", "required": ["method"],
                "properties": {"method": {"type": "string"}, "kwargs": {"type": "object"}}}}}},
            "responses": {"200": {"description": "the pickled ('ok', value) or ('error', "
                                                 "exception)"}, **_ERRORS}}},
        "/api/ship": {
            "get": {"summary": "The service's copies of a shipped run's files (size, head)",
                    "parameters": [{"name": "run", "in": "query", "required": True,
                                    "schema": {"type": "string"}}],
                    "responses": {"200": _ok("the files", {"$ref": "#/components/schemas/Object"}),
                                  **_ERRORS}},
            "post": {"summary": "Append a gzip-compressed byte range to a shipped file; needs "
                                "the write token (docs/SERVE.md, Shipping)",
                     "parameters": [{"name": n, "in": "query", "required": n != "replace",
                                     "schema": {"type": "string"}}
                                    for n in ("run", "path", "offset", "replace")],
                     "responses": {"200": _ok("the copy", {"$ref": "#/components/schemas/Object"}),
                                   "409": _error_schema(), "413": _error_schema(),
                                   **_ERRORS}}},
        "/api/openapi.json": {"get": {
            "summary": "This document",
            "responses": {"200": _ok("OpenAPI 3.1", {"$ref": "#/components/schemas/Object"})}}},
    },
}
