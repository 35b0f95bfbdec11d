"""``queries.sqltext``: the lexer that blanks comments and literals, and the named
parameters found in what is left (each rule of the module docstring once)."""

from __future__ import annotations

import pytest
from tlog.ingest.errors import QueryError
from tlog.queries.sqltext import blank_comments_and_strings, find_parameters


@pytest.mark.parametrize(("sql", "blanked"), [
    ("SELECT 1 -- $a\nFROM t", ["-- $a"]),
    ("a /* x /* nested */ still */ b", ["/* x /* nested */ still */"]),
    ("x = 'it''s $p' AND y", ["'it''s $p'"]),
    ("x = E'it\\'s $p' AND y", ["E'it\\'s $p'"]),
    ('SELECT "$col" FROM t', ['"$col"']),
    ("SELECT $$ $a $$, $tag$ $b $tag$ + $c", ["$$ $a $$", "$tag$ $b $tag$"]),
    ("SELECT type'x'", ["'x'"]),                     # a type name before it: not E'...'
    ("/* line 1\nline 2 */ $p", ["/* line 1", "line 2 */"]),
])
def test_blanked_text_keeps_offsets_and_lines(sql: str, blanked: list[str]) -> None:
    want = sql
    for part in blanked:                 # each literal or comment: spaces, newlines kept
        want = want.replace(part, " " * len(part))
    out = blank_comments_and_strings(sql)
    assert out == want and len(out) == len(sql) and out.count("\n") == sql.count("\n")


@pytest.mark.parametrize(("sql", "says"), [
    ("SELECT 'open", "string literal opened at line 1 is never closed (missing ')"),
    ('SELECT 1\n, "open', 'quoted identifier opened at line 2 is never closed (missing ")'),
    ("SELECT /* a /* b */", "block comment opened at line 1 is never closed (missing */)"),
    ("SELECT $q$ text", "dollar-quoted string $q$...$q$ opened at line 1 is never closed"),
])
def test_an_unclosed_literal_is_one_clear_error(sql: str, says: str) -> None:
    with pytest.raises(QueryError) as info:
        blank_comments_and_strings(sql)
    assert str(info.value) == says


def test_parameters_in_order_of_first_use_without_literals() -> None:
    sql = ("SELECT * FROM runs WHERE run_id = $run_id AND tags->>'$.gpus' = $gpus "
           "-- $comment\n AND started > $since AND run_id <> $run_id")
    assert find_parameters(sql) == ["run_id", "gpus", "since"]
    assert find_parameters("SELECT 1") == []


@pytest.mark.parametrize("sql", ["SELECT * FROM t WHERE a = ?", "SELECT $1"])
def test_positional_parameters_are_refused(sql: str) -> None:
    with pytest.raises(QueryError, match="positional"):
        find_parameters(sql)
