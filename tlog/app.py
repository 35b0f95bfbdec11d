"""The typer application and what every command shares.

Each command module in ``tlog/commands/`` registers itself on :data:`app`.
Library exceptions (:class:`ingest.errors.TlogError`) become one line on
stderr, ``tlog: error: <message>``, and the error's exit code (1, or 2 for a
usage error), in one place: :class:`_Group`. Commands only parse, call the
library and render.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from ingest.errors import TlogError

#: Console for human output (stdout) and for errors (stderr).
console = Console()
err_console = Console(stderr=True)


class _Group(TyperGroup):
    """Turns every :class:`TlogError` into a one-line message and exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except TlogError as exc:
            fail(str(exc), code=exc.exit_code)
        except KeyboardInterrupt:
            err_console.print("tlog: interrupted", highlight=False)
            raise typer.Exit(code=130) from None


app = typer.Typer(
    cls=_Group,
    name="tlog",
    help="Find where multi-GPU training pipelines lose their time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)


def fail(message: str, *, code: int = 1) -> None:
    """Print ``tlog: error: MESSAGE`` on stderr and exit with ``code``."""
    err_console.print(f"tlog: error: {message}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(code=code)


def json_ready(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None, recursively (JSON has
    no NaN: a share of an empty stage is undefined, not zero)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON on stdout (no colour, no wrapping); NaN and
    infinities become ``null`` (:func:`json_ready`)."""
    sys.stdout.write(json.dumps(json_ready(data), indent=2, default=str, allow_nan=False) + "\n")


# Option bundles shared by several commands, defined once.
DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="Database file (default: $TLOG_DB, else tlog.duckdb in the user data dir).",
                 dir_okay=False, envvar=None, show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
