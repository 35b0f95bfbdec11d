"""What a framework callback needs beyond begin/end: an iteration begun
after its start (``begin_iteration(start=t)``, the fetch recorded with ``add_wait``)
and an event recorded after it ended (``add_event``). Fake clock; values by hand."""

from __future__ import annotations

from runtime_helpers import WALL0, records

from dflash_runtime import Recorder


def test_an_iteration_begun_late_starts_at_start(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    clock.t = 100.25                        # the callback learns of the step here,
    it = rec.begin_iteration(start=100.0)   # after a fetch that began at 100.0
    it.add_wait("data_fetch", 100.0, 100.25, "starvation")
    it.begin("forward")
    clock.t = 101.0
    rec.end_iteration()
    clock.t = 102.0
    it = rec.begin_iteration(start=103.0)   # a start after now is ignored: now
    clock.t = 102.5
    rec.end_iteration()
    rec.close()
    first, second = records(rec.path)
    assert (first["ts"], first["dur"]) == (WALL0 + 100.0, 1.0)
    assert first["phases"] == {"data_fetch": 0.25, "forward": 0.75}
    assert first["kinds"] == {"data_fetch": "starvation"}
    assert (second["ts"], second["dur"]) == (WALL0 + 102.0, 0.5)


def test_add_event_records_a_span_that_already_ended(tmp_path, clock) -> None:
    rec = Recorder(tmp_path, install_handlers=False, cpu=False, mem_every=0)
    clock.t = 110.0
    rec.add_event("evaluate", 104.0, 109.5, step=8)
    rec.add_event("odd", 5.0, 4.0)          # end before start: dur 0
    rec.close()
    ev, odd = records(rec.path, "event")
    assert (ev["name"], ev["ts"], ev["dur"], ev["step"]) == ("evaluate", WALL0 + 104.0, 5.5, 8)
    assert (odd["ts"], odd["dur"]) == (WALL0 + 5.0, 0.0)
    off = Recorder(tmp_path, enabled=False)
    off.add_event("evaluate", 1.0, 2.0)     # disabled: nothing, no error
