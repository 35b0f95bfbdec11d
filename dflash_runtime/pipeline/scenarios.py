"""Pipeline configuration and the scenarios that inject a known bottleneck.

Torch-free, so that callers (``tlog demo``) can validate a scenario name and a
step count before paying for ``import torch``.

Each scenario is the balanced configuration with a few fields changed; the
change is the bottleneck a diagnosis must find:

======================  =========================================================
``balanced``            the default: no injected bottleneck, stages roughly matched
``slow-loader``         every batch load stalls (I/O wait) -> starvation upstream
``heavy-target``        a 4x deeper target model -> target stage, compute
``heavy-drafter``       4x the anchor blocks per sequence -> drafter stage, compute
``straggler``           the last drafter rank runs its compute 3x slower -> that
                        rank is a straggler
======================  =========================================================

The factors are deliberately large (3x-4x): the pipeline runs on a few shared
CPU cores where timings are noisy, and a verdict must hold on a busy machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

#: Default drafter optimizer steps per drafter rank for ``tlog demo``
#: (about a minute on two CPU cores, start-up included).
DEFAULT_STEPS = 300
#: Default world size: one target rank and two drafter ranks.
DEFAULT_WORLD_SIZE = 3
#: Largest step count accepted (a guard against typos such as ``--steps 3000000``).
MAX_STEPS = 1_000_000


@dataclass(frozen=True)
class PipelineConfig:
    """Everything that defines one run of the reference pipeline.

    Sizes are tokens, layers and units; times are seconds. ``steps`` counts
    optimizer steps of each drafter rank; the target ranks together produce
    one batch of hidden states per drafter step per drafter rank.
    """

    scenario: str = "balanced"
    steps: int = DEFAULT_STEPS
    world_size: int = DEFAULT_WORLD_SIZE
    target_ranks: int = 1
    seed: int = 0
    device: str = "auto"  # "auto" (CUDA if available), "cpu" or "cuda"

    # Data: packed sequences of documents ending with EOS.
    vocab_size: int = 512
    seq_len: int = 128
    batch_size: int = 2
    mean_doc_len: int = 48
    bigram_p: float = 0.8  # probability that a token follows its bigram successor
    loader_stall_s: float = 0.0  # I/O wait added to every batch load

    # Models.
    hidden: int = 128
    heads: int = 4
    intermediate: int = 384
    target_layers: int = 6
    draft_layers: int = 2  # also the number of tapped target layers (DFlash)
    block_size: int = 8
    num_anchors: int = 16  # blocks per sequence
    loss_gamma: float | None = 4.0  # DFlash: 4 for blocks of 8
    window: int | None = None  # sliding window over the target context (tokens)

    # Optimisation.
    lr: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0

    # Pipeline.
    queue_capacity: int = 4
    warmup_iters: int = 3  # first iterations of each worker, marked by a "warmup" event
    checkpoint_every: int = 150  # drafter rank 0 saves every N steps (0: never)
    straggler_rank: int | None = None  # global rank whose compute is slowed
    straggler_factor: float = 1.0  # its compute phases take this many times longer

    @property
    def drafter_ranks(self) -> int:
        """Number of drafter ranks (global ranks ``target_ranks .. world_size - 1``)."""
        return self.world_size - self.target_ranks

    def stage_of(self, rank: int) -> str:
        """``"target"`` or ``"drafter"`` for a global rank."""
        return "target" if rank < self.target_ranks else "drafter"

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict of the fields (the ``config`` of ``run.json``)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Scenario:
    """A named bottleneck: a description and the config fields it changes."""

    name: str
    description: str
    expect: str  # what a diagnosis should say, in words
    overrides: dict[str, object] = field(default_factory=dict)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("balanced", "no injected bottleneck; target and drafter stages roughly matched",
                 "small waits on both stages; the verdict names what limits this machine, "
                 "often the drafter's compute or, when ranks share few CPU cores, its "
                 "all-reduce waiting for a descheduled peer"),
        Scenario("slow-loader", "every batch load stalls for 200 ms of I/O wait",
                 "category starvation (upstream of every logged stage, phase batch_get)",
                 {"loader_stall_s": 0.2}),
        Scenario("heavy-target", "the target model is 4x deeper (24 layers)",
                 "stage target, category compute",
                 {"target_layers": 24}),
        Scenario("heavy-drafter", "4x the anchor blocks per sequence (64)",
                 "stage drafter, category compute",
                 {"num_anchors": 64}),
        Scenario("straggler", "the last drafter rank's compute runs 3x slower",
                 "the last drafter rank among the stragglers",
                 {"straggler_factor": 3.0}),
    )
}


def make_config(scenario: str = "balanced", *, steps: int = DEFAULT_STEPS,
                world_size: int = DEFAULT_WORLD_SIZE, seed: int = 0,
                **overrides: object) -> PipelineConfig:
    """Build and check the config of a scenario.

    Args:
        scenario: a key of :data:`SCENARIOS`.
        steps: drafter optimizer steps per drafter rank (1 .. :data:`MAX_STEPS`).
        world_size: total ranks (target + drafter).
        seed: weights, data and anchors derive from it.
        overrides: any other :class:`PipelineConfig` field (tests use these).

    Raises:
        ValueError: unknown scenario or field, or a value out of range; the
            message names the value and what is allowed.
    """
    if scenario not in SCENARIOS:
        msg = f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}"
        raise ValueError(msg)
    fields = {f.name for f in dataclasses.fields(PipelineConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        msg = f"unknown pipeline setting(s): {', '.join(unknown)}"
        raise ValueError(msg)
    values: dict[str, object] = dict(SCENARIOS[scenario].overrides)
    values.update(overrides)
    values.update(scenario=scenario, steps=steps, world_size=world_size, seed=seed)
    if scenario == "straggler" and values.get("straggler_rank") is None:
        values["straggler_rank"] = world_size - 1
    cfg = PipelineConfig(**values)  # type: ignore[arg-type]
    check_config(cfg)
    return cfg


def check_config(cfg: PipelineConfig) -> None:
    """Raise ``ValueError`` naming the first out-of-range field of ``cfg``."""
    def bad(what: str) -> None:
        raise ValueError(what)

    steps = cfg.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        bad(f"steps must be a whole number from 1 to {MAX_STEPS}, got {cfg.steps!r}")
    if cfg.target_ranks < 1:
        bad(f"target_ranks must be at least 1, got {cfg.target_ranks}")
    if cfg.world_size < cfg.target_ranks + 1:
        bad(f"world_size must be at least {cfg.target_ranks + 1} "
            f"({cfg.target_ranks} target rank(s) + 1 drafter rank), got {cfg.world_size}")
    if cfg.scenario == "straggler" and cfg.drafter_ranks < 2:
        bad(f"the straggler scenario needs at least 2 drafter ranks "
            f"(world_size >= {cfg.target_ranks + 2}), got world_size {cfg.world_size}")
    rank = cfg.straggler_rank
    if rank is not None and not cfg.target_ranks <= rank < cfg.world_size:
        bad(f"straggler_rank must be a drafter rank ({cfg.target_ranks}..{cfg.world_size - 1}), "
            f"got {cfg.straggler_rank}")
    if cfg.straggler_factor < 1.0:
        bad(f"straggler_factor must be at least 1, got {cfg.straggler_factor}")
    if cfg.device not in ("auto", "cpu", "cuda"):
        bad(f"device must be 'auto', 'cpu' or 'cuda', got {cfg.device!r}")
    for name in ("vocab_size", "seq_len", "batch_size", "mean_doc_len", "hidden", "heads",
                 "intermediate", "target_layers", "draft_layers", "block_size", "num_anchors",
                 "queue_capacity"):
        if getattr(cfg, name) < 1:
            bad(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.vocab_size < 8:
        bad(f"vocab_size must be at least 8 (EOS, MASK and data tokens), got {cfg.vocab_size}")
    if cfg.hidden % cfg.heads or (cfg.hidden // cfg.heads) % 2:
        bad(f"hidden ({cfg.hidden}) / heads ({cfg.heads}) must be an even whole number (RoPE)")
    if cfg.draft_layers > 1 and cfg.target_layers < 4:
        bad(f"{cfg.draft_layers} tapped layers need a target of at least 4 layers, "
            f"got {cfg.target_layers}")
    if cfg.window is not None and cfg.window < 1:
        bad(f"window must be a positive number of tokens, got {cfg.window}")
    if cfg.loader_stall_s < 0 or cfg.warmup_iters < 0 or cfg.checkpoint_every < 0:
        bad("loader_stall_s, warmup_iters and checkpoint_every must not be negative")
    if not 0.0 <= cfg.bigram_p <= 1.0:
        bad(f"bigram_p must be a probability, got {cfg.bigram_p}")
