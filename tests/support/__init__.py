"""Test support: helpers the tests and benchmarks share, kept out of the installed packages.

- :mod:`tests.support.browser`: open a report in headless Chromium (Playwright).
- :mod:`tests.support.phase_rows`: store hand-written phase rows in a database.
"""
