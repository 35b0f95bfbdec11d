"""``ingest.manifest``: ``run.json`` read and checked, each refusal one line naming
the file and the field; timestamps and run ids judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tlog.ingest.errors import RunDirError
from tlog.ingest.manifest import Manifest, epoch_problem, read_manifest, run_id_problem


def _run(tmp_path: Path, text: str | bytes) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    path = run / "run.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return run


@pytest.mark.parametrize(("value", "problem"), [
    (1764403200.0, None), (0.0, None), (-1.0, "negative"),
    (1764403200123.0, "looks like milliseconds"), (1764403200123456.0, "looks like microseconds"),
    (1.7644032e18, "looks like nanoseconds"), (1e21, "out of range"),
    (float("nan"), "not finite"), (float("inf"), "not finite"),
])
def test_epoch_problem(value: float, problem: str | None) -> None:
    assert epoch_problem(value) == problem


def test_run_id_problem() -> None:
    assert run_id_problem("dflash-2026-11-29-a") is None
    assert run_id_problem("  ") == "is empty"
    assert run_id_problem("x" * 513) == "is 513 characters long (at most 512)"
    assert run_id_problem("a\nb") == "holds the control character '\\n' at position 2"
    assert run_id_problem("é/ü ok") is None


def test_a_full_manifest(tmp_path: Path) -> None:
    raw = {"v": 1, "run_id": "r-1", "name": "all-SWA", "started": 1764403200, "world_size": 8,
           "tags": {"git_sha": "abc"}, "config": {"block": 16},
           "phase_kinds": {"hs_get": "starvation"}}
    m = read_manifest(_run(tmp_path, json.dumps(raw)))
    assert m == Manifest(present=True, run_id="r-1", name="all-SWA", started=1764403200.0,
                         world_size=8, tags={"git_sha": "abc"}, config={"block": 16},
                         phase_kinds={"hs_get": "starvation"}, raw=raw, warnings=[])
    assert m.gives_phase_kinds


def test_no_manifest_and_an_empty_one(tmp_path: Path) -> None:
    none = read_manifest(tmp_path)
    assert none == Manifest() and not none.present and not none.gives_phase_kinds
    # a byte-order mark is no error; null fields are absent ones
    m = read_manifest(_run(tmp_path, b'\xef\xbb\xbf{"run_id": null, "tags": null}'))
    assert m.present and m.run_id is None and m.tags == {} and m.gives_phase_kinds


def test_an_implausible_start_is_a_warning_not_an_error(tmp_path: Path) -> None:
    m = read_manifest(_run(tmp_path, '{"started": 1764403200000}'))
    assert m.started is None
    (w,) = m.warnings
    assert w.endswith("run.json: field 'started' (1764403200000) looks like milliseconds for "
                      "epoch seconds (at most 1e+11); ignored, the earliest iteration ts is "
                      "used")


@pytest.mark.parametrize(("text", "says"), [
    ('{"v": 1,', (":1: not valid JSON (Expecting property name enclosed in double quotes); "
                 "fix or remove the manifest")),
    ('[1, 2]', ": the manifest must be a JSON object, not list"),
    ('{"v": 2}', ": unknown manifest version 2 (this tlog reads version 1); upgrade tlog"),
    ('{"run_id": 7}', ": field 'run_id' must be a string, got 7"),
    ('{"run_id": " "}', ": field 'run_id' is empty; remove it to use the directory name"),
    ('{"run_id": "a\\u0007b"}', (": field 'run_id' holds the control character '\\x07' at "
                                "position 2; fix it, or remove it to use the directory name")),
    ('{"world_size": 0}', (": field 'world_size' must be a positive integer up to 2147483647, "
                          "got 0")),
    ('{"world_size": true}', ": field 'world_size' must be a positive integer, got true"),
    ('{"phase_kinds": {"x": "waiting"}}', (": phase_kinds['x'] = \"waiting\" is not a category; "
                                          "use one of backpressure, compute, starvation, sync")),
    ('{"tags": {}, "tags": {}}', (": not valid JSON (duplicate key 'tags'); fix or remove the "
                                 "manifest")),
    ('{"name": "\\ud800"}', (": a string holds \\ud800, half of a UTF-16 pair (not a "
                            "character); fix the manifest")),
    (b'{"name": "\xff"}', ": not UTF-8 text; the manifest must be a JSON object"),
])
def test_bad_manifests_are_one_line_naming_the_field(tmp_path: Path, text, says: str) -> None:
    run = _run(tmp_path, text)
    with pytest.raises(RunDirError) as info:
        read_manifest(run)
    assert str(info.value) == f"{run / 'run.json'}{says}"
    assert "\n" not in str(info.value)
