"""``python -m dflash_runtime.pipeline --scenario NAME --steps N --out DIR``.

Runs the reference pipeline and prints the run directory (one line, for
scripts). Exit codes: 0 done, 2 bad arguments, 1 the run failed.
"""

from __future__ import annotations

import argparse
import sys
import time

from dflash_runtime.pipeline.scenarios import DEFAULT_STEPS, DEFAULT_WORLD_SIZE, SCENARIOS


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the pipeline, print the run directory."""
    parser = argparse.ArgumentParser(
        prog="python -m dflash_runtime.pipeline",
        description="Run the reference DFlash training pipeline and write its timing logs.")
    parser.add_argument("--scenario", default="balanced", choices=list(SCENARIOS),
                        help="bottleneck to inject (default: balanced)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"drafter steps per drafter rank (default: {DEFAULT_STEPS})")
    parser.add_argument("--world-size", type=int, default=DEFAULT_WORLD_SIZE,
                        help=f"ranks: 1 target + the rest drafters (default: {DEFAULT_WORLD_SIZE})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--out", default="tlog-reports/demo-runs",
                        help="parent directory of the run (default: tlog-reports/demo-runs)")
    parser.add_argument("--run-id", default=None, help="run id and directory name")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="where to run (default: auto, CUDA if available)")
    args = parser.parse_args(argv)
    try:
        from dflash_runtime.pipeline.train import run_pipeline
    except ImportError as exc:
        print(f"error: the pipeline needs torch ({exc}); pip install 'tlog[torch]'",
              file=sys.stderr)
        return 1
    start = time.perf_counter()
    try:
        run_dir = run_pipeline(args.out, scenario=args.scenario, steps=args.steps,
                               world_size=args.world_size, seed=args.seed, run_id=args.run_id,
                               device=args.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(run_dir)
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
