"""Render a polars DataFrame as a rich table, CSV or JSON: the one place the CLI's
commands (query, sql, runs, compare) and the service's SQL answers turn rows into text.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tlog.app import console, print_json, safe_console, shown

if TYPE_CHECKING:
    import polars as pl

#: Rows drawn in a table (``--format table``); the rest are counted, not drawn.
#: A rich table lays out every cell before printing: 1,000,000 rows took over
#: 2 minutes and 2 GB (measured), while nobody reads past a screenful or two.
#: CSV and JSON print every row.
TABLE_MAX_ROWS = 1000


#: Floats from LARGE up to HUGE print in tables with thousands separators and
#: 15 significant digits, all a double holds without its last-digit noise
#: (``1,048,980``; a timestamp ``1,795,949,693.50792``): six significant digits
#: would switch to exponent form (``1.04898e+06``) and round a timestamp to
#: 100 s. Beyond HUGE, exponent form (six digits).
LARGE = 1e4
HUGE = 1e15


class OutputFormat(StrEnum):
    """How a result frame is printed."""

    table = "table"
    csv = "csv"
    json = "json"


FormatOption = Annotated[
    OutputFormat,
    typer.Option("--format", "-f", help="Output format: a table, CSV, or JSON (a list of rows).",
                 case_sensitive=False),
]


def plain(value: Any) -> Any:
    """A JSON-ready form of one cell: ISO dates, finite floats (else None), nested kept."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):   # sum() of integers is HUGEINT/DECIMAL: keep it exact
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def frame_rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    """The frame as JSON-ready row objects."""
    return [{k: plain(v) for k, v in row.items()} for row in frame.iter_rows(named=True)]


def _cell(value: Any) -> str:
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        value += 0.0                     # -0.0 -> 0.0
        if abs(value) < HUGE and max(abs(value), abs(float(f"{value:.6g}"))) >= LARGE:
            # 1048980.0 tokens/s: "1,048,980", not "1.04898e+06"; a timestamp keeps
            # its fraction; 15 digits, all a double holds without its noise
            whole, _, frac = f"{value:.15g}".partition(".")
            return f"{int(whole):,}" + (f".{frac}" if frac else "")
        return f"{value:.6g}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def render_frame(frame: pl.DataFrame, fmt: OutputFormat, *, title: str | None = None,
                 keep_whole: tuple[str, ...] = ()) -> None:
    """Print ``frame`` on stdout in ``fmt``.

    ``keep_whole`` names table columns that are never wrapped (ids a user copies
    into the next command); the other columns fold to fit a terminal.

    table: a rich table (floats to 6 significant digits, from :data:`LARGE`
    to :data:`HUGE` with thousands separators and 15; integers exact; NULL
    blank) of the
    first :data:`TABLE_MAX_ROWS` rows, then a line counting the rows left out;
    csv: a header line then one line per row (NULL empty, nested values as
    JSON); json: a list of row objects (NULL, NaN and infinities as null).
    """
    if fmt == OutputFormat.json:
        print_json(frame_rows(frame))
        return
    if fmt == OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(frame.columns)
        for row in frame.iter_rows():
            writer.writerow([_csv_cell(v) for v in row])
        return
    render_table([(name, dtype.is_numeric()) for name, dtype in frame.schema.items()],
                 list(frame.head(TABLE_MAX_ROWS).iter_rows()), frame.height, title=title,
                 keep_whole=keep_whole)


def render_table(columns: list[tuple[str, bool]], rows: list[tuple[Any, ...]], total: int, *,
                 title: str | None = None, keep_whole: tuple[str, ...] = ()) -> None:
    """Print ``rows`` as :func:`render_frame`'s table, without needing polars
    (``tlog runs``). ``columns``: ``(name, numeric)`` pairs (numeric columns are
    right-aligned); ``rows``: at most :data:`TABLE_MAX_ROWS` of the ``total``."""
    from rich.table import Table
    from rich.text import Text

    left_out = max(total - len(rows), 0)
    cells = [[shown(_cell(v)) for v in row] for row in rows[:TABLE_MAX_ROWS]]
    widths = [max([len(name), *(len(r[k]) for r in cells)])
              for k, (name, _) in enumerate(columns)]
    table = Table(title=shown(title) if title is not None else None, header_style="bold")
    for name, numeric in columns:
        whole = name in keep_whole
        table.add_column(Text(shown(name)), justify="right" if numeric else "left",
                         min_width=min(len(name), 24), overflow="fold", no_wrap=whole)
    for row in cells:
        table.add_row(*(Text(c) for c in row))
    # Full width when the output is a file or a pipe; wrap cells on a terminal.
    needed = sum(w + 3 for w in widths) + 1
    out = console if console.is_terminal else safe_console(width=max(needed, 40), file=sys.stdout)
    out.print(table)
    if total == 0:
        out.print("(no rows)", style="dim", highlight=False)
    if left_out:
        out.print(f"({left_out:,} more rows not shown of {total:,}: use --format csv "
                  f"or json for all of them, or LIMIT)", style="dim", highlight=False,
                  soft_wrap=True)


def _csv_cell(value: Any) -> Any:
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, float):
        return repr(value)
    return value


class JsonView:
    """Attribute access over a JSON object: ``view.stages[0].throughput.iters_per_s``
    reads ``data["stages"][0]["throughput"]["iters_per_s"]``; ``view["sync"]``
    reads a key. Lists come back as tuples of views, other values as they are.

    The typed results' ``to_dict()`` keys are their attribute names, so a
    renderer written for :class:`tlog.analyze.Diagnosis` prints the stored
    ``tlog diagnose --json`` the same way (``tlog diagnose`` of a stored run:
    no analysis imported). AttributeError for a key the object lacks.
    """

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            return _viewed(self._data[name])
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: str) -> Any:
        return _viewed(self._data[key])

    def to_dict(self) -> dict[str, Any]:
        """The object itself."""
        return self._data


def _viewed(value: Any) -> Any:
    if isinstance(value, dict):
        return JsonView(value)
    if isinstance(value, list):
        return tuple(_viewed(v) for v in value)
    return value
