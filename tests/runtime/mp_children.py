"""Child processes that record and end without ``Recorder.close()`` (run as a script).

``python mp_children.py METHOD MODE RUN_DIR``; METHOD is a multiprocessing start
method (fork, forkserver, spawn), MODE one of:

- ``process``: :data:`CHILDREN` ``Process`` children, child ``r`` records
  :data:`ITERS` iterations (``tokens=r``) as ``rank{r}.loader``, then returns;
- ``pool``: a ``Pool`` of :data:`WORKERS` whose initializer makes a recorder (stage
  ``pool``); task ``k`` of :data:`TASKS` records :data:`PER_TASK` iterations with
  ``tokens=k``; ``close()`` + ``join()``: the workers leave their loop and exit;
- ``pool_terminate``: the same, ended by leaving ``with Pool(...)``, which calls
  ``terminate()`` (SIGTERM to the idle workers).

Every recorder uses ``flush_interval=1.0`` and every child ends well within a second,
so the writer thread's periodic flush cannot be what writes the records: only the
flush at the child's exit can. Prints a JSON line with the children's exit codes.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys

from dflash_runtime import Recorder

CHILDREN = 3
ITERS = 40
WORKERS = 2
TASKS = 6
PER_TASK = 25

_rec: Recorder | None = None


def record_and_return(run_dir: str, rank: int) -> None:
    """A DataLoader-style worker: records, never calls close(), returns."""
    rec = Recorder(run_dir, stage="loader", rank=rank, flush_interval=1.0)
    for _ in range(ITERS):
        with rec.iteration(tokens=rank) as it:
            it.lap("fetch")
            it.lap("decode")


def pool_init(run_dir: str) -> None:
    """Pool initializer: one recorder per worker process (file names made unique)."""
    global _rec
    _rec = Recorder(run_dir, stage="pool", rank=0, flush_interval=1.0)


def pool_task(k: int) -> int:
    """Record PER_TASK iterations with ``tokens=k``."""
    for _ in range(PER_TASK):
        with _rec.iteration(tokens=k) as it:
            it.lap("work")
    return k


def main() -> None:
    method, mode, run_dir = sys.argv[1:4]
    ctx = mp.get_context(method)
    codes = []
    if mode == "process":
        procs = [ctx.Process(target=record_and_return, args=(run_dir, r)) for r in range(CHILDREN)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        codes = [p.exitcode for p in procs]
    elif mode == "pool":
        pool = ctx.Pool(WORKERS, initializer=pool_init, initargs=(run_dir,))
        done = pool.map(pool_task, range(TASKS), chunksize=1)
        assert done == list(range(TASKS))
        workers = list(pool._pool)
        pool.close()
        pool.join()
        codes = [p.exitcode for p in workers]
    else:
        with ctx.Pool(WORKERS, initializer=pool_init, initargs=(run_dir,)) as pool:
            done = pool.map(pool_task, range(TASKS), chunksize=1)
            assert done == list(range(TASKS))
            workers = list(pool._pool)
        for p in workers:
            p.join(60)
        codes = [p.exitcode for p in workers]
    print(json.dumps({"exitcodes": codes}), flush=True)


if __name__ == "__main__":
    main()
