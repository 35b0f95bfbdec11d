"""``analyze.persist``: the stored diagnosis is keyed by a digest of the analysis
code itself, so a change to a rule or a policy makes every stored run stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import tlog.analyze
from tlog.analyze import persist
from tlog.analyze.rules.drift import DriftPolicy

ANALYZE = Path(tlog.analyze.__file__).resolve().parent


def test_the_key_is_the_digest_of_the_analysis_package() -> None:
    assert persist.analysis_key() == persist.code_digest(ANALYZE)
    assert len(persist.analysis_key()) == persist.KEY_CHARS
    assert persist.analysis_key() is persist.analysis_key()        # read once per process


def test_the_digest_changes_when_a_policy_value_changes(tmp_path: Path) -> None:
    copy = tmp_path / "analyze"
    shutil.copytree(ANALYZE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert persist.code_digest(copy) == persist.code_digest(ANALYZE)
    drift = copy / "rules" / "drift.py"
    text = drift.read_text(encoding="utf-8")
    line = f"    p: float = {DriftPolicy().p!r}\n"
    assert text.count(line) == 1                    # the default the policy documents
    drift.write_text(text.replace(line, "    p: float = 0.05\n"), encoding="utf-8")
    changed = persist.code_digest(copy)
    assert changed != persist.code_digest(ANALYZE)
    # a new rule module counts too; putting the value back gives the old key
    drift.write_text(text, encoding="utf-8")
    assert persist.code_digest(copy) == persist.code_digest(ANALYZE)
    (copy / "rules" / "mine.py").write_text("X = 1\n", encoding="utf-8")
    assert persist.code_digest(copy) not in (changed, persist.code_digest(ANALYZE))
