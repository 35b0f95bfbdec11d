"""``tlog serve``: own the database, ingest watched runs as they grow, serve pages and a JSON API.

The service (docs/SERVE.md) is :mod:`tlog.web`; this command checks the
options, opens the database, announces the service (``<db>.serve.json``),
prints its URL (and its token, once) and runs uvicorn until Ctrl-C.
"""

from __future__ import annotations

import ipaddress
import math
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from tlog.app import DbOption, app, console, err_console
from tlog.ingest.errors import TlogError, UsageError


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command("serve")
def serve_command(
    db: DbOption = None,
    watch: Annotated[list[Path] | None, typer.Option(
        "--watch", help="Directory of run directories (or one run directory) to ingest as "
                        "runs appear and grow; repeat for several.", file_okay=False,
        metavar="DIR", show_default=False)] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (other than the "
                                      "loopback: a token is required).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port (0: any free one).", min=0,
                                      max=65535)] = 8765,
    token: Annotated[str | None, typer.Option(
        "--token", envvar="TLOG_TOKEN",
        help="Token every request must carry (default: $TLOG_TOKEN, else none on the "
             "loopback; generated and printed once on another address). Writes always "
             "need one: without it, one is generated and kept in <db>.serve.json.",
        show_default=False)] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between ingest "
                                            "rounds of the watched directories.")] = 2.0,
    spool: Annotated[Path | None, typer.Option(
        "--spool", help="Directory for runs shipped from other hosts (tlog ship, "
                        "TLOG_SERVER); default: <db>.spool beside the database.",
        file_okay=False, show_default=False)] = None,
    publish: Annotated[Path | None, typer.Option(
        "--publish", help="Run lake to publish every watched run into once it is "
                          "finished (its files quiet for --publish-after seconds); see "
                          "tlog publish.", file_okay=False, metavar="LAKE",
        show_default=False)] = None,
    publish_after: Annotated[float | None, typer.Option(
        "--publish-after", help="Seconds a watched run's files must stay unchanged "
                                "before it is published (with --publish; default 60).",
        show_default=False)] = None,
) -> None:
    """Serve the database: runs list, live run pages, compare and SQL pages, a JSON API.

    Example: tlog serve --watch ./runs   (then open the URL it prints)
    """
    try:
        import uvicorn

        from tlog.web.app import RedactTokens, build_app
        from tlog.web.endpoint import Announcement, ServiceInfo
        from tlog.web.service import PUBLISH_QUIET_S, Gate, ServeConfig, Service, Watcher
        from tlog.web.spool import Spool
    except ImportError as exc:
        raise TlogError(f"tlog serve needs Starlette and uvicorn ({exc}); install them with: "
                        f"pip install 'tlog[serve]' (or make setup)") from None
    from tlog.ingest.db import default_db_path

    if not (math.isfinite(interval) and interval > 0):
        raise UsageError(f"--interval must be a positive number of seconds, got {interval:g}")
    if publish_after is None:
        publish_after = PUBLISH_QUIET_S
    if not (math.isfinite(publish_after) and publish_after >= 0):
        raise UsageError(f"--publish-after must be a number of seconds >= 0, got "
                         f"{publish_after:g}")
    lake = publish.expanduser().resolve() if publish is not None else None
    if lake is not None and lake.exists() and not lake.is_dir():
        raise UsageError(f"--publish {lake}: a file; give a folder for the run lake")
    if token is not None and (len(token) < 16 or not token.isprintable() or " " in token):
        raise UsageError("--token must be at least 16 printable characters without spaces")
    roots = []
    for w in watch or []:
        if not w.is_dir():
            raise UsageError(f"--watch {w}: no such directory")
        roots.append(w.resolve())
    generated = False
    if not _loopback(host) and token is None:
        token, generated = secrets.token_urlsafe(24), True
    # writes always need a token, on the loopback too: the one given, else a new one
    write_token = token or secrets.token_urlsafe(24)
    db_path = (db.expanduser() if db is not None else default_db_path()).resolve()
    spool_dir = (spool.expanduser() if spool is not None
                 else db_path.with_name(db_path.name + ".spool")).resolve()
    try:
        shipped = Spool(spool_dir)
    except OSError as exc:
        raise UsageError(f"cannot use the spool directory {spool_dir}: "
                         f"{exc.strerror or exc}") from None
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    bound = sock.getsockname()[1]
    # the address to reach it at: a wildcard address is reached on the loopback here
    near = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"http://[{near}]:{bound}" if ":" in near else f"http://{near}:{bound}"
    gate = Gate(db_path)          # DatabaseLockedError: another process holds it
    config = ServeConfig(db=db_path, watch=roots, host=host, port=bound, token=token,
                         write_token=write_token, spool=spool_dir, lake=lake,
                         interval_s=interval, poll_s=min(interval, 2.0))
    service = Service(gate)
    watcher = Watcher(gate, [*roots, spool_dir], interval, service=service, lake=lake,
                      publish_quiet_s=publish_after)
    try:
        announcement = Announcement(ServiceInfo(url=url, pid=_pid(), db=str(db_path),
                                                watch=[str(r) for r in roots],
                                                token=write_token))
    except BaseException:
        gate.close()
        sock.close()
        raise
    try:
        where = f"listening on {host} port {bound}, " if near != host else ""
        console.print(f"tlog serve: {url}/ ({where}database {db_path}; watching "
                      f"{', '.join(map(str, roots)) or 'nothing'}; shipped runs in "
                      f"{spool_dir}"
                      f"{f'; publishing finished runs into {lake}' if lake else ''}); Ctrl-C stops", highlight=False, soft_wrap=True)
        if generated:
            console.print(f"token (shown once; also in {announcement.path}, mode 0600): {token}",
                          highlight=False, soft_wrap=True)
            console.print(f"open {url}/?token=... once in a browser, or send "
                          f"'Authorization: Bearer TOKEN'", highlight=False, soft_wrap=True)
        sys.stdout.flush()
        application = build_app(config, service, watcher, shipped)
        uv = uvicorn.Config(application, log_level="info", access_log=True, lifespan="on",
                            timeout_graceful_shutdown=10)
        import logging

        logging.getLogger("uvicorn.access").addFilter(RedactTokens())
        own = logging.getLogger("tlog.serve")
        if not own.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("tlog serve: %(levelname)s: %(message)s"))
            own.addHandler(handler)
            own.setLevel(logging.INFO)
        server = uvicorn.Server(uv)
        # uvicorn re-raises the signal that stopped it: SIGTERM's default action
        # would end the process before the announcement is removed
        signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:     # uvicorn stopped cleanly, then re-raised Ctrl-C
            pass
    finally:
        announcement.close()
        sock.close()
    err_console.print("tlog serve: stopped", highlight=False)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _pid() -> int:
    import os

    return os.getpid()
