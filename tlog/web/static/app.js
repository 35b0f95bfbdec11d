// tlog serve: the run page's script. Draws the run report's charts (Vega-Lite
// specs from /api/runs/ID/charts, the Vega libraries from /static/vega.js) and
// polls /api/runs/ID/diagnosis (If-None-Match: the data digest; before the first
// iterations, the run summary /api/runs/ID instead) to update the
// verdict, counts, stage table, findings and charts while the run grows, without
// a reload; when the data changed, also /api/runs/ID/live, the stragglers of the
// run's latest seconds ("Now"). Every text from the logs goes in through textContent, never as HTML.
// window.tlogStatus says what happened (done, errors, charts, updates, the data
// digest shown (key) and the one the charts were drawn from (chartKey)), as the
// offline report's script does (read by tests/support/browser.py).
(function () {
  "use strict";
  var root = document.getElementById("run");
  if (!root) { return; }
  var runId = root.getAttribute("data-run");
  var key = root.getAttribute("data-key");
  var pollMs = parseInt(root.getAttribute("data-poll-ms"), 10) || 2000;
  var base = "/api/runs/" + encodeURIComponent(runId);
  var CATS = ["starvation", "backpressure", "compute", "sync", "unaccounted"];
  var status = {done: false, errors: [], charts: {}, updates: 0, key: key, chartKey: null,
                iterations: null, renderMs: null};
  window.tlogStatus = status;
  status.iterations = parseInt(document.getElementById("iterations").textContent, 10);
  window.addEventListener("error", function (e) { status.errors.push(String(e.message || e)); });

  function text(id, value) {
    var node = document.getElementById(id);
    if (node) { node.textContent = value; }
  }
  function num(v, digits) {
    if (v === null || v === undefined) { return "-"; }
    return Number(v).toLocaleString("en-US", {maximumFractionDigits: digits});
  }
  function pct(v) {
    if (v === null || v === undefined) { return "-"; }
    var p = v * 100;
    return (p >= 10 || p === 0 ? p.toFixed(0) : p.toFixed(1)) + "%";
  }
  function cell(tr, value, cls) {
    var td = document.createElement("td");
    td.textContent = value;
    if (cls) { td.className = cls; }
    tr.appendChild(td);
  }

  function render(d) {
    text("verdict", d.verdict);
    text("iterations", String(d.iterations.total));
    text("steady", String(d.iterations.steady));
    text("confidence", d.confidence);
    var tp = d.throughput, parts = [num(tp.iters_per_s, 2) + " it/s"];
    if (tp.tokens_per_s !== null) { parts.push(num(tp.tokens_per_s, 0) + " tokens/s"); }
    if (tp.samples_per_s !== null) { parts.push(num(tp.samples_per_s, 2) + " samples/s"); }
    text("throughput", "throughput: " + parts.join(", "));
    var bn = d.bottleneck ? d.bottleneck.stage : null;
    var body = document.querySelector("#stages tbody");
    if (body) {
      var rows = d.stages.map(function (s) {
        var tr = document.createElement("tr");
        cell(tr, s.stage + (s.stage === bn ? " *" : ""));
        cell(tr, String(s.workers), "num");
        cell(tr, String(s.iterations), "num");
        cell(tr, num(s.throughput.iters_per_s, 2), "num");
        cell(tr, num(s.throughput.tokens_per_s, 0), "num");
        CATS.forEach(function (c) { cell(tr, pct(s.categories[c]), "num"); });
        cell(tr, s.top_phases.slice(0, 4).map(function (p) {
          return p.phase + " " + pct(p.share);
        }).join(", "));
        return tr;
      });
      body.replaceChildren.apply(body, rows);
    }
    var list = document.getElementById("findings");
    if (list) {
      var items = d.findings.map(function (f) {
        var li = document.createElement("li");
        var sev = document.createElement("span");
        sev.className = "sev sev-" + String(f.severity).replace(/[^a-z]/g, "");
        sev.textContent = f.severity;
        var code = document.createElement("strong");
        code.textContent = f.code;
        li.append(sev, " ", code, " ", f.message);
        return li;
      });
      if (!items.length) {
        var none = document.createElement("li");
        none.textContent = "none";
        items.push(none);
      }
      list.replaceChildren.apply(list, items);
    }
    status.iterations = d.iterations.total;
  }

  // The run now (/api/runs/ID/live: the latest seconds' verdict), polled with
  // the diagnosis: a straggler that began a minute ago shows here while the
  // whole run's figures still average it away.
  function renderNow(v) {
    text("now-window", String(Math.round(v.window.seconds)));
    var list = document.getElementById("now-stragglers");
    if (!list) { return; }
    var items = v.stragglers.map(function (s) {
      var li = document.createElement("li");
      var sev = document.createElement("span");
      sev.className = "sev sev-" + String(s.severity).replace(/[^a-z]/g, "");
      sev.textContent = "straggler";
      var words = " rank " + s.rank + " of " + s.stage + ": its " + s.kind
        + (s.phase ? " (" + s.phase + ")" : "")
        + (s.own_over_peers ? " takes " + Number(s.own_over_peers).toFixed(2)
           + "x its peers' time" : "");
      li.append(sev, words);
      return li;
    });
    if (!items.length) {
      var none = document.createElement("li");
      none.textContent = "no straggler";
      items.push(none);
    }
    list.replaceChildren.apply(list, items);
    status.stragglersNow = v.stragglers.map(function (s) { return s.rank; });
  }

  function fetchNow() {
    return fetch(base + "/live", {credentials: "same-origin"}).then(function (resp) {
      if (!resp.ok) { throw new Error("live: HTTP " + resp.status); }
      return resp.json().then(renderNow);
    });
  }

  function measure(box, chartKey) {
    var svg = box.querySelector("svg");
    var r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    var marks = box.querySelectorAll("g.role-mark > *:not(g)").length;
    status.charts[chartKey] = {width: r.width, height: r.height, marks: marks};
  }

  var drawing = null;
  function drawCharts() {
    if (drawing) { return drawing; }
    var t0 = performance.now();
    drawing = fetch(base + "/charts", {credentials: "same-origin"})
      .then(function (resp) {
        if (!resp.ok) { throw new Error("charts: HTTP " + resp.status); }
        return resp.json();
      })
      .then(function (payload) {
        if (typeof vegaEmbed !== "function") { throw new Error("the Vega libraries did not load"); }
        var holder = document.getElementById("charts");
        var sections = payload.charts.map(function (c) {
          var sec = document.createElement("section");
          sec.className = "chart";
          var h = document.createElement("h3");
          h.textContent = c.title;
          var cap = document.createElement("p");
          cap.className = "caption";
          cap.textContent = c.caption;
          var box = document.createElement("div");
          box.className = "tlog-chart";
          box.setAttribute("data-chart", c.key);
          sec.append(h, cap, box);
          return {sec: sec, box: box, c: c};
        });
        var jobs = sections.map(function (s) {
          return vegaEmbed(s.box, s.c.spec, {renderer: "svg", mode: "vega-lite",
                                             actions: false})
            .then(function () { return s; });
        });
        return Promise.all(jobs).then(function (done) {
          // swap the new charts in at once, so the page never shows none
          holder.replaceChildren.apply(holder, done.map(function (s) { return s.sec; }));
          done.forEach(function (s) { measure(s.box, s.c.key); });
          status.chartKey = payload.key;
          status.renderMs = performance.now() - t0;
        });
      })
      .catch(function (err) { status.errors.push(String(err && err.message || err)); })
      .then(function () { drawing = null; status.done = true; });
    return drawing;
  }

  // Before the run's first iterations are in, its diagnosis does not exist (the
  // API answers 404, which the browser reports as a failed load): the page asks
  // the run's summary (always 200 for a known run) until it counts iterations.
  function hasIterations() {
    return fetch(base, {credentials: "same-origin"}).then(function (resp) {
      if (!resp.ok) { throw new Error("run: HTTP " + resp.status); }
      return resp.json().then(function (r) { return (r.iterations || {}).total > 0; });
    });
  }

  function fetchDiagnosis() {
    return fetch(base + "/diagnosis", {credentials: "same-origin",
                                       headers: {"If-None-Match": "\"" + key + "\""}});
  }

  function poll() {
    (key ? fetchDiagnosis() : hasIterations().then(function (yes) {
      return yes ? fetchDiagnosis() : null;
    }))
      .then(function (resp) {
        if (resp === null || resp.status === 304) { return null; }
        if (!resp.ok) { throw new Error("diagnosis: HTTP " + resp.status); }
        var etag = (resp.headers.get("ETag") || "").replace(/"/g, "");
        return resp.json().then(function (d) { return {d: d, etag: etag}; });
      })
      .then(function (got) {
        if (got) {
          key = got.etag;
          status.key = key;
          render(got.d);
          status.updates += 1;
          text("live", "updated " + new Date().toLocaleTimeString());
          if (status.chartKey !== key) { drawCharts(); }
          return fetchNow();
        }
      })
      .catch(function (err) { text("live", "no answer from the service: " + err.message); })
      .then(function () { setTimeout(poll, pollMs); });
  }

  if (key) {
    drawCharts().then(function () { setTimeout(poll, pollMs); });
  } else {                      // nothing to draw before the first iterations
    status.done = true;
    setTimeout(poll, pollMs);
  }
})();
