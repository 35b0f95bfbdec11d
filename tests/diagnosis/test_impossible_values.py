"""Impossible values in an older database: 1e308 + 1e308 must not break
``diagnose`` or ``report``.

Ingest now rejects durations that are negative, not finite or over a day, but a
database written before may hold them. The rows are written straight into the
database (no ingest), and analysis must leave exactly those iterations out,
say so, and give the figures of the rest, computed here by hand.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tlog.analyze import attribute, diagnose
from tlog.ingest.errors import RunNotFoundError

from tests.support.cli import invoke
from tests.support.runbuilder import RunBuilder, loop

N = 40
#: iteration -> what is wrong with it
POISON = {
    10: "phase 1e308",
    11: "phase 1e308",       # with 10: the sum overflows to infinity
    12: "phase NaN",
    13: "device inf",
    14: "phase negative",
    15: "dur NaN",
    16: "phase two days",
}


def _phases(i: int) -> list[tuple]:
    fwd, get, gpu = 0.030, 0.010, 0.020
    what = POISON.get(i)
    if what == "phase 1e308":
        get = 1e308
    elif what == "phase NaN":
        get = math.nan
    elif what == "device inf":
        gpu = math.inf
    elif what == "phase negative":
        get = -0.010
    elif what == "phase two days":
        fwd = 2 * 86400.0
    return [("forward", fwd, gpu), ("hs_get", get)]


def _build(tmp_path: Path):
    b = RunBuilder("old")
    for i in range(N):  # every 50 ms; one dur is NaN, its ts is not
        b.iteration(iter=i, ts=1000.0 + 0.050 * i, phases=_phases(i),
                    dur=math.nan if POISON.get(i) == "dur NaN" else 0.050)
    path = tmp_path / "t.duckdb"
    b.write(path).close()
    return path


def test_diagnose_leaves_out_exactly_the_impossible_iterations(tmp_path: Path) -> None:
    from tlog.ingest.db import connect

    con = connect(_build(tmp_path), read_only=True)
    try:
        d = diagnose(con, "old").to_dict()
        its = attribute(con, "old").iteration_frame()
        ph = attribute(con, "old").phase_frame(steady_only=False)
    finally:
        con.close()
    kept = N - len(POISON)
    assert its.height == kept
    assert sorted(set(range(N)) - set(its["iter"].to_list())) == sorted(POISON)
    assert f"{len(POISON)} iterations were left out: a duration or phase time is negative, " \
           "not finite or longer than a day" in " ".join(d["notes"])
    # Every kept iteration: forward 30 ms (compute), hs_get 10 ms (starvation),
    # 10 ms in no phase, of 50 ms.
    assert its["compute_s"].to_list() == pytest.approx([0.030] * kept)
    assert its["starvation_s"].to_list() == pytest.approx([0.010] * kept)
    assert its["unaccounted_s"].to_list() == pytest.approx([0.010] * kept)
    assert its["gpu_s"].to_list() == pytest.approx([0.020] * kept)
    fwd = ph.filter(ph["phase"] == "forward").row(0, named=True)
    assert fwd["iterations"] == kept
    assert fwd["host_s"] == pytest.approx(0.030 * kept)
    assert fwd["gpu_s"] == pytest.approx(0.020 * kept)
    shares = d["stages"][0]["categories"]
    assert all(math.isfinite(v) for v in shares.values())
    assert shares["compute"] == pytest.approx(0.6)
    assert shares["starvation"] == pytest.approx(0.2)
    assert shares["unaccounted"] == pytest.approx(0.2)


def test_report_and_cli_survive_impossible_values(tmp_path: Path) -> None:
    from tlog.ingest.db import connect
    from tlog.reports import write_run_report
    from tlog.reports.data import load_report_data

    path = _build(tmp_path)
    con = connect(path, read_only=True)
    try:
        data = load_report_data(con, "old")
        files = write_run_report(con, "old", tmp_path / "out" / "index.html")
    finally:
        con.close()
    stats = {r["phase"]: r for r in data.phase_stats.iter_rows(named=True)}
    # The top phases' statistics skip the left-out iterations too: exactly 10 and 30 ms.
    assert stats["hs_get"]["mean_s"] == pytest.approx(0.010)
    assert stats["hs_get"]["p95_s"] == pytest.approx(0.010)
    assert stats["forward"]["mean_s"] == pytest.approx(0.030)
    assert "7 iterations were left out" in files.html.read_text(encoding="utf-8")
    result = invoke(["diagnose", "--run", "old", "--db", str(path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.startswith("Bottleneck: main - 20% of its time is in no phase")
    assert "7 iterations were left out" in text


def test_a_run_with_only_impossible_iterations_is_one_clear_error(tmp_path: Path) -> None:
    b = RunBuilder("bad")
    loop(b, 3, [("forward", 1e308), ("hs_get", 1e308)], dur=0.05)
    path = tmp_path / "t.duckdb"
    con = b.write(path)
    try:
        with pytest.raises(RunNotFoundError, match="all 3 have a duration or phase time"):
            diagnose(con, "bad")
    finally:
        con.close()
    result = invoke(["diagnose", "--run", "bad", "--db", str(path)])
    assert result.exit_code != 0
    assert result.output.startswith("tlog: error: run 'bad' holds no iteration tlog can")
