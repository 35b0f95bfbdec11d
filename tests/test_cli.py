"""The CLI face: every command documents itself; errors are one line, never a traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import tlog.cli  # noqa: F401  (registers every command)
from tlog.app import app

runner = CliRunner()


def _commands() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    return sorted(group.commands)


def test_every_command_has_help_text() -> None:
    import typer.main

    group = typer.main.get_command(app)
    assert group.commands, "no command registered"
    missing = [name for name, cmd in group.commands.items() if not (cmd.help or "").strip()]
    assert not missing, f"commands without help text: {missing}"


@pytest.mark.parametrize("name", _commands())
def test_command_help_exits_zero(name: str) -> None:
    result = runner.invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_phase_names_are_printed_literally_never_as_markup(tmp_path) -> None:
    """A phase name in square brackets ("[param|fc1]", "[red]x") is text:
    rich would read it as markup and drop it (issue 12, "smaller ones")."""
    import json

    run = tmp_path / "brackets"
    run.mkdir()
    lines = []
    for i in range(30):
        lines.append(json.dumps({"iter": i, "ts": 1000.0 + i * 0.1, "dur": 0.1,
                                 "phases": {"[param|fc1]": 0.07, "[red]x": 0.02}}))
    (run / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    db = str(tmp_path / "t.duckdb")
    assert runner.invoke(app, ["ingest", str(run), "--db", db]).exit_code == 0
    result = runner.invoke(app, ["diagnose", "--run", "brackets", "--db", db])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "[param|fc1]" in text
    assert "[red]x" in text
