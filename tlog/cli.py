"""Entry point of the ``tlog`` console script.

Importing this module registers every command module found in
``tlog/commands/`` on :data:`tlog.app.app`.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings

import tlog.commands
from tlog.app import app, shown

for _module in sorted(m.name for m in pkgutil.iter_modules(tlog.commands.__path__)):
    if not _module.startswith("_"):
        importlib.import_module(f"tlog.commands.{_module}")


_plain_format = warnings.formatwarning


def _one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
              line: str | None = None) -> str:
    """tlog's own warnings (a plugin that failed to load, ...) as the one line
    they are, ``tlog: warning: ...``, without Python's file and source line.
    Every warning's text is shown inert (:func:`tlog.app.shown`: control
    characters escaped): a plugin's message may carry terminal escapes."""
    text = shown(message)
    if text.startswith("tlog: "):
        return "tlog: warning: " + text.removeprefix("tlog: ") + "\n"
    return _plain_format(text, category, filename, lineno, line)


def main() -> None:
    """Run the CLI (``tlog --help``)."""
    warnings.formatwarning = _one_line
    app()


if __name__ == "__main__":
    main()
