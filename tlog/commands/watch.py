"""``tlog watch RUN_DIR``: a live terminal view of a run while it is written.

Every ``--interval`` seconds it ingests what is new in the run directory
(the follow loop of ``tlog ingest --follow``, :meth:`tlog.api.Database.follow`:
the same incremental, transactional ingest) and redraws the view
(:meth:`tlog.api.Database.live_view`, :mod:`tlog.analyze.live`): throughput
now (over the last ``--window`` seconds of the run) and against the
high-water mark (the best earlier run of the same configuration), the stage
shares, the bottleneck and its phase, stragglers, queue depths, memory
trend and findings. A run directory not there yet is waited for (said once).

``q`` (stdin a terminal) or Ctrl-C stops: the round in progress finishes
(a signal only asks to stop, :mod:`tlog.commands._stop`; during the wait
between rounds it stops at once), the run's diagnosis is stored once more,
and the command exits 0 (SIGTERM: the same, then exit 143). Ctrl-C again
before that stops at once: the ingest batch in progress rolls back (each is
one transaction). When stdout is not
a terminal (piped, logged), each refresh prints one summary line instead
of the live view. This module parses, calls and renders; the figures are
analyze's.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tlog.api import WAIT_S
from tlog.app import DbOption, app, check_wait, console, err_console, open_database, shown
from tlog.commands._stop import StopRequest
from tlog.ingest.errors import RunNotFoundError, UsageError

if TYPE_CHECKING:
    from tlog.analyze.baseline import HighWaterMark
    from tlog.analyze.live import LiveView
    from tlog.job import Job, JobResult

#: Seconds between two refreshes (an ingest round and a redraw). Source:
#: tlog's choice: "every couple of seconds"; the shim flushes
#: at least every second.
WATCH_INTERVAL_S = 2.0

#: Fewest seconds between two stores of the whole run's diagnosis while
#: watching (:meth:`tlog.api.Database.follow`'s ``store_interval_s``; ``tlog
#: ingest --follow`` stores every 30 s). A store diagnoses the whole run under
#: the write lock (seconds at millions of iterations) and the view waits for
#: it; the view itself diagnoses only its window, and reads the stored
#: diagnosis only for its whole-run trends (shown with their time). Source:
#: tlog's choice.
WATCH_STORE_INTERVAL_S = 120.0

#: Findings the live view lists (the most important first, as diagnose orders
#: them). Source: tlog's choice (what fits a terminal).
SHOW_FINDINGS = 3


class QuitKey(KeyboardInterrupt):
    """``q`` was pressed: raised from the wait between rounds, so that the
    follow loop ends as it does on Ctrl-C (its last diagnosis store included)."""


class _Waiter:
    """The wait between two rounds of the follow loop: reads single keys from
    a terminal on stdin meanwhile (cbreak mode: keys arrive unbuffered, Ctrl-C
    still interrupts), and ends the wait early once ``until()`` is true.

    Args:
        fd: stdin's file descriptor when it is a terminal, else None (no keys).
        until: when it returns True (``tlog run --live``: the job ended), the
            wait ends and :attr:`ending` is set: one more round, then the view ends.
    """

    #: Seconds between two looks at ``until`` while waiting (tlog's choice).
    POLL_S = 0.2

    def __init__(self, fd: int | None, until: Callable[[], bool] | None = None) -> None:
        self.fd = fd
        self.until = until
        self.ending = False

    @contextmanager
    def cbreak(self) -> Iterator[_Waiter]:
        """Keys unbuffered while inside (nothing to do without a terminal)."""
        if self.fd is None:
            yield self
            return
        import termios
        import tty

        saved = termios.tcgetattr(self.fd)
        try:
            tty.setcbreak(self.fd)
            yield self
        finally:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``; raise :class:`QuitKey` at once when ``q`` is
        pressed; return early once ``until()`` is true, and raise
        :class:`QuitKey` when called again after that (the follow loop waits
        between its retries of a run directory without logs too: a job that
        ended without writing any ends the view after that one last look)."""
        import select

        if self.ending:
            raise QuitKey
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.until is not None and self.until():
                self.ending = True
                return
            step = left if self.until is None else min(left, self.POLL_S)
            if self.fd is None:
                time.sleep(step)
                continue
            ready, _, _ = select.select([self.fd], [], [], step)
            if ready:
                data = os.read(self.fd, 64)
                if not data or b"q" in data.lower():
                    raise QuitKey


def _rate(value: float | None, unit: str) -> str:
    from tlog.analyze.text import DASH, rate

    return DASH if value is None else rate(value, unit)


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%H:%M:%S")


def _span(seconds: float) -> str:
    """A long wait in words: ``45 s``, ``12 min``, ``5.0 h``, ``3.2 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _when(epoch: float) -> str:
    """A time of today as HH:MM:SS, another day's with its date."""
    t = datetime.fromtimestamp(epoch)
    return t.strftime("%H:%M:%S" if t.date() == datetime.now().date() else "%Y-%m-%d %H:%M:%S")


def _window_words(v: LiveView) -> str:
    w = v.window
    if w.whole_run:
        return f"the whole run so far ({w.iterations:,} iterations, {w.seconds:.0f} s)"
    return (f"the last {w.seconds:.0f} s of the run ({w.iterations:,} of {v.iterations:,} "
            f"iterations, since {_when(w.first)})")


def _high_water_words(v: LiveView) -> str:
    from tlog.analyze.text import times

    hw = v.high_water
    if hw is None:
        return "high-water mark: not looked up yet"
    if hw.run_id is None:
        return "high-water mark: none (no earlier run of this configuration with steady iterations)"
    value = v.high_water_value
    if value is None:
        missing = (f"it has no {v.unit} figure" if v.unit else
                   "no steady iteration in the window to compare yet")
        return f"high-water mark: run {shown(hw.run_id)} ({missing})"
    ratio = v.vs_high_water
    return (f"high-water mark: {_rate(value, v.unit)} (run {shown(hw.run_id)})"
            + (f", now {times(ratio)} of it" if ratio is not None else ""))


def _bottleneck_words(v: LiveView) -> str:
    from tlog.analyze.history import CAUSE_LABELS
    from tlog.analyze.text import pct

    bn = v.diagnosis.bottleneck
    if bn is None:
        return "bottleneck: not known yet (no steady iteration in the window)"
    phase = f", most in phase {shown(bn.phase)} ({pct(bn.phase_share)})" if bn.phase else ""
    cause = (f"; the verdict: {shown(bn.stage)} {CAUSE_LABELS.get(bn.cause, 'is limited by')} "
             f"({shown(bn.cause)})" if bn.cause else "")
    lead = bn.straggler
    slow = (f"; led by a straggler: rank {lead.rank} ({shown(lead.worker)}, {lead.kind})"
            if lead is not None else "")
    return (f"bottleneck: stage {shown(bn.stage)} is {bn.category}-bound ({pct(bn.share)} of "
            f"its time){phase}{cause}{slow}")


def summary_line(v: LiveView) -> str:
    """One line per refresh when stdout is not a terminal."""
    parts = [f"{_clock(v.as_of)} run {shown(v.run_id)}: {v.iterations:,} iterations",
             f"now {_rate(v.now, v.unit)} (last {v.window.seconds:.0f} s)"]
    if v.vs_high_water is not None:
        from tlog.analyze.text import times

        parts.append(f"{times(v.vs_high_water)} of the high-water mark "
                     f"(run {shown(v.high_water.run_id)})")  # type: ignore[union-attr]
    parts.append(_bottleneck_words(v))
    if v.diagnosis.stragglers:
        s = v.diagnosis.stragglers[0]
        parts.append(f"straggler: rank {s.rank} of {shown(s.stage)}")
    return "; ".join(parts)


def _view(v: LiveView, interval: float, tty_keys: bool, hint: str | None = None) -> Any:
    """The live view as one rich renderable (``hint``: how to quit, else the keys')."""
    from rich.console import Group
    from rich.text import Text

    from tlog.analyze.text import ms, pct, size
    from tlog.commands.diagnose import finding_line, stage_table

    d = v.diagnosis
    quit_hint = hint or ("q or Ctrl-C quits" if tty_keys else "Ctrl-C quits")
    out: list[Any] = [
        Text(f"tlog watch · run {shown(v.run_id)} · {v.iterations:,} iterations · "
             f"refreshed {_clock(v.as_of)} every {interval:g} s · {quit_hint}", style="bold"),
    ]
    if v.idle_s > max(3 * interval, 10.0):
        out.append(Text(f"no new iteration for {_span(v.idle_s)} (the last ended at "
                        f"{_when(v.last_end)}): stalled or finished?", style="yellow"))
    out.append(Text(f"now: {_rate(v.now, v.unit)} over {_window_words(v)}"))
    out.append(Text(_high_water_words(v)))
    out.append(Text(_bottleneck_words(v), style="bold"))
    out.append(stage_table(d, "Stages: share of worker wall time in the window (steady)"))
    for s in d.stragglers[:3]:
        phase = f", most in {shown(s.phase)}" if s.phase else ""
        out.append(Text(f"straggler: rank {s.rank} of {shown(s.stage)} - its {s.kind} takes "
                        f"{s.slowdown:.2f}x its peers' ({ms(s.own_s)} vs {ms(s.peers_s)} per "
                        f"iteration){phase}"))
    if v.queues:
        states = {q.name: q.state for q in d.queues}
        cells = []
        for q in v.queues[:6]:
            cap = f"/{q.capacity}" if q.capacity is not None else ""
            state = f" ({states[q.name]})" if q.name in states else ""
            cells.append(f"{shown(q.name)}@{shown(q.worker)} {q.depth}{cap}{state}")
        more = f" (+{len(v.queues) - 6} more)" if len(v.queues) > 6 else ""
        out.append(Text("queues (latest depth): " + ", ".join(cells) + more))
    for m in v.memory:
        rate = ("" if m.rate_bytes_per_iter is None else
                f", {'+' if m.rate_bytes_per_iter >= 0 else ''}{size(m.rate_bytes_per_iter)} "
                f"per iteration in the window")
        out.append(Text(f"memory {shown(m.worker)} {m.kind}: {size(m.first_bytes)} at start -> "
                        f"{size(m.latest_bytes)} now (peak {size(m.peak_bytes)}){rate}"))
    if not v.memory:
        out.append(Text("memory: no readings (the shim samples RSS every 2 s and device "
                         "memory with CUDA)", style="dim"))
    if v.whole_run is not None:
        w = v.whole_run
        for f in w.findings:
            line = Text(f"whole run (as of {_clock(w.computed_at)}, {w.iterations:,} "
                        f"iterations): ")
            line.append_text(finding_line(f))
            out.append(line)
    if d.findings:
        out.append(Text("Findings (in the window)", style="bold"))
        out.extend(finding_line(f) for f in d.findings[:SHOW_FINDINGS])
    out.append(Text(f"figures over the window only (diagnose is not incremental: whole-run "
                    f"figures are 'tlog diagnose'); warm-up is looked for at the window's "
                    f"start; refresh took {ms(v.seconds)}; steady {pct(_steady_share(v))} "
                    f"of the window", style="dim"))
    return Group(*out)


def _steady_share(v: LiveView) -> float:
    it = v.diagnosis.iterations
    return it.steady / it.total if it.total else 0.0


def _waiting_view(text: str) -> Any:
    from rich.text import Text

    return Text(text, style="yellow")


@app.command("watch")
def watch_command(
    run_dir: Annotated[Path, typer.Argument(help="Run directory being written (waited for if "
                                                 "not there yet).", show_default=False)],
    db: DbOption = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes "
                                            "(ingest, then redraw).")] = WATCH_INTERVAL_S,
    window: Annotated[float | None, typer.Option(
        "--window", help="Seconds of the run's latest iterations the figures cover "
                         "[default: 30]", show_default=False)] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Run id (default: run.json "
                                               "run_id, else the directory name).")] = None,
    wait: Annotated[float, typer.Option("--wait", help="Seconds to wait while another tlog "
                                        "process uses the database.")] = WAIT_S,
) -> None:
    """Watch a run live: throughput now and against its high-water mark, bottleneck, queues."""
    if not (math.isfinite(interval) and interval > 0):
        raise UsageError(f"--interval must be a positive number of seconds, got {interval:g}")
    if window is not None and not (math.isfinite(window) and window > 0):
        raise UsageError(f"--window must be a positive number of seconds, got {window:g}")
    check_wait(wait)
    watch(run_dir, db=db, interval=interval, window=window, run_id=run_id, wait=wait)


def watch(run_dir: Path, *, db: Path | None = None, interval: float = WATCH_INTERVAL_S,
          window: float | None = None, run_id: str | None = None, wait: float = WAIT_S,
          until: Callable[[], bool] | None = None, hint: str | None = None) -> int:
    """Show the live view of ``run_dir`` (module docstring) until ``q`` or
    Ctrl-C, or, with ``until``, until it returns True (then after one last
    round). Returns the number of refreshes shown. ``tlog run --live`` calls
    it with ``until`` = the job has ended (its Ctrl-C goes to the job) and
    its own ``hint`` (how to quit, in the view's first line)."""
    live = sys.stdout.isatty()
    waiter = _Waiter(sys.stdin.fileno() if live and _stdin_tty() else None, until)

    database = open_database(db, wait_s=wait)
    state: dict[str, Any] = {"refreshes": 0, "run": None, "live": None}

    def retrying(exc: Exception, interval_s: float) -> None:
        text = f"tlog: waiting: {exc}; looking again every {interval_s:g} s (Ctrl-C to stop)"
        if state["live"] is not None:
            state["live"].update(_waiting_view(shown(text)), refresh=True)
        else:
            err_console.print(text, highlight=False, markup=False, soft_wrap=True)

    # Ctrl-C and SIGTERM stop at the next wait between rounds (tlog.commands._stop:
    # raised inside DuckDB they were lost or became other errors); under tlog run
    # --live they go to the job instead (its relay), and the view ends with it
    stop = StopRequest((signal.SIGINT, signal.SIGTERM))
    rounds = database.follow(run_dir, run_id, interval_s=interval, on_retry=retrying,
                             sleep=stop.sleep(waiter.sleep),
                             store_interval_s=WATCH_STORE_INTERVAL_S)
    hw: HighWaterMark | None = None
    keys = waiter.fd is not None
    with stop.handling(until is None), waiter.cbreak(), _live(live) as screen:
        state["live"] = screen
        # q, Ctrl-C or SIGTERM: the follow loop has stored the diagnosis
        with stop.ending():
            try:
                for report in rounds:
                    state["run"] = report.run_id
                    try:
                        if hw is None:
                            hw = database.high_water_mark(report.run_id)
                        view = database.live_view(report.run_id, window_s=window, high_water=hw)
                    except RunNotFoundError as exc:
                        text = shown(f"{exc}; waiting for its first iterations")
                        if screen is not None:
                            screen.update(_waiting_view(text), refresh=True)
                        else:        # stdout carries the summary lines only
                            err_console.print(f"tlog: {text}", highlight=False, soft_wrap=True)
                    else:
                        state["refreshes"] += 1
                        if screen is not None:
                            screen.update(_view(view, interval, keys, hint), refresh=True)
                        else:
                            console.print(summary_line(view), highlight=False, soft_wrap=True)
                            sys.stdout.flush()
                    if waiter.ending:
                        break
            finally:   # stopped in the view (q, Ctrl-C twice): the last store
                with stop.ending():
                    rounds.close()   # type: ignore[attr-defined]
    name = f"run {shown(state['run'])}" if state["run"] else shown(str(run_dir))
    err_console.print(f"tlog: stopped watching {name} after {state['refreshes']} refreshes; "
                      f"the database holds every round ingested{stop.forced_note}",
                      highlight=False, soft_wrap=True)
    if stop.signum == signal.SIGTERM:
        raise typer.Exit(code=128 + signal.SIGTERM)    # as a shell reports a SIGTERM
    return state["refreshes"]


#: Where ``tlog run --live`` puts the job's output (standard output and
#: error), in the run directory: the terminal shows the live view.
JOB_OUTPUT = "job.log"

#: Lines of the job's output shown when it failed under ``tlog run --live``.
#: Source: tlog's choice (a Python traceback's usual length).
JOB_TAIL_LINES = 20


def watch_job(job: Job, run_dir: Path, *, run_id: str | None = None,
              db: Path | None = None) -> JobResult:
    """``tlog run --live``: the live view of the job's run while it runs
    (Ctrl-C goes to the job, ``q`` leaves the view and the job goes on), then
    wait for the job; when it failed, the end of its output
    (:data:`JOB_OUTPUT`) on stderr. Returns the job's result."""
    out = run_dir / JOB_OUTPUT
    err_console.print(f"tlog: the job's output goes to {out}", highlight=False,
                      markup=False, soft_wrap=True)
    keys = sys.stdout.isatty() and _stdin_tty()
    watch(run_dir, db=db, run_id=run_id, until=lambda: job.poll() is not None,
          hint=("q leaves the view (the job goes on); " if keys else "")
          + "Ctrl-C stops the job")
    result = job.wait()
    if result.exit_code != 0 and out.is_file():
        with open(out, "rb") as fh:
            fh.seek(max(0, out.stat().st_size - 64 * 1024))
            tail = fh.read().decode("utf-8", "replace").splitlines()[-JOB_TAIL_LINES:]
        err_console.print(f"tlog: the end of the job's output ({out}):", highlight=False,
                          markup=False, soft_wrap=True)
        for line in tail:
            err_console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    return result


def _stdin_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def _live(on: bool) -> Iterator[Any]:
    """A rich Live display on stdout when ``on`` (a terminal), else None."""
    if not on:
        yield None
        return
    from rich.console import Console
    from rich.live import Live

    # A console of its own: every name in the view passes through shown() where
    # it is built (tlog.app's console escapes plain strings, not renderables).
    screen = Live(console=Console(markup=False, highlight=False), auto_refresh=False,
                  transient=False, redirect_stdout=False, redirect_stderr=True)
    with screen:
        yield screen
