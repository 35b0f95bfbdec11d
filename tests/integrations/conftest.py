"""Fixtures of the framework-integration tests (helpers: fw_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import fw_helpers  # noqa: F401  (sets the offline environment before any framework import)
import pytest
from fw_helpers import fetch_share


@pytest.fixture
def starvation_verdict(tmp_path: Path):
    """``starvation_verdict(run_dir, spans, ends, excluded, label)``: ingest the run
    into a fresh database, diagnose it (``tlog.open(db).diagnose``), and check the
    verdict against the injected bottleneck: starvation in ``data_fetch``, with a
    starvation share within 5 points of the bare timers' (``fw_helpers.fetch_share``
    of the fetch ``spans``, step ``ends`` and ``excluded`` evaluations, over the
    steps tlog judged steady), which must be the larger part of the loop's time.
    Prints both shares."""
    import tlog

    def check(run_dir: Path, spans, ends, excluded, label: str):
        db = tlog.open(tmp_path / "t.duckdb")
        d = db.diagnose(db.ingest(run_dir).run_id)
        steady = d.analysis.steady["iter"].to_list()
        truth = fetch_share(spans, ends, excluded, steady)
        print(f"{label} starvation over steps {steady}: bare timers {truth:.3f}, tlog "
              f"{d.categories.starvation:.3f};", d.verdict)
        assert d.bottleneck is not None
        assert (d.bottleneck.category, d.bottleneck.phase) == ("starvation", "data_fetch")
        assert d.categories.starvation == pytest.approx(truth, abs=0.05), (truth, d.verdict)
        assert truth > 0.4
        return d

    return check


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One intra-op thread: the tiny models gain nothing from more, and on a shared
    2-core machine extra threads only add scheduling noise to the timings."""
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
