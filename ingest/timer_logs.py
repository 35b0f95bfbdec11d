"""The ``timer_log`` source: the timer lines Megatron-LM (and its forks,
GPT-NeoX, NeMo 2) and DeepSpeed print.

A training job's console log (``*.log``, ``*.txt``, ``*.out``, ``*.err``) that
holds Megatron-LM's ``--timing-log-level`` block or iteration lines, or
DeepSpeed's ``wall_clock_breakdown`` lines, ingests with no rerun: each logged
interval becomes iterations with phases (docs/TIMER_LOGS.md). The formats are
the ones these projects' own code writes:

- Megatron-LM, ``megatron/training/training.py`` ``training_log`` (the
  iteration line, printed by the last rank) and ``megatron/core/timers.py``
  ``Timers.log`` (the block that follows it: ``(min, max) time across ranks
  (ms):``, ``max time across ranks (ms):`` or ``times across ranks (ms):``,
  each timer's elapsed time divided by ``log_interval``), or before August
  2022 one line ``time (ms) | name: value | ...``;
- DeepSpeed, ``deepspeed/utils/timer.py`` ``SynchronizedWallClockTimer.log``
  called by ``deepspeed/runtime/engine.py`` ``_take_model_step``: a line
  ``time (ms) | fwd_microstep: ... | ...`` after every micro-step and a line
  ``time (ms) | fwd: ... | bwd: ... | bwd_inner: ... | bwd_allreduce: ... |
  step: ...`` at every gradient-accumulation boundary (the names were
  ``forward``, ``backward``, ``backward_inner``, ``backward_allreduce`` and
  ``*_microstep`` before July 2023, when the line started ``rank=N time (ms)``).

Also GPT-NeoX (``megatron/logging.py``: Megatron's iteration line and the
2020 timers ``forward``/``backward``/``optimizer``/``batch generator``),
Megatron-LM of 2019-2020, forks that log ``iteration=`` ... key=value
(argonne-lcf/Megatron-DeepSpeed), NeMo 2's ``ProgressPrinter`` line
(``train_step_timing in s``) and DeepSpeed's pipeline engine (timers summed
over ``steps_per_print`` steps, closed by ``steps: N ... iter time (s): T``).
DeepSpeed's lines beside an iteration line are merged into its interval;
timer blocks with no iteration line in the file are intervals of their own.

Lines from several ranks may share a file, behind a launcher's prefix: torchrun's
``[default3]:`` (``--tee``), pdsh's ``host: ``, DeepSpeed's ``[Rank 3]`` and its
logger's ``[2024-05-01 12:00:00,123] [INFO] [logging.py:96:log_dist]``. Every
other line is skipped and counted (``files.meta`` ``extra.lines_skipped``; the
ingest summary prints the count).

The decoder reads the whole file each time (:attr:`Source.whole`): the first
logged interval's length depends on the next one, so the records are not an
append-only function of the file.
"""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tlog.ingest.kineto_find import rank_from_name

if TYPE_CHECKING:
    from tlog.ingest.sources import Source

#: Name endings of the files sniffed for timer lines (console logs: torchrun's
#: ``stdout.log``, Slurm's ``slurm-123.out``, ``tee train.txt``). tlog's choice.
SUFFIXES = (".log", ".txt", ".out", ".err")

#: Bytes of a file's start searched for a timer line before it is claimed
#: (Megatron prints its arguments and dataset set-up first: tens of KB). tlog's choice.
SNIFF_BYTES = 8 << 20

_SNIFF = re.compile(rb"elapsed time per iteration \(ms\)|time across ranks \(ms\):|"
                    rb"elapsed_time_per_iteration_ms=|train_step_timing in s: |"
                    rb"iter time \(s\): [\d.]+ samples/sec|time \(ms\) \| [\w /-]+: -?[\d.]+")

# --- line patterns ------------------------------------------------------------

#: ``[2024-05-01 12:00:00,123]`` (Python logging), ``[2024-05-01 12:00:00.123456]``
#: (Megatron's iteration line); naive local times, read as UTC.
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d{1,6}))?")
#: A launcher's tag at the start of a line: pdsh ``host: ``, then torchrun
#: ``[default3]:`` (behind NeMo-Run's ``<task>/<n> `` when it launches torchrun).
_TAG = re.compile(r"^(?:([A-Za-z0-9][\w.-]*): )?(?:(?:[\w.-]+/\d+ )?\[([A-Za-z_]*)(\d+)\]:)?")
#: How a timer line behind pdsh's ``host: `` (or srun's ``3: ``) tag starts.
_TAGGED_STARTS = (" ", "\t", "[", "(", "time (ms)", "max time", "times across")
_RANK_WORD = re.compile(r"\[Rank (\d+)\]|\brank=(\d+)\b")
#: Megatron's ``iteration  N/  T |`` (``iteration=  N/  T |`` in forks that log
#: key=value, NeMo 2's ``Training epoch E, iteration N/T |``).
_ITER = re.compile(r"\biteration(?:=\s*|\s+)(\d+)\s*/\s*(\d+)\s*\|(.*)$")
#: DeepSpeed's pipeline engine (``runtime/pipe/engine.py`` ``train_batch``), rank 0
#: every ``steps_per_print`` steps: ``steps: N loss: X iter time (s): T samples/sec: S``.
_PIPE_STEPS = re.compile(r"\bsteps: (\d+) loss: .*?iter time \(s\): (-?[\d.]+) "
                         r"samples/sec: (-?[\d.]+)")
_HEADER = re.compile(r"(\(min, max\) time|max time|times) across ranks \(ms\):\s*$")
_ROW = re.compile(r"^\s+(\S(?:.*?\S)?) \.*: (?:\((-?[\d.]+), (-?[\d.]+)\)|(-?[\d.]+))\s*$")
_ALL_NAME = re.compile(r"^\s{1,3}(\S(?:.*\S)?):\s*$")
_ALL_RANK = re.compile(r"^\s+rank\s+(\d+): (-?[\d.]+)\s*$")
_TIME_MS = re.compile(r"time \(ms\)((?: \| [^|:]+?: -?[\d.]+)+)\s*\|?\s*$")
_LOADED = re.compile(r"loaded checkpoint .* at iteration\s+(\d+)")
#: Megatron's argument dump (``arguments.py`` ``_print_args``: ``'  {} {} {}'``
#: with dots to column 48): the sequence length, for tokens per sample.
_SEQ_LENGTH = re.compile(r"^\s+seq_length \.+ (\d+)\s*$")

# --- what the names are -------------------------------------------------------

#: DeepSpeed engine timers at a gradient-accumulation boundary -> tlog phase.
#: ``bwd_inner`` (``loss.backward()``) and ``bwd_allreduce`` (the gradient
#: reduction) run inside ``bwd`` (``engine.backward``), so they are its children.
DEEPSPEED_PHASES = {
    "fwd": "forward", "forward": "forward",
    "bwd": "backward", "backward": "backward",
    "bwd_inner": "backward/inner", "backward_inner": "backward/inner",
    "bwd_allreduce": "backward/allreduce", "backward_allreduce": "backward/allreduce",
    "step": "optimizer",
}
#: ZeRO stage 1/2's optimizer timers (``stage_1_and_2.py`` ``step``, logged
#: inside the engine's ``step`` timer, before the boundary line) -> children of ``optimizer``.
DEEPSPEED_ZERO = {"optimizer_allgather": "optimizer/allgather",
                  "optimizer_gradients": "optimizer/gradients",
                  "optimizer_step": "optimizer/step"}
#: DeepSpeed's per-micro-step timers (read as timer lines, not used: the
#: boundary line holds their sums).
DEEPSPEED_MICRO = frozenset(f"{n}_microstep" for n in
                            ("fwd", "forward", "bwd", "backward", "bwd_inner", "backward_inner",
                             "bwd_allreduce", "backward_allreduce", "step"))

#: Megatron timers inside ``forward-backward`` (``forward_backward_func``):
#: the data fetch (``batch-generator``, inside ``forward-compute``), the compute
#: and the pipeline hand-offs (``*-send``/``*-recv`` names).
MEGATRON_FB_CHILDREN = frozenset({"batch-generator", "forward-compute", "backward-compute"})
#: Timers of ``finalize_model_grads``: inside ``forward-backward`` since
#: September 2023 (commit 805a3d5, when ``all-grads-sync`` appeared), between
#: ``forward-backward`` and ``optimizer`` before.
MEGATRON_GRAD_SYNC = frozenset({"all-grads-sync", "layernorm-grads-all-reduce",
                                "embedding-grads-all-reduce",
                                "conditional-embedder-grads-all-reduce",
                                "non-tensor-parallel-grads-all-reduce", "grads-all-reduce"})
#: Before August 2022: ``backward-reduce-model-grads`` holds the three reductions.
MEGATRON_OLD_REDUCE = frozenset({"backward-params-all-reduce", "backward-layernorm-all-reduce",
                                 "backward-embedding-all-reduce"})
#: The timers of Megatron-LM before 2021 (``megatron/training.py`` at 3354081,
#: ``training_log``), of DeepSpeedExamples' Megatron-LM and of GPT-NeoX
#: (``megatron/training.py`` ``train_step``/``backward_step``, logged by
#: ``megatron/logging.py``): ``batch generator`` runs inside ``forward``
#: (``forward_step``), the gradient reduction and fp16 steps inside
#: ``backward`` (``backward_step``), ``optimizer`` on its own.
OLD_CHILDREN = {"batch generator": "forward", "allreduce": "backward",
                "backward-backward": "backward", "backward-allreduce": "backward",
                "backward-master-grad": "backward", "backward-clip-grad": "backward"}
#: Collectives whose names the category rules would call compute.
MEGATRON_SYNC_KINDS = {"backward-reduce-model-grads": "sync",
                       "backward-gather-model-params": "sync"}
#: Timers logged once, outside the training iterations, each in a block or
#: line of its own: start-up (``startup-*``, ``model-and-optimizer-setup``,
#: ``train/valid/test-data-iterators-setup``; GPT-NeoX's ``model and optimizer``,
#: ``train/valid/test data loaders``/``iterators``), checkpoints and
#: evaluation (Megatron-LM ``training.py``: ``save-checkpoint``,
#: ``load-checkpoint``, ``evaluate``, ``gpu-sniff-test``). A block of these
#: alone is not an interval's timers.
_OUTSIDE = re.compile(r"^(?:startup-.*|.*-setup|save-checkpoint.*|load-checkpoint|evaluate|"
                      r"eval-time|gpu-sniff-test|interval[- ]time|"
                      r"all-reduce-start-timestamps-tensor|model and optimizer|"
                      r"train/valid/test data (?:loaders|iterators))$")
#: Pipeline hand-offs (``forward-recv``, ``forward-send-backward-recv``, ...).
_P2P = re.compile(r"-(send|recv)\b")
#: Rounding of Megatron's ``{:.2f}`` ms figures: a child may exceed its parent
#: by this much (ms) and still be placed inside it.
_ROUND_MS = 0.011
#: Iterations one logged Megatron interval may stand for at most. Megatron
#: prints every ``--log-interval`` iterations (100 by default); two iteration
#: lines further apart (a log that starts mid-run without its ``loaded
#: checkpoint`` line, a cut log, a garbled number) do not say how many of the
#: iterations between them ran at the logged speed, so the interval counts as
#: its neighbour's length, or 1 (and a warning says so). tlog's choice.
MAX_INTERVAL_ITERS = 10_000


def _phase_name(parent: str | None, name: str) -> str:
    return name if parent is None else f"{parent}/{name}"


def _placed(values: dict[int | None, dict[str, float]]) -> dict | None:
    """:func:`place_megatron` of each rank's figures of a timer block, or None
    when the block holds only timers of set-up, checkpoints or evaluation
    (:data:`_OUTSIDE`), which Megatron logs in blocks of their own (e.g.
    ``save-checkpoint`` right after an iteration line)."""
    if all(_OUTSIDE.match(n) for v in values.values() for n in v):
        return None
    return {r: place_megatron(v) for r, v in values.items()}


def place_megatron(values: dict[str, float]) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Megatron-LM (and GPT-NeoX) timer figures (ms per iteration, by timer
    name) as v1 phases.

    Returns ``(phases in seconds, kinds, names placed top-level unknown)``.
    Top-level phases are the outermost timers (``forward-backward``,
    ``optimizer``, the gradient reductions of versions before September 2023;
    ``forward``, ``backward`` and ``optimizer`` before 2021 and in GPT-NeoX); a
    timer that runs inside one becomes its child ``parent/name``
    (``forward-backward/batch-generator``, ``optimizer/params-all-gather``,
    ``backward/backward-allreduce``), so attribution carves the starvation and
    sync children out of their compute parent (docs/FORMAT.md "Measured
    collective waits"). Nesting is the frameworks' code (module docstring); a
    child longer than its parent (another version's layout) is placed
    top-level. A timer tlog does not know the place of (a fork's own, RL
    timers, ...) is kept as a top-level phase, its category by its name
    (docs/FORMAT.md), and named in the third item.
    """
    has_fb = "forward-backward" in values
    new_sync = "all-grads-sync" in values
    parent: dict[str, str | None] = {}
    unknown: list[str] = []
    for name in values:
        if name in ("forward-backward", "optimizer", "backward-reduce-model-grads",
                    "backward-gather-model-params", "forward", "backward"):
            parent[name] = None
        elif name in OLD_CHILDREN:
            up = OLD_CHILDREN[name]
            parent[name] = up if up in values else None
        elif name in MEGATRON_FB_CHILDREN or _P2P.search(name):
            if has_fb:
                parent[name] = "forward-backward"
            elif name == "batch-generator" and "forward-compute" in values:
                parent[name] = "forward-compute"
            else:
                parent[name] = None
        elif name in MEGATRON_GRAD_SYNC:
            parent[name] = "forward-backward" if (has_fb and new_sync) else None
        elif name in MEGATRON_OLD_REDUCE:
            parent[name] = ("backward-reduce-model-grads"
                            if "backward-reduce-model-grads" in values else None)
        elif name.startswith("optimizer-") or name == "params-all-gather":
            inside = "optimizer" in values and (name != "params-all-gather" or new_sync)
            parent[name] = "optimizer" if inside else None
        else:
            parent[name] = None
            unknown.append(name)
    phases: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for name, up in parent.items():
        if up is not None and values[name] > values[up] + _ROUND_MS:
            up = None
        key = _phase_name(up, name)
        phases[key] = round(values[name] / 1000.0, 9)
        if name in MEGATRON_SYNC_KINDS:
            kinds[key] = MEGATRON_SYNC_KINDS[name]
    return phases, kinds, unknown


# --- parsing ------------------------------------------------------------------

#: DeepSpeed's pipeline engine timers (``runtime/pipe/engine.py``): the batch
#: load (``batch_input``, in the micro-step line) and the stage hand-offs.
DEEPSPEED_PIPE = {"batch_input": "batch_input", "pipe_send_output": "pipe_send_output",
                  "pipe_send_grad": "pipe_send_grad", "pipe_recv_input": "pipe_recv_input",
                  "pipe_recv_grad": "pipe_recv_grad"}
#: Categories the phase-name rules would get wrong (``batch_input`` reads as compute).
DEEPSPEED_KINDS = {"batch_input": "starvation"}
_DS_NAMES = frozenset(DEEPSPEED_PHASES) | DEEPSPEED_MICRO | frozenset(DEEPSPEED_ZERO) | frozenset(
    DEEPSPEED_PIPE)
#: Where an interval's iteration time is, by field name, and its scale to ms:
#: Megatron-LM, forks that log key=value (argonne-lcf/Megatron-DeepSpeed
#: ``megatron/training_log.py``), NeMo 2 (``TimingCallback``, seconds).
_ELAPSED = (("elapsed time per iteration (ms)", 1.0), ("elapsed_time_per_iteration_ms", 1.0),
            ("train_step_timing in s", 1000.0))
_BATCH = ("global batch size", "global_batch_size")


@dataclass
class _Iteration:
    """An iteration line (Megatron-LM, its forks, GPT-NeoX, NeMo 2) and the
    timers that followed it."""

    iteration: int
    fields: dict[str, str]
    stamp: float | None
    lineno: int = 0
    #: the iteration a ``loaded checkpoint ... at iteration N`` line named
    #: since the previous iteration line (a resumed job starts there)
    resumed_at: int | None = None
    #: the timers that followed, placed (:func:`_placed`), by rank (None: all ranks)
    timers: dict[int | None, tuple[dict[str, float], dict[str, str], list[str]]] | None = None
    mode: str = ""
    #: the log counts from 0 (NeMo 2's ``global_step``): records say ``iteration - 1``
    zero_based: bool = False
    #: no iteration line: a timer block alone (the log interval is not known)
    synthetic: bool = False
    lines: int = 0          # the lines of a block alone


@dataclass
class _Block:
    """An open Megatron timer block: ``mode`` ``minmax``/``max``/``all``."""

    mode: str
    lines: int = 1
    values: dict[int | None, dict[str, float]] = field(default_factory=dict)
    current: str | None = None


_Line = tuple[int, dict[str, float], float | None]     # (line number, values, stamp)


@dataclass
class _Stream:
    """The lines of one launcher tag (a rank's lines in a shared file)."""

    host: str | None
    tag_rank: int | None
    iterations: list[_Iteration] = field(default_factory=list)
    block: _Block | None = None
    real: int = 0                   # iteration lines (not timer blocks alone)
    steps: dict[int | None, list[_Line]] = field(default_factory=dict)
    #: a ZeRO optimizer line waiting for its boundary line, by rank
    zero: dict[int | None, dict[str, float]] = field(default_factory=dict)
    #: DeepSpeed micro-step lines by rank (used where no boundary line is, and
    #: for the pipeline engine's ``batch_input``)
    micro: dict[int | None, list[_Line]] = field(default_factory=dict)
    #: the pipeline engine's hand-off lines, by rank
    pipe: dict[int | None, list[_Line]] = field(default_factory=dict)
    #: the pipeline engine's ``steps: N ... iter time (s): T`` lines: (line, N, T)
    pipe_steps: list[tuple[int, int, float]] = field(default_factory=list)


@dataclass
class _DsInterval:
    """A DeepSpeed logged interval: ``n`` steps with these phases (s per step)."""

    lineno: int
    n: int
    phases: dict[str, float]
    stamp: float | None
    dur: float | None = None        # s per step (the pipeline engine's iter time)
    last_step: int | None = None    # the engine's global step at its end


@dataclass
class TimerLog:
    """What :func:`parse_lines` found in one file.

    Attributes:
        framework: ``'megatron'``, ``'deepspeed'`` or ``''`` (no timer lines).
        records: v1 records (dicts), a ``meta`` first.
        lines_skipped: non-blank lines that are not timer lines (other text).
        warnings: what was assumed or left out, one line each.
        averaged: the iterations are averages over logged intervals (Megatron).
    """

    framework: str
    records: list[dict[str, Any]]
    lines_skipped: int
    warnings: list[str]
    averaged: bool
    #: some line carried a timestamp (else ``ts`` counts from ``base_ts``)
    stamped: bool = False


def _stamp(text: str) -> float | None:
    m = _STAMP.search(text)
    if m is None:
        return None
    frac = (m.group(3) or "0").ljust(6, "0")
    day, clock = m.group(1), m.group(2)
    try:
        t = datetime(int(day[:4]), int(day[5:7]), int(day[8:10]), int(clock[:2]),
                     int(clock[3:5]), int(clock[6:8]), tzinfo=UTC)
    except ValueError:
        return None
    return t.timestamp() + int(frac) / 1e6


def _last_stamp(text: str) -> float | None:
    """The last timestamp in ``text`` (a progress bar may precede the logger's)."""
    found = list(_STAMP.finditer(text))
    return _stamp(text[found[-1].start():]) if found else None


def _pairs(body: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in body.split("|"):
        name, _, value = part.rpartition(":")
        name = name.strip()
        if name:
            try:
                out[name] = float(value)
            except ValueError:
                continue
    return out


def _fields(body: str) -> dict[str, str]:
    """``name: value`` (Megatron-LM, NeMo 2) or ``name=value`` (forks) parts
    between ``|``."""
    out: dict[str, str] = {}
    for part in body.split("|"):
        if ":" in part:
            name, _, value = part.rpartition(":")
        else:
            name, _, value = part.partition("=")
        if name.strip():
            out[name.strip()] = value.strip()
    return out


def _new_iteration(number: int, fields: dict[str, str], stamp: float | None,
                   lineno: int, resumed_at: int | None) -> _Iteration:
    """An iteration line's interval; NeMo 2's lines are numbered by their
    ``global_step`` (from 0), the others by the printed iteration (from 1)."""
    step = _number(fields.get("global_step"))
    if step is not None and step >= 0 and step == int(step):
        return _Iteration(int(step) + 1, fields, stamp, lineno, resumed_at, zero_based=True)
    return _Iteration(number, fields, stamp, lineno, resumed_at)


def parse_lines(lines: Iterable[str], *, path_rank: int | None = None,
                base_ts: float | None = None) -> TimerLog:
    """Read the complete lines of one log (no line breaks) into v1 records.

    Args:
        lines: the file's lines, in order.
        path_rank: the rank its path names (torchrun's per-rank ``.../3/stdout.log``,
            ``rank3.log``), used where no line says one.
        base_ts: epoch seconds to start from when no line carries a timestamp
            (the file's ``mtime`` less the logged time, :func:`decode_timer_log`).

    Returns:
        :class:`TimerLog`. A file with iteration lines (or Megatron-style timer
        blocks and lines) is read as Megatron, its DeepSpeed engine lines
        (Megatron-DeepSpeed, GPT-NeoX) merged into its intervals; else as DeepSpeed.
    """
    streams: dict[tuple[str | None, int | None], _Stream] = {}
    skipped = 0
    loaded_at: int | None = None
    seq_length: int | None = None
    first_stamp: float | None = None
    ds_lines = 0            # DeepSpeed lines (skipped in a Megatron file unless merged)

    def attach(st: _Stream, placed: dict | None, mode: str, lineno: int,
               lines: int = 1) -> bool:
        """Give ``placed`` timers to the stream's open iteration, or, in a log
        without iteration lines, to an interval of their own."""
        if placed is None:
            return False
        target = st.iterations[-1] if st.iterations else None
        if target is not None and target.timers is None:
            target.timers, target.mode = placed, mode
            return True
        if st.real:
            return False
        st.iterations.append(_Iteration(len(st.iterations) + 1, {}, None, lineno,
                                        timers=placed, mode=mode, synthetic=True,
                                        lines=lines))
        return True

    def close(st: _Stream, lineno: int) -> None:
        nonlocal skipped
        blk, st.block = st.block, None
        if blk is not None and not attach(st, _placed(blk.values), blk.mode, lineno,
                                          blk.lines):
            skipped += blk.lines

    lineno = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        tag = _TAG.match(line)
        host, tag_rank = tag.group(1), (int(tag.group(3)) if tag.group(3) else None)
        rest = line[tag.end():]
        if host is not None and tag.group(3) is None and not rest.startswith(_TAGGED_STARTS):
            host, rest = None, line   # "word: text" is text, not pdsh's "host: " tag
        elif host is not None and host.isdigit() and tag_rank is None:
            host, tag_rank = None, int(host)    # srun --label's "3: " (the task's rank)
        st = streams.get((host, tag_rank))
        if st is None:
            st = streams[(host, tag_rank)] = _Stream(host, tag_rank)
        if st.block is not None:
            blk = st.block
            if blk.mode == "all":
                m_name, m_rank = _ALL_NAME.match(rest), _ALL_RANK.match(rest)
                if m_rank is not None and blk.current is not None:
                    blk.values.setdefault(int(m_rank.group(1)), {})[blk.current] = float(
                        m_rank.group(2))
                    blk.lines += 1
                    continue
                if m_name is not None:
                    blk.current = m_name.group(1)
                    blk.lines += 1
                    continue
            else:
                m = _ROW.match(rest)
                if m is not None:
                    value = m.group(3) if m.group(3) is not None else m.group(4)
                    blk.values.setdefault(None, {})[m.group(1)] = float(value)
                    blk.lines += 1
                    continue
            close(st, lineno)
        stamp = _stamp(rest[:40]) if "-" in rest[:40] else None
        if stamp is not None and first_stamp is None:
            first_stamp = stamp
        if (m := _ITER.search(rest)) is not None and int(m.group(1)) <= int(m.group(2)):
            # (Megatron's iteration never exceeds its --train-iters: a line that
            # says so is not Megatron's, or garbled: other text)
            close(st, lineno)
            st.iterations.append(_new_iteration(int(m.group(1)), _fields(m.group(3)),
                                                _last_stamp(rest[:m.start()]), lineno,
                                                loaded_at))
            st.real += 1
            loaded_at = None
            continue
        if (m := _HEADER.search(rest)) is not None:
            close(st, lineno)
            mode = {"(min, max) time": "minmax", "max time": "max", "times": "all"}[m.group(1)]
            st.block = _Block(mode)
            continue
        if (m := _PIPE_STEPS.search(rest)) is not None:
            ds_lines += 1
            st.pipe_steps.append((lineno, int(m.group(1)), float(m.group(2))))
            continue
        if (m := _TIME_MS.search(rest)) is not None:
            values = _pairs(m.group(1))
            names = set(values)
            if names and names <= _DS_NAMES:
                ds_lines += 1
                rw = _RANK_WORD.search(rest[:m.start()])
                rank = int(rw.group(1) or rw.group(2)) if rw else None
                at = _last_stamp(rest[:m.start()])
                if names <= set(DEEPSPEED_ZERO):
                    st.zero[rank] = values
                elif names <= DEEPSPEED_MICRO | {"batch_input"}:
                    st.micro.setdefault(rank, []).append(
                        (lineno, {k.removesuffix("_microstep"): v for k, v in values.items()}, at))
                elif names <= set(DEEPSPEED_PIPE):
                    st.pipe.setdefault(rank, []).append((lineno, values, at))
                elif names & set(DEEPSPEED_PHASES):
                    values.update(st.zero.pop(rank, {}))
                    st.steps.setdefault(rank, []).append((lineno, values, at))
                continue
            if attach(st, _placed({None: values}), "line", lineno):
                continue
        if (m := _LOADED.search(rest)) is not None:
            loaded_at = int(m.group(1))
        elif (m := _SEQ_LENGTH.match(rest)) is not None:
            seq_length = int(m.group(1))
        skipped += 1
    for st in streams.values():
        close(st, lineno + 1)

    if any(st.real for st in streams.values()):
        # timer blocks of a stream without iteration lines beside streams with
        # them (another rank's tag): not intervals of their own, other text
        for st in streams.values():
            skipped += sum(it.lines for it in st.iterations if it.synthetic)
            st.iterations = [it for it in st.iterations if not it.synthetic]
    start = first_stamp if first_stamp is not None else base_ts
    if any(st.iterations for st in streams.values()):
        out = _megatron(streams, skipped, ds_lines, path_rank, start, seq_length)
    elif any(st.steps or st.micro or st.pipe_steps for st in streams.values()):
        out = _deepspeed(streams, skipped, path_rank, start)
    else:
        out = TimerLog("", [_meta("", skipped, False, [])], skipped, [], False)
    out.stamped = first_stamp is not None
    return out


def _meta(framework: str, skipped: int, averaged: bool, warnings: list[str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"type": "meta", "v": 1, "timer_log": framework,
                            "lines_skipped": skipped}
    if averaged:
        meta["averaged"] = True
    if warnings:
        meta["warnings"] = warnings
    return meta


def _worker(stage: str, host: str | None, rank: int) -> str:
    """``<stage>-<rank>`` (the v1 default), ``<stage>-<host>-<rank>`` behind pdsh."""
    return f"{stage}-{host}-{rank}" if host else f"{stage}-{rank}"


def _ds_phases(values: dict[str, float], n: int = 1) -> dict[str, float]:
    """DeepSpeed timer figures (ms, summed over ``n`` steps) as v1 phases (s per step)."""
    names = {**DEEPSPEED_PHASES, **DEEPSPEED_ZERO, **DEEPSPEED_PIPE}
    return {names[k]: round(v / 1000.0 / n, 9) for k, v in values.items() if k in names}


def _ds_intervals(st: _Stream, rank: int | None, notes: list[str]) -> list[_DsInterval]:
    """The logged intervals of one rank's DeepSpeed lines in a stream.

    The engine (``runtime/engine.py`` ``step``) logs every step: each boundary
    line is one step (micro-step lines alone: each is one, said in ``notes``).
    The pipeline engine (``runtime/pipe/engine.py``) logs every
    ``steps_per_print`` steps, its timers summed over them and never
    normalised: a ``steps: N ... iter time (s): T`` line closes each interval,
    the boundary and micro-step lines before it and the hand-off line after it
    are its figures, divided by the steps since the previous ``steps:`` line.
    """
    steps = st.steps.get(rank, [])
    micro = st.micro.get(rank, [])
    pipe = st.pipe.get(rank, [])
    if st.pipe_steps and rank in (0, None, min((r for r in st.steps if r is not None),
                                                 default=None)):
        out: list[_DsInterval] = []
        prev_line, prev_step = 0, 0
        for i, (line, step, iter_s) in enumerate(st.pipe_steps):
            nxt = st.pipe_steps[i + 1][0] if i + 1 < len(st.pipe_steps) else 1 << 62
            n = max(step - prev_step, 1)
            values: dict[str, float] = {}
            stamp = None
            for ln, v, at in micro:
                if prev_line < ln < line and "batch_input" in v:
                    values["batch_input"] = v["batch_input"]
            for ln, v, at in steps:
                if prev_line < ln < line:
                    values.update({k: x for k, x in v.items() if k != "batch_input"})
                    stamp = at
            for ln, v, _ in pipe:
                if line < ln < nxt:
                    values.update(v)
                    break
            out.append(_DsInterval(line, n, _ds_phases(values, n), stamp,
                                   dur=iter_s if iter_s > 0 else None, last_step=step))
            prev_line, prev_step = line, step
        return out
    if pipe or any("batch_input" in v for _, v, _ in micro):
        notes.append("DeepSpeed pipeline-engine timers without the engine's 'steps: N' lines: "
                     "each line counts as one step, though its figures are sums over "
                     "steps_per_print steps")
    lines = steps
    if not lines:
        lines = [(ln, {k: x for k, x in v.items() if k != "batch_input"}, at)
                 for ln, v, at in micro]
        if lines:
            notes.append("DeepSpeed lines without gradient-accumulation boundary lines: "
                         "each micro-step line is an iteration")
    return [_DsInterval(ln, 1, _ds_phases(v), at) for ln, v, at in lines]


def _ds_ranks(st: _Stream) -> list[int | None]:
    return sorted({*st.steps, *st.micro, *st.pipe}, key=lambda r: -1 if r is None else r)


def _mean_phases(items: list[_DsInterval]) -> dict[str, float]:
    """Per-step phases over DeepSpeed intervals, weighted by their steps."""
    total = sum(d.n for d in items)
    keys = {k for d in items for k in d.phases}
    return {k: round(sum(d.phases.get(k, 0.0) * d.n for d in items) / total, 9) for k in keys}


#: DeepSpeed's waits inside the host timers that wrap the engine's calls:
#: ``bwd_allreduce`` inside ``engine.backward`` (GPT-NeoX's ``backward``,
#: Megatron-DeepSpeed's ``forward-backward``), ZeRO's ``optimizer_allgather``
#: inside ``engine.step`` (``optimizer``). (DeepSpeed phase, host parents, name).
_DS_INSIDE = (("backward/allreduce", ("backward", "forward-backward"), "bwd_allreduce"),
              ("optimizer/allgather", ("optimizer",), "optimizer_allgather"))


def _merge_deepspeed(phases: dict[str, float], kinds: dict[str, str],
                     ds: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """An interval's host timers with the DeepSpeed lines logged within it.

    With no host timers (GPT-NeoX on the pipeline engine logs an empty
    ``time (ms)``; ``--timing-log-level 0``) DeepSpeed's phases are the
    interval's. Else DeepSpeed's collective waits become sync children of the
    host timer that runs the engine's call (:data:`_DS_INSIDE`), carved out of
    its compute; the rest of DeepSpeed's timers repeat the host's."""
    if not phases:
        return dict(ds), {k: DEEPSPEED_KINDS[k] for k in ds if k in DEEPSPEED_KINDS}
    out = dict(phases)
    for ds_name, parents, name in _DS_INSIDE:
        value = ds.get(ds_name)
        up = next((p for p in parents if p in phases), None)
        if value is None or up is None or value > phases[up] + _ROUND_MS / 1000:
            continue
        out[f"{up}/{name}"] = value
    return out, kinds


def _megatron(streams: dict, skipped: int, ds_lines: int, path_rank: int | None,
              base_ts: float | None, seq_length: int | None) -> TimerLog:
    records: list[dict[str, Any]] = []
    unknown: set[str] = set()
    notes: list[str] = []
    per_rank = False
    merged = 0
    synthetic = False
    ends: dict[str, list[int]] = {}
    longest = 1
    ds_all = [(d.lineno, d) for st in streams.values() for r in _ds_ranks(st)[:1]
              for d in _ds_intervals(st, r, [])]
    ds_all.sort(key=lambda x: x[0])
    ds_lines_at = [ln for ln, _ in ds_all]
    for st in streams.values():
        its = st.iterations
        if not its:
            continue
        clock = base_ts if base_ts is not None else 0.0
        last_n: int | None = None
        prev_line = 0
        for i, it in enumerate(its):
            prev = its[i - 1].iteration if i else None
            nxt = its[i + 1].iteration - it.iteration if i + 1 < len(its) else None
            if it.synthetic:
                n = 1
                synthetic = True
            elif it.resumed_at is not None and it.iteration > it.resumed_at:
                n = it.iteration - it.resumed_at
            elif prev is not None and it.iteration > prev:
                n = it.iteration - prev
            elif nxt is not None and nxt > 0:
                n = min(it.iteration, nxt)
            else:
                n = max(it.iteration, 1)
            n = max(n, 1)
            if n > MAX_INTERVAL_ITERS:
                near = [d for d in (nxt, last_n) if d is not None and 0 < d <= MAX_INTERVAL_ITERS]
                counted = min(near) if near else 1
                notes.append(f"iteration {it.iteration}: {n:,} iterations since the previous "
                             f"one logged (more than {MAX_INTERVAL_ITERS:,}: lines missing); "
                             f"counted as {counted}")
                n = counted
            last_n = n
            longest = max(longest, n)
            elapsed = next((v * scale for key, scale in _ELAPSED
                            if (v := _number(it.fields.get(key))) is not None), None)
            gbs = next((v for key in _BATCH if (v := _number(it.fields.get(key))) is not None),
                       None)
            seq = _number(it.fields.get("actual_seqlen")) or seq_length
            a, b = bisect_right(ds_lines_at, prev_line), bisect_right(ds_lines_at, it.lineno)
            prev_line = it.lineno
            ds = _mean_phases([d for _, d in ds_all[a:b]]) if b > a else None
            timers = it.timers or {None: ({}, {}, [])}
            per_rank = per_rank or it.mode == "all"
            by_rank: dict[int, tuple[dict[str, float], dict[str, str]]] = {}
            for r, (phases, kinds, out) in timers.items():
                unknown.update(out)
                rank = r if r is not None else (st.tag_rank if st.tag_rank is not None
                                                else (path_rank or 0))
                if ds is not None and (r is None or r == 0):
                    phases, kinds = _merge_deepspeed(phases, kinds, ds)
                    merged += 1
                by_rank[rank] = (phases, kinds)
            finish = []
            base = it.iteration - (1 if it.zero_based else 0)
            for rank, (phases, kinds) in sorted(by_rank.items()):
                dur = round(elapsed / 1000.0 if elapsed is not None
                            else sum(v for k, v in phases.items() if "/" not in k), 9)
                end = it.stamp if it.stamp is not None else clock + n * dur
                finish.append(end)
                worker = _worker("megatron", st.host, rank)
                ends.setdefault(worker, []).append(base)
                for k in range(n):
                    rec: dict[str, Any] = {
                        "type": "iter", "rank": rank, "stage": "megatron", "worker": worker,
                        "iter": base - n + 1 + k, "ts": round(end - (n - k) * dur, 6),
                        "dur": dur, "phases": phases}
                    if kinds:
                        rec["kinds"] = kinds
                    if gbs is not None and gbs >= 0 and gbs == int(gbs):
                        rec["samples"] = int(gbs)
                        if seq is not None:
                            rec["tokens"] = int(gbs) * int(seq)
                    records.append(rec)
            clock = max(finish)
    warnings = []
    if unknown:
        warnings.append(f"timers tlog does not know the place of, kept as top-level phases "
                        f"(category by name): {', '.join(sorted(unknown))}")
    if synthetic:
        warnings.append("timer blocks without iteration lines: each counts as one iteration "
                        "(its figures are averages over a log interval the file does not give)")
    if notes:
        more = f" (and {len(notes) - 3} more)" if len(notes) > 3 else ""
        warnings.append("; ".join(notes[:3]) + more)
    meta = _meta("megatron", skipped + (0 if merged else ds_lines), True, warnings)
    if per_rank:
        meta["per_rank"] = True
    if merged:
        meta["deepspeed_merged"] = True
    if longest > 1 or synthetic:
        meta["interval_ends"] = ends
    return TimerLog("megatron", [meta, *records], meta["lines_skipped"], warnings, True)


def _deepspeed(streams: dict, skipped: int, path_rank: int | None,
               base_ts: float | None) -> TimerLog:
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    ends: dict[str, list[int]] = {}
    longest = 1
    for st in streams.values():
        for r in _ds_ranks(st):
            rank = r if r is not None else (st.tag_rank if st.tag_rank is not None
                                            else (path_rank or 0))
            worker = _worker("deepspeed", st.host, rank)
            clock = base_ts if base_ts is not None else 0.0
            count = 0
            for d in _ds_intervals(st, r, notes):
                dur = d.dur if d.dur is not None else round(
                    sum(v for k, v in d.phases.items() if "/" not in k), 9)
                end = d.stamp if d.stamp is not None else clock + d.n * dur
                first = d.last_step - d.n + 1 if d.last_step is not None else count
                kinds = {k: DEEPSPEED_KINDS[k] for k in d.phases if k in DEEPSPEED_KINDS}
                for k in range(d.n):
                    rec: dict[str, Any] = {"type": "iter", "rank": rank, "stage": "deepspeed",
                                           "worker": worker, "iter": first + k,
                                           "ts": round(end - (d.n - k) * dur, 6), "dur": dur,
                                           "phases": d.phases}
                    if kinds:
                        rec["kinds"] = kinds
                    records.append(rec)
                ends.setdefault(worker, []).append(first + d.n - 1)
                longest = max(longest, d.n)
                count = first + d.n
                clock = end
    warnings = sorted(set(notes))
    meta = _meta("deepspeed", skipped, longest > 1, warnings)
    if longest > 1:
        meta["interval_ends"] = ends
    # boundary lines without a timestamp: the time outside the engine's timers is not seen
    meta["stamped"] = all(stamp is not None for st in streams.values()
                          for steps in (*st.steps.values(), *st.micro.values())
                          for _line, _values, stamp in steps) and not any(
                              st.pipe_steps for st in streams.values())
    return TimerLog("deepspeed", [meta, *records], skipped, warnings, longest > 1)


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


# --- the source ---------------------------------------------------------------


#: ``path -> (dev, inode, size, mtime_ns)`` of files sniffed and found not to be
#: timer logs, so that a follow round (``tlog watch``, ``tlog serve``: every 2 s)
#: does not read the first 8 MiB of every ``slurm-*.out`` again (20 such files
#: took 0.8 s a round). At most :data:`_NOT_TIMER_MAX` entries.
_NOT_TIMER: dict[str, tuple[int, int, int, int]] = {}
_NOT_TIMER_MAX = 65_536


def _known_not_timer(key: str, st: os.stat_result) -> bool:
    """Whether the file at ``key`` was sniffed before and cannot have become a
    timer log since: the same file (device, inode), unchanged, or grown from
    :data:`SNIFF_BYTES` or more (its sniffed head is what it was)."""
    old = _NOT_TIMER.get(key)
    if old is None or old[:2] != (st.st_dev, st.st_ino):
        return False
    if (old[2], old[3]) == (st.st_size, st.st_mtime_ns):
        return True
    return old[2] >= SNIFF_BYTES and st.st_size >= old[2]


def looks_like_timer_log(path: Path) -> bool:
    """True when ``path``'s name ends in one of :data:`SUFFIXES` and its first
    :data:`SNIFF_BYTES` hold a Megatron iteration line or timer block, or a
    DeepSpeed engine timer line. Unreadable files are not claimed. A file found
    not to be one is not read again while it stays the same (or only grows
    past :data:`SNIFF_BYTES`)."""
    if not path.name.lower().endswith(SUFFIXES):
        return False
    key = os.path.abspath(path)
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if _known_not_timer(key, st):
                return False
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return False
    if _SNIFF.search(head) is not None:
        _NOT_TIMER.pop(key, None)
        return True
    if len(_NOT_TIMER) >= _NOT_TIMER_MAX:
        _NOT_TIMER.clear()
    _NOT_TIMER[key] = (st.st_dev, st.st_ino, len(head) if len(head) < SNIFF_BYTES
                       else max(st.st_size, SNIFF_BYTES), st.st_mtime_ns)
    return False


def find_timer_logs(root: Path) -> list[Path]:
    """Timer logs below ``root`` (recursive, sorted; hidden paths and links
    out of ``root`` left out), found by :func:`looks_like_timer_log`. Only
    names ending in :data:`SUFFIXES` are looked at (a run of 10,000 shim logs
    costs one directory walk, no ``stat`` per file)."""
    base = Path(root)
    if base.is_file():
        return [base] if looks_like_timer_log(base) else []
    inside = os.path.realpath(base) + os.sep
    out = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith(".") or not name.lower().endswith(SUFFIXES):
                continue
            p = Path(folder) / name
            if (p.is_file() and os.path.realpath(p).startswith(inside)
                    and looks_like_timer_log(p)):
                out.append(p)
    return sorted(out)


def _path_rank(path: Path) -> int | None:
    """The rank a log's path names: ``rank3.log``, or torchrun's
    ``--log-dir`` layout ``<run>/attempt_0/3/stdout.log`` (a folder named by the
    local rank)."""
    r = rank_from_name(path.name)
    if r is not None:
        return r
    return int(path.parent.name) if path.parent.name.isdigit() else None


def _complete_lines(fh: Any) -> Iterator[str]:
    """The lines of binary file ``fh`` that end in a line break, decoded (UTF-8,
    bad bytes replaced) and split as :meth:`str.splitlines` splits (a progress
    bar's ``\r`` included): a last line still being written is left out."""
    for raw in fh:
        if not raw.endswith(b"\n"):
            return
        yield from raw.decode("utf-8", "replace").splitlines()   # a progress bar's \r too


def decode_timer_log(path: Path) -> Iterator[str]:
    """The ingest decoder: v1 JSONL of one timer log (a ``meta`` line, then
    ``iter`` lines). A last line with no line break yet is left out (it is
    read once complete; the source reloads a changed file whole)."""
    with open(path, "rb") as fh:
        mtime = os.fstat(fh.fileno()).st_mtime
        # line by line: the whole file is never held in memory (a 200 MB log
        # took 1.7 GB when read whole, decoded and split)
        parsed = parse_lines(_complete_lines(fh), path_rank=_path_rank(Path(path)),
                             base_ts=0.0)
    iters = parsed.records[1:]
    if not parsed.stamped and iters:
        # no timestamp in the file: its last iteration ends at the file's mtime
        shift = max(mtime - max(r["ts"] + r["dur"] for r in iters), 0.0)
        for r in iters:
            r["ts"] = round(r["ts"] + shift, 6)
    shared: dict[int, str] = {}     # the n rows of an interval share their phases' text
    for rec in parsed.records:
        phases = rec.get("phases")
        if phases is None:
            yield json.dumps(rec, separators=(",", ":")) + "\n"
            continue
        tail = shared.get(id(phases))
        if tail is None:
            tail = shared[id(phases)] = json.dumps(
                {k: rec[k] for k in ("phases", "kinds") if k in rec}, separators=(",", ":"))[1:]
        head = json.dumps({k: v for k, v in rec.items() if k not in ("phases", "kinds")},
                          separators=(",", ":"))
        yield f"{head[:-1]},{tail}\n"


def source() -> Source:
    """The ``timer_log`` log source (the ``tlog.sources`` entry point
    ``timer_log``; ``runs.source = 'timer_log'`` when a run has only these)."""
    from tlog.ingest.sources import Source

    return Source(kind="timer_log", find=find_timer_logs, decode=decode_timer_log,
                  run_source="timer_log", label="timer logs", converts=True, whole=True)


def stored_notes(con: Any, run_id: str) -> list[str]:
    """What the analysis must say of a run's timer logs, one line each: the
    Megatron logs whose iterations are interval averages; the DeepSpeed logs,
    whose phases are the engine's timers only (with timestamps the time
    between steps is seen as unaccounted; without, not at all). ``con``: a
    DuckDB connection to the tlog database."""
    rows = con.execute(
        "SELECT path, json_extract_string(meta, '$.extra.timer_log'), "
        "json_extract(meta, '$.extra.averaged')::VARCHAR, "
        "json_extract(meta, '$.extra.stamped')::VARCHAR FROM files "
        "WHERE run_id = ? AND source = 'timer_log' ORDER BY path", [run_id]).fetchall()
    out = []
    for path, framework, averaged, stamped in rows:
        if framework == "megatron" and averaged == "true":
            out.append(f"{path}: Megatron-LM timer log: each logged interval's figures are "
                       f"averages over its iterations (and the slowest rank's timers), "
                       f"repeated for each iteration; spread within an interval is not known")
        elif framework == "deepspeed" and averaged == "true":
            out.append(f"{path}: DeepSpeed pipeline-engine timer log: each logged interval's "
                       f"figures are its timers summed over steps_per_print steps, divided "
                       f"by them and repeated for each step (rank 0's: the first stage)")
        elif framework == "deepspeed" and stamped == "true":
            out.append(f"{path}: DeepSpeed timer log: phases are the engine's timers "
                       f"(forward, backward, step); the time between one step's line and "
                       f"the next outside them (the data fetch, the loop's own code) is "
                       f"unaccounted")
        elif framework == "deepspeed":
            out.append(f"{path}: DeepSpeed timer log without timestamps: iterations are the "
                       f"engine's forward + backward + step only; time outside them (the "
                       f"data fetch, the loop's own code) is not seen, so throughput is an "
                       f"upper bound")
    return out


def stored_intervals(con: Any, run_id: str) -> dict[str, list[int]]:
    """The logged intervals of a run's averaged timer logs: by worker name,
    the last iteration number of each interval, ascending (``files.meta``
    ``extra.interval_ends``, written by :func:`parse_lines` where an interval
    stands for more than one iteration, or where timer blocks had no iteration
    line). The rows of one interval repeat one logged figure: they are one
    observation, not ``n``. ``con``: a DuckDB connection to the tlog database;
    ``{}`` for a run without such files."""
    rows = con.execute(
        "SELECT json_extract(meta, '$.extra.interval_ends')::VARCHAR FROM files "
        "WHERE run_id = ? AND source = 'timer_log' "
        "AND json_extract(meta, '$.extra.interval_ends') IS NOT NULL", [run_id]).fetchall()
    out: dict[str, list[int]] = {}
    for (text,) in rows:
        for worker, ends in json.loads(text).items():
            out.setdefault(worker, []).extend(int(e) for e in ends)
    return {w: sorted(set(e)) for w, e in out.items()}
