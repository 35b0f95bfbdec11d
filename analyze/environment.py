"""Did the machine change between two runs? (``tlog compare``'s environment).

:func:`compare_environments` sets two runs' :class:`~tlog.analyze.results.SystemSummary`
side by side and answers:

- **What differed** (:class:`EnvDifference`): the machine (host, CPU model,
  cores, GPU model and count, driver, CUDA) and its load over the steady
  state (usable cores, load average, the process's runnable threads, the
  recording thread's on-CPU share, SM clocks, throttling), each where it
  moved beyond :data:`LOAD_LIMITS`.
- **Is the change contention?** (:attr:`Environment.contention`): every
  compute phase of the compared stage moved the same way
  (:func:`moved_together`) while the load moved the same way (more runnable
  threads than cores, a higher load average, or the thread waiting for a
  core more; or the reverse for a speed-up), and the added time is a wait
  for a core. Measured where both runs carry the run-queue delay
  (``SystemSummary.run_queue_share``, Linux): the thread's run-queue wait
  per iteration changed by at least :data:`CPU_SHARE_OF_CHANGE` of its
  wall time's change; a slowdown from sleeping, I/O, locks or the GIL adds
  wall time off the CPU but no run-queue wait, so it is never called
  contention. Without those figures (not Linux, older logs) tlog guesses,
  and the sentence says so (:data:`GUESS_WORDS`): the thread's CPU time per
  iteration stayed about the same (without ``cpu``, at least two compute
  phases by similar factors), and the thread off the CPU more counts as
  more load. A code change moves the phases it touches and its CPU time; a
  busier machine slows every phase that needs a CPU without adding work.
- **Which way did the load go?** (:func:`_load_differences`): by the
  thread's run-queue share where both runs carry it, else by its on-CPU
  share; never by the load average alone.
- **How much is more work?** (:func:`split_change`): with run-queue figures
  and ``cpu`` in both runs, the change splits exactly into more work and a
  busier core; where more work is a quarter of it or more
  (:data:`WORK_SHARE_OF_CHANGE`) it is never called contention, and the
  sentence names the work first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tlog.analyze.results import SystemSummary
from tlog.analyze.text import ms, pct, signed_pct

#: How much a load figure must move to count as a change. Source: tlog's choice:
#: ``load1`` by half a core and a quarter of its value (the one-minute average
#: of a shared machine wanders by less between runs); runnable threads by one
#: and a quarter; the thread's on-CPU share by 15 points (``cpu`` sampling and
#: GIL hand-offs move it a few points); SM clocks by 5% (boost moves less);
#: the throttled share by 10 points (``gpu_throttled_share``); the run-queue
#: share by 15 points, as the on-CPU share.
LOAD_LIMITS: dict[str, float] = {"load1": 0.5, "running": 1.0, "on_cpu_share": 0.15,
                                 "run_queue_share": 0.15,
                                 "gpu_sm_clock_mhz": 0.05, "throttled_share": 0.10}
#: How the sentence says the contention is inferred without run-queue figures.
GUESS_WORDS = "tlog's guess: no run-queue figures"
#: Phases that move together: their relative changes lie within this factor of
#: each other. Source: tlog's choice: contention stretches every CPU-bound phase
#: by the same ``1 / on_cpu`` factor; twice apart leaves room for noise and
#: phases that wait on memory rather than the core.
TOGETHER_FACTOR = 2.0
#: A compute phase counts in :func:`moved_together` from this share of the
#: stage's baseline time (smaller ones are too noisy). Source: tlog's choice
#: (``MODERATE_SHARE``, 5%).
PHASE_SHARE = 0.05
#: The machine fields compared, in the sentence's order, and their words.
MACHINE_FIELDS: dict[str, str] = {
    "host": "host", "cpu_model": "CPU", "ncpu": "CPU cores", "gpu_name": "GPU",
    "gpu_count": "GPUs", "driver": "driver", "cuda": "CUDA",
}


@dataclass
class EnvDifference:
    """One figure of the environment that differed between the runs.

    Attributes:
        field: ``machine.<name>`` (:data:`MACHINE_FIELDS`) or a load figure
            of :class:`SystemSummary` (``load1``, ``running``, ``ncpu``,
            ``on_cpu_share``, ``run_queue_share``, ``gpu_sm_clock_mhz``,
            ``throttled_share``).
        baseline, candidate: the two values.
        words: how the sentence writes it (``"load 0.4 -> 3.9"``).
    """

    field: str
    baseline: Any
    candidate: Any
    words: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass
class Environment:
    """The environments of two runs compared (:func:`compare_environments`).

    Attributes:
        recorded: both runs recorded system samples or a machine.
        machine_differs: the host, CPU, GPU, driver or CUDA differed.
        differences: every figure that differed, machine first.
        load_change: +1 the candidate ran under more load, -1 under less, 0 neither.
        moved_together: the compared stage's compute phases all moved the same way
            by a similar factor (:func:`moved_together`), with their relative changes.
        contention: the difference is likely the machine's load, not the change
            under test (``moved_together`` and ``load_change`` agree with the gap).
        work_s, machine_s: where both runs carry the run-queue delay, the
            change of the compared stage's time per iteration that more work
            and a busier core explain (:func:`split_change`; seconds, None
            without the figures).
        sentence: what ``tlog compare``'s verdict says of it ("" when nothing).
    """

    recorded: bool
    machine_differs: bool
    differences: list[EnvDifference] = field(default_factory=list)
    load_change: int = 0
    moved_together: dict[str, float] | None = None
    contention: bool = False
    work_s: float | None = None
    machine_s: float | None = None
    sentence: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The ``environment`` object of ``tlog compare --json``."""
        return {"recorded": self.recorded, "machine_differs": self.machine_differs,
                "differences": [d.to_dict() for d in self.differences],
                "load_change": self.load_change, "moved_together": self.moved_together,
                "contention": self.contention, "work_s": self.work_s,
                "machine_s": self.machine_s, "sentence": self.sentence}


def _fmt(name: str, v: Any) -> str:
    if v is None:
        return "?"
    if name in ("on_cpu_share", "run_queue_share", "throttled_share"):
        return pct(v)
    if name == "gpu_sm_clock_mhz":
        return f"{v:.0f} MHz"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def _load_differences(a: SystemSummary, b: SystemSummary) -> tuple[list[EnvDifference], int]:
    """The load figures that moved, and which way the load went (+1 more, -1 less).

    Where both runs carry the thread's run-queue share, it alone decides the
    way (the direct evidence of a wait for a core: the load average counts
    every process of the machine, and rose where the thread's wait did not,
    and the reverse). Else (a guess) the thread's on-CPU share decides it,
    unless the load average or the runnable threads moved the other way: the
    load average alone never makes a busier machine (time off the CPU may as
    well be a sleep, and a busy machine need not crowd the job's cores)."""
    out: list[EnvDifference] = []
    measured = a.run_queue_share is not None and b.run_queue_share is not None
    queue_vote = cpu_vote = load_vote = 0
    if a.ncpu is not None and b.ncpu is not None and a.ncpu != b.ncpu:
        out.append(EnvDifference("ncpu", a.ncpu, b.ncpu, f"usable cores {a.ncpu} -> {b.ncpu}"))
    for name, words in (("running", "runnable threads"), ("load1", "load"),
                        ("on_cpu_share", "the thread on the CPU"),
                        ("run_queue_share", "the thread waiting for a core"),
                        ("gpu_sm_clock_mhz", "SM clock"), ("throttled_share", "GPU throttled")):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            continue
        limit = LOAD_LIMITS[name]
        if name == "gpu_sm_clock_mhz":
            moved = max(x, y) > 0 and abs(y - x) >= limit * max(x, y)
        elif name in ("load1", "running"):
            moved = abs(y - x) >= limit and abs(y - x) >= 0.25 * max(abs(x), abs(y))
        else:
            moved = abs(y - x) >= limit
        if not moved:
            continue
        tail = ""
        if name in ("load1", "running") and b.ncpu is not None:
            tail = f" on {b.ncpu} core{'s' if b.ncpu != 1 else ''}"
        if name == "on_cpu_share":
            tail = " of its compute time"
        if name == "run_queue_share":
            tail = " of its time"
        out.append(EnvDifference(name, x, y, f"{words} {_fmt(name, x)} -> {_fmt(name, y)}{tail}"))
        if name in ("load1", "running"):
            cores = b.ncpu or a.ncpu
            # more load only counts where it crowds the cores in the busier run
            if cores is None or max(x, y) > cores:
                load_vote += 1 if y > x else -1
        elif name == "on_cpu_share":
            cpu_vote = 1 if y < x else -1
        elif name == "run_queue_share":
            queue_vote = 1 if y > x else -1
    if measured:
        return out, queue_vote
    if cpu_vote and load_vote and (load_vote > 0) != (cpu_vote > 0):
        return out, 0
    return out, cpu_vote


def moved_together(contributors: Sequence[Any], stage: str, min_change: float, *,
                   alike: bool) -> dict[str, float] | None:
    """Whether ``stage``'s compute phases all moved together: the phases of
    category ``compute`` present in both runs, each at least
    :data:`PHASE_SHARE` of the stage's baseline time (at least one; two with
    ``alike``), whose relative changes (``delta / baseline``) all have the
    same sign and are each at least ``min_change``
    (``analyze.compare.MIN_RELATIVE_CHANGE``); with ``alike``, also within
    :data:`TOGETHER_FACTOR` of each other.

    Args:
        contributors: ``analyze.compare.Contributor`` items.

    Returns:
        ``{phase: relative change}`` when they did, else None.
    """
    rows = [c for c in contributors if c.stage == stage]
    total = sum(c.baseline_s_per_iter for c in rows)
    comp = [c for c in rows if c.category == "compute" and c.baseline_s_per_iter > 0
            and c.candidate_s_per_iter > 0 and c.baseline_s_per_iter >= PHASE_SHARE * total]
    if len(comp) < (2 if alike else 1):
        return None
    rel = {c.phase: c.delta_s_per_iter / c.baseline_s_per_iter for c in comp}
    values = list(rel.values())
    if not (all(v >= min_change for v in values) or all(v <= -min_change for v in values)):
        return None
    mags = [abs(v) for v in values]
    if alike and max(mags) > TOGETHER_FACTOR * min(mags):
        return None
    return rel


#: The thread's CPU time per iteration may change by at most this share of the
#: change in wall time for the change to be waiting, not work (contention adds
#: wall time, not CPU time); where the run-queue delay is known, its change
#: must be at least this share of the change in wall time (the added time is
#: mostly a wait for a core). Source: tlog's choice (half).
CPU_SHARE_OF_CHANGE = 0.5
#: Where the run-queue delay is known, the part of the change that more work
#: explains (:func:`split_change`) must stay under this share of the change in
#: wall time for the change to be the machine's alone; from it on, the work
#: (the change under test) is named first and the machine's part beside it.
#: Source: tlog's choice (a quarter: a model change that added 40% of the
#: candidate's slowdown under load was called "contention from a busier
#: machine, not the change under test").
WORK_SHARE_OF_CHANGE = 0.25


def split_change(cpu_a: float, q_a: float, cpu_b: float, q_b: float) -> tuple[float, float]:
    """The change of a thread's on-CPU plus run-queue seconds per iteration
    (``cpu + q``), split into the part of more work and the part of a busier
    core (a shift-share split, exact: the two add up to the change).

    A thread that waits ``q`` seconds for a core per ``cpu`` seconds of work
    is stretched by ``s = (cpu + q) / cpu``. Work: ``(cpu_b - cpu_a) * s_a``,
    the new work at the baseline's stretch; machine: ``(s_b - s_a) * cpu_b``,
    the change of the stretch over the candidate's work. A code change that
    doubles the work under an unchanged load is all work; the same work on a
    busier core is all machine.

    Returns:
        ``(work_s, machine_s)`` per iteration (seconds; 0, 0 when either run
        has no CPU time).
    """
    if cpu_a <= 0 or cpu_b <= 0:
        return 0.0, 0.0
    s_a, s_b = (cpu_a + q_a) / cpu_a, (cpu_b + q_b) / cpu_b
    return (cpu_b - cpu_a) * s_a, (s_b - s_a) * cpu_b


def compare_environments(base: SystemSummary | None, cand: SystemSummary | None,
                         contributors: Sequence[Any], stage: str | None,
                         gap_s_per_iter: float | None, min_change: float,
                         cpu_wall: tuple[Sequence[float | None] | None,
                                         Sequence[float | None] | None] = (None, None)
                         ) -> Environment:
    """The two runs' environments compared (module docstring).

    Contention needs the load to have moved the way of the gap and the
    compute phases to have moved together. Where both runs carry the thread's
    run-queue wait per iteration: all compute phases the same way
    (:func:`moved_together`) and that wait changed, the way of the gap, by at
    least :data:`CPU_SHARE_OF_CHANGE` of the change in wall time (measured:
    the time added is a wait for a core), and more work (:func:`split_change`)
    explains under :data:`WORK_SHARE_OF_CHANGE` of it. Where both parts reach
    that share, the sentence names the work first (the change under test) and
    the machine's part beside it, and ``contention`` stays False. Where only the slower run carries
    it, its whole run-queue wait under :data:`CPU_SHARE_OF_CHANGE` of the
    change in wall time rules contention out (the change of the wait is at
    most the wait). Else, a guess (the sentence says
    :data:`GUESS_WORDS`): when both runs' threads recorded ``cpu``, all
    compute phases the same way and the thread's CPU time per iteration
    changed by at most :data:`CPU_SHARE_OF_CHANGE` of the change in its wall
    time (the time added is time off the CPU, not work); without ``cpu``, at
    least two compute phases by similar factors (``alike``).

    Args:
        base, cand: each run's ``Diagnosis.system``.
        contributors: the comparison's ``Contributor`` items.
        stage: the stage compared (the candidate's bottleneck).
        gap_s_per_iter: that stage's change in seconds per iteration
            (positive: the candidate is slower).
        min_change: the smallest relative change of a phase that counts
            (``analyze.compare.MIN_RELATIVE_CHANGE``).
        cpu_wall: per run, the stage's thread CPU seconds, wall seconds and
            run-queue wait seconds (None where not recorded) per steady
            iteration carrying ``cpu`` (None without ``cpu``).
    """
    if base is None or cand is None:
        return Environment(recorded=False, machine_differs=False)
    recorded = (base.samples > 0 or base.machine is not None) and (
        cand.samples > 0 or cand.machine is not None)
    diffs: list[EnvDifference] = []
    if base.machine is not None and cand.machine is not None:
        ma, mb = base.machine.to_dict(), cand.machine.to_dict()
        for name, words in MACHINE_FIELDS.items():
            if ma[name] is not None and mb[name] is not None and ma[name] != mb[name]:
                diffs.append(EnvDifference(f"machine.{name}", ma[name], mb[name],
                                           f"{words} {ma[name]} -> {mb[name]}"))
    machine_differs = bool(diffs)
    load, direction = _load_differences(base, cand)
    diffs += load
    (cpu_a, wall_a, q_a), (cpu_b, wall_b, q_b) = (
        (*x, None)[:3] if x is not None else (None, None, None) for x in cpu_wall)
    waited = None
    measured = None not in (q_a, q_b, wall_a, wall_b) and wall_b != wall_a
    slow_q = None if None in (wall_a, wall_b) else (q_b if wall_b > wall_a else q_a)
    work = machine = None
    if measured and None not in (cpu_a, cpu_b):
        work, machine = split_change(cpu_a, q_a, cpu_b, q_b)
    if measured:
        d_wall = wall_b - wall_a
        waited = (q_b - q_a) * d_wall >= CPU_SHARE_OF_CHANGE * d_wall * d_wall
        if work is not None and work * d_wall >= WORK_SHARE_OF_CHANGE * d_wall * d_wall:
            waited = False   # more work explains a real part: the change under test
    elif slow_q is not None and slow_q < CPU_SHARE_OF_CHANGE * abs(wall_b - wall_a):
        # only the slower run has the figure: its whole run-queue wait bounds the
        # change of it, and that is under half the change in wall time
        waited = False
    elif None not in (cpu_a, wall_a, cpu_b, wall_b) and wall_b != wall_a:
        waited = abs(cpu_b - cpu_a) <= CPU_SHARE_OF_CHANGE * abs(wall_b - wall_a)
    together = (moved_together(contributors, stage, min_change, alike=waited is None)
                if stage is not None and waited is not False else None)
    gap_sign = 0 if not gap_s_per_iter else (1 if gap_s_per_iter > 0 else -1)
    same_way = (together is not None and direction != 0 and direction == gap_sign
                and all((v > 0) == (gap_sign > 0) for v in together.values()))
    sentence = ""
    both = (work is not None and machine is not None and not same_way and measured
            and gap_sign != 0 and direction == gap_sign
            and machine * gap_sign >= WORK_SHARE_OF_CHANGE * abs(wall_b - wall_a)
            and work * gap_sign >= WORK_SHARE_OF_CHANGE * abs(wall_b - wall_a))
    if both:
        sentence = (f"{stage}'s thread did {'more' if work > 0 else 'less'} work per iteration "
                    f"(CPU time {ms(cpu_a)} -> "
                    f"{ms(cpu_b)}, {ms(abs(work))} of the change at the baseline's load) "
                    f"and the machine was {'busier' if gap_sign > 0 else 'quieter'} too "
                    f"(run-queue wait per iteration {ms(q_a)} -> {ms(q_b)}, "
                    f"{ms(abs(machine))} of the change): the change under test and the load "
                    f"both moved it")
    elif same_way:
        phases = ", ".join(f"{p} {signed_pct(v)}" for p, v in
                           sorted(together.items(), key=lambda kv: -abs(kv[1])))
        figures = "; ".join(d.words for d in load)
        if measured:
            figures += (f"; its run-queue wait per iteration {ms(q_a)} -> {ms(q_b)} while its "
                        f"wall time went {ms(wall_a)} -> {ms(wall_b)}")
        elif waited:
            figures += (f"; its CPU time per iteration {ms(cpu_a)} -> {ms(cpu_b)} while its "
                        f"wall time went {ms(wall_a)} -> {ms(wall_b)}")
        sentence = (f"every compute phase of {stage} moved together ({phases}) while the "
                    f"machine's load {'rose' if direction > 0 else 'fell'} ({figures}): "
                    f"likely {'contention from a busier machine' if direction > 0 else 'a quieter machine'}"
                    f", not the change under test" + ("" if measured else f" ({GUESS_WORDS})"))
    elif diffs and recorded and not machine_differs and direction != 0 \
            and direction == -gap_sign:
        # the slower run had the quieter machine: its load cannot have slowed it
        sentence = ("the runs' environments differed: " + "; ".join(d.words for d in diffs)
                    + f" - the {'candidate' if gap_sign > 0 else 'baseline'} was slower on "
                    f"the quieter machine: the load does not explain the change")
    elif work is not None and measured and gap_sign != 0 \
            and work * gap_sign >= WORK_SHARE_OF_CHANGE * abs(wall_b - wall_a) and diffs:
        sentence = (f"the runs' environments differed ({'; '.join(d.words for d in diffs)}), "
                    f"but {stage}'s thread did {'more' if work > 0 else 'less'} work per "
                    f"iteration (CPU time {ms(cpu_a)} -> "
                    f"{ms(cpu_b)}, {ms(abs(work))} of the change at the baseline's load; "
                    f"the run-queue wait explains {ms(abs(machine or 0.0))}): the code or the "
                    f"configuration changed the work")
    elif diffs and recorded:
        sentence = ("the runs' environments differed: " + "; ".join(d.words for d in diffs)
                    + " - the change may not be the code's")
    return Environment(recorded=recorded, machine_differs=machine_differs, differences=diffs,
                       load_change=direction, moved_together=together, contention=same_way,
                       work_s=work, machine_s=machine, sentence=sentence)
