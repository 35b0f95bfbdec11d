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
