"""The shim's SIGTERM handler runs even when the main thread sits in a wait with no
timeout (dflash_runtime/sigwatch.py).

The race that made ``Pool.terminate()`` hang now and then (a worker's SIGTERM landed
just before its ``SemLock.acquire`` started waiting, the handler never ran, the worker
lived on) is made certain here: the signal is sent to another thread of the process
(``signal.pthread_kill``), which CPython's C handler marks as tripped without
interrupting the main thread's wait. Without tlog the process would die at once; with
the shim's handler and no watch it hung until the test's timeout (checked when this
was written: ``timeout 10`` ended it, rc 124). Each script runs in its own process;
the truth is the process's exit status and the records counted in its file.
"""

from __future__ import annotations

import signal

from runtime_helpers import records, run_child

PRELUDE = """
import multiprocessing as mp, os, signal, sys, threading, time
from dflash_runtime import Recorder
rec = Recorder(sys.argv[1], flush_interval=1.0)
for i in range(30):
    with rec.iteration() as it:
        it.lap("step")
def term_on_another_thread(delay=0.3):
    def go():
        time.sleep(delay)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Thread(target=go, daemon=True).start()
"""

BLOCKED_MAIN = PRELUDE + """
term_on_another_thread()
mp.get_context("fork").Semaphore(0).acquire()   # a Pool worker's get() under terminate()
print("acquired", flush=True)
"""

FORK_CHILD = PRELUDE + """
def child():
    term_on_another_thread()
    mp.get_context("fork").Semaphore(0).acquire()
p = mp.get_context("fork").Process(target=child)
p.start()
p.join(20)
time.sleep(0.5)                                  # a poke from the child's signal would land now
print("child", p.exitcode, "parent alive", flush=True)
rec.close()
"""

USER_HANDLER = """
import signal, sys, threading, time
calls = []
signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
from dflash_runtime import Recorder
rec = Recorder(sys.argv[1], flush_interval=1.0)
with rec.iteration() as it:
    it.lap("step")
def go():
    time.sleep(0.2)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
threading.Thread(target=go, daemon=True).start()
deadline = time.monotonic() + 1.5
while time.monotonic() < deadline:
    time.sleep(0.05)
print("calls", len(calls), flush=True)
rec.close()
"""

LATER_HANDLER = """
import signal, sys, threading, time
from dflash_runtime import Recorder
rec = Recorder(sys.argv[1], flush_interval=1.0)
with rec.iteration() as it:
    it.lap("step")
calls = []
# put in after the shim's, as a framework's checkpoint-on-preemption or a CLI's stop
# request does: the signal is its, and no poke may deliver it again
signal.signal(signal.SIGTERM, lambda s, f: calls.append(s))
def go():
    time.sleep(0.2)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
threading.Thread(target=go, daemon=True).start()
deadline = time.monotonic() + 2.5
while time.monotonic() < deadline:
    time.sleep(0.05)
print("calls", len(calls), flush=True)
rec.close()
"""

OTHER_WAKEUP_FD = """
import os, signal, sys
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
from dflash_runtime import Recorder
rec = Recorder(sys.argv[1])
print("kept", signal.set_wakeup_fd(-1) == w, flush=True)
rec.close()
"""


def test_sigterm_taken_by_another_thread_ends_a_main_thread_blocked_in_a_semlock(tmp_path):
    done = run_child(BLOCKED_MAIN, str(tmp_path), timeout=20)  # hung before the watch: TimeoutExpired
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "acquired" not in done.stdout
    assert [r["iter"] for r in records(tmp_path / "rank0.main.jsonl")] == list(range(30))


def test_a_fork_childs_sigterm_is_watched_in_the_child_and_never_pokes_the_parent(tmp_path):
    done = run_child(FORK_CHILD, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"child {-signal.SIGTERM} parent alive" in done.stdout
    # the child inherited a disabled recorder: the parent's 30 records, written once
    assert [r["iter"] for r in records(tmp_path / "rank0.main.jsonl")] == list(range(30))


def test_a_users_own_handler_runs_once_for_one_signal(tmp_path):
    done = run_child(USER_HANDLER, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "calls 1" in done.stdout  # no poke: the chained handler returns, may not run twice


def test_a_handler_put_in_after_the_shims_gets_the_signal_once(tmp_path):
    """Before, the watch kept poking while the shim's handler was not the one installed:
    the later handler ran again and again, and once it was taken out (a stop request
    ending) the next poke reached the shim's handler, which ended the process."""
    done = run_child(LATER_HANDLER, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "calls 1" in done.stdout, done.stdout


def test_a_wakeup_fd_set_before_the_shim_is_left_as_it_was(tmp_path):
    done = run_child(OTHER_WAKEUP_FD, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "kept True" in done.stdout
