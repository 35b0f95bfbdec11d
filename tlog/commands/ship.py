"""``tlog ship RUN_DIR --to URL``: send a run to a ``tlog serve`` on another host as it is written.

The sender is :mod:`dflash_runtime.ship` (the shim ships the same way with
``TLOG_SERVER``); docs/SERVE.md says what is guaranteed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from tlog.app import JsonOption, app, console, err_console, print_json
from tlog.commands._stop import StopRequest
from tlog.ingest.errors import TlogError, UsageError


@app.command("ship")
def ship_command(
    run_dir: Annotated[Path, typer.Argument(help="The run directory to send.",
                                            file_okay=False, show_default=False)],
    to: Annotated[str, typer.Option("--to", help="The service's URL, e.g. "
                                    "http://tlog.example:8765 (default: $TLOG_SERVER).",
                                    show_default=False)] = "",
    token: Annotated[str | None, typer.Option(
        "--token", help="The service's token (default: $TLOG_TOKEN).",
        show_default=False)] = None,
    run: Annotated[str | None, typer.Option(
        "--run", help="The run's name on the service (default: run.json's run_id, else "
                      "the directory name).", show_default=False)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep sending what the "
                                         "files gain until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between passes "
                                            "with --follow.")] = 1.0,
    json_: JsonOption = False,
) -> None:
    """Send a run's logs to a tlog serve on another host (at least once here, exactly
    once there; resumes where it stopped). Example: tlog ship runs/r1 --to URL -f"""
    from dflash_runtime.ship import (
        MAX_BACKOFF_S,
        SERVER_ENV,
        TOKEN_ENV,
        ServiceDown,
        Shipper,
        ShipRefused,
        safe_name,
    )

    url = (to or os.environ.get(SERVER_ENV, "")).strip()
    if not url:
        raise UsageError("give the service's URL with --to http://HOST:PORT (or set "
                         f"{SERVER_ENV})")
    if "://" not in url:
        url = "http://" + url          # --to host:8765
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"--to {url}: give an http:// or https:// URL")
    if not run_dir.is_dir():
        if not follow:
            raise UsageError(f"{run_dir}: no such run directory (with --follow, tlog ship "
                             f"waits for it)")
        err_console.print(f"tlog: waiting for {run_dir} to appear (Ctrl-C to stop)",
                          highlight=False, soft_wrap=True)
        while not run_dir.is_dir():
            time.sleep(min(interval, 1.0))
    if not (interval > 0):
        raise UsageError(f"--interval must be a positive number of seconds, got {interval:g}")
    if run is not None and safe_name(run) != run:
        raise UsageError(f"--run {run!r}: use letters, digits and _.+=@- only")
    shipper = Shipper(run_dir.resolve(), url, token or os.environ.get(TOKEN_ENV) or None,
                      run=run)
    stop = StopRequest((signal.SIGINT, signal.SIGTERM))
    said_down = False
    wait = interval
    with stop.handling(follow):
        try:
            while True:
                try:
                    sent = shipper.ship_once()
                    said_down, wait = False, interval
                except ShipRefused as exc:
                    raise TlogError(str(exc)) from None
                except ServiceDown as exc:
                    if not follow:
                        raise TlogError(f"tlog serve at {url} does not answer ({exc}); what "
                                        f"was acknowledged is kept: run tlog ship again"
                                        ) from None
                    if not said_down:
                        err_console.print(f"tlog: tlog serve at {url} does not answer "
                                          f"({exc}); trying again", highlight=False,
                                          soft_wrap=True)
                        said_down = True
                    wait = min(wait * 2, MAX_BACKOFF_S)
                    sent = -1
                if not follow and sent == 0:
                    break
                if follow:
                    stop.sleep(time.sleep)(wait)
        except KeyboardInterrupt:      # Ctrl-C or SIGTERM while following: one last pass
            with contextlib.suppress(ServiceDown, ShipRefused):
                shipper.ship_once()
    files = len(shipper.files)
    if json_:
        print_json({"run": shipper.run, "url": url, "files": files,
                    "bytes_sent": shipper.bytes_sent, "requests": shipper.requests})
        return
    console.print(f"Shipped run {shipper.run} to {url}: {files} files, "
                  f"{shipper.bytes_sent:,} bytes sent", highlight=False, soft_wrap=True)
