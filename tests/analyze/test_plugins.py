"""``analyze.plugins.rule_set_key``: the installed rule plugins as one text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tlog.analyze import plugins


def _ep(name: str, value: str, dist: tuple[str, str] | None) -> SimpleNamespace:
    d = None if dist is None else SimpleNamespace(metadata={"Name": dist[0]}, version=dist[1])
    return SimpleNamespace(name=name, value=value, dist=d)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch):
    """Set what ``entry_points(group="tlog.rules")`` returns; the cached key is reset."""
    def _set(eps: list[SimpleNamespace]) -> None:
        def fake(*, group: str):
            assert group == plugins.RULES_GROUP == "tlog.rules"
            return eps
        monkeypatch.setattr(plugins, "entry_points", fake)
        plugins.rule_set_key.cache_clear()

    yield _set
    plugins.rule_set_key.cache_clear()


def test_no_plugin_is_the_empty_key(installed) -> None:
    installed([])
    assert plugins.rule_set_key() == ""


def test_entry_points_sorted_by_name_with_their_distribution(installed) -> None:
    installed([_ep("zeta", "zpkg.rules:Z", ("zpkg", "2.0")),
               _ep("alpha", "apkg:Rule", ("apkg", "0.1.3")),
               _ep("loose", "loose:R", None)])
    assert plugins.rule_set_key() == ("alpha=apkg:Rule@apkg==0.1.3;loose=loose:R@?;"
                                      "zeta=zpkg.rules:Z@zpkg==2.0")


def test_read_once_per_process(installed, monkeypatch: pytest.MonkeyPatch) -> None:
    installed([_ep("a", "a:R", ("a", "1"))])
    first = plugins.rule_set_key()
    # a plugin removed later in the process is not seen: the key describes the rules loaded
    monkeypatch.setattr(plugins, "entry_points", lambda *, group: [])
    assert plugins.rule_set_key() == first == "a=a:R@a==1"
