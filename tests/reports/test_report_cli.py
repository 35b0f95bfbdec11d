"""``tlog report``: default and given paths, images, JSON, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import assert_one_line_error, invoke


def _db(scenario_db, *runs: dict) -> Path:
    con = None
    for kw in runs or ({},):
        con, _ = scenario_db(**kw)
    path = Path(
        con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal").fetchall()[0][0]
    )
    con.close()  # the CLI opens it read-only
    return path


def test_run_report_goes_to_tlog_reports_in_the_working_directory(
    scenario_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _db(scenario_db)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    result = invoke(["report", "--run", "two-stage", "--db", str(db)])
    assert result.exit_code == 0, result.output
    expected = work / "tlog-reports" / "two-stage" / "index.html"
    assert result.output.strip() == f"Report written to {expected}"
    html = expected.read_text(encoding="utf-8")
    assert "Bottleneck:" in html and "<title>tlog report: two-stage</title>" in html


def test_images_and_json(scenario_db, tmp_path: Path) -> None:
    db = _db(scenario_db)
    out = tmp_path / "out" / "r.html"
    result = invoke(
        [
            "report",
            "--run",
            "two-stage",
            "--db",
            str(db),
            "-o",
            str(out),
            "--svg",
            "--png",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["html"] == str(out) and out.is_file()
    names = sorted(Path(p).name for p in got["images"])
    charts = ["queues", "rank-phase", "shares", "timeline", "top-phases"]
    assert names == sorted([f"{c}.png" for c in charts] + [f"{c}.svg" for c in charts])
    for name in names:
        data = (out.parent / name).read_bytes()
        if name.endswith(".svg"):
            assert (
                data.startswith(b"<svg")
                and b"hs_get" in (out.parent / "top-phases.svg").read_bytes()
            )
        else:
            assert data.startswith(b"\x89PNG\r\n\x1a\n")


def test_compare_report_default_path(
    scenario_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _db(scenario_db, {"run_id": "base"}, {"run_id": "slow-mask", "mask_build_s": 0.022})
    monkeypatch.chdir(tmp_path)
    result = invoke(["report", "--compare", "base", "slow-mask", "--db", str(db)])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "tlog-reports" / "slow-mask-vs-base" / "index.html").read_text("utf-8")
    assert "<td>mask_build</td>" in html and "+18 ms" in html


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ([], 2, "give exactly one of --run RUN_ID or --compare BASELINE CANDIDATE"),
        (
            ["--run", "a", "--compare", "a", "b"],
            2,
            "give exactly one of --run RUN_ID or --compare BASELINE CANDIDATE",
        ),
        (["--run", "nope"], 1, "no run 'nope' in the database"),
        (["--compare", "two-stage", "two-stage"], 2, "same run"),
    ],
)
def test_errors_are_one_line(scenario_db, args: list[str], code: int, message: str) -> None:
    db = _db(scenario_db)
    result = invoke(["report", *args, "--db", str(db)])
    assert message in assert_one_line_error(result, code)


def test_output_that_cannot_be_written_is_one_line(scenario_db, tmp_path: Path) -> None:
    db = _db(scenario_db)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke(
        [
            "report",
            "--run",
            "two-stage",
            "--db",
            str(db),
            "-o",
            str(blocker / "sub" / "index.html"),
        ],
    )
    assert assert_one_line_error(result, 1).startswith("tlog: error: cannot write ")
