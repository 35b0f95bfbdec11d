"""The runs list says what the verdict leads with: a run whose thread waited for a
core most of its time reads "lacks CPU" in ``tlog runs`` and on ``tlog serve``'s
runs page, not "compute (forward)" (tryout 16: the loop pinned to one core beside
two spinning processes read "main: compute (forward)" in the runs list while its
verdict said "main (rank 0) lacks CPU ... 83% of its time")."""

from __future__ import annotations

from tlog.analyze.history import list_runs

from tests.support.cli import invoke
from tests.support.runbuilder import RunBuilder, loop
from tlog.web.app import _templates

MiB = 1 << 20


def _contended_run(run_id: str, queue: float) -> RunBuilder:
    # 60 iterations of 100 ms of forward with 30 ms of thread CPU time; the thread
    # waits runnable for a core ``queue`` of its wall time (cpu_wait_s rises by
    # queue * 0.1 s per iteration), sampled every 2 iterations on 1 usable core.
    b = RunBuilder(run_id=run_id)
    loop(b, 60, [("forward", 0.100)], cpu=0.030)
    for i in range(0, 60, 2):
        b.sys_sample(ts=1000.0 + i * 0.1 + 0.05, iter=i, ncpu=1, running=4, load1=3.9,
                     cpu_s=0.3 * i, rss_bytes=500 * MiB, cpu_wait_s=5.0 + queue * 0.1 * i)
    return b


def test_runs_list_names_cpu_contention_as_the_verdict_does(tmp_path) -> None:
    db = tmp_path / "runs.duckdb"
    # 70% of wall time in the run queue: the verdict leads with contention;
    # 5%: the same thread merely sleeps (blocked), the bottleneck is plain compute.
    con = _contended_run("crowded", 0.7).write(db)
    con.close()
    con = _contended_run("sleepy", 0.05).write(db)
    try:
        runs = {r.run_id: r for r in list_runs(con)}
    finally:
        con.close()
    crowded, sleepy = runs["crowded"], runs["sleepy"]
    assert crowded.verdict.startswith("Bottleneck: main (rank 0) lacks CPU - its thread "
                                      "waited runnable for a core 70% of its time")
    assert crowded.bottleneck["cause"] == "cpu_contention"
    assert crowded.bottleneck["category"] == "compute"
    assert sleepy.bottleneck["cause"] is None

    result = invoke(["runs", "--db", str(db)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = {ln.split()[1]: ln for ln in result.output.splitlines() if ln.startswith("│")}
    assert "main: lacks CPU (compute, forward)" in lines["crowded"]
    assert "main: compute (forward)" in lines["sleepy"]
    assert "lacks CPU" not in lines["sleepy"]

    html = _templates().get_template("runs.html").render(
        title="tlog: runs", rows=[r.to_dict() for r in runs.values()], marks={}, q="", tag="",
        error=None,
        config=type("C", (), {"watch": []})())
    assert "main: lacks CPU (compute, forward)" in html
    assert "main: compute (forward)" in html


def test_watch_bottleneck_line_says_the_stage_lacks_cpu(tmp_path) -> None:
    from tlog.analyze.live import live_view

    from tlog.commands.watch import _bottleneck_words

    con = _contended_run("crowded", 0.7).write(tmp_path / "w.duckdb")
    try:
        line = _bottleneck_words(live_view(con, "crowded"))
    finally:
        con.close()
    # all 60 iterations are forward (100 ms each): compute-bound, the cause contention
    assert line.startswith("bottleneck: stage main is compute-bound (100% of its time), "
                           "most in phase forward (100%)"), line
    assert line.endswith("; the verdict: main lacks CPU (cpu_contention)"), line
