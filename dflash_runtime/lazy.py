"""Package names imported on first use (a module ``__getattr__``, PEP 562).

One definition for every package that exports names lazily: the shim (so ingest
and analysis, which import only :mod:`dflash_runtime.format`, do not load the
writer and recorder) and tlog's ``ingest``, ``analyze`` and ``queries`` (so
``tlog --help`` loads no DuckDB, polars or pyarrow). Standard library
only, like the rest of the shim.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` exporting ``exports`` lazily.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module defining it: a submodule of
            ``package`` (``"db"``) or, with a dot, an absolute module name
            (``"tlog.ingest.errors"``).

    The first access imports the module and caches the value in the package's
    namespace; an unknown name raises AttributeError as a module would.
    """

    def getattr_(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = where if "." in where else f"{package}.{where}"
        value = getattr(importlib.import_module(module), name)
        vars(sys.modules[package])[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return getattr_, dir_
