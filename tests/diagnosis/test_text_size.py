"""``size``: bytes in binary units, never in exponent notation (tryout 16: a leak's
finding read "453 MiB -> 1.01e+03 MiB")."""

from __future__ import annotations

import pytest
from tlog.analyze.text import size


@pytest.mark.parametrize(("nbytes", "text"), [
    (512, "512 B"),
    (8 * 2**20, "8.00 MiB"),
    (1.5 * 2**30, "1.50 GiB"),
    (1010 * 2**20, "1010 MiB"),             # was '1.01e+03 MiB'
    (1023 * 2**20, "1023 MiB"),
    (999.6 * 2**10, "1000 KiB"),            # was '1e+03 KiB'
    (99.97 * 2**20, "100 MiB"),             # rounds up to a whole 100, not '1e+02'
    (-1010 * 2**20, "-1010 MiB"),
    (1023.7 * 2**20, "1.00 GiB"),           # rounds to 1024 MiB: the next unit
])
def test_size_writes_whole_units_from_100_on(nbytes, text) -> None:
    assert size(nbytes) == text
