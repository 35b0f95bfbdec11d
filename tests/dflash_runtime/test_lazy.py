"""``dflash_runtime.lazy.lazy_exports``: names imported on first use."""

from __future__ import annotations

import sys
import types

import pytest

from dflash_runtime.lazy import lazy_exports


@pytest.fixture
def package(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A package ``lazypkg`` exporting ``join`` (from the absolute module os.path: a
    name with a dot) and ``Fraction`` (from its own submodule ``lazypkg.frac``, which
    is fractions)."""
    import fractions

    pkg = types.ModuleType("lazypkg")
    monkeypatch.setitem(sys.modules, "lazypkg", pkg)
    monkeypatch.setitem(sys.modules, "lazypkg.frac", fractions)
    getattr_, dir_ = lazy_exports("lazypkg", {"join": "os.path", "Fraction": "frac"})
    pkg.__getattr__, pkg.__dir__ = getattr_, dir_
    return pkg


def test_first_access_imports_and_caches(package: types.ModuleType) -> None:
    import fractions
    import os.path

    assert "join" not in vars(package)
    assert package.join is os.path.join
    assert vars(package)["join"] is os.path.join          # cached: no second lookup
    assert package.Fraction is fractions.Fraction


def test_unknown_names_and_dir(package: types.ModuleType) -> None:
    with pytest.raises(AttributeError, match="module 'lazypkg' has no attribute 'nope'"):
        package.nope  # noqa: B018
    assert {"join", "Fraction"} <= set(dir(package))
