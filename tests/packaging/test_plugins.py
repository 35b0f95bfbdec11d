"""Sources and rules from entry points: a tiny plugin distribution,
built and installed here (no network), adds a log source (``tlog.sources``)
and a finding rule (``tlog.rules``); ``tlog ingest`` reads its files and
``tlog diagnose --json`` carries its finding. Its broken entry points give a
warning and break nothing.

The plugin's log is tab-separated ``iter<TAB>dur<TAB>forward`` rows; its
rule reports the run's iteration count and longest iteration, known here by
construction: 40 iterations of 0.10 s, iteration 17 of 0.35 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
import json

from tlog.analyze.findings import Finding
from tlog.analyze.rules import Rule
from tlog.ingest.sources import Source


def _find(root):
    return sorted(p for p in root.rglob("*.tsvlog") if p.is_file())


def _decode(path):
    ts = 1000.0
    for row in path.read_text().splitlines():
        i, dur, fwd = row.split("\\t")
        yield json.dumps({"type": "iter", "iter": int(i), "ts": ts, "dur": float(dur),
                          "phases": {"forward": float(fwd)}}) + "\\n"
        ts += float(dur)


SOURCE = Source(kind="tsvlog", find=_find, decode=_decode, label="*.tsvlog")


class LongestIteration(Rule):
    code = "longest_iteration"

    def evaluate(self, ctx):
        it = ctx.analysis.iterations
        longest = float(it["dur"].max())
        return [Finding(self.code, "info",
                        f"the longest of {it.height} iterations takes {longest} s",
                        {"iterations": it.height, "longest_s": longest})]
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "tlog-tsvdemo"
version = "0.1"

[tool.setuptools]
py-modules = ["tlog_tsvdemo"]

[project.entry-points."tlog.sources"]
tsvlog = "tlog_tsvdemo:SOURCE"
broken = "tlog_tsvdemo_missing:SOURCE"

[project.entry-points."tlog.rules"]
longest = "tlog_tsvdemo:LongestIteration"
broken_rule = "tlog_tsvdemo:NOT_THERE"
'''


#: The one line each broken entry point gives (tlog's warnings print as one line).
SOURCE_WARNING = ("tlog: warning: log source plugin 'broken' (tlog_tsvdemo_missing:SOURCE) "
                  "failed to load and is left out: ModuleNotFoundError: No module named "
                  "'tlog_tsvdemo_missing'")
RULE_WARNING = ("tlog: warning: rule plugin 'broken_rule' (tlog_tsvdemo:NOT_THERE) failed to "
                "load and is left out: AttributeError: module 'tlog_tsvdemo' has no attribute "
                "'NOT_THERE'")


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("plugin_src")
    (src / "tlog_tsvdemo.py").write_text(PLUGIN)
    (src / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    target = tmp_path_factory.mktemp("plugin_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "-q", "--target", str(target),
                    str(src)], check=True, capture_output=True, text=True, timeout=300)
    assert list(target.glob("tlog_tsvdemo-0.1.dist-info/entry_points.txt"))
    return target


def _tlog(args: list[str], plugin: Path | None,
          extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if plugin is not None:
        env["PYTHONPATH"] = str(plugin)
    env.update(extra or {})
    return subprocess.run([sys.executable, "-m", "tlog", *args], cwd=ROOT, env=env, check=False,
                          capture_output=True, text=True, timeout=300)


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "tsvrun"
    run.mkdir()
    rows = [f"{i}\t{0.35 if i == 17 else 0.10}\t{0.30 if i == 17 else 0.08}" for i in range(40)]
    (run / "w0.tsvlog").write_text("\n".join(rows) + "\n")
    return run


def test_plugin_source_and_rule_are_used(plugin_path: Path, tmp_path: Path) -> None:
    run, db = _run_dir(tmp_path), tmp_path / "t.duckdb"
    done = _tlog(["ingest", str(run), "--db", str(db)], plugin_path)
    assert done.returncode == 0, done.stderr
    # the broken entry points: one clear warning each, and nothing else breaks
    # (ingest may diagnose the run to store it, and so load the rules as well)
    assert SOURCE_WARNING in done.stderr.splitlines()
    assert set(done.stderr.splitlines()) <= {SOURCE_WARNING, RULE_WARNING}
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT path, source FROM files").fetchall() == [
            ("w0.tsvlog", "tsvlog")]
        assert con.execute("SELECT count(*), max(dur) FROM iterations").fetchone() == (40, 0.35)

    done = _tlog(["diagnose", "--run", "tsvrun", "--db", str(db), "--json"], plugin_path)
    assert done.returncode == 0, done.stderr
    assert RULE_WARNING in done.stderr.splitlines()
    assert set(done.stderr.splitlines()) <= {SOURCE_WARNING, RULE_WARNING}
    findings = json.loads(done.stdout)["findings"]
    mine = [f for f in findings if f["code"] == "longest_iteration"]
    assert mine == [{"code": "longest_iteration", "severity": "info",
                     "message": "the longest of 40 iterations takes 0.35 s",
                     "evidence": {"iterations": 40, "longest_s": 0.35}}]


def test_without_the_plugin_its_files_are_not_logs(tmp_path: Path) -> None:
    run, db = _run_dir(tmp_path), tmp_path / "t.duckdb"
    done = _tlog(["ingest", str(run), "--db", str(db)], None)
    assert done.returncode != 0
    assert done.stderr.startswith("tlog: error: no logs under")
    assert "*.jsonl" in done.stderr and "tsvlog" not in done.stderr


# -- hostile plugins: a hang at import, terminal escapes in their messages --------------

HOSTILE = '''
import time

from tlog.analyze.findings import Finding
from tlog.analyze.rules import Rule

ESC = "\\x1b"


class Shouting(Rule):
    code = "shouting"

    def evaluate(self, ctx):
        return [Finding(self.code, "info",
                        ESC + "]52;c;cHduZWQ=" + "\\x07" + ESC + "[2J" + ESC + "[31mred",
                        {})]


class _Broken:
    def __getattr__(self, name):
        raise RuntimeError(ESC + "[2J" + ESC + "]0;pwned" + "\\x07" + "cleared")


BROKEN = _Broken()
'''

HANGS = '''
import time

time.sleep(3600)
SOURCE = None
RULE = None
'''

HOSTILE_PYPROJECT = '''
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "tlog-hostile"
version = "0.1"

[tool.setuptools]
py-modules = ["tlog_hostile", "tlog_hostile_hangs"]

[project.entry-points."tlog.sources"]
hangs = "tlog_hostile_hangs:SOURCE"

[project.entry-points."tlog.rules"]
hangs = "tlog_hostile_hangs:RULE"
shouting = "tlog_hostile:Shouting"
escapes = "tlog_hostile:BROKEN.rule"
'''

#: Seconds each hanging plugin is given here ($TLOG_PLUGIN_TIMEOUT_S).
HANG_BOUND_S = 2


@pytest.fixture(scope="module")
def hostile_path(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("hostile_src")
    (src / "tlog_hostile.py").write_text(HOSTILE)
    (src / "tlog_hostile_hangs.py").write_text(HANGS)
    (src / "pyproject.toml").write_text(textwrap.dedent(HOSTILE_PYPROJECT))
    target = tmp_path_factory.mktemp("hostile_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "-q", "--target", str(target),
                    str(src)], check=True, capture_output=True, text=True, timeout=300)
    return target


def test_a_plugin_that_hangs_is_left_out_and_escapes_stay_inert(
        plugin_path: Path, hostile_path: Path, tmp_path: Path) -> None:
    """A source and a rule whose module sleeps an hour at import: each gives one
    warning after the bound, and ingest and diagnose go on. A rule's finding and a
    plugin's error that carry terminal escapes (clear screen, OSC 52 clipboard
    write, window title) reach the terminal with every control character written
    out (``\\x1b``), never as the raw byte."""
    import time

    run, db = _run_dir(tmp_path), tmp_path / "t.duckdb"
    env = {"PYTHONPATH": os.pathsep.join([str(plugin_path), str(hostile_path)]),
           "TLOG_PLUGIN_TIMEOUT_S": str(HANG_BOUND_S)}
    t0 = time.monotonic()
    done = _tlog(["ingest", str(run), "--db", str(db)], None, env)
    ingest_s = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    hang = (f"tlog: warning: log source plugin 'hangs' (tlog_hostile_hangs:SOURCE) failed to "
            f"load and is left out: PluginTimeoutError: its import made no progress for "
            f"{HANG_BOUND_S} s (it hangs; $TLOG_PLUGIN_TIMEOUT_S sets the bound)")
    assert hang in done.stderr.splitlines(), done.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*), max(dur) FROM iterations").fetchone() == (40, 0.35)
    # the source's import and (if ingest diagnoses) the rule's: one bound each, not an hour
    assert ingest_s < 120, ingest_s

    done = _tlog(["diagnose", "--run", "tsvrun", "--db", str(db)], None, env)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    rule_hang = (f"tlog: warning: rule plugin 'hangs' (tlog_hostile_hangs:RULE) failed to load "
                 f"and is left out: PluginTimeoutError: its import made no progress for "
                 f"{HANG_BOUND_S} s (it hangs; $TLOG_PLUGIN_TIMEOUT_S sets the bound)")
    escapes = ("tlog: warning: rule plugin 'escapes' (tlog_hostile:BROKEN.rule) failed to load "
               "and is left out: RuntimeError: \\x1b[2J\\x1b]0;pwned\\x07cleared")
    lines = done.stderr.splitlines()
    assert rule_hang in lines and escapes in lines, done.stderr
    assert "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x1b[31mred" in done.stdout, done.stdout
