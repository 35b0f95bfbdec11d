"""Where a test goes (docs/TESTING.md): the unit tests of module ``<pkg>/<mod>.py``
are ``tests/<pkg>/test_<mod>.py``. This fails for a module of tlog's packages
that has neither that file nor an exemption below, and for an exemption that
is no longer needed or names a suite that is gone. Command modules are tested
through the CLI (:data:`COMMANDS`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

#: The packages whose modules are mirrored (every ``*.py`` in these folders, not below).
PACKAGES = ("analyze", "analyze/rules", "dflash_runtime", "ingest", "queries", "reports",
            "tlog", "tlog/commands", "tlog/web")

#: Modules without a mirrored test file, each with the test file that holds its
#: tests and why they live there. Keep it short: a new module gets its own file.
EXEMPT: dict[str, tuple[str, str]] = {
    # the shim: its tests run real recorders (threads, processes, signals) and read the
    # logs back with the suite's helpers (tests/runtime/runtime_helpers.py)
    "dflash_runtime/recorder.py": ("tests/runtime/test_recorder.py", "the shim's suite"),
    "dflash_runtime/collectives.py": ("tests/runtime/test_collectives.py", "the shim's suite"),
    "dflash_runtime/queues.py": ("tests/runtime/test_queues.py", "the shim's suite"),
    "dflash_runtime/sigwatch.py": ("tests/runtime/test_sigwatch.py", "the shim's suite"),
    # timed against bare timers with the cores to itself: make test's ALONE_TESTS
    # names the file
    "dflash_runtime/auto.py": ("tests/runtime/test_auto.py", "cores_alone"),
    # analysis whose truth is a simulated lockstep or a family of built runs: the
    # analysis suite's simulators (tests/diagnosis/lockstep_sim.py)
    "analyze/attribution.py": ("tests/diagnosis/test_attribution.py", "the analysis suite"),
    "analyze/lockstep.py": ("tests/diagnosis/test_lockstep.py", "the analysis suite"),
    "analyze/verdict.py": ("tests/diagnosis/test_verdict.py", "the analysis suite"),
    "analyze/rules/drift.py": ("tests/diagnosis/test_drift.py", "the analysis suite"),
    # run histories: the history suite's databases of several runs (tests/history/conftest.py)
    "analyze/compare.py": ("tests/history/test_compare.py", "the history suite"),
    "queries/export.py": ("tests/history/test_export.py", "the history suite"),
    # logs written by torchtitan's own writer code (tests/titan/titan_writer.py)
    "ingest/torchtitan.py": ("tests/titan/test_titan_source.py", "torchtitan's suite"),
    # needs a Spark session and Java: the lake suite starts one for all its tests
    "queries/lake_diagnose.py": ("tests/lake/test_lake_spark.py", "Spark"),
    # entry points: nothing of their own to test
    "tlog/__main__.py": ("tests/tlog/test_cli.py", "`python -m tlog` calls tlog.cli.main"),
}

#: Command modules (``tlog/commands/<name>.py``, the command ``tlog <name>``): each
#: parses its options, calls ``tlog.api`` and renders, so it is tested through the
#: CLI, in the suite of what it does; tests/tlog/test_cli.py runs every ``--help``.
COMMANDS: dict[str, str] = {
    "compare": "tests/history/test_compare.py",
    "demo": "tests/pipeline/test_pipeline_scenarios.py",
    "diagnose": "tests/diagnosis/test_diagnose_cli.py",
    "export": "tests/history/test_export.py",
    "forget": "tests/history/test_one_truth.py",
    "ingest": "tests/ingest/test_ingest_cli.py",
    "publish": "tests/lake/test_lake_publish.py",
    "query": "tests/history/test_query_cli.py",
    "report": "tests/reports/test_report_cli.py",
    "run": "tests/run/test_tlog_run.py",
    "runs": "tests/history/test_runs.py",
    "serve": "tests/serve/served.py",
    "ship": "tests/serve/test_one_service.py",
    "sql": "tests/history/test_query_cli.py",
    "watch": "tests/watch/test_watch_terminal.py",
}

#: ``__init__.py`` files re-export their package's names (tested where those are
#: defined); this one also holds code, tested in the file named.
INIT_CODE: dict[str, str] = {
    "analyze/rules/__init__.py": "tests/packaging/test_plugins.py",
}


def _modules() -> list[str]:
    out = []
    for pkg in PACKAGES:
        out += [f"{pkg}/{p.name}" for p in sorted((ROOT / pkg).glob("*.py"))]
    return out


def _mirror(module: str) -> Path:
    pkg, _, name = module.rpartition("/")
    return TESTS / pkg / f"test_{name.removesuffix('.py')}.py"


def _command(module: str) -> str | None:
    """``ingest`` for ``tlog/commands/ingest.py``; None for other modules."""
    pkg, _, name = module.rpartition("/")
    return name.removesuffix(".py") if pkg == "tlog/commands" else None


def test_every_module_has_its_test_file() -> None:
    missing = [f"{m}: no {_mirror(m).relative_to(ROOT)}" for m in _modules()
               if not m.endswith("/__init__.py") and m not in EXEMPT
               and _command(m) not in COMMANDS and not _mirror(m).is_file()]
    assert not missing, "\n".join(missing)


def test_exemptions_are_needed_and_name_a_test_file() -> None:
    modules = set(_modules())
    for module, (test_file, why) in EXEMPT.items():
        assert module in modules, f"{module} is gone: drop its exemption"
        assert not _mirror(module).is_file(), f"{module} has its own test file now"
        assert (ROOT / test_file).is_file(), f"{module}: {test_file} does not exist"
        assert why, module
    for module, test_file in INIT_CODE.items():
        assert module in modules and (ROOT / test_file).is_file(), module


def test_each_command_is_run_by_its_suite() -> None:
    """The file named runs the command: its name first in an argument list
    (``invoke(["<name>", ...])``, ``_tlog("<name>", ...)``) or after ``tlog`` in a
    program's arguments (``[..., "tlog", "<name>", ...]``)."""
    commands = {c for m in _modules() if (c := _command(m)) and not c.startswith("_")}
    assert set(COMMANDS) == commands
    for name, test_file in COMMANDS.items():
        text = (ROOT / test_file).read_text(encoding="utf-8")
        runs = rf'[(\[]\s*"{name}"\s*[,\])]|"tlog",\s*"{name}"'
        assert re.search(runs, text), (name, test_file)


def test_mirrored_folders_are_packages() -> None:
    """``tests/analyze/test_x.py`` and ``tests/tlog/test_x.py`` may share a name:
    pytest tells them apart by their package (``tests.analyze.test_x``)."""
    folders = {_mirror(m).parent for m in _modules()} | {TESTS}
    assert [f for f in sorted(folders) if not (f / "__init__.py").is_file()] == []
