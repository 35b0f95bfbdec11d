"""Entry point of the ``tlog`` console script.

Importing this module registers every command module found in
``tlog/commands/`` on :data:`tlog.app.app`.
"""

from __future__ import annotations

import importlib
import pkgutil

import tlog.commands
from tlog.app import app

for _module in sorted(m.name for m in pkgutil.iter_modules(tlog.commands.__path__)):
    if not _module.startswith("_"):
        importlib.import_module(f"tlog.commands.{_module}")


def main() -> None:
    """Run the CLI (``tlog --help``)."""
    app()


if __name__ == "__main__":
    main()
