"""Fixtures of the rules' unit tests: a built run's findings of one code."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tlog.analyze import diagnose
from tlog.analyze.findings import Finding

from tests.support.runbuilder import RunBuilder


@pytest.fixture
def findings(build) -> Callable[..., list[Finding]]:
    """``findings(builder, code) -> [Finding]``: diagnose the run ``builder`` writes
    (``tlog diagnose``'s rules, in its order) and keep the findings of ``code``."""
    def _findings(builder: RunBuilder, code: str, **kw) -> list[Finding]:
        d = diagnose(build(builder), builder.run_id, **kw)
        return [f for f in d.findings if f.code == code]

    return _findings
