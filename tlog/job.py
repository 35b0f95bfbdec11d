"""Run a training job for ``tlog run``: its environment, its signals, its exit status.

The job (``torchrun ... train.py``, ``python train.py``, any command) is started as
a child process in a process group of its own, with the environment the shim
reads (:func:`job_env`: ``TLOG_RUN_DIR``, ``TLOG_RUN_ID``, ``TLOG_TAGS``), and
tlog waits for it. Signals sent to tlog go on to the job, escalating
(:class:`_Relay`):

1. the first SIGINT (Ctrl-C) or SIGTERM is passed on, as it is, to the
   job's process group, as a shell passes Ctrl-C to a foreground job:
   ``torchrun`` hands it to each rank (each rank runs in a session of its
   own, so only torchrun can), a plain ``python train.py`` gets its
   ``KeyboardInterrupt``; the shim writes its logs at exit (or in its SIGTERM
   flush handler). A SIGHUP (the terminal closed) goes on as SIGTERM: Python's
   default SIGHUP ends a rank without the shim's flush;
2. the second: SIGTERM to every process of the job (the launcher, its ranks,
   their workers): the shim's SIGTERM handler flushes each rank's logs, then
   the rank dies;
3. the third and later: SIGKILL to every process of the job.

When the job's main process has ended, any process of the job still running
(a rank whose launcher was killed, a helper it left behind) is stopped:
SIGTERM, then SIGKILL after :data:`LEFTOVER_GRACE_S`. On Linux tlog makes
itself the "child subreaper" of the job for its duration, so a rank orphaned
by its launcher's death is re-parented to tlog rather than to init, and found;
and the job's main process gets SIGTERM should tlog itself die (``PR_SET_PDEATHSIG``:
torchrun then stops its ranks). Beside the job runs a watchdog (``tlog/_watchdog.py``,
a small process in a session of its own): should tlog die, however (``kill -9``
included), it stops the job's whole process tree, its process group and every
process it saw in it (SIGTERM, then SIGKILL after :data:`LEFTOVER_GRACE_S`), so
no process of the job outlives tlog.

Nothing here prints: messages go through the ``notify`` callback; the CLI
(``tlog/commands/run.py``) renders.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from dflash_runtime.recorder import RUN_DIR_ENV, RUN_ID_ENV, TAGS_ENV
from tlog.ingest.errors import TlogError

#: Seconds the job's processes still running after its main process ended get
#: between SIGTERM and SIGKILL: the shim's SIGTERM flush takes at most about
#: 1 s (``dflash_runtime.writer.SIGTERM_FLUSH_S``) plus the process's exit.
#: tlog's choice.
LEFTOVER_GRACE_S = 5.0

#: Signals tlog passes on to the job (escalating, module docstring).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: Linux prctl options: the signal a process gets when its parent dies; make
#: this process the subreaper of its descendants.
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 1, 36, 37


class CommandNotFoundError(TlogError):
    """The job's command is not found (exit code 127, as a shell gives)."""

    exit_code = 127


class CommandNotRunnableError(TlogError):
    """The job's command exists but cannot be executed (exit code 126, as a shell gives)."""

    exit_code = 126


@dataclass(frozen=True)
class JobResult:
    """How a job ended.

    Attributes:
        exit_code: the job's exit status as a shell gives it: its own code, or
            128 + N when signal N ended its main process.
        signal: the signal that ended the job's main process, or None.
        interrupts: signals tlog received and passed on (0: the job ended by itself).
        leftovers: pids of the job's processes still running after its main
            process ended, which tlog stopped.
        seconds: wall seconds from start to the end of the main process.
    """

    exit_code: int
    signal: int | None
    interrupts: int
    seconds: float
    leftovers: list[int] = field(default_factory=list)


def job_env(base: Mapping[str, str], run_dir: Path, run_id: str,
            tags: Mapping[str, str]) -> dict[str, str]:
    """``base`` plus what :meth:`dflash_runtime.Recorder.from_env` reads in every
    rank: ``TLOG_RUN_DIR`` (absolute, so a job that changes directory still
    finds it), ``TLOG_RUN_ID``, ``TLOG_TAGS`` (the tags as one JSON object; left
    out when there are none)."""
    env = dict(base)
    env[RUN_DIR_ENV] = str(Path(run_dir).resolve())
    env[RUN_ID_ENV] = run_id
    if tags:
        env[TAGS_ENV] = json.dumps(dict(tags), separators=(",", ":"))
    else:
        env.pop(TAGS_ENV, None)
    return env


def default_run_id(argv: Sequence[str], now: datetime | None = None) -> str:
    """``<script>-<YYYYmmdd-HHMMSS>``: the first ``*.py`` argument's stem (the
    training script behind ``torchrun`` or ``python``), else the command's
    name; local time."""
    script = next((Path(a).stem for a in argv if a.endswith(".py")), Path(argv[0]).name)
    return f"{script or 'run'}-{(now or datetime.now()).strftime('%Y%m%d-%H%M%S')}"


def exit_code_of(returncode: int) -> int:
    """A ``Popen.returncode`` as a shell's exit status: -N (killed by signal N)
    becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _libc() -> Any:
    """The C library (Linux), for ``prctl``; None elsewhere or when it cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _set_subreaper(on: bool) -> bool | None:
    """Make this process the child subreaper (Linux) or stop being one; return
    the previous setting, or None where the system has no such thing."""
    libc = _libc()
    if libc is None:
        return None
    try:
        import ctypes

        prev = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(prev), 0, 0, 0) != 0:
            return None
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            return None
        return bool(prev.value)
    except (OSError, AttributeError):
        return None


def _job_processes(started: float, exclude: frozenset[int] = frozenset()) -> list[Any]:
    """The running processes of the job: this process's descendants created
    since ``started`` (epoch s; older children are not the job's), but the pids
    of ``exclude`` (the job's watchdog). Zombies (ended, not yet reaped) are
    reaped when they are this process's children and left out."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.pid in exclude or p.create_time() < started - 1.0:
                continue
            if p.status() == psutil.STATUS_ZOMBIE:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(p.pid, os.WNOHANG)
                continue
            out.append(p)
    return out


def _send(procs: list[Any], pgid: int | None, sig: int) -> None:
    """``sig`` to the job's process group and to each of ``procs`` (those gone are skipped)."""
    import psutil

    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _stop(procs: list[Any], pgid: int | None, grace_s: float) -> None:
    """SIGTERM to ``procs`` and the group, SIGKILL to what outlives ``grace_s``;
    reap those that are this process's children."""
    import psutil

    _send(procs, pgid, signal.SIGTERM)
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    if alive:
        _send(alive, pgid, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace_s)
    elif pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


class _Relay:
    """The signal handler of tlog while the job runs (module docstring, steps 1-3)."""

    def __init__(self, notify: Callable[[str], None], started: float) -> None:
        self.notify = notify
        self.started = started
        self.proc: subprocess.Popen | None = None
        self.count = 0
        self.early: int | None = None   # a signal that came before the job existed
        self.exclude: frozenset[int] = frozenset()   # tlog's own helpers (the watchdog)

    def __call__(self, signum: int, _frame: Any) -> None:
        self.count += 1
        if self.proc is None:
            self.early = signum
            return
        self.forward(signum)

    def forward(self, signum: int) -> None:
        name = signal.Signals(signum).name
        pgid = self.proc.pid
        if self.count == 1:
            sent = signal.SIGTERM if signum == signal.SIGHUP else signum
            _send([], pgid, sent)
            self._say(f"{name}: {signal.Signals(sent).name} passed on to the job; waiting "
                      f"for it to stop (Ctrl-C again: SIGTERM to all its processes)")
            return
        procs = _job_processes(self.started, self.exclude)
        sig = signal.SIGTERM if self.count == 2 else signal.SIGKILL
        _send(procs, pgid, sig)
        again = " (Ctrl-C again: SIGKILL)" if sig == signal.SIGTERM else ""
        self._say(f"{name} again: {signal.Signals(sig).name} to the job's "
                  f"{len(procs)} processes{again}")

    def _say(self, message: str) -> None:
        """``notify``, never raising out of the signal handler (a terminal that
        hung up fails the write; the job must still be waited for)."""
        with contextlib.suppress(Exception):
            self.notify(message)


class Job:
    """A job started in a process group of its own, with tlog's signal relay
    (module docstring) installed while it runs: ``with Job(argv, env) as job:``
    then :meth:`poll` (a caller doing work meanwhile, e.g. a live view) or
    :meth:`wait`. Leaving the block restores the signal handlers; a job still
    running then (the caller's own error) is stopped as leftovers are.

    The job inherits tlog's standard output and error (with ``output``, both
    are appended to that file instead: ``tlog run --live`` draws on the
    terminal); its standard input too,
    except a terminal: a process group other than the terminal's foreground one
    may not read it (it would stop), so the job then reads ``/dev/null``.
    Signal handlers are installed only from the main thread.

    Raises (on entering):
        CommandNotFoundError: the command is not found (exit code 127).
        CommandNotRunnableError: it cannot be executed (126).
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *,
                 notify: Callable[[str], None] = lambda _m: None,
                 grace_s: float = LEFTOVER_GRACE_S, output: Path | None = None) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.output = output
        self.grace_s = grace_s
        self.started = time.time()
        self._t0 = time.perf_counter()
        self._relay = _Relay(notify, self.started)
        self._previous: dict[int, Any] = {}
        self._reaper: bool | None = None
        self._watchdog: _Watchdog | None = None
        self.result: JobResult | None = None

    def __enter__(self) -> Self:
        if sys.platform != "win32" and _is_main_thread():
            self._previous = {s: signal.signal(s, self._relay) for s in FORWARDED}
        self._reaper = _set_subreaper(True)
        try:
            self._relay.proc = _popen(self.argv, self.env, self.output)
        except BaseException:
            self._restore()
            raise
        self._watchdog = _Watchdog.start(self._relay.proc.pid, self.started, self.grace_s)
        if self._watchdog is not None:
            self._relay.exclude = frozenset({self._watchdog.proc.pid})
        if self._relay.early is not None:
            self._relay.forward(self._relay.early)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.result is None and self._relay.proc is not None:
                self._relay.proc.kill()
                self._finish(self._relay.proc.wait())
        finally:
            self._restore()
            if self._watchdog is not None:
                self._watchdog.release()
                self._watchdog = None

    @property
    def pid(self) -> int:
        """The job's main process (also its process group id)."""
        return self._relay.proc.pid

    def poll(self) -> JobResult | None:
        """The result once the job's main process has ended (its leftovers
        stopped first), else None."""
        if self.result is None and (code := self._relay.proc.poll()) is not None:
            self._finish(code)
        return self.result

    def wait(self) -> JobResult:
        """Wait for the job's main process to end (signals are relayed
        meanwhile); stop its leftovers; return the result."""
        if self.result is None:
            self._finish(self._relay.proc.wait())
        return self.result

    def _finish(self, returncode: int) -> None:
        seconds = time.perf_counter() - self._t0
        leftovers = _job_processes(self.started, self._relay.exclude)
        if leftovers or _group_alive(self.pid):
            _stop(leftovers, self.pid, self.grace_s)
        self.result = JobResult(exit_code=exit_code_of(returncode),
                                signal=-returncode if returncode < 0 else None,
                                interrupts=self._relay.count, seconds=seconds,
                                leftovers=[p.pid for p in leftovers])

    def _restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
        if self._reaper is not None:
            _set_subreaper(self._reaper)
            self._reaper = None


class _Watchdog:
    """The job's watchdog process (``tlog/_watchdog.py``, module docstring): it
    stops the job's process tree if tlog dies before :meth:`release`."""

    def __init__(self, proc: subprocess.Popen, write_fd: int) -> None:
        self.proc = proc
        self._fd = write_fd

    @classmethod
    def start(cls, job_pid: int, started: float, grace_s: float) -> _Watchdog | None:
        """Start the watchdog of the job ``job_pid`` (also its process group);
        None where it cannot run (no psutil, no pipes: tlog's own stop still works)."""
        script = Path(__file__).with_name("_watchdog.py")
        try:
            r, w = os.pipe()
        except OSError:
            return None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(script), str(job_pid), str(os.getpid()),
                 repr(started), repr(grace_s)],
                stdin=r, stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            os.close(w)
            return None
        finally:
            os.close(r)
        return cls(proc, w)

    def release(self) -> None:
        """tlog ended the job itself: tell the watchdog so, and wait for it to exit."""
        with contextlib.suppress(OSError):
            from tlog._watchdog import DONE

            os.write(self._fd, DONE)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _popen(argv: list[str], env: dict[str, str], output: Path | None = None
           ) -> subprocess.Popen:
    """Start ``argv`` in a process group of its own (:class:`Job`); with
    ``output``, its standard output and error are appended to that file."""
    import threading

    stdin = subprocess.DEVNULL if _stdin_is_tty() else None
    # Code between fork and exec is safe only while no other thread may hold a
    # lock (the CLI has none yet); otherwise the job goes without PDEATHSIG.
    libc = _libc() if threading.active_count() == 1 else None

    def die_with_tlog() -> None:   # in the child, before exec: SIGTERM when tlog dies
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    out = open(output, "ab") if output is not None else None  # noqa: SIM115 (closed below)
    try:
        return subprocess.Popen(argv, env=env, stdin=stdin, process_group=0,
                                preexec_fn=die_with_tlog if libc is not None else None,  # noqa: PLW1509
                                stdout=out, stderr=subprocess.STDOUT if out else None)
    except FileNotFoundError:
        raise CommandNotFoundError(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise CommandNotRunnableError(f"{argv[0]}: permission denied (not executable)"
                                      ) from None
    except OSError as exc:
        raise CommandNotRunnableError(f"{argv[0]}: cannot run it: {exc.strerror or exc}"
                                      ) from None
    finally:
        if out is not None:
            out.close()          # the job holds its own copy


def run_job(argv: Sequence[str], env: Mapping[str, str], *,
            notify: Callable[[str], None] = lambda _m: None,
            grace_s: float = LEFTOVER_GRACE_S) -> JobResult:
    """Run ``argv`` with ``env`` until it ends, passing signals on (module
    docstring; :class:`Job` for the details and errors); return its :class:`JobResult`."""
    with Job(argv, env, notify=notify, grace_s=grace_s) as job:
        return job.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _stdin_is_tty() -> bool:
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, ValueError, OSError):
        return False
