"""The lines of a batch as DuckDB reads them (ingest/sources.py): templates are
learned from lines sampled out of the raw bytes, and the lines table is handed
to the template pass a record batch at a time (``LinesStream``) while the rest
is still being split. Every figure here is worked out by hand from the bytes."""

from __future__ import annotations

import types

import pyarrow as pa
import pytest
from tlog.ingest import sources
from tlog.ingest.sources import LinesStream, Piece, sample_lines


def _piece(lines: list[bytes], first_line: int = 1) -> Piece:
    data = b"".join(line + b"\n" for line in lines)
    return Piece(types.SimpleNamespace(), memoryview(data), 0, first_line, len(lines),
                 len(data), last=False)


def test_samples_are_the_head_and_the_lines_at_byte_fractions() -> None:
    """Ten 8-byte lines (80 bytes): the first 3 lines, and the lines holding
    bytes 0, 20, 40, 60 and 79 (fractions 0, 1/4, 1/2, 3/4, 1): lines 0, 2, 5,
    7 and 9."""
    piece = _piece([b'{"i":%d}' % k for k in range(10)])
    assert len(piece.data) == 80
    got = sample_lines([piece], (0.0, 0.25, 0.5, 0.75, 1.0), 3)
    assert got == [f'{{"i":{k}}}' for k in (0, 1, 2, 5, 7, 9)]


def test_a_line_longer_than_the_sample_cap_is_not_sampled(monkeypatch) -> None:
    monkeypatch.setattr(sources, "SAMPLE_MAX_BYTES", 16)
    piece = _piece([b"short", b"x" * 40, b"tail"])     # bytes 0-5, 6-46, 47-51
    assert sample_lines([piece], (0.5,), 0) == []          # byte 26: the long line
    assert sample_lines([piece], (0.0, 1.0), 3) == ["short", "tail"]   # head stops at it


def test_the_stream_gives_the_table_in_order_in_chunks_of_at_most_chunk_rows() -> None:
    """Two small pieces of 5 and 3 lines share one record batch of 8 rows (small
    pieces are joined); chunks of 3 rows: 3, 3, 2, in line order, each
    line's text as written."""
    pieces = [_piece([b'{"a":%d}' % k for k in range(5)], first_line=1),
              _piece([b'{"b":%d}' % k for k in range(3)], first_line=7)]
    fids = {id(pieces[0].log): 0, id(pieces[1].log): 1}
    stream = LinesStream(pieces, fids, chunk_rows=3)
    parts = list(stream.reader())
    table, bad = stream.result()
    assert [p.num_rows for p in parts] == [3, 3, 2]
    assert pa.Table.from_batches(parts).equals(table)
    assert table.column("raw").to_pylist() == (
        [f'{{"a":{k}}}\n' for k in range(5)] + [f'{{"b":{k}}}\n' for k in range(3)])
    assert table.column("line").to_pylist() == [1, 2, 3, 4, 5, 7, 8, 9]
    assert table.column("fid").to_pylist() == [0] * 5 + [1] * 3
    assert table.column("quotes").to_pylist() == [2] * 8
    assert bad == []
    with pytest.raises(RuntimeError, match="read once"):
        stream.reader()


def test_an_error_while_splitting_reaches_the_reader_and_the_result(monkeypatch) -> None:
    calls = []

    def broken(piece):
        calls.append(piece)
        if len(calls) == 2:
            raise MemoryError("no room for the second piece")
        return real(piece)

    real = sources._piece_columns
    monkeypatch.setattr(sources, "_piece_columns", broken)
    pieces = [_piece([b"{}"] * 3), _piece([b"{}"] * 3)]
    stream = LinesStream(pieces, {id(p.log): i for i, p in enumerate(pieces)}, chunk_rows=16)
    with pytest.raises(MemoryError, match="second piece"):
        stream.reader().read_all()
    with pytest.raises(MemoryError, match="second piece"):
        stream.result()


def test_the_template_pass_reads_the_stream_and_loads_what_the_exact_path_loads(
        tmp_path, monkeypatch) -> None:
    """An ingest's template pass reads each batch's stream, one reader per batch;
    the rows equal those of the exact path (check_all: no templates, the whole
    table), line for line. 100 lines of 87-88 bytes (8,790 bytes), chunk_bytes
    4,000: pieces of 45, 45 and 10 lines (3,950, 3,960 and 880 bytes); the
    third joins the second batch (4,840 bytes, under 1.5 chunks): 2 batches."""
    import json

    from tlog.ingest import connect, ingest_run

    run = tmp_path / "run"
    run.mkdir()
    with (run / "rank0.jsonl").open("w") as fh:
        for i in range(100):
            fh.write(json.dumps({"type": "iter", "v": 1, "iter": i, "ts": 1000.0 + i,
                                 "dur": 0.5, "phases": {"fwd": 0.25, "bwd": 0.125}},
                                separators=(",", ":")) + "\n")
    readers = []
    real = LinesStream.reader

    def spy(self):
        readers.append(self)
        return real(self)

    monkeypatch.setattr(LinesStream, "reader", spy)
    rows = {}
    for exact in (False, True):
        con = connect(tmp_path / f"{exact}.duckdb")
        try:
            ingest_run(con, run, chunk_bytes=4000, check_all=exact)
            rows[exact] = con.execute(
                "SELECT iter, ts, dur, phase_host_s, file, line FROM iterations "
                "ORDER BY iter").fetchall()
        finally:
            con.close()
        if not exact:
            assert len(readers) == 2
    assert rows[False] == rows[True] and len(rows[True]) == 100
    assert rows[True][7][:3] == (7, 1007.0, 0.5)


def test_a_ctrl_c_while_duckdb_waits_for_lines_ends_the_ingest(tmp_path, monkeypatch) -> None:
    """DuckDB reads the stream from the thread that runs the statement too, so a
    Ctrl-C can land in the reader's wait: it ends the ingest with
    KeyboardInterrupt (as anywhere else), nothing stored: DuckDB hands it back as
    a read error, which the template pass took for an ordinary failure, fell
    back to the exact path and the ingest (and ``--follow``) went on. Raised for
    real inside the generator, so DuckDB's own wording of it is tested here."""

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(LinesStream, "_take", interrupted)
    _ingest_is_interrupted(tmp_path)


def test_a_ctrl_c_at_the_streams_first_instruction_ends_the_ingest(tmp_path, monkeypatch) -> None:
    """A Ctrl-C that comes while DuckDB plans the template pass is handled at the
    first Python instruction DuckDB runs: the stream generator's start, before
    any ``try`` of it can catch it. DuckDB then gives a read error that wraps
    the KeyboardInterrupt; it ends the ingest (nothing stored) instead of the
    template pass falling back to the full one and the ingest going on (seen:
    2 of 400 Ctrl-Cs at random times of a 3,000-line ingest were lost so)."""
    real = LinesStream.reader

    def reader(self):
        inner = real(self)

        def parts():
            raise KeyboardInterrupt     # the signal handler, run at the generator's start
            yield from inner            # pragma: no cover

        return pa.RecordBatchReader.from_batches(inner.schema, parts())

    monkeypatch.setattr(LinesStream, "reader", reader)
    _ingest_is_interrupted(tmp_path)


def test_interrupts_are_told_from_other_stream_errors() -> None:
    """The two ways DuckDB 2.0.1 wrapped a Ctrl-C handled in Python code it ran
    for the stream (messages copied from DuckDB, seen in random Ctrl-Cs of an
    ingest), and errors that are not one: a read error of another exception,
    and a JSON error whose quoted line text names KeyboardInterrupt."""
    import duckdb
    from tlog.ingest.batch import _wraps_interrupt

    def err(text):
        return duckdb.InvalidInputException(text)

    assert _wraps_interrupt(err("Invalid Input Error: counting the rows of the object "
                                "registered as '_tlog_lines' failed: KeyboardInterrupt: "))
    assert _wraps_interrupt(err(
        "Invalid Input Error: reading the stream registered as '_tlog_lines' failed: Unknown "
        "error: . Detail: Python exception: Traceback (most recent call last):\n  File "
        "\"sources.py\", line 5, in parts\nKeyboardInterrupt\n"))
    assert not _wraps_interrupt(err(
        "Invalid Input Error: reading the stream registered as '_tlog_lines' failed: Unknown "
        "error: . Detail: Python exception: Traceback (most recent call last):\n  File "
        "\"sources.py\", line 5, in parts\nMemoryError: no room\n"))
    assert not _wraps_interrupt(err('Invalid Input Error: Malformed JSON at byte 3 of input: '
                                    'unexpected character.  Input: "{"x": KeyboardInterrupt'))


def _ingest_is_interrupted(tmp_path) -> None:
    """Ingest a run of 50 template lines: it raises KeyboardInterrupt and
    stores no iteration."""
    import json

    from tlog.ingest import connect, ingest_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.jsonl").write_text("".join(
        json.dumps({"type": "iter", "v": 1, "iter": i, "ts": 1000.0 + i, "dur": 0.5,
                    "phases": {"fwd": 0.25}}) + "\n" for i in range(50)))
    con = connect(tmp_path / "t.duckdb")
    try:
        with pytest.raises(KeyboardInterrupt):
            ingest_run(con, run)
        assert con.execute("SELECT count(*) FROM iterations").fetchall() == [(0,)]
    finally:
        con.close()
