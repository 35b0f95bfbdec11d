"""Cut tests/data/kineto_ddp_gloo out of a kept input_bound trace run (README.md):
``python make_fixture.py RUN_DIR`` from the repository root."""
import gzip
import json
import sys
from pathlib import Path

src = Path(sys.argv[1])   # OUT/input_bound-trace of `python tests/ddp/ddp_runs.py OUT input_bound-trace`
STEPS = [12, 14, 29, 30, 34, 36]
doc = json.loads(next((src / "run").glob("rank0.*.json")).read_text())
ev = doc["traceEvents"]
steps = {int(e["name"].split("#")[1]): e for e in ev if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}
wins = [(steps[i]["ts"], steps[i]["ts"] + steps[i]["dur"]) for i in STEPS]
keep = [e for e in ev if e.get("ph") == "M" or (e.get("ph") == "X" and e.get("cat") != "Trace"
        and any(a <= e["ts"] < b for a, b in wins))]
for e in keep:   # Kineto's args hold sizes/ids the converter does not read: smaller file
    if e.get("ph") == "X":
        e.pop("args", None)
out = {k: v for k, v in doc.items() if k != "traceEvents"}
out["traceName"] = "rank0.pt.trace.json"
out["traceEvents"] = keep
dest = Path("tests/data/kineto_ddp_gloo")
with gzip.open(dest / "rank0.pt.trace.json.gz", "wt") as f:
    json.dump(out, f, separators=(",", ":"))
truth = json.loads((src / "truth" / "truth-rank0.json").read_text())
t = {k: truth[k] for k in ("rank", "world_size", "scenario", "mode", "unit", "how")}
t["per_step"] = [truth["per_step"][i] for i in STEPS]
(dest / "truth-rank0.json").write_text(json.dumps(t, indent=1) + "\n")
print(len(keep), [k for k in out if k != "traceEvents"])
