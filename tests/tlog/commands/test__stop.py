"""``tlog.commands._stop.StopRequest``: a signal while following asks to stop at the
next wait; during the wait it stops at once; a second Ctrl-C stops where it lands
(real signals sent to this process)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback

import pytest

from tlog.commands._stop import StopRequest, Terminated


def _in_a_fork(body) -> None:
    """Run ``body`` in a fork of this process: a SIGTERM sent to this pytest worker
    would also reach the shim's SIGTERM watch, which an earlier test of the worker may
    have left running (a fork child has none); exit status 0 if ``body`` passed."""
    def run() -> None:
        try:
            body()
        except BaseException:           # noqa: BLE001 - shown, then the status says it
            traceback.print_exc()
            os._exit(1)
        os._exit(0)

    child = multiprocessing.get_context("fork").Process(target=run)
    child.start()
    child.join(30)
    assert child.exitcode == 0, f"the test's body failed in its fork: exit {child.exitcode}"


def test_a_signal_during_a_round_stops_at_the_next_wait() -> None:
    _in_a_fork(_a_signal_during_a_round)


def _a_signal_during_a_round() -> None:
    stop = StopRequest((signal.SIGINT, signal.SIGTERM))
    waits: list[float] = []
    with stop.handling():
        os.kill(os.getpid(), signal.SIGTERM)         # the round goes on ...
        assert stop.asked and stop.signum == signal.SIGTERM
        sleep = stop.sleep(waits.append)
        with pytest.raises(Terminated):              # ... and the wait ends it
            sleep(1.0)
    assert waits == [] and not stop.forced


def test_a_signal_during_the_wait_stops_at_once() -> None:
    stop = StopRequest()

    def wait(_s: float) -> None:
        os.kill(os.getpid(), signal.SIGINT)          # arrives while waiting
        raise AssertionError("not reached: the handler raises")

    with stop.handling(), pytest.raises(KeyboardInterrupt):
        stop.sleep(wait)(5.0)
    assert stop.signum == signal.SIGINT and not stop.forced


def test_ctrl_c_twice_is_forced_and_ending_swallows_what_came_out() -> None:
    stop = StopRequest()
    with stop.handling():
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert stop.forced
    assert stop.forced_note == (" (Ctrl-C twice: stopped at once, a transaction in progress "
                                "rolled back)")
    with stop.ending():                # inside DuckDB the second one came out as this
        raise RuntimeError("Query interrupted")


def test_ending_lets_a_real_error_through_and_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    stop = StopRequest()
    with stop.handling():
        assert signal.getsignal(signal.SIGINT) != before
    assert signal.getsignal(signal.SIGINT) == before
    with pytest.raises(ValueError), stop.ending():
        raise ValueError("a bug")
    with stop.ending():
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), stop.ending(on=False):
        raise KeyboardInterrupt
    assert stop.forced_note == ""
