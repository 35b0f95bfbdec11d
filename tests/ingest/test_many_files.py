"""Many small files (10,000 files of 6 records ran out of memory).

Counts are known by construction: each file ``w{k}.jsonl`` holds one meta line,
``ITERS`` iteration records and, in every 7th file, one line that is not JSON.
The time and peak memory of 10,000 files are measured by
``benchmarks/bench_ingest.py``, not here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tlog.ingest.run
from tlog.ingest import connect, ingest_run

FILES = 2000
ITERS = 5
BAD_EVERY = 7


def _write(root: Path, k: int, iters: int = ITERS, start: int = 0) -> bytes:
    lines = [] if start else [json.dumps({"type": "meta", "v": 1, "rank": k % 64,
                                          "stage": f"loader{k // 64}", "worker": f"w{k}"})]
    for i in range(start, start + iters):
        lines.append(json.dumps({"type": "iter", "v": 1, "iter": i, "ts": 1.7e9 + i,
                                 "dur": 0.25, "phases": {"fetch": 0.1, "compute": 0.15}}))
    if k % BAD_EVERY == 0 and not start:
        lines.insert(2, "not json at all")
    data = ("\n".join(lines) + "\n").encode()
    path = root / f"part{k // 500}" / f"w{k}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        fh.write(data)
    return data


@pytest.mark.parametrize("max_files", [2048, 300])
def test_two_thousand_small_files_load_exactly(tmp_path: Path, monkeypatch,
                                               max_files: int) -> None:
    """Every record of 2,000 files loads once, each file's stored offset is its
    size, and a batch cap (300 files a batch: 7 batches) changes nothing."""
    monkeypatch.setattr(tlog.ingest.run, "MAX_BATCH_FILES", max_files)
    run = tmp_path / "run"
    sizes = {f"part{k // 500}/w{k}.jsonl": len(_write(run, k)) for k in range(FILES)}
    bad = len(range(0, FILES, BAD_EVERY))
    con = connect(tmp_path / "t.duckdb")
    try:
        rep = ingest_run(con, run, run_id="many")
        assert rep.files == rep.files_read == FILES
        assert rep.records_loaded == {"iter": FILES * ITERS, "queue": 0, "event": 0,
                                      "meta": FILES}
        assert rep.records_rejected == bad and rep.rejected_by_reason == {"not_json": bad}
        assert rep.duplicates == 0
        stored = dict(con.execute('SELECT path, "offset" FROM files WHERE run_id = ?',
                                  ["many"]).fetchall())
        assert stored == sizes
        # each worker's records by its own meta line (meta defaults are per file)
        got = con.execute("SELECT count(DISTINCT worker), count(*) FILTER "
                          "(WHERE worker <> 'w' || (rank + 64 * "
                          "CAST(substr(stage, 7) AS INTEGER))::VARCHAR) FROM iterations "
                          "WHERE run_id = 'many'").fetchall()[0]
        assert got == (FILES, 0)
        rejected = con.execute("SELECT count(*), count(*) FILTER (WHERE line = 3) FROM rejects "
                               "WHERE run_id = 'many'").fetchall()[0]
        assert rejected == (bad, bad)

        again = ingest_run(con, run, run_id="many")
        assert again.files_unchanged == FILES and again.files_read == 0
        assert again.records_total == 0

        for k in (0, 999, 1999):       # three files grow by 2 records each
            _write(run, k, iters=2, start=ITERS)
        grown = ingest_run(con, run, run_id="many")
        assert grown.files_read == 3 and grown.files_unchanged == FILES - 3
        assert grown.records_loaded["iter"] == 6 and grown.duplicates == 0
        n = con.execute("SELECT count(*) FROM iterations WHERE run_id = 'many'").fetchall()[0][0]
        assert n == FILES * ITERS + 6
    finally:
        con.close()
