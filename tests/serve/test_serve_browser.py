"""``tlog serve`` in a real browser: Debian's chromium driven by Playwright
(tests/support/browser.py) against the real service on 127.0.0.1.

Runs (tests/serve/runs.py, figures by hand there and in test_serve_api.py):
``small`` (40 ms/iter), ``small-b`` (forward grown by 20 ms), ``xss`` (its
compute phase and a tag named with an HTML payload), and ``live``, written
by a shim process (tests/serve/shim_writer.py) while the page is open.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.serve.runs import T0, write_pair, write_small_run
from tests.serve.served import Served, start_service, tlog_env
from tests.support.browser import Browser, find_chromium

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (apt-get install chromium, or set $TLOG_CHROMIUM)",
)

XSS = "<img src=x onerror=alert(7)>"
SHIM = Path(__file__).with_name("shim_writer.py")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    tmp = tmp_path_factory.mktemp("browser")
    (tmp / "runs").mkdir()
    ids = write_pair(tmp / "runs")
    write_small_run(tmp / "runs", "xss", started=T0 + 7200, forward_name=XSS,
                    tags={"note": XSS})
    s = start_service(tmp, interval=0.3)
    s.wait_for_runs(ids | {"xss"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with Browser(loopback=True) as b:
        yield b


def _clean(result) -> None:
    assert result.console_errors == []
    assert result.requests == [], "the page tried to reach beyond the service"
    assert result.dialogs == []


def test_runs_list_shows_the_ingested_runs(served: Served, browser) -> None:
    with browser.service_page(served.url) as sp:
        sp.goto(served.url + "/")
        rows = sp.page.eval_on_selector_all("#runs tbody tr", "rs => rs.map(r => r.dataset.run)")
        assert rows == ["small", "small-b", "xss"]
        text = sp.text()
        # small-b's high-water mark is small's 2,500 tokens/s; it runs at 40/60 of it
        row = sp.page.inner_text('#runs tr[data-run="small-b"]')
        assert "by small" in row and "0.67x" in row
        assert XSS in text          # the tag, as text
        _clean(sp.result)


def test_run_page_shows_the_verdict_and_draws_the_charts(served: Served, browser) -> None:
    with browser.service_page(served.url) as sp:
        sp.goto(served.url + "/run/small")
        status = sp.status()
        assert status["errors"] == []
        assert status["charts"], "no chart drawn"
        for key, chart in status["charts"].items():
            assert chart["width"] > 100 and chart["height"] > 40, key
            assert chart["marks"] > 0, f"chart {key} drew no marks"
        text = sp.text()
        assert "Bottleneck: input - main waits for data 25% of its time in load" in text
        _clean(sp.result)


def test_a_growing_run_gains_iterations_on_the_open_page(served: Served, browser) -> None:
    writer = subprocess.Popen([sys.executable, str(SHIM), str(served.runs / "live"), "30"],
                              env=tlog_env())
    try:
        served.wait_for_runs({"live"}, timeout_s=30)
        with browser.service_page(served.url) as sp:
            sp.goto(served.url + "/run/live")     # maybe before its first iterations
            first, first_charts = sp.status()["iterations"], sp.status()["chartKey"]
            sp.page.evaluate("window.__sameDocument = 'yes'")
            sp.page.wait_for_function(
                f"window.tlogStatus.updates >= 2 && window.tlogStatus.iterations > {first}",
                polling=200, timeout=30_000)
            later = sp.status()
            shown = int(sp.page.inner_text("#iterations"))
            assert shown == later["iterations"] > first
            assert sp.page.evaluate("window.__sameDocument") == "yes"   # no reload
            assert sp.page.evaluate("performance.getEntriesByType('navigation').length") == 1
            # "Now" follows too (/api/runs/ID/live): one rank, so no straggler
            sp.page.wait_for_function("Array.isArray(window.tlogStatus.stragglersNow)",
                                      polling=200, timeout=30_000)
            assert sp.status()["stragglersNow"] == []
            assert sp.page.inner_text("#now-stragglers") == "no straggler"
            # the charts follow the data: drawn again from a later digest than the first
            sp.page.wait_for_function(
                f"window.tlogStatus.chartKey !== null && window.tlogStatus.chartKey !== "
                f"{json.dumps(first_charts)}", polling=200, timeout=30_000)
            drawn = sp.status()
            assert drawn["chartKey"] and all(c["marks"] > 0 for c in drawn["charts"].values())
            assert later["errors"] == [] and drawn["errors"] == []
            _clean(sp.result)
    finally:
        writer.terminate()          # the shim flushes on SIGTERM
        writer.wait(timeout=30)


def test_a_run_page_opened_before_the_first_iterations_waits_without_errors(
        served: Served, browser) -> None:
    """A run the service knows (its manifest and the worker's meta line) but
    with no iteration yet: its diagnosis does not exist, and the page must not
    ask for it (a 404 the browser reports as a failed load) until the summary
    counts iterations; then it shows them without a reload."""
    run_dir = write_small_run(served.runs, "pending", started=T0 + 10_800, n=5,
                              tags={"kind": "pending"})
    log = run_dir / "rank0.main.jsonl"
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    log.write_text(lines[0], encoding="utf-8")            # the meta line alone
    served.wait_for_runs({"pending"}, timeout_s=30)
    assert served.json("/api/runs/pending")["iterations"]["total"] == 0
    with browser.service_page(served.url) as sp:
        sp.goto(served.url + "/run/pending")
        assert sp.status()["iterations"] == 0
        time.sleep(1.5)                                    # several polls at 0.3 s
        assert sp.status()["updates"] == 0
        with log.open("a", encoding="utf-8") as fh:
            fh.writelines(lines[1:])
        sp.page.wait_for_function("window.tlogStatus.iterations === 5", polling=200,
                                  timeout=30_000)
        assert int(sp.page.inner_text("#iterations")) == 5
        assert sp.status()["errors"] == []
        _clean(sp.result)


def test_compare_page_names_the_top_contributor(served: Served, browser) -> None:
    with browser.service_page(served.url) as sp:
        sp.goto(served.url + "/compare?a=small&b=small-b")
        top = sp.page.inner_text("#top")
        assert top.startswith("Top contributor: main/forward (compute): +20.0 ms per iteration")
        sp.goto(served.url + "/compare?b=small-b")       # the default baseline
        assert "Baseline small (chosen" in sp.text()
        _clean(sp.result)


def test_crafted_names_show_as_text(served: Served, browser) -> None:
    with browser.service_page(served.url) as sp:
        sp.goto(served.url + "/run/xss")
        time.sleep(0.5)
        assert XSS in sp.page.inner_text("#stages")
        assert sp.page.evaluate("document.images.length") == 0
        scripts = sp.page.evaluate("Array.from(document.scripts).map(s => s.src)")
        assert scripts == [served.url + "/static/vega.js", served.url + "/static/app.js"]
        _clean(sp.result)


def test_sql_page_refuses_a_write(served: Served, browser) -> None:
    with browser.service_page(served.url) as sp:
        sp.goto(served.url + "/sql")
        sp.page.fill("textarea[name=q]", "DELETE FROM iterations")
        sp.page.click("button[type=submit]")
        sp.page.wait_for_selector("#sql-error")
        assert sp.page.inner_text("#sql-error").startswith("refused: the statement is DELETE")
        sp.page.fill("textarea[name=q]", "SELECT count(*) AS n FROM iterations "
                                          "WHERE run_id = 'small'")
        sp.page.click("button[type=submit]")
        sp.page.wait_for_selector("#result")
        assert sp.page.inner_text("#result tbody") == "20"
        _clean(sp.result)
