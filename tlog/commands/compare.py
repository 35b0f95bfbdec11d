"""``tlog compare``: explain a throughput change between two runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tlog.app import DbOption, JsonOption, app, console, open_database, print_json
from tlog.ingest.errors import UsageError
from tlog.render import OutputFormat, render_frame

if TYPE_CHECKING:
    from tlog.analyze.compare import Comparison

#: Contributors shown in the human output (``--json`` has them all).
DEFAULT_TOP = 8


@app.command("compare")
def compare_command(
    runs: Annotated[list[str], typer.Argument(
        help="BASELINE CANDIDATE, or CANDIDATE alone to compare with the best earlier run "
             "whose tags match.", show_default=False, metavar="[BASELINE] CANDIDATE")],
    match: Annotated[str | None, typer.Option(
        "--match", help="With CANDIDATE alone: tag keys the baseline must share, comma-"
                        "separated (default: every tag the two runs have in common, except identity "
                        "tags such as git_sha, git_branch, host).",
        show_default=False)] = None,
    top: Annotated[int, typer.Option("--top", help="Contributors to show.", min=1)] = DEFAULT_TOP,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Explain a throughput change: ratio, whether it is beyond noise, and which phases moved.

    Example: tlog compare RUN_A RUN_B, or tlog compare RUN_B --match gpus,branch
    """
    if len(runs) not in (1, 2):
        raise UsageError(f"give BASELINE CANDIDATE or CANDIDATE alone, not {len(runs)} run ids")
    keys = [k.strip() for k in match.split(",")] if match is not None else None
    if keys is not None and (not all(keys)):
        raise UsageError(f"bad --match {match!r}: write tag keys separated by commas, e.g. gpus,branch")
    if keys is not None and len(runs) == 2:
        raise UsageError("--match chooses the baseline; it needs CANDIDATE alone")
    database = open_database(db)
    if len(runs) == 2:
        result = database.compare(runs[0], runs[1])
    else:
        result = database.compare(runs[0], match=keys)
    if json_:
        print_json(result.to_dict())
        return
    _render(result, top)


def _rate(summary, unit: str | None) -> str:
    key = {"tokens/s": "tokens_per_s", "samples/s": "samples_per_s",
           "iterations/s": "iters_per_s"}.get(unit or "")
    value = summary.throughput.get(key) if key else None
    from tlog.analyze.text import rate

    return rate(value, unit or "") if value is not None else "n/a"


def _render(c: Comparison, top: int) -> None:
    import polars as pl

    base, cand = c.runs["baseline"], c.runs["candidate"]
    how = ""
    if c.baseline_choice:
        how = (" (best earlier run of the same program: no configuration tags to match)"
               if c.baseline_choice.get("match") == "phases"
               else " (best earlier run with matching tags)")
        if c.baseline_choice.get("machine") == "same":
            how = how[:-1] + ", on the same kind of machine)"
    lines = [f"Baseline:  {c.baseline}{how}: {_rate(base, c.unit)}",
             f"Candidate: {c.candidate}: {_rate(cand, c.unit)}"]
    if c.throughput_ratio is not None:
        lines.append(f"Throughput ratio: {c.throughput_ratio:.3f} (candidate / baseline)")
    tested = c.significance.delta_s_per_iter is not None   # else too few iterations, no stage
    mark = ("significant" if c.significant else "not significant") if tested else "not tested"
    lines.append(f"Change: {mark} - {c.significance.reason}")
    for side, summary in (("baseline", base), ("candidate", cand)):
        if summary.verdict:
            lines.append(f"  {side}: {summary.verdict}")
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    stages = pl.DataFrame({
        "stage": [s.stage + (" *" if s.bottleneck else "") for s in c.stages],
        "baseline ms/iter": [_ms(s.baseline_s_per_iter) for s in c.stages],
        "candidate ms/iter": [_ms(s.candidate_s_per_iter) for s in c.stages],
        "change ms/iter": [_ms(s.delta_s_per_iter) for s in c.stages],
    }, schema={"stage": pl.String, "baseline ms/iter": pl.Float64,
               "candidate ms/iter": pl.Float64, "change ms/iter": pl.Float64})
    render_frame(stages, OutputFormat.table, title="Stages (* = candidate's bottleneck)")
    from tlog.analyze.compare import top_contributors

    shown, left_out = top_contributors(c, top)
    if shown:
        frame = pl.DataFrame({
            "stage": [x.stage for x in shown],
            "phase": [x.phase + (" (self)" if x.scope == "self" else "") for x in shown],
            "category": [x.category for x in shown],
            "baseline ms": [_ms(x.baseline_s_per_iter) for x in shown],
            "candidate ms": [_ms(x.candidate_s_per_iter) for x in shown],
            "change ms": [_ms(x.delta_s_per_iter) for x in shown],
            "share of gap": [None if x.share_of_gap is None else round(x.share_of_gap * 100, 1)
                             for x in shown],
        }, schema={"stage": pl.String, "phase": pl.String, "category": pl.String,
                   "baseline ms": pl.Float64, "candidate ms": pl.Float64,
                   "change ms": pl.Float64, "share of gap": pl.Float64})
        render_frame(frame, OutputFormat.table, title="What moved (per iteration; share in %)")
        if left_out:
            console.print(f"({left_out} more contributor{'s' if left_out != 1 else ''} moved "
                          f"less and {'are' if left_out != 1 else 'is'} left out; --top "
                          f"{top + left_out} shows all)", highlight=False, markup=False)
    console.print(c.verdict, highlight=False, markup=False, soft_wrap=True)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3) + 0.0  # no "-0"
