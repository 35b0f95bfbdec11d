"""Test support: helpers the tests and benchmarks share, kept out of the installed
packages (docs/TESTING.md, "Shared helpers").

- :mod:`tests.support.cli`: ``tlog ARGS`` in this process (:func:`~tests.support.cli.invoke`)
  and the bad-input check (:func:`~tests.support.cli.assert_one_line_error`).
- :mod:`tests.support.runs`: tiny run directories of JSONL logs.
- :mod:`tests.support.runbuilder`: runs written straight into a database
  (the ``build`` fixture of tests/conftest.py writes one).
- :mod:`tests.support.phase_rows`: store hand-written phase rows in a database.
- :mod:`tests.support.loops`: pieces of the child-process loops whose timers are a test's truth.
- :mod:`tests.support.browser`: open a report in headless Chromium (Playwright).
"""
