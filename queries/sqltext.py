"""SQL text helpers: blank out comments and string literals, find named parameters.

Parameters are found the way datasette finds them: in the SQL *after* comments
and string literals are removed, so ``'$.a'`` inside a string, ``$x`` inside a
``-- comment`` or a ``"$col"`` quoted identifier is never taken for a
parameter. Named parameters use DuckDB's own syntax, ``$name``; values are
always bound by DuckDB, never formatted into the text.

The lexer follows DuckDB's (PostgreSQL's) rules:

- ``-- ...`` runs to the end of the line;
- ``/* ... */`` block comments nest (``/* a /* b */ c */`` is one comment);
- ``'...'`` strings escape a quote by doubling it (``'it''s'``), and
  ``E'...'`` strings also take a backslash escape (``E'it\\'s'``);
- ``"..."`` quoted identifiers escape a quote by doubling it;
- ``$$...$$`` and ``$tag$...$tag$`` are dollar-quoted strings.

:func:`blank_comments_and_strings` replaces each of these by spaces (keeping
newlines), so offsets and line numbers in the result are those of the input.
"""

from __future__ import annotations

import re

from tlog.ingest.errors import QueryError

#: ``$name`` named parameter (DuckDB syntax). A digit after ``$`` is a
#: positional parameter, which stored queries do not use.
PARAMETER_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_POSITIONAL_RE = re.compile(r"\$\d+|\?")
_DOLLAR_TAG_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_IDENT_CHAR_RE = re.compile(r"[A-Za-z0-9_]")


def _blank(text: str) -> str:
    """Spaces for every character of ``text`` except newlines (kept for line numbers)."""
    return "".join("\n" if ch == "\n" else " " for ch in text)


def blank_comments_and_strings(sql: str) -> str:
    """Return ``sql`` with comments, string literals and quoted identifiers blanked.

    The result has the same length and the same line breaks as ``sql``; what is
    left is the SQL's keywords, names, operators and parameters.

    Raises:
        QueryError: a string, quoted identifier or block comment is never closed.

    >>> blank_comments_and_strings("SELECT '$a' AS x, $b -- $c").rstrip()
    'SELECT      AS x, $b'
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        two = sql[i:i + 2]
        if two == "--":
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(_blank(sql[i:end]))
            i = end
        elif two == "/*":
            end = _block_comment_end(sql, i)
            out.append(_blank(sql[i:end]))
            i = end
        elif ch == "'" or (ch in "eE" and sql[i + 1:i + 2] == "'" and not _ident_before(sql, i)):
            backslash = ch in "eE"
            start = i
            i = i + 2 if backslash else i + 1
            end = _quoted_end(sql, i, "'", backslash=backslash, what="string literal", start=start)
            out.append(_blank(sql[start:end]))
            i = end
        elif ch == '"':
            end = _quoted_end(sql, i + 1, '"', backslash=False, what="quoted identifier", start=i)
            out.append(_blank(sql[i:end]))
            i = end
        elif ch == "$" and (m := _DOLLAR_TAG_RE.match(sql, i)) and not _ident_before(sql, i):
            tag = m.group(0)
            close = sql.find(tag, m.end())
            if close < 0:
                raise QueryError(f"dollar-quoted string {tag}...{tag} opened at line "
                                 f"{_line(sql, i)} is never closed")
            end = close + len(tag)
            out.append(_blank(sql[i:end]))
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _ident_before(sql: str, i: int) -> bool:
    """True when the character before ``i`` continues a name (``type'x'`` is not ``E'x'``)."""
    return i > 0 and bool(_IDENT_CHAR_RE.match(sql[i - 1]))


def _line(sql: str, i: int) -> int:
    return sql.count("\n", 0, i) + 1


def _block_comment_end(sql: str, start: int) -> int:
    depth, i, n = 0, start, len(sql)
    while i < n:
        two = sql[i:i + 2]
        if two == "/*":
            depth += 1
            i += 2
        elif two == "*/":
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise QueryError(f"block comment opened at line {_line(sql, start)} is never closed (missing */)")


def _quoted_end(sql: str, i: int, quote: str, *, backslash: bool, what: str, start: int) -> int:
    n = len(sql)
    while i < n:
        ch = sql[i]
        if backslash and ch == "\\":
            i += 2
        elif ch == quote:
            if sql[i + 1:i + 2] == quote:
                i += 2
            else:
                return i + 1
        else:
            i += 1
    raise QueryError(f"{what} opened at line {_line(sql, start)} is never closed (missing {quote})")


def find_parameters(sql: str) -> list[str]:
    """Named parameters (``$name``) the SQL uses, in order of first use, without ``$``.

    Comments and string literals are removed first, so only real parameters count.

    Raises:
        QueryError: the SQL uses a positional parameter (``?`` or ``$1``), which
            cannot be named on the command line; or a literal is never closed.

    >>> find_parameters("SELECT * FROM runs WHERE run_id = $run_id -- $not_me")
    ['run_id']
    """
    code = blank_comments_and_strings(sql)
    if m := _POSITIONAL_RE.search(code):
        raise QueryError(f"positional parameter {m.group(0)!r} at line {_line(code, m.start())}: "
                         "use a named parameter ($name) instead")
    seen: dict[str, None] = {}
    for m in PARAMETER_RE.finditer(code):
        seen.setdefault(m.group(1), None)
    return list(seen)
