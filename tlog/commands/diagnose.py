"""``tlog diagnose``: where one run's time went, which stage limits it, and why.

Human output, in the order a tired engineer reads it: the verdict line
(``Bottleneck: ...``), then a table per stage (throughput and the share of
time in each category, top phases), then the findings with their figures,
then the what-if list. ``--json`` prints ``Diagnosis.to_dict()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from tlog.app import DbOption, JsonOption, app, console, open_database, print_json, shown

if TYPE_CHECKING:
    from tlog.analyze import Diagnosis

_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_CATS = ("starvation", "backpressure", "compute", "sync", "unaccounted")


def _rate(value: float | None, unit: str) -> str:
    from tlog.analyze.text import rate

    return "-" if value is None else rate(value, unit)


def _then_limits(stage: str, limited_by: str | None, multi: bool) -> str:
    """', then target limits' (another stage caps the gain) or ', drafter still
    limits' after a what-if change; nothing for a one-stage run."""
    if not multi or limited_by is None:
        return ""
    return f", {limited_by} still limits" if limited_by == stage else f", then {limited_by} limits"


def stage_table(d: Diagnosis, title: str) -> Any:
    """The per-stage table (workers, iterations, throughput, category shares;
    ``*`` marks the bottleneck stage) as a rich Table (``tlog watch`` shows it too)."""
    from rich import box
    from rich.table import Table

    from tlog.analyze.text import pct

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1))
    table.add_column("stage", no_wrap=True)
    for name in ("wkrs", "iters", "it/s", "tok/s", "starv", "backp", "comp", "sync", "unacc"):
        table.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    bn_stage = d.bottleneck.stage if d.bottleneck else None
    for s in d.stages:
        tput = s.throughput
        name = shown(s.stage) + (" *" if s.stage == bn_stage else "")
        table.add_row(name, str(s.workers), str(s.iterations),
                      _rate(tput.iters_per_s, "").strip(),
                      _rate(tput.tokens_per_s, "").strip(),
                      *[pct(s.categories[c]) for c in _CATS])
    return table


def finding_line(f: Any) -> Any:
    """One finding as an indented rich Text: severity (coloured), code, message."""
    from rich.text import Text

    line = Text("  ")
    line.append(f"{f.severity:<8}", style=_SEVERITY_STYLE.get(f.severity, ""))
    line.append(f" {shown(f.code):<16} ", style="bold")
    line.append(shown(f.message))       # names from the logs inside: escaped here
    return line


def render(d: Diagnosis) -> None:
    """Print a diagnosis for people (module docstring): a
    :class:`~tlog.analyze.Diagnosis`, or its stored JSON through
    :class:`tlog.render.JsonView`."""
    from rich.text import Text

    from tlog.analyze.text import ms, pct, speedup

    console.print(Text(d.verdict, style="bold"), soft_wrap=True)
    it = d.iterations
    dev = ("device times recorded" if d.device_times else
           "host only (no GPU: sync shares are exact)" if d.host_only else
           "timer log (the framework's timers synchronise the device: sync shares are exact)"
           if d.timers_synced else
           "no device times (sync is an upper bound)")
    console.print(
        f"run {d.run_id}: {it.steady} of {it.total} iterations in steady state "
        f"({it.warmup} warm-up, {it.event} overlapping events"
        + (f", {it.attempt} of other attempts" if it.attempt else "")
        + " left out); "
        f"{dev}; confidence {d.confidence}"
        + (f" ({'; '.join(d.confidence_reasons)})" if d.confidence_reasons else ""),
        highlight=False, soft_wrap=True)
    tp = d.throughput
    parts = [_rate(tp.iters_per_s, "it/s"), _rate(tp.tokens_per_s, "tokens/s"),
             _rate(tp.samples_per_s, "samples/s")]
    console.print("throughput: " + ", ".join(p for p in parts if p != "-"), highlight=False)
    from tlog.analyze.text import system_line

    if (machine := system_line(d.system)) is not None:   # host and model names: escaped
        console.print(shown(machine), highlight=False, soft_wrap=True)

    console.print(stage_table(d, "Stages: share of worker wall time (steady state)"))
    bn_stage = d.bottleneck.stage if d.bottleneck else None
    if bn_stage:
        console.print("* bottleneck stage", style="dim")
    for s in d.stages:
        tops = ", ".join(
            f"{p.phase} {pct(p.share)} ({ms(p.seconds_per_iter)}"
            + (f", {ms(p.waiting_s_per_iter)} of it waiting for peers"
               if p.waiting_s_per_iter >= 0.05 * p.seconds_per_iter > 0 else "")
            + ")" for p in s.top_phases[:4])
        if tops:
            console.print(f"  {s.stage} top phases: {tops}", highlight=False, soft_wrap=True)

    if d.findings:
        console.print(Text("Findings", style="bold"))
        for f in d.findings:
            console.print(finding_line(f), soft_wrap=True)
    if d.what_if:
        console.print(Text("What if (pipeline model)", style="bold"))
        multi = len(d.stages) > 1
        for w in d.what_if:
            console.print(
                f"  remove {w.stage}/{w.phase} ({ms(w.seconds_per_iter)}/iter): "
                f"{speedup(w.throughput_gain)} throughput"
                f"{_then_limits(w.stage, w.limited_by, multi)}; halve it: "
                f"{speedup(w.throughput_gain_halved)}"
                f"{_then_limits(w.stage, w.limited_by_halved, multi)}",
                highlight=False, soft_wrap=True)
    for note in d.notes:
        console.print(f"note: {note}", style="dim", highlight=False)


@app.command("diagnose")
def diagnose_command(
    run: Annotated[str | None, typer.Option(
        "--run", "-r", help="Run id (tlog runs lists them; default: the last ingested run).",
        show_default=False)] = None,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Print the bottleneck verdict of a run: stage, category, phase, stragglers, what-if."""
    database = open_database(db)
    run_id = run if run is not None else database.latest_run()
    if not run_id.strip():
        from tlog.ingest.errors import UsageError

        raise UsageError("--run needs a run id (tlog runs lists them)")
    # the verdict the last ingest stored, while the run's data are unchanged:
    # printed without loading the analysis (the same JSON diagnose computes)
    stored = database.stored_diagnosis(run_id)
    if stored is not None:
        from tlog.render import JsonView

        d: Any = JsonView(stored)
    else:
        d = database.diagnose(run_id)
    if json_:
        print_json(d.to_dict())
    else:
        render(d)
