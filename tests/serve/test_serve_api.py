"""The JSON API of a real ``tlog serve`` against hand-made runs (tests/serve/runs.py),
and the CLI's commands while the service holds the database.

Figures by hand: ``small`` does load 10 ms + forward 30 ms = 40 ms per
iteration, 100 tokens: 25 it/s, 2,500 tokens/s, starvation 25% (at least the
20% that makes the input the bottleneck, docs/DIAGNOSIS.md), removing load
gives 40/30 = 1.33x. ``small-b`` (started an hour later, same tags) does
forward 50 ms: 60 ms per iteration, 16.67 it/s, 1,666.7 tokens/s; against
``small`` its forward grew by 20 ms per iteration, the whole gap.
"""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest
from pytest import approx

from tests.serve.runs import T0, write_pair
from tests.serve.served import Served, start_service
from tests.support.cli import invoke


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    tmp = tmp_path_factory.mktemp("api")
    (tmp / "runs").mkdir()
    ids = write_pair(tmp / "runs")
    s = start_service(tmp)
    s.wait_for_runs(ids)
    yield s
    s.stop()



SMALL_VERDICT = ("Bottleneck: input - main waits for data 25% of its time in load (10 ms/iter); "
                 "without it: 1.33x faster.")


def test_runs_is_the_exact_hand_made_json(served: Served) -> None:
    runs = served.json("/api/runs")
    assert [r["run_id"] for r in runs] == ["small", "small-b"]
    assert runs[0] == {
        "run_id": "small", "name": "small", "source": "jsonl", "started": T0,
        "started_utc": "2025-11-29T08:00:00+00:00", "tags": {"gpus": "1"},
        "iterations": {"total": 20, "steady": 20},
        "throughput": {"iters_per_s": approx(25.0), "tokens_per_s": approx(2500.0),
                       "samples_per_s": None},
        "bottleneck": {"stage": "main", "category": "starvation", "phase": "load",
                       "share": approx(0.25), "straggler": None, "cause": None},
        "verdict": SMALL_VERDICT, "confidence": "high"}
    assert runs[1]["throughput"] == {"iters_per_s": approx(1 / 0.060),
                                     "tokens_per_s": approx(100 / 0.060), "samples_per_s": None}
    # the tag filter, as tlog runs --tag
    assert served.json("/api/runs?tag=gpus%3D2") == []
    # paged and filtered on the server: the page's rows, and how many match
    status, headers, body = served.get("/api/runs?offset=1&limit=1")
    assert status == 200 and headers["x-tlog-total"] == "2"
    assert json.loads(body) == [runs[1]]
    status, headers, body = served.get("/api/runs?q=SMALL-B")
    assert headers["x-tlog-total"] == "1" and [r["run_id"] for r in json.loads(body)] == ["small-b"]
    assert served.get("/api/runs?limit=-1")[0] == 400
    status, _, page = served.get("/?q=small-b")
    assert status == 200 and b"1 run(s)" in page and b"page 1 of" not in page


def test_diagnosis_figures_by_hand_and_etag(served: Served) -> None:
    status, headers, body = served.get("/api/runs/small/diagnosis")
    assert status == 200
    d = json.loads(body)
    assert d["verdict"] == SMALL_VERDICT
    assert d["iterations"] == {"total": 20, "steady": 20, "excluded": 0, "warmup": 0,
                               "event": 0, "attempt": 0}
    assert d["categories"] == {"starvation": approx(0.25), "backpressure": 0.0,
                               "compute": approx(0.75), "sync": 0.0, "unaccounted": 0.0}
    (stage,) = d["stages"]
    assert stage["seconds"] == approx(20 * 0.040)
    assert [(p["phase"], p["seconds_per_iter"]) for p in stage["top_phases"]] == [
        ("forward", approx(0.030)), ("load", approx(0.010))]
    etag = headers["etag"]
    status, _, body = served.get("/api/runs/small/diagnosis", headers={"If-None-Match": etag})
    assert (status, body) == (304, b"")


def test_compare_names_the_grown_phase_and_the_default_baseline(served: Served) -> None:
    c = served.json("/api/compare?a=small&b=small-b")
    assert (c["baseline"], c["candidate"], c["unit"]) == ("small", "small-b", "tokens/s")
    assert c["throughput_ratio"] == approx(0.040 / 0.060)
    top = c["contributors"][0]
    assert (top["stage"], top["phase"]) == ("main", "forward")
    assert top["delta_s_per_iter"] == approx(0.020)
    auto = served.json("/api/compare?b=small-b")
    assert auto["baseline"] == "small" and auto["baseline_choice"]["auto"] is True
    status, _, body = served.get("/api/compare?b=small")
    assert status == 404 and "no earlier run" in json.loads(body)["error"]


def test_run_summary_carries_the_high_water_mark(served: Served) -> None:
    r = served.json("/api/runs/" + urllib.parse.quote("small-b", safe=""))
    assert r["high_water_mark"] == {
        "run_id": "small", "match": "shared", "reason": None,
        "throughput": {"iters_per_s": approx(25.0), "tokens_per_s": approx(2500.0),
                       "samples_per_s": None},
        "versus": {"unit": "tokens/s", "value": approx(100 / 0.060),
                   "mark_value": approx(2500.0), "ratio": approx(0.040 / 0.060),
                   "mark_run": "small", "best": approx(2500.0)}}
    first = served.json("/api/runs/small")["high_water_mark"]
    assert first["run_id"] is None and "no run started before it" in first["reason"]
    assert (first["versus"]["mark_run"], first["versus"]["best"]) == ("small", approx(2500.0))
    assert served.get("/api/runs/nope")[0] == 404


def test_sql_reads_and_refuses_writes(served: Served) -> None:
    q = urllib.parse.quote("SELECT run_id, count(*) AS n FROM iterations GROUP BY run_id "
                           "ORDER BY run_id")
    assert served.json(f"/api/sql?q={q}") == [{"run_id": "small", "n": 20},
                                              {"run_id": "small-b", "n": 20}]
    for bad in ("DROP TABLE runs", "DELETE FROM iterations",
                "SELECT * FROM read_csv('/etc/passwd')"):
        status, _, body = served.request("POST", "/api/sql", {"sql": bad})
        assert status == 400, bad
        assert json.loads(body)["error"]
    assert served.json("/api/sql?q=" + urllib.parse.quote("SELECT count(*) AS n FROM runs")) \
        == [{"n": 2}]


def test_openapi_documents_every_api_path(served: Served) -> None:
    doc = served.json("/api/openapi.json")
    assert doc["openapi"].startswith("3.")
    assert {"/api/runs", "/api/runs/{run_id}/diagnosis", "/api/compare", "/api/sql"} <= set(
        doc["paths"])


def _tlog(*args: str):
    """The CLI in this process (the test process does not hold the database)."""
    return invoke(list(args))


def test_cli_reads_while_served_and_writes_say_what_to_do(served: Served) -> None:
    db = str(served.db)
    out = _tlog("runs", "--db", db, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == served.json("/api/runs")
    out = _tlog("diagnose", "--run", "small", "--db", db, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == served.json("/api/runs/small/diagnosis")
    out = _tlog("sql", "SELECT count(*) AS n FROM iterations", "--db", db, "--format", "json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == [{"n": 40}]
    # a write goes to the service too: the same report, and one line saying so
    out = _tlog("ingest", str(served.runs / "small"), "--db", db, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["run_id"] == "small"
    out = _tlog("ingest", str(served.runs / "small"), "--db", db)
    assert out.exit_code == 0, out.output
    assert "it took this write" in out.stderr
    q = urllib.parse.quote("SELECT count(*) AS n FROM runs")
    assert served.json(f"/api/sql?q={q}", timeout=10) == [{"n": 2}]


def test_short_load_while_a_run_grows(served: Served) -> None:
    """The load benchmark (benchmarks/bench_serve.py), 3 s: every answer 200,
    iteration counts never going down nor past what was written, and after it
    every iteration written stored exactly once."""
    from benchmarks.bench_serve import run_load

    r = run_load(served.url, served.runs, clients=32, seconds=3.0, floor=False)
    assert r["load"]["errors"] == []
    assert r["load"]["requests"] > 32
    assert r["stored"] == r["distinct"] == r["written"] > 0


def test_loopback_needs_no_token_but_a_loopback_host_name(served: Served) -> None:
    assert served.get("/api/runs", token=None)[0] == 200
    # writes need the write token (in <db>.serve.json) on the loopback too
    assert served.token and len(served.token) >= 16
    assert served.request("POST", "/api/call", {"method": "latest_run"}, token=None)[0] == 401
    assert served.request("POST", "/api/call", {"method": "latest_run"},
                          token="x" * 32)[0] == 401
    # DNS rebinding: another site's page whose name resolves to 127.0.0.1
    assert served.get("/api/runs", token=None, headers={"Host": "evil.example:80"})[0] == 400
    csp = served.get("/")[1]["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self' 'unsafe-eval';" in csp
    assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp


def test_changes_from_another_site_are_refused_and_leases_are_no_more(
        served: Served) -> None:
    # a page of another site can POST text/plain without a preflight: refused
    status, _, _ = served.request("POST", "/api/call", None, headers={
        "Content-Type": "text/plain"})
    assert status == 403
    status, _, _ = served.request("POST", "/api/call", {"method": "latest_run"}, headers={
        "Origin": "http://evil.example"})
    assert status == 403
    # no request closes the database for another process any more
    assert served.request("POST", "/api/lease", {"pid": 1})[0] == 404
    q = urllib.parse.quote("SELECT count(*) AS n FROM iterations WHERE run_id = 'small'")
    t0 = time.monotonic()
    assert served.json(f"/api/sql?q={q}", timeout=20) == [{"n": 20}]
    assert time.monotonic() - t0 < 5


def test_openapi_names_exactly_the_api_routes() -> None:
    """The document cannot drift from the routes: every ``/api`` route of the
    application, and nothing else, is a path of it (``{run_id:path}`` written
    ``{run_id}``)."""
    from tlog.web.app import OPENAPI, build_app
    from tlog.web.service import ServeConfig

    app = build_app(ServeConfig(db=None), service=None)  # type: ignore[arg-type]
    routes = {r.path.replace(":path", "") for r in app.app.routes if r.path.startswith("/api")}
    assert routes == set(OPENAPI["paths"])


def test_sql_results_are_cut_at_sql_max_rows(served: Served) -> None:
    """A statement returning more than SQL_MAX_ROWS rows gets the first ones and a
    header saying so (before: every row held in the service: 3 million short rows
    took 2 GB, a SELECT * of a big phases table could take it down)."""
    from tlog.web.service import SQL_MAX_ROWS

    q = urllib.parse.quote(f"SELECT range AS i FROM range({SQL_MAX_ROWS * 3 + 7})")
    status, headers, body = served.get(f"/api/sql?q={q}")
    rows = json.loads(body)
    assert status == 200 and [r["i"] for r in rows] == list(range(SQL_MAX_ROWS))
    assert headers["x-tlog-rows-cut"] == str(SQL_MAX_ROWS)
    q = urllib.parse.quote(f"SELECT range AS i FROM range({SQL_MAX_ROWS})")
    status, headers, body = served.get(f"/api/sql?q={q}")
    assert len(json.loads(body)) == SQL_MAX_ROWS and "x-tlog-rows-cut" not in headers
    status, _, page = served.get("/sql?q=" + urllib.parse.quote(
        f"SELECT range AS i FROM range({SQL_MAX_ROWS + 1})"))
    assert status == 200 and f"The first {SQL_MAX_ROWS} rows".encode() in page


def test_bodies_are_capped_and_deep_json_is_a_400(served: Served) -> None:
    """A 2 MiB SQL body or call: 413 before it is read; the same without a length
    (chunked): 413 as it is read; JSON nested 100,000 deep: 400 with a JSON
    error (Python's parser raised RecursionError: a 500 with a traceback)."""
    import http.client

    host, port = served.url.removeprefix("http://").rsplit(":", 1)

    def post(path: str, headers: dict[str, str], pieces: list[bytes]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.putrequest("POST", path)
        for k, v in {"Content-Type": "application/json",
                     "Authorization": f"Bearer {served.token}", **headers}.items():
            conn.putheader(k, v)
        conn.endheaders()
        try:
            for piece in pieces:
                conn.send(piece)
        except OSError:
            pass                                 # the service may answer and close first
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp.status, body

    big = b"x" * (2 * 2**20)
    for path in ("/api/sql", "/api/call"):       # said in Content-Length: refused unread
        status, body = post(path, {"Content-Length": str(len(big))}, [big])
        assert status == 413 and b"larger than 1,048,576 bytes" in body, (path, body)
    chunk = b"x" * 65536                         # 2.5 MiB chunked, no Content-Length
    status, body = post("/api/sql", {"Transfer-Encoding": "chunked"},
                        [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 40 + [b"0\r\n\r\n"])
    assert status == 413, body
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("/api/sql", "/api/call"):
        status, _, body = served.request("POST", path, None, headers={
            "Content-Type": "application/json"}, raw=deep.encode())
        assert status == 400, (path, body[:200])
        assert "nested too deeply" in json.loads(body)["error"]
    assert served.get("/api/runs/small", timeout=10)[0] == 200
    assert "Traceback" not in served.stderr.read_text()
