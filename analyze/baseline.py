"""The default baseline of ``tlog compare``: :func:`pick_baseline` chooses the
best earlier run (by ``started``) of the same kind whose tags match the
candidate's (the high-water mark); :class:`NoBaselineError` says why none does.
:func:`high_water_mark` is the same choice as a typed :class:`HighWaterMark`
(``tlog watch``), with the reason when there is none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
from tlog.analyze.history import RunSummary, list_runs, run_rows, summarize
from tlog.ingest.errors import RunNotFoundError, TlogError, UsageError


class NoBaselineError(TlogError):
    """No earlier run matches the candidate's tags, so there is no default baseline."""


#: Tags that name *the change under test* or where it ran, not the configuration:
#: a default baseline is looked for across them (the high-water mark of a config is
#: usually set by another commit, branch or node). The shim writes ``git_sha``,
#: ``git_branch``, ``host``, ``python`` and ``torch`` (dflash_runtime.manifest);
#: the rest are common spellings. ``--match`` can still name any of them.
IDENTITY_TAGS: frozenset[str] = frozenset({
    "git_sha", "git_commit", "git_branch", "sha", "commit", "branch",
    "host", "hostname", "node", "python", "torch", "date", "user",
})

def _kinds_of_run(con: duckdb.DuckDBPyConnection) -> dict[str, tuple]:
    """What makes two runs the same program, per run: its source (``jsonl`` or
    ``kineto``), the stages it has iterations of, and its top-level phase names."""
    stages = dict(con.execute("SELECT run_id, list(DISTINCT stage ORDER BY stage) "
                              "FROM iterations GROUP BY run_id").fetchall())
    phases = dict(con.execute("SELECT run_id, list(DISTINCT phase ORDER BY phase) "
                              "FROM phase_layouts WHERE parent IS NULL "
                              "GROUP BY run_id").fetchall())
    sources = dict(con.execute("SELECT run_id, source FROM runs").fetchall())
    return {r: (sources.get(r) or "jsonl", tuple(stages.get(r) or ()), tuple(phases.get(r) or ()))
            for r in set(stages) | set(sources)}


def machine_kinds(con: duckdb.DuckDBPyConnection) -> dict[str, frozenset[tuple]]:
    """Per run, the kinds of machine it ran on: the distinct ``(cpu_model, ncpu,
    gpu_name)`` of its ``machines`` rows (the shim's ``meta`` machine record).
    Runs without rows, and a database without the table, have none."""
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'machines' "
                       "AND NOT internal").fetchall()[0][0]:
        return {}
    out: dict[str, set[tuple]] = {}
    for run_id, cpu, ncpu, gpu in con.execute(
            "SELECT DISTINCT run_id, cpu_model, ncpu, gpu_name FROM machines").fetchall():
        out.setdefault(run_id, set()).add((cpu, ncpu, gpu))
    return {r: frozenset(k) for r, k in out.items()}


def _tag_text(value: Any) -> str:
    """A tag value as ``tlog runs --tag`` reads it (``->>``): a string as is,
    anything else as its JSON text (``true``, ``8``, ``8.0``)."""
    return value if isinstance(value, str) else json.dumps(value)


def pick_baseline(con: duckdb.DuckDBPyConnection, candidate: str, *,
                  match: Sequence[str] | None = None) -> tuple[str, dict[str, Any]]:
    """The best earlier run of the same kind as the candidate (its high-water mark).

    Earlier: ``started`` before the candidate's. Of the same kind: the same
    source and stages (a run of another pipeline is never a default
    baseline), and matching tags: on the keys in ``match``, each of which both
    runs must have with equal values (as ``tlog runs --tag`` reads them);
    without ``match``, on every tag key the two runs share except
    :data:`IDENTITY_TAGS` (commit, branch, host, versions: what a comparison
    looks across), at least one of them. A candidate with no such tags (the
    shim's bare run.json, a profiler trace) matches runs with the same
    top-level phase names instead: the same program.
    Of the same kind of machine, where there is one: when some such runs
    ran on the candidate's kind of machine (:func:`machine_kinds`: CPU model,
    cores, GPU model), only those are considered (a run on a faster machine
    is no high-water mark for this one).
    Best: highest steady tokens/s; runs without tokens come after, by
    samples/s, then by iterations/s (each from ``tlog diagnose``).

    Returns:
        ``(run_id, choice)`` where ``choice`` says how: ``match`` (keys or
        ``"shared"``), ``candidates`` (ids considered), ``throughput``,
        ``machine`` (``"same"``: runs of the candidate's kind of machine
        only; ``"any"``: none of them was, or the candidate's machine is not
        recorded).

    Raises:
        RunNotFoundError: the candidate is not in the database.
        UsageError: ``match`` names a tag the candidate does not have.
        NoBaselineError: no earlier run matches (the message says what blocked
            each kind of run and which ``--match`` keys would admit one).
    """
    return _pick(candidate, match, {r.run_id: r for r in run_rows(con)}, _kinds_of_run(con),
                 lambda: machine_kinds(con), lambda runs: [summarize(con, r) for r in runs])


def _pick(candidate: str, match: Sequence[str] | None, rows: dict[str, RunSummary],
          kinds: dict[str, tuple], machines_of: Callable[[], dict[str, frozenset[tuple]]],
          score: Callable[[list[RunSummary]], list[RunSummary]]) -> tuple[str, dict[str, Any]]:
    """:func:`pick_baseline` over what it reads of the database: ``rows`` (every
    run), ``kinds`` (:func:`_kinds_of_run`), ``machines_of()``
    (:func:`machine_kinds`, asked only when some run matches) and ``score``
    (the runs with their figures, as :func:`tlog.analyze.history.summarize`
    fills them), so that :func:`high_water_marks` reads them once for all runs."""
    me = rows.get(candidate)
    if me is None:
        msg = f"no run {candidate!r} in the database: 'tlog runs' lists the run ids"
        raise RunNotFoundError(msg)
    keys = [k for k in (match or []) if k]
    missing = [k for k in keys if k not in me.tags]
    if missing:
        have = ", ".join(sorted(me.tags)) or "none"
        msg = f"run {candidate!r} has no tag {missing[0]!r} to match on (its tags: {have})"
        raise UsageError(msg)
    if me.started is None:
        msg = f"run {candidate!r} has no start time, so no run is earlier; name a baseline"
        raise NoBaselineError(msg)
    own = [k for k in me.tags if k not in IDENTITY_TAGS]

    def differing(other: RunSummary) -> list[str]:
        """The match keys on which ``other`` differs from the candidate (or lacks)."""
        use = keys or [k for k in own if k in other.tags]
        if not keys and own and not use:
            return list(own)         # shares no tag at all: another experiment
        return [k for k in use if k not in other.tags
                or _tag_text(other.tags[k]) != _tag_text(me.tags[k])]

    source, stages, phases = kinds.get(candidate, ("jsonl", (), ()))
    by_phases = not keys and not own
    before = [r for r in rows.values()
              if r.run_id != candidate and r.started is not None and r.started < me.started]
    alike = [r for r in before if kinds.get(r.run_id, ("", (), ()))[:2] == (source, stages)
             and (not by_phases or kinds[r.run_id][2] == phases)]
    earlier = [r for r in alike if not differing(r)]
    scored = [r for r in score(earlier) if r.iterations["steady"] > 0]
    if not scored:
        raise NoBaselineError(_no_baseline_message(candidate, me.tags, keys, before, alike,
                                                   earlier, differing, list(stages), by_phases))
    machines = machines_of()
    mine = machines.get(candidate)
    same = [r for r in scored if mine and machines.get(r.run_id) == mine]
    if same:
        scored = same
    best = max(scored, key=lambda r: (r.rank_key, -(r.started or 0.0)))
    choice = {"auto": True, "match": keys or ("phases" if by_phases else "shared"),
              "candidates": [r.run_id for r in scored], "throughput": dict(best.throughput),
              "machine": "same" if same else "any"}
    return best.run_id, choice


def _no_baseline_message(candidate: str, tags: dict[str, Any], keys: list[str],
                         before: list[RunSummary], alike: list[RunSummary],
                         matched: list[RunSummary], differing: Any,
                         stages: list[str], by_phases: bool) -> str:
    """One line saying why no earlier run is a baseline: none earlier, none
    with the same stages, or which match keys blocked them (with the
    candidate's and the earlier runs' values) and which keys would admit one."""
    name_one = f"tlog compare BASELINE {candidate}"
    if not before:
        return f"no earlier run matches {candidate!r}: no run started before it; name one: {name_one}"
    if not alike:
        what = "source, stages and phases" if by_phases else "source and stages"
        extra = ("; it has no configuration tags to match on, so only the same program "
                 "(its phase names) is looked for" if by_phases else "")
        return (f"no earlier run matches {candidate!r}: none has its {what} "
                f"(stages {', '.join(stages) or 'none'}){extra}; name one: {name_one}")
    if matched:
        ids = ", ".join(r.run_id for r in matched)
        return (f"no earlier run matches {candidate!r}: the matching runs ({ids}) have no "
                f"steady-state iterations; name one: {name_one}")
    values: dict[str, set[str]] = {}
    for r in alike:
        for k in differing(r):
            values.setdefault(k, set()).add(_tag_text(r.tags[k]) if k in r.tags else "(none)")
    blocking = sorted(values)
    on = ", ".join(keys) if keys else "the tags they share"
    why = "; ".join(f"{k} ({candidate}: {_tag_text(tags[k])}; earlier: "
                    f"{', '.join(sorted(values[k]))})" for k in blocking)
    # each key on which some earlier run of its kind agrees: --match it to admit that run
    admits = {k: [r.run_id for r in alike if k in r.tags
                  and _tag_text(r.tags[k]) == _tag_text(tags[k])]
              for k in sorted(tags) if k not in keys and k not in IDENTITY_TAGS}
    usable = [(k, ids) for k, ids in admits.items() if ids]
    hint = ("; ".join(f"--match {k} admits {', '.join(ids[:3])}"
                      + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
                      for k, ids in usable[:3]) + ", or name one" if usable else
            "it is the first run of its kind; name one")
    return f"no earlier run matches {candidate!r} on {on}: earlier runs differ on {why}; {hint}: {name_one}"


#: The throughput units of a high-water mark, in the order a run is ranked by
#: (:attr:`tlog.analyze.history.RunSummary.rank_key`): tokens, then samples,
#: then iterations per second.
THROUGHPUT_UNITS: tuple[tuple[str, str], ...] = (
    ("tokens_per_s", "tokens/s"), ("samples_per_s", "samples/s"), ("iters_per_s", "it/s"))


def first_rate(throughput: Mapping[str, float | None]
               ) -> tuple[str | None, str | None, float | None]:
    """``(key, unit, value)`` of the first of :data:`THROUGHPUT_UNITS` that
    ``throughput`` (``iters_per_s``, ``tokens_per_s``, ``samples_per_s``)
    reports; ``(None, None, None)`` when it reports none. The unit a run is
    shown in against its high-water mark (``tlog watch``, ``tlog serve``)."""
    return next(((k, u, throughput[k]) for k, u in THROUGHPUT_UNITS
                 if throughput.get(k) is not None), (None, None, None))


@dataclass(frozen=True)
class HighWaterMark:
    """The high-water mark of a run: the best earlier run of the same
    configuration (:func:`pick_baseline`, ``tlog compare``'s default baseline).

    Attributes:
        run_id: that run, or None when there is none.
        throughput: its steady ``iters_per_s``, ``tokens_per_s``,
            ``samples_per_s`` (``tlog diagnose``'s; None when not reported);
            empty when there is no such run.
        match: how the configuration was matched (``pick_baseline``'s
            ``choice["match"]``: tag keys, ``"shared"`` or ``"phases"``), or None.
        reason: why there is none (:class:`NoBaselineError`'s message), or None.
    """

    run_id: str | None
    throughput: dict[str, float | None]
    match: Any = None
    reason: str | None = None

    def value(self, key: str) -> float | None:
        """Its throughput in ``key`` (``tokens_per_s``, ...), or None."""
        return self.throughput.get(key)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the fields above."""
        return {"run_id": self.run_id, "throughput": dict(self.throughput),
                "match": self.match, "reason": self.reason}

    def versus(self, run_id: str, throughput: Mapping[str, float | None]) -> dict[str, Any]:
        """The run ``run_id`` (steady ``throughput``, as :attr:`throughput`)
        against this mark, for the runs list of ``tlog serve``.

        Returns:
            ``{"unit", "value", "mark_value", "ratio", "mark_run", "best"}``:
            ``unit`` the first of :data:`THROUGHPUT_UNITS` the run reports
            (None: none yet) and ``value`` its figure; ``mark_value`` this
            mark's figure in it (None: no mark, or it lacks the unit);
            ``ratio`` value / mark_value; ``mark_run`` the run holding the best
            figure of the configuration up to this run (this mark's run, or
            ``run_id`` when it is at least as fast or there is no mark) and
            ``best`` that figure.
        """
        key, unit, value = first_rate(throughput)
        mark = self.value(key) if key and self.run_id is not None else None
        ratio = value / mark if value is not None and mark else None
        ahead = mark is not None and (value is None or mark > value)
        return {"unit": unit, "value": value, "mark_value": mark, "ratio": ratio,
                "mark_run": self.run_id if ahead else run_id,
                "best": mark if ahead else value}


def high_water_mark(con: duckdb.DuckDBPyConnection, run_id: str, *,
                    match: Sequence[str] | None = None) -> HighWaterMark:
    """The high-water mark of ``run_id``: :func:`pick_baseline`'s choice, typed,
    or a :class:`HighWaterMark` with ``run_id`` None and the reason when no
    earlier run of the same configuration has steady iterations.

    Raises:
        RunNotFoundError: ``run_id`` is not in the database.
        UsageError: ``match`` names a tag the run does not have.
    """
    return _mark(lambda: pick_baseline(con, run_id, match=match))


def _mark(pick: Callable[[], tuple[str, dict[str, Any]]]) -> HighWaterMark:
    try:
        best, choice = pick()
    except NoBaselineError as exc:
        return HighWaterMark(run_id=None, throughput={}, reason=str(exc))
    return HighWaterMark(run_id=best, throughput=dict(choice["throughput"]),
                         match=choice["match"])


def high_water_marks(con: duckdb.DuckDBPyConnection,
                     run_ids: Sequence[str] | None = None) -> dict[str, HighWaterMark]:
    """:func:`high_water_mark` of each run of ``run_ids`` (None: every run), by
    tag matching as ``tlog compare``'s default (no ``match``), reading the
    database once for all of them: the runs' figures in one pass
    (:func:`tlog.analyze.history.list_runs`, the stored diagnosis) instead of
    one per earlier run and candidate (``tlog serve``'s runs list: 40 runs
    took 91 s one by one).

    Raises:
        RunNotFoundError: a run of ``run_ids`` is not in the database.
    """
    rows = {r.run_id: r for r in list_runs(con)}
    kinds = _kinds_of_run(con)
    machines = machine_kinds(con)
    return {r: _mark(lambda r=r: _pick(r, None, rows, kinds, lambda: machines,
                                       lambda runs: runs))
            for r in (rows if run_ids is None else run_ids)}
