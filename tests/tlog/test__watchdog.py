"""``tlog._watchdog``: the whole process tree of a job stopped, and nothing when tlog
ended the job itself (real processes: ``sleep`` children in a group of their own)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from tlog import _watchdog


def _tree() -> tuple[subprocess.Popen, int]:
    """A job (its own process group) that started a child, which ignores SIGTERM."""
    code = ("import signal, subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
            "time.sleep(60)'], stdout=subprocess.PIPE); "
            "c.stdout.readline(); print(c.pid, flush=True); time.sleep(60)")
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           process_group=0)
    child = int(job.stdout.readline())
    return job, child


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stop_tree_terms_then_kills_what_ignores_it() -> None:
    job, child = _tree()
    try:
        t0 = time.monotonic()
        _watchdog.stop_tree(job.pid, {}, grace_s=0.5)
        job.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child)
        assert time.monotonic() - t0 >= 0.5           # the grace came before SIGKILL
    finally:
        for pid in (job.pid, child):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def _watch(job: subprocess.Popen) -> subprocess.Popen:
    """The watchdog as tlog starts it: ``python -I _watchdog.py JOB TLOG STARTED GRACE``,
    its standard input a pipe only this process writes."""
    return subprocess.Popen([sys.executable, "-I", _watchdog.__file__, str(job.pid),
                             str(os.getpid()), str(time.time() - 5), "0.5"],
                            stdin=subprocess.PIPE, start_new_session=True)


def test_done_on_the_pipe_leaves_the_job_alone() -> None:
    job, child = _tree()
    try:
        dog = _watch(job)
        dog.stdin.write(_watchdog.DONE)
        dog.stdin.close()
        assert dog.wait(timeout=30) == 0
        assert job.poll() is None and not _gone(child)
    finally:
        os.killpg(job.pid, 9)
        os.kill(child, 9)
        job.wait(timeout=10)


def test_the_pipes_end_without_done_stops_the_tree() -> None:
    job, child = _tree()
    try:
        dog = _watch(job)
        time.sleep(1.0)                      # a tick or two: the processes noted
        dog.stdin.close()                    # as when tlog dies
        assert dog.wait(timeout=30) == 0
        job.wait(timeout=10)
        assert _gone(child)
    finally:
        for pid in (job.pid, child):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
