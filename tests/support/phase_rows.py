"""Store hand-written phase rows in a tlog database (test support).

Tests that build databases by hand (tests/history, tests/support/runbuilder.py,
tests/ingest/test_migration.py) give phases in the shape of the ``phases``
view, as they did when ``phases`` was a table (schema v1). This helper turns
them into what the schema stores now. It lived in ``ingest.db`` but only tests
used it, so it lives here, outside the installed package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import duckdb


def insert_phase_rows(con: duckdb.DuckDBPyConnection,
                      rows: Iterable[Sequence[Any]]) -> int:
    """Store phase rows given in the shape of the ``phases`` view.

    For hand-built databases (test fixtures) that used to ``INSERT INTO phases
    VALUES (...)`` when ``phases`` was a table (schema v1). Each row is
    ``(run_id, rank, stage, worker, iter, seq, phase, parent, host_s, gpu_s,
    category)``; the matching ``iterations`` rows must exist already. Rows of one
    iteration are grouped and ordered by ``seq``; their layout (names and
    categories, stored as given, like a record's ``kinds``, so that an ingest
    keeps them) is found or added in ``phase_layouts`` and the times are
    written into ``iterations.phase_host_s`` / ``phase_gpu_s``. ``parent`` is recomputed
    from the name (the part before the last ``/``). Returns the number of
    iterations updated.
    """
    import pyarrow as pa

    rows = list(rows)
    if not rows:
        return 0
    cols = list(zip(*rows, strict=True))
    names = ("run_id", "rank", "stage", "worker", "iter", "seq", "phase", "parent",
             "host_s", "gpu_s", "category")
    types = (pa.string(), pa.int32(), pa.string(), pa.string(), pa.int64(), pa.int32(),
             pa.string(), pa.string(), pa.float64(), pa.float64(), pa.string())
    table = pa.table({n: pa.array(c, type=t) for n, c, t in zip(names, cols, types, strict=True)})
    con.register("_tlog_phase_rows", table)
    try:
        con.execute("""
        CREATE OR REPLACE TEMP TABLE _tlog_pr AS
        SELECT run_id, rank, stage, worker, iter,
               list(phase ORDER BY seq) AS names, list(category ORDER BY seq) AS cats,
               list(host_s ORDER BY seq) AS host, list(gpu_s ORDER BY seq) AS gpu
        FROM _tlog_phase_rows GROUP BY run_id, rank, stage, worker, iter;
        CREATE OR REPLACE TEMP TABLE _tlog_pl AS
        WITH have AS (
            SELECT run_id, layout, list(phase ORDER BY seq) AS names,
                   list(category ORDER BY seq) AS cats
            FROM phase_layouts GROUP BY run_id, layout),
        want AS (SELECT DISTINCT run_id, names, cats FROM _tlog_pr),
        new AS (
            SELECT w.run_id, w.names, w.cats FROM want w
            LEFT JOIN have h ON h.run_id = w.run_id AND h.names = w.names AND h.cats = w.cats
            WHERE h.layout IS NULL)
        SELECT run_id, names, cats, layout FROM have
        UNION ALL
        SELECT n.run_id, n.names, n.cats,
               (coalesce((SELECT max(layout) FROM phase_layouts p WHERE p.run_id = n.run_id), -1)
                + row_number() OVER (PARTITION BY n.run_id ORDER BY n.names::VARCHAR,
                                     n.cats::VARCHAR))::INTEGER
        FROM new n;
        INSERT INTO phase_layouts (run_id, layout, seq, phase, parent, category, given)
            SELECT run_id, layout, (generate_subscripts(names, 1) - 1)::INTEGER, unnest(names),
                   NULL, unnest(cats), unnest(cats)
            FROM _tlog_pl l
            WHERE NOT EXISTS (SELECT 1 FROM phase_layouts p
                              WHERE p.run_id = l.run_id AND p.layout = l.layout);
        UPDATE phase_layouts SET parent = regexp_extract(phase, '^(.*)/[^/]*$', 1)
            WHERE contains(phase, '/') AND parent IS NULL;
        UPDATE iterations SET layout = x.layout, phase_host_s = x.host,
               phase_gpu_s = CASE WHEN list_count(x.gpu) > 0 THEN x.gpu END
            FROM (SELECT r.*, l.layout FROM _tlog_pr r
                  JOIN _tlog_pl l USING (run_id, names, cats)) x
            WHERE iterations.run_id = x.run_id AND iterations.rank = x.rank
              AND iterations.stage = x.stage AND iterations.worker = x.worker
              AND iterations.iter = x.iter;
        """)
        n = con.execute("SELECT count(*) FROM _tlog_pr").fetchall()[0][0]
        con.execute("DROP TABLE _tlog_pr; DROP TABLE _tlog_pl")
    finally:
        con.unregister("_tlog_phase_rows")
    return int(n)
