"""The ``torchtitan`` source: torchtitan's per-rank structured logs (JSONL spans).

torchtitan's structured logger (``torchtitan/observability/structured_logger/``
in github.com/pytorch/torchtitan, read at commit b5bcd76, August 2026) writes
one file per process, ``{dump_folder}/structured_logs/{source}.global_rank_{rank}.
{%Y%m%d-%H%M%S}-{6 random A-Z0-9}.jsonl`` (``jsonl_handler.py``
``TraceJsonlHandler``), one JSON object a line (``TraceJsonlFormatter._log_dict``)
with, among others, ``rank``, ``source``, ``host_name``, ``pid``, ``step`` (set
by ``set_step``), ``step_tags``, ``time_us`` (``int(LogRecord.created * 1e6)``:
the wall clock when the record was made), ``log_type`` (``event`` or
``instant``), ``log_type_name``, ``event_name``, ``value`` and ``task_name``:

- ``log_trace_span(name)`` (``structured_logging.py``) writes ``<name>_start``
  on entry and ``<name>_end`` on exit, whose ``value`` is the span's elapsed
  time in **milliseconds** (``timeit.default_timer``), with a ``<name>_error``
  record before the ``_end`` when the block raised; nested spans pair LIFO per
  ``task_name`` (``gantt_generator.py``);
- ``log_trace_scalar({name: x})`` writes ``metric_value`` instants (``event_name``
  the name, ``value`` the number); ``log_trace_instant(name)`` an instant marker.

The trainer (``torchtitan/trainer.py`` ``Trainer.train``/``train_step``) wraps
each training step in a ``step`` span holding ``gc_collect``, one
``fetching_batch`` per micro-batch, ``fwd_bwd`` (with
``post_dataloading_process`` inside), ``optim`` and, on logging steps,
``collect_dist_metrics``; then ``checkpoint_save`` and ``eval`` (which tag the
step when they really save or validate); it logs the scalar
``local_valid_tokens`` once a step.

Each ``step`` span becomes one v1 ``iter`` record (``iter`` = its ``step``,
``ts`` = its start, ``dur`` = its ``value``), the spans inside it phases
(:data:`SPANS`; nested spans as ``parent/child``; a span repeated in a step,
one per micro-batch, summed), ``local_valid_tokens`` its ``tokens``. Spans and
markers outside any step (set-up, teardown), and a save or a validation that
really ran, become ``event`` records. Everything else is counted and named in
the file's warnings: lines that are not torchtitan records, span names tlog
does not know the place of (kept as phases, categorised by their name), spans
that end without a start, spans that raised, unmapped scalars.
docs/TIMER_LOGS.md "torchtitan's structured logs" has the mapping and what
is left out.

Declared under the ``tlog.sources`` entry points as ``torchtitan``, as a
third-party plugin declares its source; it claims its files before the
``jsonl`` source (:attr:`Source.before`), whose ``*.jsonl`` they also match.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dflash_runtime.format import CHILD_SEP, MAX_DURATION_S, categorize

if TYPE_CHECKING:
    from tlog.ingest.sources import Source

#: ``TraceJsonlHandler``'s file name: ``{source}.global_rank_{rank}.{stamp}-{random}.jsonl``
#: (the ``source`` may itself hold dots). The files are claimed by name, so a run
#: of many shim logs costs no read of theirs.
FILE_NAME = re.compile(r"^(?P<source>.+)\.global_rank_(?P<rank>\d+)\.(?P<rest>[^/]*)\.jsonl$")

#: The span that is one training step (``Trainer.train``: ``with sl.log_trace_span("step")``).
STEP_SPAN = "step"

#: Spans of torchtitan's trainer -> category of the phase they become, from what
#: each runs (``torchtitan/trainer.py``, ``tools/utils.py``, ``tools/profiler.py``
#: at b5bcd76). tlog's choice of category, one per span:
#:
#: - ``fetching_batch``: ``next(data_iterator)``, the data loader: starvation;
#: - ``fwd_bwd``: forward, loss and backward, where DDP and FSDP also reduce the
#:   gradients (no span of their own: the wait is found from rank alignment,
#:   ``analyze.lockstep``, as for the shim's ``backward``): compute;
#: - ``post_dataloading_process`` (inside ``fwd_bwd``): input preparation on the
#:   host after the fetch (masks, context-parallel sharding): compute;
#: - ``optim``: gradient clipping (its norm all-reduce), the finite-loss
#:   all-reduce, ``optimizer.step()``, the LR schedulers: compute;
#: - ``collect_dist_metrics``: ``dist_sum``/``dist_max`` of the loss and token
#:   counts read back to the host: sync;
#: - ``gc_collect``: ``GarbageCollection.run`` (a collection every ``gc_freq``
#:   steps): compute, the host's own work;
#: - ``kineto_profiler_step_call``, ``memory_profiler_step_call``: the profilers'
#:   ``step()``: compute.
SPANS: dict[str, str] = {
    "fetching_batch": "starvation",
    "fwd_bwd": "compute",
    "post_dataloading_process": "compute",
    "optim": "compute",
    "collect_dist_metrics": "sync",
    "gc_collect": "compute",
    "kineto_profiler_step_call": "compute",
    "memory_profiler_step_call": "compute",
}

#: Spans that are an ``event`` when they really ran (their step tag appeared
#: while they were open: ``checkpoint/dcp.py`` ``_save`` and
#: ``components/validate.py`` ``validate`` tag the step; on other steps the call
#: returns at once and is a phase like the others). Iterations overlapping an
#: event are left out of steady state, as a shim ``event`` does. A call that did
#: not save or validate is a phase of category compute (the check itself).
EVENT_SPANS: dict[str, str] = {"checkpoint_save": "checkpoint_save", "eval": "eval"}

#: The scalar that gives an iteration's ``tokens`` (``train_step``:
#: ``log_trace_scalar({"local_valid_tokens": ...})``, this rank's non-padding
#: labels summed over the step's micro-batches).
TOKENS_SCALAR = "local_valid_tokens"
#: Scalars known and deliberately not mapped: the global count is the ranks' sum
#: of ``local_valid_tokens``.
KNOWN_SCALARS = frozenset({TOKENS_SCALAR, "global_valid_tokens"})

#: Longest line read (bytes); a record is under 2 KB (``MAX_MESSAGE_SIZE`` caps its
#: message at 1,000 characters). Longer lines are damage, skipped and counted.
#: The same cap as the v1 reader's (``ingest.sources.MAX_LINE_BYTES``).
MAX_LINE_BYTES = 1 << 20

#: Names listed one by one in a warning (then a count). tlog's choice.
MAX_NAMED = 8


def source_of_name(name: str) -> tuple[str, int] | None:
    """``(source, rank)`` from a torchtitan structured-log file name, else None."""
    m = FILE_NAME.match(name)
    return (m.group("source"), int(m.group("rank"))) if m else None


def claims(name: str) -> bool:
    """Whether a file name is one ``TraceJsonlHandler`` writes."""
    return FILE_NAME.match(name) is not None


def attempt_of(path: Path) -> int:
    """0 for the first file of its ``(source, rank)`` in its folder, ``k`` for the
    ``k``-th after it by name (the name's timestamp: a job restarted into the same
    dump folder, each start a file of its own)."""
    got = source_of_name(path.name)
    if got is None:
        return 0
    prefix = f"{got[0]}.global_rank_{got[1]}."
    try:
        names = sorted(n for n in os.listdir(path.parent)
                       if n.startswith(prefix) and claims(n) and source_of_name(n) == got)
    except OSError:
        return 0
    return names.index(path.name) if path.name in names else 0


@dataclass
class _Open:
    """A span between its ``_start`` and ``_end`` record."""

    name: str
    start_us: int
    step: int | None
    tags: tuple[str, ...]
    line: int
    #: where its time goes: "iter" (the step), "phase" (a phase of the open
    #: iteration: ``path`` its name), "event", "inside_event" (ignored), "outside"
    role: str = "outside"
    path: str = ""


@dataclass
class _Iter:
    """The iteration being built from an open ``step`` span."""

    step: int
    ts: float
    phases: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    tokens: int | None = None


@dataclass
class _Counts:
    """What was not mapped, for the file's warnings (``files.meta`` ``extra``)."""

    bad: int = 0
    first_bad: tuple[int, str] | None = None
    unknown: dict[str, int] = field(default_factory=dict)
    orphans: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    scalars: dict[str, int] = field(default_factory=dict)
    unclosed: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    events: int = 0

    def reject(self, line: int, why: str) -> None:
        self.bad += 1
        if self.first_bad is None:
            self.first_bad = (line, why)


def _lines(fh: IO[bytes], counts: _Counts) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each complete line of ``fh``; a line longer
    than :data:`MAX_LINE_BYTES` is read past and counted, never held; a last
    line with no line break yet (being written) is left for the next read."""
    n = 0
    while True:
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        n += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = fh.readline(MAX_LINE_BYTES)
            if not raw:
                return              # a giant last line still being written
            counts.reject(n, f"longer than {MAX_LINE_BYTES:,} bytes")
            continue
        if not raw.endswith(b"\n"):
            return
        yield n, raw.decode("utf-8", "replace")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _time_us(rec: dict[str, Any]) -> int | None:
    """``time_us``, else ``time_ms`` x 1000 (``gantt_generator`` falls back so too)."""
    us = _number(rec.get("time_us"))
    if us is None:
        ms = _number(rec.get("time_ms"))
        us = None if ms is None else ms * 1000
    return None if us is None or us < 0 else int(us)


def _tags(rec: dict[str, Any]) -> tuple[str, ...]:
    tags = rec.get("step_tags")
    return tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else ()


class _Reader:
    """Turns one file's records into v1 records (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        named = source_of_name(path.name)
        self.file_source, self.file_rank = named if named else ("torchtitan", 0)
        self.attempt = attempt_of(path)
        self.counts = _Counts()
        self.meta: dict[str, Any] | None = None
        self.stacks: dict[Any, list[_Open]] = {}
        self.iter: _Iter | None = None
        self.last_step: int | None = None

    # -- records -----------------------------------------------------------------
    def read(self, fh: IO[bytes]) -> Iterator[dict[str, Any]]:
        for n, text in _lines(fh, self.counts):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except ValueError:
                self.counts.reject(n, "not JSON")
                continue
            if not isinstance(rec, dict):
                self.counts.reject(n, "not a JSON object")
                continue
            name = rec.get("log_type_name")
            if not isinstance(name, str) or not name:
                self.counts.reject(n, "no log_type_name")
                continue
            t_us = _time_us(rec)
            if t_us is None:
                self.counts.reject(n, "no time_us")
                continue
            if self.meta is None:
                self.meta = self._meta(rec)
                yield self.meta
            yield from self._record(n, rec, name, t_us)

    def _meta(self, rec: dict[str, Any]) -> dict[str, Any]:
        rank = rec.get("rank")
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 \
            else self.file_rank
        stage = rec.get("source") if isinstance(rec.get("source"), str) and rec.get("source") \
            else self.file_source
        worker = f"{stage}-{rank}" + (f".{self.attempt}" if self.attempt else "")
        meta: dict[str, Any] = {"type": "meta", "v": 1, "rank": rank, "stage": stage,
                                "worker": worker}
        if isinstance(rec.get("host_name"), str):
            meta["host"] = rec["host_name"]
        pid = rec.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and pid >= 0:
            meta["pid"] = pid
        return meta

    def _record(self, n: int, rec: dict[str, Any], name: str,
                t_us: int) -> Iterator[dict[str, Any]]:
        log_type = rec.get("log_type")
        stack = self.stacks.setdefault(rec.get("task_name"), [])
        if log_type == "instant":
            # instants first: markers named ``training_start`` are not span starts
            yield from self._instant(n, rec, name, t_us, stack)
        elif name.endswith("_start"):
            self._start(n, rec, name.removesuffix("_start"), t_us, stack)
        elif name.endswith("_end"):
            yield from self._end(n, rec, name.removesuffix("_end"), t_us, stack)
        elif name.endswith("_error"):
            base = name.removesuffix("_error")
            self.counts.errors[base] = self.counts.errors.get(base, 0) + 1
        else:
            self.counts.reject(n, f"unknown record {name!r}")

    def _instant(self, n: int, rec: dict[str, Any], name: str, t_us: int,
                 stack: list[_Open]) -> Iterator[dict[str, Any]]:
        if name == "metric_value":
            scalar = rec.get("event_name")
            value = _number(rec.get("value"))
            if scalar == TOKENS_SCALAR and value is not None and value >= 0 \
                    and self.iter is not None:
                self.iter.tokens = (self.iter.tokens or 0) + int(value)
            elif scalar not in KNOWN_SCALARS:
                key = str(scalar)
                self.counts.scalars[key] = self.counts.scalars.get(key, 0) + 1
            return
        if self.iter is None:
            # a marker outside every step (``training_start``): an instant event; one
            # inside a step would leave that iteration out of steady state
            self.counts.events += 1
            yield {"type": "event", "name": name, "ts": round(t_us / 1e6, 6), "dur": 0.0}

    def _start(self, n: int, rec: dict[str, Any], name: str, t_us: int,
               stack: list[_Open]) -> None:
        step = rec.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
        span = _Open(name, t_us, step, _tags(rec), n)
        inside = [s for s in stack if s.role in ("iter", "phase")]
        if any(s.role in ("event", "inside_event") for s in stack):
            span.role = "inside_event"
        elif name == STEP_SPAN and self.iter is None:
            span.role = "iter"
            number = step if step is not None else (
                0 if self.last_step is None else self.last_step + 1)
            self.iter = _Iter(number, t_us / 1e6)
        elif self.iter is not None and inside:
            parent = next((s.path for s in reversed(inside) if s.role == "phase"), "")
            span.role = "phase"
            span.path = f"{parent}{CHILD_SEP}{name}" if parent else name
        stack.append(span)

    def _end(self, n: int, rec: dict[str, Any], name: str, t_us: int,
             stack: list[_Open]) -> Iterator[dict[str, Any]]:
        at = next((i for i in range(len(stack) - 1, -1, -1) if stack[i].name == name), None)
        if at is None:
            self.counts.orphans[name] = self.counts.orphans.get(name, 0) + 1
            return
        for lost in stack[at + 1:]:     # started inside it, never ended
            self.counts.unclosed[lost.name] = self.counts.unclosed.get(lost.name, 0) + 1
            if lost.role == "iter":
                self.iter = None
        span = stack[at]
        del stack[at:]
        ms = _number(rec.get("value"))
        dur = ms / 1e3 if ms is not None and ms >= 0 else max(t_us - span.start_us, 0) / 1e6
        dur = min(dur, MAX_DURATION_S)
        if span.role == "outside" or (span.role == "phase" and name in EVENT_SPANS
                                      and EVENT_SPANS[name] in _tags(rec)
                                      and EVENT_SPANS[name] not in span.tags):
            self.counts.events += 1
            if span.role == "phase" and self.iter is not None:
                # what ran inside the save or the validation is the event's, not phases
                inner = span.path + CHILD_SEP
                for key in [k for k in self.iter.phases if k.startswith(inner)]:
                    self.iter.phases.pop(key)
                    self.iter.kinds.pop(key, None)
            yield {"type": "event", "name": name, "ts": round(span.start_us / 1e6, 6),
                   "dur": round(dur, 6)}
            return
        if span.role == "phase" and self.iter is not None:
            it = self.iter
            it.phases[span.path] = it.phases.get(span.path, 0.0) + dur
            want = SPANS.get(name) or ("compute" if name in EVENT_SPANS else None)
            if want is None:
                self.counts.unknown[name] = self.counts.unknown.get(name, 0) + 1
            elif want != categorize(span.path):
                it.kinds[span.path] = want
        elif span.role == "iter" and self.iter is not None:
            yield self._iter_record(self.iter, dur)
            self.last_step = self.iter.step
            self.iter = None

    def _iter_record(self, it: _Iter, dur: float) -> dict[str, Any]:
        self.counts.steps += 1
        rec: dict[str, Any] = {"type": "iter", "iter": it.step, "ts": round(it.ts, 6),
                               "dur": round(dur, 6),
                               "phases": {k: round(v, 6) for k, v in it.phases.items()}}
        if it.kinds:
            rec["kinds"] = it.kinds
        if it.tokens is not None:
            rec["tokens"] = it.tokens
        return rec

    # -- the file's summary ------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The last ``meta`` line: counts kept in ``files.meta`` ``extra`` and the
        warnings the ingest prints, one line each."""
        c = self.counts
        warnings: list[str] = []

        def names(d: dict[str, int]) -> str:
            items = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))
            out = ", ".join(f"{k} ({v:,})" for k, v in items[:MAX_NAMED])
            return out + (f" and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")

        if c.bad:
            line, why = c.first_bad or (0, "")
            warnings.append(f"{c.bad:,} line(s) are not torchtitan structured-log records "
                            f"and were skipped (first: line {line}, {why})")
        if c.unknown:
            warnings.append(f"spans tlog does not know the place of, kept as phases "
                            f"categorised by their name (docs/FORMAT.md): {names(c.unknown)}")
        if c.orphans:
            warnings.append(f"span ends without their start (a file cut at its head?), "
                            f"not loaded: {names(c.orphans)}")
        if c.unclosed:
            warnings.append(f"spans that never ended (their end record is missing), "
                            f"not loaded: {names(c.unclosed)}")
        if c.errors:
            warnings.append(f"spans that raised (their _error record), loaded up to the "
                            f"exception: {names(c.errors)}")
        if c.scalars:
            warnings.append(f"scalars not mapped (tlog keeps only {TOKENS_SCALAR} as tokens): "
                            f"{names(c.scalars)}")
        if self.meta is not None and c.steps == 0:
            warnings.append("no 'step' spans: no iterations (the spans are loaded as events; "
                            "only torchtitan's trainer logs are mapped to iterations)")
        out: dict[str, Any] = {"type": "meta", "v": 1,
                               "torchtitan": {"steps": c.steps, "events": c.events,
                                              "bad_lines": c.bad}}
        if warnings:
            out["warnings"] = warnings
        return out


def decode_torchtitan(path: Path) -> Iterator[str]:
    """The ingest decoder: v1 JSONL of one structured-log file: a ``meta`` line
    (rank, stage = torchtitan's ``source``, worker ``<source>-<rank>``, or
    ``<source>-<rank>.<k>`` for the ``k``-th restart, host, pid), ``iter`` and
    ``event`` lines in the file's order, then a ``meta`` line of counts and
    warnings. Read line by line (a step's spans at a time held); a last line with
    no line break yet is left for the next read (the source reloads a changed
    file whole)."""
    reader = _Reader(Path(path))
    with open(path, "rb") as fh:
        for rec in reader.read(fh):
            yield json.dumps(rec, separators=(",", ":")) + "\n"
    if reader.meta is None:     # nothing readable: defaults from the file name
        yield json.dumps(reader._meta({}), separators=(",", ":")) + "\n"
    yield json.dumps(reader.summary(), separators=(",", ":")) + "\n"


def find_torchtitan(root: Path) -> list[Path]:
    """Structured-log files below ``root`` (by name, :data:`FILE_NAME`), sorted."""
    base = Path(root)
    if base.is_file():
        return [base] if claims(base.name) else []
    return sorted(p for p in base.rglob("*.jsonl") if p.is_file() and claims(p.name)
                  and not any(part.startswith(".") for part in p.relative_to(base).parts))


def source() -> Source:
    """The ``torchtitan`` log source (the ``tlog.sources`` entry point
    ``torchtitan``; ``runs.source = 'torchtitan'`` when a run has only these).
    It goes before ``jsonl``: its files end in ``.jsonl`` too."""
    from tlog.ingest.sources import Source

    return Source(kind="torchtitan", find=find_torchtitan, decode=decode_torchtitan,
                  run_source="torchtitan", label="torchtitan structured logs",
                  match=claims, converts=True, whole=True, before=("jsonl",))
