"""Memory stays bounded: ingest streams (under 1 GB for a 2 GB run).

Slow (writes a 2 GB run and ingests it): ``pytest -m slow tests/ingest/test_memory.py``.
``benchmarks/bench_ingest.py`` measures the same on a smaller run every time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._memory import PEAK_BYTES_SRC

ROOT = Path(__file__).resolve().parents[2]
#: Size of the run directory (bytes): the issue's "2 GB run directory".
RUN_BYTES = 2 * 10**9
#: Budget: peak resident memory of the ingesting process (bytes).
RSS_BUDGET = 1 << 30

_LINE = ('{"type":"iter","v":1,"iter":%d,"ts":%.6f,"dur":%.6f,"phases":{"hs_get":%.6f,'
         '"mask_build":%.6f,"draft_forward":%.6f,"backward":%.6f,"grad_norm_item":%.6f,'
         '"optimizer":%.6f},"cpu":%.6f,"tokens":16384,"samples":8}\n')


def write_run(root: Path, total_bytes: int, ranks: int = 4) -> tuple[int, int]:
    """Write about ``total_bytes`` of iter records over ``ranks`` files; return
    (bytes, iter records). Phase times cycle through fixed round values."""
    root.mkdir(parents=True)
    per_rank = total_bytes // ranks
    written = records = 0
    for r in range(ranks):
        with open(root / f"rank{r}.jsonl", "w") as fh:
            fh.write(f'{{"type":"meta","v":1,"rank":{r},"stage":"drafter"}}\n')
            size, i = 0, 0
            while size < per_rank:
                block = "".join(_LINE % (j, 1e9 + j * 0.0625, 0.0625, 0.001, 0.002, 0.01, 0.02,
                                         0.004, 0.003, 0.03)
                                for j in range(i, i + 10_000))
                fh.write(block)
                size += len(block)
                i += 10_000
            written += size
            records += i
    return written, records


@pytest.mark.slow
def test_two_gigabyte_run_stays_under_one_gigabyte(tmp_path: Path):
    run = tmp_path / "big"
    size, records = write_run(run, RUN_BYTES)
    assert size >= RUN_BYTES
    # The child's own peak (VmHWM): ru_maxrss would carry pytest's peak across fork+exec.
    code = ("import sys\n"
            f"{PEAK_BYTES_SRC}\n"
            "from tlog.ingest import connect, ingest_run\n"
            "con = connect(sys.argv[2]); r = ingest_run(con, sys.argv[1]); con.close()\n"
            "print(r.records_loaded['iter'], r.records_rejected)\n"
            "print(_peak_bytes())\n")
    out = subprocess.run([sys.executable, "-c", code, str(run), str(tmp_path / "big.duckdb")],
                         check=True, capture_output=True, text=True, cwd=ROOT).stdout.split()
    loaded, rejected, peak = int(out[0]), int(out[1]), int(out[2])
    assert (loaded, rejected) == (records, 0)
    print(f"\n2 GB-class run: {size / 1e9:.2f} GB, {records:,} records, peak RSS {peak / 2**20:.0f} MiB")
    assert peak < RSS_BUDGET, f"peak RSS {peak / 2**20:.0f} MiB for a {size / 1e9:.1f} GB run"
