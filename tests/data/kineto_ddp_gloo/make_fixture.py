"""Cut tests/data/kineto_ddp_gloo out of kept trace runs (README.md), from the
repository root: ``python make_fixture.py RUN_DIR`` (rank 0 of an input_bound run:
``rank0.pt.trace.json.gz``, ``truth-rank0.json``) or ``python make_fixture.py
RUN_DIR RANK NAME STEP...`` (``NAME.pt.trace.json.gz``, ``truth-NAME.json``)."""
import gzip
import json
import sys
from pathlib import Path

src = Path(sys.argv[1])   # OUT/input_bound-trace of `python tests/ddp/ddp_runs.py OUT input_bound-trace`
RANK, NAME, STEPS = 0, "rank0", [12, 14, 29, 30, 34, 36]
if len(sys.argv) > 2:
    RANK, NAME, STEPS = int(sys.argv[2]), sys.argv[3], [int(a) for a in sys.argv[4:]]
doc = json.loads(next((src / "run").glob(f"rank{RANK}.*.json")).read_text())
ev = doc["traceEvents"]
steps = {int(e["name"].split("#")[1]): e for e in ev if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}
wins = [(steps[i]["ts"], steps[i]["ts"] + steps[i]["dur"]) for i in STEPS]
keep = [e for e in ev if e.get("ph") == "M" or (e.get("ph") == "X" and e.get("cat") != "Trace"
        and any(a <= e["ts"] < b for a, b in wins))]
for e in keep:   # Kineto's args hold sizes/ids the converter does not read: smaller file
    if e.get("ph") == "X":
        e.pop("args", None)
out = {k: v for k, v in doc.items() if k != "traceEvents"}
out["traceName"] = f"{NAME}.pt.trace.json"
out["traceEvents"] = keep
dest = Path("tests/data/kineto_ddp_gloo")
with gzip.open(dest / f"{NAME}.pt.trace.json.gz", "wt") as f:
    json.dump(out, f, separators=(",", ":"))
truth = json.loads((src / "truth" / f"truth-rank{RANK}.json").read_text())
t = {k: truth[k] for k in ("rank", "world_size", "scenario", "mode", "unit", "how")}
t["per_step"] = [truth["per_step"][i] for i in STEPS]
(dest / f"truth-{NAME}.json").write_text(json.dumps(t, indent=1) + "\n")
print(len(keep), [k for k in out if k != "traceEvents"])
