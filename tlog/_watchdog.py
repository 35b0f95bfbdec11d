"""The watchdog of a ``tlog run`` job: it ends the job's whole process tree when tlog dies.

Started by :class:`tlog.job.Job` as ``python -I _watchdog.py JOB_PID TLOG_PID
STARTED GRACE_S`` in a session of its own (a Ctrl-C at the terminal does not
reach it), with its standard input the read end of a pipe whose only write end
tlog holds. It imports no tlog code (the standard library and psutil), so it
starts in about 50 ms.

While tlog lives, the watchdog notes every :data:`TICK_S` the job's processes:
tlog's descendants created since ``STARTED`` (epoch s), itself left out. tlog
is the child subreaper of its job (``tlog.job``), so a process orphaned inside
the job, even one in a session of its own, is among them.

- tlog writes ``done`` (:data:`DONE`) and closes the pipe when it has ended the
  job itself: the watchdog exits.
- The pipe reaches its end without it: tlog died, however (``kill -9``
  included; the kernel closes a dead process's files). The watchdog then sends
  SIGTERM to the job's process group (``JOB_PID``), to every process it noted
  and to their descendants, and SIGKILL after ``GRACE_S`` to what still runs
  (the same escalation as tlog's own leftover stop, :data:`tlog.job.LEFTOVER_GRACE_S`).

A process noted is recognised by its pid and start time, so a pid reused by
another program is never signalled. What it cannot see: a process started in a
session of its own, whose parent then died, in the last :data:`TICK_S` before
tlog died.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

import psutil

#: What tlog writes before closing the pipe when the job has ended under its
#: watch (anything else, or nothing, followed by the pipe's end: tlog died).
DONE = b"done"
#: Seconds between two notes of the job's processes (tlog's choice: one scan of
#: the process table, a few ms, twice a second).
TICK_S = 0.5
#: Seconds between two checks of what still runs while stopping.
POLL_S = 0.05


def _note(tlog_pid: int, started: float, known: dict[int, float]) -> None:
    """Add tlog's descendants created since ``started`` to ``known`` (pid -> start time)."""
    me = os.getpid()
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(tlog_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                t = p.create_time()
                if p.pid != me and t >= started - 1.0:
                    known.setdefault(p.pid, t)


def _alive(known: dict[int, float]) -> list[psutil.Process]:
    """The processes of ``known`` still running (same pid and start time, not
    zombies), with their descendants (noted into ``known`` too)."""
    out: dict[int, psutil.Process] = {}
    for pid, t in list(known.items()):
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if abs(p.create_time() - t) > 0.01:
                continue
            for q in [p, *p.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    if q.status() != psutil.STATUS_ZOMBIE:
                        known.setdefault(q.pid, q.create_time())
                        out[q.pid] = q
    return list(out.values())


def _signal_all(procs: list[psutil.Process], pgid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def stop_tree(job_pid: int, known: dict[int, float], grace_s: float) -> None:
    """SIGTERM to the job's group and every process of ``known`` (and their
    descendants), SIGKILL to what still runs after ``grace_s``."""
    known.setdefault(job_pid, 0.0)
    with contextlib.suppress(psutil.Error):
        known[job_pid] = psutil.Process(job_pid).create_time()
    _signal_all(_alive(known), job_pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while _alive(known) and time.monotonic() < end:
        time.sleep(POLL_S)
    _signal_all(_alive(known), job_pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Watch (module docstring); ``argv``: JOB_PID TLOG_PID STARTED GRACE_S."""
    job_pid, tlog_pid, started, grace_s = int(argv[0]), int(argv[1]), float(argv[2]), float(argv[3])
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(s, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    known: dict[int, float] = {}
    got = b""
    while True:
        _note(tlog_pid, started, known)
        ready, _, _ = select.select([fd], [], [], TICK_S)
        if not ready:
            continue
        data = os.read(fd, 64)
        if data:
            got += data
            continue
        break
    if got == DONE:
        return 0
    stop_tree(job_pid, known, grace_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
