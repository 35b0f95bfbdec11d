"""Run the DDP scenarios of ``ddp_train.py`` under torchrun and read back their truth.

Library for ``conftest.py`` and a command line that writes the runs somewhere to
keep (``python tests/ddp/ddp_runs.py OUT [scenario-mode ...]``). Each run lands in
``OUT/<scenario>-<mode>/`` as ``run/`` (the shim's logs or the traces: what
``tlog ingest`` reads) and ``truth/truth-rank{R}.json`` (the bare timers), plus
``TRUTH.md`` (the expected verdicts and the figures, for people).

Everything here is computed from the truth files (bare ``time.perf_counter()``
timers in the training script), never from tlog's output.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SCRIPT = HERE / "ddp_train.py"

#: World size per scenario. Two: three ranks on this 2-core machine made a healthy
#: rank's forward take 5x its peer's (119 vs 24 ms, measured by the bare timers of an
#: input_straggler run): oversubscription, a real straggler no scenario injected.
WORLD = {"healthy": 2, "input_bound": 2, "input_straggler": 2, "compute_straggler": 2}
SCENARIOS = tuple(WORLD)
MODES = ("phases", "trace")
#: Scenarios also run in ``measured`` mode (plain phases + the shim's rec.watch_ddp):
#: the measured collective wait against the truth, without doubling the suite's time.
MEASURED = ("healthy", "compute_straggler")
ALL_RUNS = tuple(f"{s}-{m}" for s in SCENARIOS for m in MODES) + tuple(f"{s}-measured" for s in MEASURED)
SLOW_RANK = 1
#: Scenarios whose truth needs each rank on a core of its own (pytest marker
#: ``cores_alone``; ``make test`` runs them after the rest, alone): beside another
#: pytest worker the two ranks of compute_straggler competed for the 2 cores and the
#: inferred wait, hence the gain, ran 10-27% high (README.md "Shared cores"), and a
#: healthy rank slowed by another process is a straggler no scenario injected. The
#: input scenarios' faults are 120 ms sleeps that a busy core does not move (they
#: ran beside the other worker in every CI run before the split, as the tlog run
#: test's input_straggler job still does), so they run in the parallel part.
ALONE = ("healthy", "compute_straggler")
#: One torchrun per suite: the scenarios of each run together (ddp_runs.run_suite).
SUITES = {"alone": ALONE, "shared": tuple(s for s in SCENARIOS if s not in ALONE)}


def suite_of(scenario: str) -> tuple[str, ...]:
    """The scenarios that run in one torchrun with ``scenario`` (:data:`SUITES`)."""
    return next(group for group in SUITES.values() if scenario in group)
#: Wall-clock limit of one torchrun (seconds); a run took 12-26 s on the shared 2-core machine.
RUN_TIMEOUT_S = 180
#: Steps of each reference job (the straggler scenarios' loop with the fault removed,
#: ``ddp_train.py --reference-steps``): 5 warm-up + 15 timed, ~1.5 s on idle cores.
REFERENCE_STEPS = 20


def torchrun_cmd(nproc: int) -> list[str]:
    """``torchrun`` of this interpreter's environment, ``--standalone``.

    ``--standalone`` rendezvouses at ``localhost:0`` (torch/distributed/run.py sets
    it, overriding any ``--rdzv-endpoint``): a free port per run, so parallel runs
    never collide.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


@dataclass
class RunResult:
    """One finished scenario run: where its files are and how long it took (seconds)."""

    scenario: str
    mode: str
    out: Path
    wall_s: float
    log: str = ""

    @property
    def run_dir(self) -> Path:
        return self.out / "run"

    @property
    def truth_dir(self) -> Path:
        return self.out / "truth"


class RunFailed(RuntimeError):
    """torchrun exited non-zero or ran past its limit; the message holds its output tail."""


def modes_of(scenario: str) -> tuple[str, ...]:
    """The modes ``scenario`` runs in, in the order one torchrun runs them."""
    return ("phases", "measured", "trace") if scenario in MEASURED else ("phases", "trace")


def run_suite(jobs: dict[str, tuple[str, ...]], parent: Path, *, timeout_s: float = RUN_TIMEOUT_S,
              extra_args: tuple[str, ...] = ()) -> dict[str, dict[str, RunResult]]:
    """Run every scenario of ``jobs`` (scenario -> its modes) in ONE torchrun, into
    ``parent/<scenario>-<mode>/{run,truth}``: ``{scenario: {mode: RunResult}}``.

    The ranks join the process group once and run the jobs one after the other, each
    mode a whole job of its own (``ddp_train.run_mode``): only the start-up (three
    interpreters importing torch, the rendezvous) is shared, paid once for the suite
    rather than once per scenario (4 torchruns -> 1; the saving is in the docstring of
    tests/ddp/README.md). ``timeout_s`` is per mode. Every result carries the one
    torchrun's wall seconds. Raises :class:`RunFailed` on a non-zero exit or past the
    limit (one failure fails every scenario of the suite).
    """
    parent = Path(parent)
    for scenario, modes in jobs.items():
        for m in modes:
            (parent / f"{scenario}-{m}").mkdir(parents=True, exist_ok=True)
    template = str(parent / "{scenario}-{mode}")
    n_modes = sum(len(m) for m in jobs.values())
    wall, log = _torchrun(list(jobs.items()), template + "/run", template + "/truth",
                          timeout_s * n_modes, extra_args)
    return {s: {m: RunResult(s, m, parent / f"{s}-{m}", wall, log) for m in modes}
            for s, modes in jobs.items()}


def _torchrun(jobs: list[tuple[str, tuple[str, ...]]], run_dir: str, truth_dir: str,
              timeout_s: float, extra_args: tuple[str, ...]) -> tuple[float, str]:
    """One torchrun of ``ddp_train.py`` running ``jobs`` ((scenario, modes) each, in
    turn; ``{scenario}`` and ``{mode}`` in the directories: one per job and mode); its
    wall seconds and output. Raises :class:`RunFailed`."""
    name = "+".join(f"{s}-{','.join(m)}" for s, m in jobs)
    world = {WORLD[s] for s, _ in jobs}
    if len(world) != 1:
        raise ValueError(f"one torchrun runs one world size: {name} asks for {sorted(world)}")
    job_args = [a for s, m in jobs for a in ("--job", f"{s}:{','.join(m)}")]
    cmd = [*torchrun_cmd(world.pop()), str(SCRIPT), *job_args,
           "--run-dir", run_dir, "--truth-dir", truth_dir,
           "--slow-rank", str(SLOW_RANK), "--reference-steps", str(REFERENCE_STEPS),
           *extra_args]
    return run_torchrun(cmd, name, timeout_s)


def run_torchrun(cmd: list[str], name: str, timeout_s: float) -> tuple[float, str]:
    """Run ``cmd`` (a :func:`torchrun_cmd` line) from the repository root with the
    repository importable, no ``TLOG_RUN_DIR`` and one intra-op thread; its wall
    seconds and output. Raises :class:`RunFailed` (``name`` in the message) on a
    non-zero exit or past ``timeout_s``, the whole process group killed."""
    env = dict(os.environ)
    env.pop("TLOG_RUN_DIR", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    # A session of its own: on timeout the whole group (torchrun and its ranks) is
    # killed, not only torchrun, whose ranks would run on.
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        log, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        log, _ = p.communicate()
        raise RunFailed(f"{name}: torchrun ran past {timeout_s} s: {log[-3000:]}") from None
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RunFailed(f"{name}: torchrun exit {p.returncode}: {log[-3000:]}")
    return wall, log


@dataclass
class Truth:
    """The bare-timer truth of one run, over each rank's steady steps (seconds).

    ``ranks[r]`` is rank r's truth file (``ddp_train.py`` writes it). Shares are
    time-weighted: summed seconds over summed step seconds, over all ranks.
    """

    scenario: str
    mode: str
    ranks: list[dict] = field(default_factory=list)
    #: per rank, the reference jobs' steady steps per second just before and just
    #: after this run (``reference-rank{R}.json``; empty without reference jobs)
    references: list[list[float]] = field(default_factory=list)

    @classmethod
    def load(cls, truth_dir: Path) -> Truth:
        files = sorted(Path(truth_dir).glob("truth-rank*.json"))
        ranks = sorted((json.loads(f.read_text()) for f in files), key=lambda t: t["rank"])
        if not ranks:
            raise FileNotFoundError(f"no truth-rank*.json in {truth_dir}")
        refs = [json.loads(f.read_text())["steps_per_s"]
                for f in sorted(Path(truth_dir).glob("reference-rank*.json"))]
        return cls(ranks[0]["scenario"], ranks[0]["mode"], ranks, refs)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def total(self, key: str, rank: int | None = None) -> float:
        """Sum of ``key`` (``step_s``, ``data_s``, ...) over the steady steps, one rank or all."""
        rs = self.ranks if rank is None else [self.ranks[rank]]
        return sum(r["steady_totals_s"][key] for r in rs)

    def per_step(self, key: str, rank: int) -> float:
        """Mean seconds per steady step of ``key`` on ``rank``."""
        return self.total(key, rank) / len(self.ranks[rank]["steady_steps"])

    def share(self, key: str, rank: int | None = None) -> float:
        """Time-weighted share of the step in ``key`` (one rank or all ranks)."""
        return self.total(key, rank) / self.total("step_s", rank)

    def idle_share(self, rank: int | None = None) -> float:
        """Share of the step outside data, forward, backward and optimizer: loop overhead.

        Everything the rank does is inside one of those four timers (the all-reduce
        wait is inside backward), so this is the share no phase should hold.
        """
        phases = sum(self.total(k, rank) for k in ("data_s", "forward_s", "backward_s", "optimizer_s"))
        return max(0.0, 1.0 - phases / self.total("step_s", rank))

    def own_work(self, rank: int, step: int, *, without_fault: bool = False) -> float:
        """Seconds of ``step`` that ``rank`` spent on its own work: step - all-reduce wait.

        ``without_fault``: also minus the injected fault's measured seconds.
        """
        st = self.ranks[rank]["per_step"][step]
        own = st["step_s"] - st["comm_wait_s"]
        return own - st["fault_s"] if without_fault else own

    def peer_wait_share(self) -> float:
        """Share of the step the ranks waited for each other, beyond the transfer itself.

        Per step, the last rank to arrive waits only for the transfer (the smallest
        exposed all-reduce wait of the step); every rank's wait beyond that is the
        time it waited for a slower peer. This part is visible from rank alignment
        alone (the phases' end times); the transfer every rank waits is not.
        """
        extra = 0.0
        for i in self.ranks[0]["steady_steps"]:
            waits = [r["per_step"][i]["comm_wait_s"] for r in self.ranks]
            extra += sum(w - min(waits) for w in waits)
        return extra / self.total("step_s")

    def compute_per_step(self, rank: int) -> float:
        """Mean seconds per steady step of ``rank``'s own compute: forward + backward
        + optimizer - its exposed all-reduce wait (the wait is not its work)."""
        return (self.per_step("forward_s", rank) + self.per_step("backward_s", rank)
                + self.per_step("optimizer_s", rank) - self.per_step("comm_wait_s", rank))

    def own_work_steps(self, rank: int, steps: list[int]) -> list[float]:
        """``rank``'s own work in each of ``steps`` (seconds): step - data fetch -
        exposed all-reduce wait (forward + backward + optimizer - the wait, plus any
        loop overhead, which tlog too counts as the rank's own)."""
        per = self.ranks[rank]["per_step"]
        return [per[i]["step_s"] - per[i]["data_s"] - per[i]["comm_wait_s"] for i in steps]

    def compute_median(self, rank: int) -> float:
        """Median over ``rank``'s steady steps of its own work in the step: step - data
        fetch - exposed all-reduce wait (seconds; forward + backward + optimizer - the
        wait, plus any loop overhead, which tlog too counts as the rank's own).

        The statistic tlog's straggler rule uses (the median over steady iterations
        of a rank's own work, docs/DIAGNOSIS.md section 6): on two shared cores a
        rank's own compute is skewed by a few steps that another process slowed, so
        its mean and median differ by up to 12 ms of 125 ms (input_bound trace run
        under two busy loops, rank 0: mean 137.3, median 125.1 ms), and the ratio of
        two ranks by up to 5 points (1.055 by means, 1.102 by medians).
        """
        return statistics.median(self.own_work_steps(rank, self.ranks[rank]["steady_steps"]))

    def slower_ranks(self, threshold: float = 0.15) -> set[int]:
        """Ranks whose own compute (:meth:`compute_median`) exceeds the median of
        their peers' by more than ``threshold`` (tlog's STRAGGLER_THRESHOLD,
        docs/DIAGNOSIS.md section 6), by tlog's statistic: the median over steps.

        In a run with no injected straggler this is the machine's doing (two ranks
        on two shared cores): a rank named a straggler must be in this set. By the
        mean per step instead (:meth:`compute_per_step`, as before) an input_bound
        trace run under pytest-xdist read 82.2 vs 93.7 ms (14%: no straggler) where
        tlog's medians read 71.8 vs 92.7 (29%: rank 1 named). That run was not kept.
        On 13 trace runs since (load 2-9) the timers' mean and median of a rank's own
        work differed by up to 12 ms, and tlog's median was up to 5.7% over the
        timers' median (1.0% since docs/KINETO.md gaps rule 5).
        """
        own = [self.compute_median(r) for r in range(self.world_size)]
        out = set()
        for r in range(self.world_size):
            peers = [own[p] for p in range(self.world_size) if p != r]
            if own[r] > (1 + threshold) * statistics.median(peers):
                out.add(r)
        return out

    def lockstep_gain(self, rank: int = SLOW_RANK) -> float:
        """Speedup if ``rank``'s fault were gone, by the lockstep model on the bare timers.

        Each steady step of a DDP job lasts as long as its slowest rank's own work plus
        the all-reduce transfer (the last rank to arrive waits only for that: the
        smallest exposed wait of the step). With the fault removed from ``rank``:

            fixed_i = max_r(own_r,i - fault_r,i) + min_r(wait_r,i)
            gain    = sum_i(step_i) / sum_i(fixed_i)

        where step_i is the mean over ranks of the step's duration. This is the
        asserted truth: it holds where each rank has its own compute (a GPU per rank).
        """
        steps = self.ranks[0]["steady_steps"]
        total = fixed = 0.0
        for i in steps:
            per = [r["per_step"][i] for r in self.ranks]
            total += sum(p["step_s"] for p in per) / len(per)
            fixed += (max(self.own_work(r, i, without_fault=(r == rank)) for r in range(self.world_size))
                      + min(p["comm_wait_s"] for p in per))
        return total / fixed

    def fixed_gain(self) -> float | None:
        """Speedup of really fixing the straggler: the reference jobs' step rate (the same
        loop without the fault, run in the same ranks just before and just after this
        job; the mean of the two, over ranks) over this job's, by the bare timers. None
        without reference jobs.

        Where each rank has its own core this agrees with :meth:`lockstep_gain`. Where
        the ranks share cores it is higher: removing the fault also gives the peer back
        the core time the fault's work took from it, which the lockstep model, keeping
        each rank's measured own work, cannot see (tests/ddp/README.md: 2.4-2.7x
        against 1.98-2.28x beside two busy loops).
        """
        if not self.references:
            return None
        rate = statistics.mean(statistics.mean(r) for r in self.references)
        return rate / self.step_rate()

    def gain_from_fault(self, rank: int = SLOW_RANK) -> float:
        """sum(step) / (sum(step) - sum(fault)) on ``rank``: the upper bound of the gain.

        Assumes the fault is all on the path of every step; higher than
        :meth:`lockstep_gain` when, without it, another rank would set the pace.
        """
        steps = self.total("step_s", rank)
        return steps / (steps - self.total("fault_s", rank))

    def summary(self) -> dict:
        """The figures the tests assert against, with how each is computed (JSON-able)."""
        d = {
            "scenario": self.scenario, "mode": self.mode, "world_size": self.world_size,
            "slow_rank": SLOW_RANK, "expected": EXPECTED[self.scenario],
            "data_share": self.share("data_s"), "comm_wait_share": self.share("comm_wait_s"),
            "idle_share": self.idle_share(), "step_rate": self.step_rate(),
            "per_rank_ms_per_step": {
                str(r): {k: 1e3 * self.per_step(k, r) for k in (
                    "step_s", "data_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "fault_s")}
                for r in range(self.world_size)},
            "how": {
                "shares": "time-weighted over all ranks' steady steps: sum(seconds)/sum(step seconds)",
                "comm_wait": "backward return - last DDP bucket ready (timing comm hook)",
                "idle_share": "1 - (data + forward + backward + optimizer) / step",
            },
        }
        if self.scenario in ("compute_straggler", "input_straggler"):
            d["gain_lockstep"] = self.lockstep_gain()
            d["gain_fixed"] = self.fixed_gain()
            d["how"]["gain_fixed"] = ("mean steady step rate of the fault-free reference jobs "
                                      "run just before and after / this run's step rate")
            d["gain_upper_bound"] = self.gain_from_fault()
            d["how"]["gain_lockstep"] = (
                "sum_i mean_r step_ri / sum_i (max_r(own_ri - fault_ri) + min_r wait_ri), "
                "own = step - all-reduce wait")
            d["how"]["gain_upper_bound"] = "sum(step)/(sum(step)-sum(fault)) on the slow rank"
        return d

    def step_rate(self) -> float:
        """Steady steps per second, the mean over ranks (lockstep: all equal)."""
        return sum(len(r["steady_steps"]) / r["steady_totals_s"]["step_s"] for r in self.ranks) / self.world_size


EXPECTED = {
    "healthy": "verdict compute; no straggler; the all-reduce wait is sync (trace: not unaccounted)",
    "input_bound": "verdict starvation (input); no straggler; starvation share ~ truth data share",
    "input_straggler": f"only rank {SLOW_RANK} named, kind input (phase data_wait / DataLoader next); "
                       "the other ranks wait in backward (all-reduce) and are NOT named",
    "compute_straggler": f"only rank {SLOW_RANK} named, kind compute, phase forward; "
                         "speedup_if_fixed within 25% of the truth gain",
}


def truth_markdown(truth: Truth, wall_s: float | None = None, healthy: Truth | None = None) -> str:
    """A short TRUTH.md for people: expected verdict and the bare-timer figures."""
    def ms(s: float) -> str:
        return f"{s * 1e3:.1f} ms"

    lines = [f"# {truth.scenario} ({truth.mode} mode), world size {truth.world_size}", "",
             f"Expected: {EXPECTED[truth.scenario]}.", ""]
    if wall_s is not None:
        lines.append(f"torchrun wall time: {wall_s:.1f} s.")
    faults = {r["rank"]: {k: v for k, v in r["fault"].items() if v} for r in truth.ranks}
    steady = truth.ranks[0]["steady_steps"]
    lines += [f"Fault per rank: {json.dumps(faults)}.", "",
              f"Per steady step (bare perf_counter timers; steps {steady[0]}..{steady[-1]}):", "",
              "| rank | step | data | forward | backward | (all-reduce wait in it) | optimizer | fault |",
              "|---|---|---|---|---|---|---|---|"]
    for r in range(truth.world_size):
        lines.append("| " + " | ".join([str(r)] + [ms(truth.per_step(k, r)) for k in (
            "step_s", "data_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "fault_s")]) + " |")
    lines += ["", (f"Shares of the step (all ranks, time-weighted): data {truth.share('data_s'):.1%}, "
                   f"all-reduce wait (sync) {truth.share('comm_wait_s'):.1%}, "
                   f"idle outside the four phases {truth.idle_share():.1%}."),
              f"Step rate: {truth.step_rate():.2f} steps/s."]
    if truth.scenario in ("compute_straggler", "input_straggler"):
        lines.append(f"Gain if rank {SLOW_RANK} fixed: {truth.lockstep_gain():.2f}x by the lockstep "
                     "model on the timers (per step: max over ranks of own work without the fault "
                     "+ the smallest all-reduce wait); "
                     f"upper bound sum(step)/(sum(step)-sum(fault)) {truth.gain_from_fault():.2f}x.")
        fixed = truth.fixed_gain()
        if fixed is not None:
            lines.append(f"Gain of really removing the fault: {fixed:.2f}x (the fault-free reference "
                         "jobs just before and after, same ranks). tlog's figure must lie within "
                         "25% of the span of the two.")
        if healthy is not None:
            lines.append(f"Against the healthy run's step rate: {healthy.step_rate() / truth.step_rate():.2f}x "
                         "(another run at another moment on 2 shared cores: the machine's load, and "
                         "both ranks computing at once, move it; not asserted).")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``ddp_runs.py [--truth-only] OUT [scenario-mode ...]``: run (all by default) and
    write TRUTH.md and truth.json; ``--truth-only`` rewrites those two from the truth
    files already there, running nothing."""
    truth_only = "--truth-only" in argv
    argv = [a for a in argv if a != "--truth-only"]
    out = Path(argv[0])
    wanted = argv[1:] or list(ALL_RUNS)
    jobs: dict[str, tuple[str, ...]] = {}
    for name in wanted:
        scenario, mode = name.rsplit("-", 1)
        jobs[scenario] = (*jobs.get(scenario, ()), mode)
    ran: dict[str, dict[str, RunResult]] = {}
    if not truth_only:
        for name in wanted:
            if (out / name).exists():
                shutil.rmtree(out / name)
        ran = run_suite(jobs, out)
    for name in wanted:
        scenario, mode = name.rsplit("-", 1)
        dest = out / name
        if truth_only:
            old = json.loads((dest / "truth.json").read_text()) if (dest / "truth.json").exists() else {}
            res = RunResult(scenario, mode, dest, old.get("torchrun_wall_s", float("nan")))
        else:
            res = ran[scenario][mode]
        truth = Truth.load(res.truth_dir)
        healthy_dir = out / f"healthy-{mode}" / "truth"
        healthy = Truth.load(healthy_dir) if healthy_dir.exists() else None
        (dest / "TRUTH.md").write_text(truth_markdown(truth, res.wall_s, healthy))
        summary = {**truth.summary(), "torchrun_wall_s": res.wall_s}
        if healthy is not None and scenario == "compute_straggler":
            summary["gain_vs_healthy_run"] = healthy.step_rate() / truth.step_rate()
        (dest / "truth.json").write_text(json.dumps(summary, indent=1))
        print(f"{name}: {res.wall_s:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
