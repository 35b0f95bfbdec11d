"""``tlog run [options] -- COMMAND ...``: run a training job, then ingest and judge it.

Every process of the job gets the run directory, run id and tags through the
environment the shim reads (``TLOG_RUN_DIR``, ``TLOG_RUN_ID``, ``TLOG_TAGS``:
:func:`tlog.job.job_env`), so ``Recorder.from_env()`` in the training script
needs nothing else. The run directory is ``<--runs-dir>/<run id>``
(default ``./tlog-runs/<script>-<YYYYmmdd-HHMMSS>``). The job runs in a
process group of its own; Ctrl-C is passed on to it, escalating
(:mod:`tlog.job`). When it has ended, the run is ingested into the database
(``tlog ingest``'s code), its verdict printed (``tlog diagnose``'s renderer)
and its HTML report written (``tlog report``'s code).

Exit code: the job's (128 + N when signal N ended it, as a shell gives), also
when it wrote no logs; 127 when the command is not found, 126 when it cannot
be executed. When the job succeeded but tlog could not ingest or judge the run,
tlog's own error code (1).
"""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tlog.app import DbOption, app, console, err_console, open_database
from tlog.ingest.errors import RunNotFoundError, TlogError, UsageError

if TYPE_CHECKING:
    from tlog.job import JobResult

#: Parent of the run directories ``tlog run`` makes when ``--runs-dir`` is not given
#: (relative to the working directory, like ``./tlog-reports/``).
DEFAULT_RUNS_DIR = Path("tlog-runs")


def _say(message: str) -> None:
    """One line of tlog's own on stderr (the job's output shares the terminal)."""
    err_console.print(f"tlog: {message}", highlight=False, markup=False, soft_wrap=True)


def _check_run_id(run_id: str) -> None:
    """UsageError unless ``run_id`` is a run id (``tlog ingest``'s rules) that
    can also name a directory."""
    from tlog.ingest.manifest import run_id_problem

    problem = run_id_problem(run_id)
    if problem is None and (run_id in (".", "..") or "/" in run_id or os.sep in run_id):
        problem = "cannot name a directory (it is '.' or '..', or holds a '/')"
    if problem:
        short = run_id if len(run_id) <= 60 else run_id[:60] + "..."
        raise UsageError(f"--run-id {short!r} {problem}: give a short name such as "
                         f"lr3e-4-bs64, or leave --run-id out for <script>-<date-time>")


def choose_run_dir(runs_dir: Path, run_id: str | None, argv: list[str]) -> tuple[str, Path]:
    """The run id and directory of a new run: ``runs_dir / run_id``.

    Without ``run_id``: :func:`tlog.job.default_run_id`, with ``-2``, ``-3`` ...
    appended while that directory exists.

    Raises:
        UsageError: a bad ``run_id``, or its directory exists and is not empty
            (the new run's logs would mix with another run's).
    """
    from tlog.job import default_run_id

    if run_id is not None:
        _check_run_id(run_id)
        run_dir = runs_dir / run_id
        if run_dir.is_dir() and any(run_dir.iterdir()):
            raise UsageError(f"run directory {run_dir} already holds files: give another "
                             f"--run-id (or --runs-dir) so this run's logs do not mix "
                             f"with them")
        if run_dir.exists() and not run_dir.is_dir():
            raise UsageError(f"{run_dir} exists and is not a directory: give another "
                             f"--run-id (or --runs-dir)")
        return run_id, run_dir
    base = default_run_id(argv)
    run_id, n = base, 1
    while (runs_dir / run_id).exists():
        n += 1
        run_id = f"{base}-{n}"
    return run_id, runs_dir / run_id


def _check_free(db: Path | None, run_id: str, run_dir: Path) -> None:
    """UsageError when the database already holds ``run_id`` from another
    directory (ingest would refuse it after the job, :func:`ingest.run._check_root`);
    said before the job starts. Skipped when the database is absent or busy."""
    from tlog.ingest.errors import DatabaseError

    try:
        root = open_database(db, wait_s=0).run_root(run_id)
    except DatabaseError:
        return
    if root is not None and root != str(run_dir.resolve()):
        raise UsageError(f"run id {run_id!r} is already in the database (from {root}): "
                         f"give this run another --run-id")


def _ended(result: JobResult) -> str:
    """How the job ended, in words: 'exited with code 3', 'was ended by SIGINT (exit code 130)'."""
    if result.signal is not None:
        try:
            name = signal.Signals(result.signal).name
        except ValueError:
            name = f"signal {result.signal}"
        return f"was ended by {name} (exit code {result.exit_code})"
    return f"exited with code {result.exit_code}"


def _judge(run_dir: Path, run_id: str | None, db: Path | None) -> None:
    """Ingest ``run_dir``, print its verdict and its report's path (the code of
    ``tlog ingest``, ``tlog diagnose`` and ``tlog report``)."""
    from tlog.commands.diagnose import render

    database = open_database(db)
    try:
        report = database.ingest(run_dir, run_id)
        diagnosis = database.diagnose(report.run_id)
        # the run's total: a live tlog serve's watcher may have loaded part of it first
        _say(f"ingested run {report.run_id}: {diagnosis.iterations.total:,} "
             f"iterations from {report.files} files"
             + (f"; {report.records_rejected:,} lines rejected (tlog ingest --json lists "
                f"them)" if report.records_rejected else ""))
        render(diagnosis)
        html = database.report(report.run_id)
    finally:
        database.close()
    console.print(f"Report: {html}", highlight=False, markup=False, soft_wrap=True)


def _wrote_nothing(run_dir: Path) -> bool:
    """True when the job left no log that ingest reads under ``run_dir`` (shim
    JSONL, torch.profiler traces, a plugin source's files:
    :func:`tlog.ingest.sources.discover`, the files ``tlog ingest`` would read)."""
    from tlog.ingest.sources import discover

    try:
        return not run_dir.is_dir() or not discover(run_dir)
    except OSError:
        return False           # ingest says what is wrong with the directory


@app.command("run", context_settings={"allow_interspersed_args": False,
                                      "ignore_unknown_options": True})
def run_command(
    command: Annotated[list[str] | None, typer.Argument(
        metavar="-- COMMAND [ARGS]...",
        help="The job, e.g. torchrun --nproc-per-node 8 train.py, or python train.py.",
        show_default=False)] = None,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Run id (default: <script>-<YYYYmmdd-HHMMSS>); also names the "
                         "run directory.", show_default=False)] = None,
    tag: Annotated[list[str] | None, typer.Option(
        "--tag", help="A tag of the run as key=value (repeat for more); tlog runs --tag "
                      "filters on them.", show_default=False)] = None,
    runs_dir: Annotated[Path, typer.Option(
        "--runs-dir", file_okay=False, help="Parent of the run directory "
                                            "(<runs-dir>/<run id>).")] = DEFAULT_RUNS_DIR,
    db: DbOption = None,
    live: Annotated[bool, typer.Option(
        "--live", help="Show the live view (tlog watch) while the job runs; the job's "
                       "output goes to RUN_DIR/job.log; q leaves the view, Ctrl-C goes to "
                       "the job.")] = False,
) -> None:
    """Run a training job with tlog's environment set for every rank, pass Ctrl-C on to
    it, then ingest the run, print its verdict and write its report; exit with the
    job's exit code."""
    from tlog.analyze.history import parse_tag_filters
    from tlog.job import Job, job_env

    command = list(command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("give the job to run after '--', e.g. tlog run -- torchrun "
                         "--nproc-per-node 2 train.py")
    tags = parse_tag_filters(tag, what="tag")
    chosen_id, run_dir = choose_run_dir(runs_dir, run_id, command)
    _check_free(db, chosen_id, run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the run directory {run_dir}: "
                         f"{exc.strerror or exc}") from None
    try:
        from tlog.commands.watch import JOB_OUTPUT, watch_job

        with Job(command, job_env(os.environ, run_dir, chosen_id, tags), notify=_say,
                 output=run_dir / JOB_OUTPUT if live else None) as job:
            _say(f"run {chosen_id}: logs in {run_dir} (TLOG_RUN_DIR); started "
                 f"{shlex.join(command)} (pid {job.pid})")
            result = watch_job(job, run_dir, run_id=run_id, db=db) if live else job.wait()
    except TlogError:          # the command is not there or cannot be executed
        _remove_if_empty(run_dir)
        raise
    _say(f"the job {_ended(result)} after {result.seconds:.1f} s")
    if result.leftovers:
        pids = ", ".join(str(p) for p in result.leftovers[:8])
        n = len(result.leftovers)
        _say(f"{n} of the job's processes {'was' if n == 1 else 'were'} still running after "
             f"it ended (pids {pids}): stopped {'it' if n == 1 else 'them'}")
    if _wrote_nothing(run_dir):
        _remove_if_empty(run_dir)
        _nothing(f"the job wrote no timing logs to {run_dir}")
        raise typer.Exit(code=result.exit_code)
    try:
        _judge(run_dir, run_id, db)
    except RunNotFoundError as exc:      # logs without a single iteration
        _nothing(str(exc))
    except TlogError as exc:
        if result.exit_code == 0:
            raise
        _say(f"error: {exc}")
    raise typer.Exit(code=result.exit_code)


def _remove_if_empty(run_dir: Path) -> None:
    """Remove the run directory tlog made for the job when nothing is in it."""
    if run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()


def _nothing(why: str) -> None:
    """The one line for a run with nothing to judge."""
    _say(f"{why}: nothing to judge (does the training script record with "
         f"Recorder.from_env()? see docs/RUNTIME.md)")
