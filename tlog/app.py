"""The typer application and what every command shares.

Each command module in ``tlog/commands/`` registers itself on :data:`app`.
Library exceptions (:class:`ingest.errors.TlogError`) become one line on
stderr, ``tlog: error: <message>``, and the error's exit code (1, or 2 for a
usage error), in one place: :class:`_Group`. Commands only parse, call the
library and render.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperGroup

from tlog.ingest.errors import TlogError, UsageError

#: Set this environment variable (to anything) to see the Python traceback of an
#: unexpected error instead of its one-line summary.
DEBUG_ENV = "TLOG_DEBUG"


def _one_line(text: str) -> str:
    """``text`` with its line breaks and runs of white space as single spaces."""
    return " ".join(text.split())


def _usage_line(exc: ClickException, args: Any = ()) -> str:
    """A click parse error (bad option value, missing argument, unknown option)
    as one line, pointing at the command's ``--help``; ``args``: the command
    line, to say where an option given before its command goes."""
    message = _one_line(exc.format_message()).rstrip(".")
    message = message[:1].lower() + message[1:]
    ctx = getattr(exc, "ctx", None)
    option = getattr(exc, "option_name", None)
    if ctx is not None and ctx.parent is None and option:
        # 'tlog --db X runs': the option belongs to the command, after its name
        command = _taker(ctx, option, list(args))
        if command is not None:
            return (f"{message}: options go after the command, e.g. 'tlog {command} "
                    f"{option} ...' (see 'tlog {command} --help')")
    if ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


def _taker(ctx: Any, option: str, args: list[str]) -> str | None:
    """The command that takes ``option``: the one named on the command line if
    it does, else the first that does; None when none does."""
    group = ctx.command
    names = list(getattr(group, "list_commands", lambda _c: [])(ctx))

    def takes(name: str) -> bool:
        cmd = group.get_command(ctx, name)
        return cmd is not None and any(option in p.opts for p in cmd.params)

    given = next((a for a in args if a in names), None)
    if given is not None and takes(given):
        return given
    return next((n for n in names if takes(n)), None)


#: ``(errno, words of DuckDB's text, message)`` of failures of the machine, not
#: of tlog: each gets its own line with what to do.
_MACHINE_FAILURES: tuple[tuple[int | None, tuple[str, ...], str], ...] = (
    (errno.ENOSPC, ("no space left on device",),
     ("disk full (no space left on device){where}: free space (or pass --db on another "
     "disk) and run the command again; an ingest goes on where it stopped")),
    (errno.EFBIG, ("file too large",),
     ("file size limit reached (file too large){where}: raise the limit (ulimit -f) or "
     "pass --db on another file system, and run the command again")),
    (errno.EDQUOT, ("disk quota exceeded",),
     "disk quota exceeded{where}: free space or raise the quota, and run the command again"),
    (None, ("out of memory", "could not allocate", "failed to allocate"),
     ("out of memory{where}: close other programs or run on a machine with more memory; "
     "an ingest goes on where it stopped")),
    (None, ("corrupt", "checksum", "invalid block", "failed to read block",
            "serializ", "malformed database"),
     ("the database looks damaged ({detail}){where}: keep a copy of the file, then move it "
     "away and ingest the runs again into a new one (tlog ingest RUN_DIR --db NEW)")),
)


def machine_failure(exc: BaseException) -> str | None:
    """The one-line message for a failure of the machine or of the database
    file (disk full, file-size limit, quota, out of memory, a damaged
    database), or None when ``exc`` is none of them."""
    import duckdb

    if isinstance(exc, MemoryError | duckdb.OutOfMemoryException):
        return _MACHINE_FAILURES[3][2].format(where="", detail="")
    code = getattr(exc, "errno", None)
    where = f" writing {exc.filename}" if getattr(exc, "filename", None) else ""
    text = str(exc).lower()
    detail = _one_line(str(exc).split("\n", 1)[0])[:120]
    for number, words, message in _MACHINE_FAILURES:
        if (number is not None and code == number) or (
                isinstance(exc, duckdb.Error) and any(w in text for w in words)):
            return message.format(where=where, detail=detail)
    if isinstance(exc, duckdb.FatalException | duckdb.InternalException) and (
            "database" in text or "block" in text or "storage" in text):
        return _MACHINE_FAILURES[-1][2].format(where=where, detail=detail)
    return None


def interrupted_in_duckdb(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a Ctrl-C that DuckDB let
    out as another exception. Raised inside a statement, Python's
    KeyboardInterrupt comes out of DuckDB (2.0.1, measured:
    tlog/commands/_stop.py) as ``RuntimeError('Query interrupted')`` (a
    statement that polls for signals), ``duckdb.InterruptException``, or a
    ``duckdb.Error`` whose message names it (Python code the statement ran:
    a registered table's scan)."""
    import duckdb

    seen: BaseException | None = exc
    for _ in range(4):               # exc, then what it was raised from
        if seen is None:
            return False
        if (type(seen) is RuntimeError and str(seen) == "Query interrupted") or isinstance(
                seen, duckdb.InterruptException) or (
                isinstance(seen, duckdb.Error) and "KeyboardInterrupt" in str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _interrupted() -> None:
    err_console.print("tlog: interrupted", highlight=False)
    raise typer.Exit(code=130) from None


class _Group(TyperGroup):
    """Turns every failure into one line ``tlog: error: ...`` and an exit code.

    - :class:`TlogError`: its message and exit code (1, or 2 for a usage error);
    - click's own parse errors (bad option value, missing argument, unknown
      option or command): exit 2, instead of click's four-line usage block;
    - an :class:`OSError` that no layer turned into a TlogError (a file that
      cannot be read or written): its reason and file, exit 1;
    - Ctrl-C: ``tlog: interrupted``, exit 130 (as a shell reports SIGINT),
      also when DuckDB let it out as another error (:func:`interrupted_in_duckdb`);
    - anything else is a bug in tlog: its type and first line, exit 1, and how
      to see the traceback (``TLOG_DEBUG=1``). It never leaves the database half
      written: ingest writes in transactions that the error rolls back.
    """

    def make_context(self, info_name: Any, args: Any, parent: Any = None,
                     **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except NoArgsIsHelpError:
            raise
        except ClickException as exc:
            fail(_usage_line(exc, args), code=exc.exit_code)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except TlogError as exc:
            if interrupted_in_duckdb(exc):
                _interrupted()
            fail(str(exc), code=exc.exit_code)
        except KeyboardInterrupt:
            _interrupted()
        except NoArgsIsHelpError:
            raise
        except ClickException as exc:
            fail(_usage_line(exc), code=exc.exit_code)
        except (typer.Exit, typer.Abort):
            raise
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                closed_pipe()
            if os.environ.get(DEBUG_ENV):
                raise
            if (known := machine_failure(exc)) is not None:
                fail(known)
            reason = exc.strerror or _one_line(str(exc)) or type(exc).__name__
            fail(f"{reason}: {exc.filename}" if exc.filename is not None else reason)
        except (Exception, MemoryError) as exc:
            if os.environ.get(DEBUG_ENV):
                raise
            if interrupted_in_duckdb(exc):
                _interrupted()
            if (known := machine_failure(exc)) is not None:
                fail(known)
            first = _one_line(str(exc).split("\n", 1)[0])[:300]
            fail(f"internal error ({type(exc).__name__}: {first}); this is a bug in tlog, "
                 f"please report it with the traceback that {DEBUG_ENV}=1 shows")


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
    """Print ``tlog: error: MESSAGE`` on stderr and exit with ``code`` (control
    characters escaped, :func:`shown`)."""
    err_console.print(f"tlog: error: {message}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(code=code)


#: Characters that act on a terminal or fake a line: C0 and C1 controls, DEL,
#: the Unicode line/paragraph separators and bidirectional overrides.
_ACTIVE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e"
                     "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(m: re.Match[str]) -> str:
    c = m.group(0)
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def shown(text: object) -> str:
    """``text`` as it may reach a terminal: every control character escaped
    visibly (ESC as ``\\x1b``, a line break as ``\\n``, U+2028 as
    ``\\u2028``), so a name read from a log (phase, stage, worker, file,
    directory, run id) can neither move the cursor, write the clipboard (OSC
    52) nor forge a line. Markup is inert anyway: the consoles never read it.
    Every CLI render path passes names through this one function."""
    s = str(text)
    return _ACTIVE.sub(_escape_one, s) if _ACTIVE.search(s) else s


def closed_pipe() -> None:
    """The reader of stdout went away (``tlog diagnose | head -1``): stop quietly
    with 141 (128 + SIGPIPE), the status a shell shows for ``git log | head -1``,
    not 1, which reads as a failed command. Later writes go to ``/dev/null`` so
    the interpreter's exit does not fail on them again. (Not by restoring
    SIGPIPE's default action: that would kill the process wherever it writes, an
    ingest between batches or ``tlog run`` with its job running.)"""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(128 + signal.SIGPIPE)


def safe_console(**options: Any) -> Any:
    """A new console of tlog's class (:func:`_safe_console_class`: strings shown
    through :func:`shown`, a closed stdout ends with :func:`closed_pipe`);
    ``options`` go to :class:`rich.console.Console`."""
    return _safe_console_class()(**options)


def _safe_console_class() -> type:
    """The console class (rich imported on first use: the CLI's start-up, ``tlog
    --help``, loads no rich console)."""
    from rich.console import Console

    class _SafeConsole(Console):
        """A console that shows every string it prints through :func:`shown`
        (a :class:`rich.text.Text` keeps its styles; tables escape their cells
        where they are built). One printed string is one line: print a blank line
        with ``print()``."""

        def print(self, *objects: Any, **kwargs: Any) -> None:
            from rich.text import Text

            safe = []
            for obj in objects:
                if isinstance(obj, str):
                    obj = shown(obj)
                elif isinstance(obj, Text) and _ACTIVE.search(obj.plain):
                    copy = Text(shown(obj.plain), style=obj.style, justify=obj.justify,
                                no_wrap=obj.no_wrap, overflow=obj.overflow)
                    obj = copy
                safe.append(obj)
            kwargs.setdefault("markup", False)
            super().print(*safe, **kwargs)

        def on_broken_pipe(self) -> None:
            """See :func:`closed_pipe` (rich's own handling exits 1)."""
            self.quiet = True
            closed_pipe()

    return _SafeConsole


class _LazyConsole:
    """Stands for a :class:`_SafeConsole` built on first use (every attribute
    and method is the real console's)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Any = None

    def _real(self) -> Any:
        if self._console is None:
            self._console = safe_console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._real(), name)


#: Console for human output (stdout) and for errors (stderr): never markup,
#: control characters escaped (``_SafeConsole``), built on first use.
console: Any = _LazyConsole(markup=False)
err_console: Any = _LazyConsole(stderr=True, markup=False)


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


def check_wait(wait: float) -> None:
    """UsageError unless ``--wait`` is zero or a positive number of seconds (NaN
    and negative values are refused; ``inf`` waits for ever)."""
    if math.isnan(wait) or wait < 0:
        raise UsageError(f"--wait must be zero or a positive number of seconds, got {wait:g}")


def open_database(db: Path | None, *, wait_s: float | None = None, quiet: bool = False) -> Any:
    """The CLI's one way to the database: a :class:`tlog.api.Database` that says
    on stderr when it waits for another writer and, once, when a live
    ``tlog serve`` takes its writes (``quiet``: neither, for ``--json``).

    Args:
        db: ``--db`` (None: ``$TLOG_DB``, else the user data dir).
        wait_s: seconds a write waits for another process (default
            :data:`tlog.api.WAIT_S`).
    """
    from tlog.api import WAIT_S, Database

    def waiting(path: Path, wait: float) -> None:
        if not quiet:
            err_console.print(f"tlog: database {path} is in use by another tlog process; "
                              f"waiting up to {wait:g} s ...", highlight=False, soft_wrap=True)

    def served(info: Any) -> None:
        if not quiet:
            err_console.print(f"tlog: tlog serve (pid {info.pid}, {info.url}) owns {info.db}; "
                              f"it took this write", highlight=False, soft_wrap=True)

    return Database(db, wait_s=WAIT_S if wait_s is None else wait_s, on_wait=waiting,
                    on_served=served)
