"""The trainer's config sections (``grpo``, ``loop``, ``sft`` of ``looprl train``), without torch:
a config is read and checked before anything heavy is imported, so a bad key or value is one
line in well under a second. Every importer takes a section from here, the one place it
lives; the names a choice is checked against are the keys of
the registries beside the code (``losses.LOSSES``, ``losses.KL_ESTIMATORS``), which assert they
match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from looprl.config import Range, Seed, Share, Tokens, check_choice
from looprl.trainer.advantages import ADVANTAGES

LOSS_NAMES = ("dr_grpo", "grpo", "cispo")
"""``grpo.loss``: the keys of ``losses.LOSSES``."""
KL_ESTIMATOR_NAMES = ("k1", "k3")
"""``grpo.experimental.objective.kl_estimator``: the keys of ``losses.KL_ESTIMATORS``."""
PARALLEL = ("ddp", "fsdp")
"""``GRPOConfig.parallel``: how ranks split a step under torchrun (ignored in one process)."""


@dataclass(frozen=True)
class Credit:
    """Credit assignment's research switches (``grpo.experimental.credit``): which groups train
    and how their advantages (``advantages.ADVANTAGES``, picked by ``grpo.std_norm``) are
    reshaped before they reach the tokens. The defaults are plain GRPO."""

    skip_zero_variance: bool = True
    """Skip groups whose rewards are all equal (they carry no advantage signal)."""
    skip_groups_without_pass: bool = False
    """Skip groups where no trajectory passed the tests: their advantages come from the shaping
    terms alone, which for a weak policy teach failing cheaply (quitting) over trying
    (``docs/experiments.md``, table C)."""
    flat_failures: bool = False
    """Every failed trajectory of a group gets the mean reward of the group's failures
    (``flatten_failures``), so the shaping terms rank passing trajectories only: inside a group
    with a pass, quitting (cheap) no longer out-scores a failed attempt. A group with no pass
    then has no signal."""
    negative_advantage_scale: Share = 1.0
    """Negative advantages are multiplied by this (``scale_negatives``): 1 is standard GRPO; 0
    learns from the better-than-average trajectories only (the failures of a group push nothing
    down). Without length normalisation a failure's push-down is summed over all its tokens,
    and failed trajectories are many and long (flailing to the turn limit) while passes are
    short, so the format tokens both share are pushed down on net, which can collapse the call
    format (``docs/experiments.md``, table C). ``balance_negatives`` and
    ``broken_call_advantage`` keep a negative signal without that push."""
    balance_negatives: bool = False
    """Scale a group's negative advantages down so that its failures push down no more token
    mass (advantage x model tokens, summed) than its passes push up (``balance_negatives``):
    the format tokens passes and failures share get no net push from the failures' length."""
    broken_call_advantage: Annotated[float, Range(-100.0, 100.0)] | None = None
    """Token-level credit for broken tool calls: every token of a broken call's own block
    (``Trajectory.broken_spans``) gets this advantage (e.g. -0.5) in passing and failing
    trajectories alike; None = the trajectory's advantage."""


@dataclass(frozen=True)
class LossParams:
    """The loss's knobs (``grpo.experimental.objective``; the loss itself is ``grpo.loss``)."""

    kl_coef: Annotated[float, Range(0.0, 100.0)] = 0.0
    """Weight of the sequence KL folded into the advantage; 0 = no reference model needed."""
    kl_estimator: str = "k1"
    """'k1' (= lp - ref, unbiased) or 'k3' (r - 1 - log r), r = pi_ref / pi_theta."""
    tis_cap: Annotated[float, Range(0.0, math.inf, lo_open=True)] = 2.0
    """Upper bound C of the importance weight pi_prox / pi_engine; inf disables truncation."""
    clip: bool = True
    """PPO ratio clipping against the step's starting policy (acts only when
    ``mini_batches > 1``)."""
    clip_eps_low: Annotated[float, Range(0.0, 1.0)] = 0.2
    clip_eps_high: Annotated[float, Range(0.0, 100.0)] = 0.28
    """Asymmetric clip (DAPO's clip-higher keeps exploration tokens alive)."""
    norm_tokens: Tokens = 1024
    """Dr. GRPO's constant: each sequence's token sum is divided by this; set it to the max
    new tokens of a trajectory."""

    def __post_init__(self) -> None:
        check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATOR_NAMES)


@dataclass(frozen=True)
class FeedbackDistill:
    """Targeted textual feedback (``grpo.experimental.feedback``, issue 54): a research switch,
    off by default. On, each group's first failed trajectories get a hint at their first wrong
    turn (``rewards.hints``), the policy continues from there with it (``harness.hinted``), and
    the step adds ``coef`` x ``trainer.distill``'s term to the GRPO loss."""

    coef: Annotated[float, Range(0.0, 100.0)] = 0.0
    """Weight of the distillation term; 0 = off (no hinted continuation is run)."""
    max_per_group: Annotated[int, Range(0, 4096)] = 1
    """Hinted continuations per group, at most (each costs a rollout from the hinted turn and
    a grading)."""
    follow_ups: bool = False
    """The real-time loop (``looprl feedback loop``, ``looprl feedback cycle --follow-ups``):
    users' dissatisfied follow-ups are the hints, each after the turn it answers
    (``feedback.follow_ups``), continued by the serving policy and distilled in the window's
    training (needs ``coef > 0``). ``looprl train`` has no users: its hints come from the
    environment whatever this says."""

    @property
    def hints_per_group(self) -> int:
        """What the rollouts run: 0 when the term is off."""
        return self.max_per_group if self.coef > 0 else 0


@dataclass(frozen=True)
class GRPOExperimental:
    """The step's research switches and tuning knobs (``experimental`` in ``looprl.config``):
    the optimizer, numerics and memory, the loss's knobs (``objective``) and credit
    assignment's switches (``credit``). The defaults are Dr. GRPO with AdamW."""

    micro_batch_tokens: Tokens = 4096
    """Tokens per forward pass: rows x longest row, a prefix the rows share counted once
    (``trainer.batch``); bounds activation memory. Gradients accumulate across micro-batches."""
    mini_batches: Annotated[int, Range(1, 100_000)] = 1
    """Optimizer updates per batch (each on a consecutive slice of the micro-batches)."""
    max_grad_norm: Annotated[float, Range(0.0, math.inf, lo_open=True)] = 1.0
    """Global gradient-norm clip (inf = no clip); a non-finite norm skips the update."""
    weight_decay: Annotated[float, Range(0.0, 100.0)] = 0.0
    adam_beta1: Annotated[float, Range(0.0, 1.0, hi_open=True)] = 0.9
    adam_beta2: Annotated[float, Range(0.0, 1.0, hi_open=True)] = 0.999
    temperature: Annotated[float, Range(0.0, 100.0, lo_open=True)] = 1.0
    """The engine's sampling temperature: logits are divided by it so logprobs match the engine's."""
    autocast_bf16: bool = False
    """Run forward passes under bf16 autocast (faster at batch >= 16 on CPUs with AMX)."""
    parallel: str = "ddp"
    """Under torchrun: ddp (a replica per rank, gradients all-reduced) or fsdp (FSDP2: weights,
    gradients and optimizer state sharded over the ranks); see ``trainer.ddp``. One process
    ignores it."""
    activation_checkpointing: bool = False
    """Recompute each layer's activations in the backward instead of keeping them (HF's
    gradient checkpointing): less memory for about one more forward per step."""
    mtp_lr: Annotated[float, Range(0.0, 1.0, lo_open=True)] = 1e-3
    """Learning rate of the model's MTP heads (``looprl.models.mtp``) when it has them: their
    distillation is an auxiliary term of every micro-batch's loss (``losses.mtp_distillation``),
    so the engine's drafts keep up with the moving policy. The heads have their own param group
    and gradient clip; the policy's update is the same with or without them."""
    objective: LossParams = field(default_factory=LossParams)
    """The loss's knobs: KL to a reference, importance-weight cap, PPO clip, Dr. GRPO's divisor."""
    credit: Credit = field(default_factory=Credit)
    """Which groups train and how their advantages are reshaped (``batch.Credit``)."""
    router_replay: bool = False
    """MoE models: the forward routes each sampled token's position to the experts the engine
    recorded (``Segment.routes``) while mixing them with the trainer's own gate weights (R3,
    ``looprl.models.moe``); off: the trainer's routers pick their own top-k. The step logs
    ``router_disagree`` and ``engine_kl`` either way."""
    feedback: FeedbackDistill = field(default_factory=FeedbackDistill)
    """Targeted textual feedback: hinted continuations self-distilled into the unhinted policy
    (``trainer.distill``); off by default."""

    def __post_init__(self) -> None:
        check_choice("parallel", self.parallel, PARALLEL)


@dataclass(frozen=True)
class GRPOConfig:
    """The GRPO step: a learning rate and the objective's two named choices (the async loop's
    knobs live with the loop; everything else in ``experimental``)."""

    lr: Annotated[float, Range(0.0, 1.0, lo_open=True)] = 1e-5
    """AdamW learning rate; RL on a pretrained policy uses 1e-6..1e-5."""
    loss: str = "dr_grpo"
    """A name in ``looprl.trainer.losses.LOSSES``: dr_grpo, grpo, cispo."""
    std_norm: str = "never"
    """Group advantage scaling (``looprl.trainer.advantages.ADVANTAGES``): never (Dr. GRPO),
    always, unless_equal."""
    experimental: GRPOExperimental = field(default_factory=GRPOExperimental)

    def __post_init__(self) -> None:
        # Checked at load: a typo here would otherwise surface after pretraining and SFT.
        check_choice("loss", self.loss, LOSS_NAMES)
        check_choice("std_norm", self.std_norm, ADVANTAGES)


SCHEDULES = ("auto", "async", "sync")
"""``LoopExperimental.schedule``'s choices."""


@dataclass(frozen=True)
class LoopExperimental:
    """Policy lag, checkpoints and the task walk: research switches and tuning knobs
    (``experimental`` in ``looprl.config``)."""

    max_staleness: Annotated[int, Range(0, 1_000_000)] = 2
    """Drop a group whose oldest token was sampled more than this many versions ago."""
    queue_size: Annotated[int, Range(1, 1_000_000)] = 8
    """Scored groups waiting for the trainer; producers block beyond it (bounds policy lag).
    When the trainer is the slower side the queue stays full and a group waits
    ``queue_size / groups_per_step`` steps before it is trained on: keep that under
    ``max_staleness`` or finished groups go stale in the queue."""
    schedule: str = "auto"
    """When rollouts run relative to the trainer's step (a name in ``SCHEDULES``). ``async``:
    rollouts keep producing groups while the trainer steps (they overlap). ``sync``: roll out a
    step's groups, then train, then roll out again (no overlap). ``auto``: measure both on this
    run's first steps and keep the faster (``trainer.grpo``'s module docstring): overlap only pays
    where the trainer and the engine do not fight over the same cores, which a config cannot
    know, so it is measured rather than assumed."""
    schedule_probe_steps: Annotated[int, Range(1, 1000)] = 2
    """``auto``: steps timed under each schedule, after one unmeasured step each (the first
    step warms up, the first async one fills the pipeline); async is timed only if the sync
    steps left cores idle."""
    checkpoint_every: Annotated[int, Range(0, 10**9)] = 0
    """Steps between checkpoints (0 = only at the end)."""
    save_trajectories: bool = True
    """Append every trained trajectory (messages, tokens, reward breakdown; its step in
    ``metadata["train_step"]``) to ``run_dir/trajectories/train.jsonl``: what the dashboard's
    trajectory viewer reads."""
    passes: Annotated[int, Range(1, 10_000)] = 1
    """Walks over the task set. A task is trained at most once a pass, each time on fresh
    rollouts of the policy as it is then (each batch is still stepped on once: single epoch).
    More than one only matters when the tasks run out before ``max_minutes``; a task whose group
    had no pass the first time may have one by the next."""
    max_screens: Annotated[int, Range(0, 10_000)] = 3
    """Times a task may be screened out (with ``rollout.experimental.screen``) before it is
    given up; a screened-out task is tried again once the fresh tasks run out
    (``TaskSampler.defer``)."""
    signal_first: bool = False
    """From the second pass on, hand out first the tasks whose last group had both passes and
    failures (GRPO's signal), then those with no pass (or not seen), and last those every
    rollout passed (``TaskSampler.record``): when the time runs out before the pass does, what
    is left untried is what taught least (``docs/experiments.md``, stop 44)."""

    RETIRED: ClassVar[dict[str, str]] = {
        "sync": 'set schedule = "sync" (or leave the default "auto", which measures both)'}
    """Keys older configs may hold (``looprl.config``)."""

    def __post_init__(self) -> None:
        check_choice("schedule", self.schedule, SCHEDULES)



@dataclass(frozen=True)
class LoopConfig:
    """The asynchronous loop's budgets (the step's knobs live in ``GRPOConfig``)."""

    groups_per_step: Annotated[int, Range(1, 1_000_000)] = 4
    """Groups (tasks) per optimizer step."""
    max_steps: Annotated[int, Range(0, 10**9)] = 1_000
    max_minutes: Annotated[float, Range(0.0, 1e7)] = 30.0
    """Wall-clock budget of the loop; it stops after the step that crosses it."""
    loggers: tuple[str, ...] = ("tensorboard",)
    """Trackers beside ``metrics.jsonl`` (always written): ``tensorboard``, ``wandb`` (the
    ``wandb`` extra), or a plugin; see ``looprl.trainer.loggers``."""
    experimental: LoopExperimental = field(default_factory=LoopExperimental)

    RETIRED: ClassVar[dict[str, str]] = {
        "seed": "it was never read; the task order follows the run's seed (top-level `seed`)"}
    """Keys older configs may hold (``looprl.config``)."""


@dataclass(frozen=True)
class SFTExperimental:
    """The schedule, batch shape, optimizer and numerics of SFT: tuning knobs (``experimental``
    in ``looprl.config``)."""

    schedule: str = "constant"
    """``constant``: ``lr`` throughout. ``cosine``: linear warmup over the first 5% of the steps,
    then a cosine decay to 0, as pretraining does: the last steps move the weights little, so
    the model SFT ends on is not wherever a full-size step's noise left it."""
    max_steps: Annotated[int, Range(1, 10**9)] | None = None
    """Stop after this many optimizer steps (cycling over the data as needed)."""
    batch_sequences: Annotated[int, Range(1, 1_000_000)] = 8
    """Segments per optimizer step."""
    micro_batch_tokens: Tokens = 4096
    """Tokens per forward pass: rows x longest row, a prefix the rows share counted once
    (``trainer.batch``); bounds activation memory. Gradients accumulate across micro-batches."""
    max_grad_norm: Annotated[float, Range(0.0, math.inf, lo_open=True)] = 1.0
    """Global gradient-norm clip (inf = no clip)."""
    weight_decay: Annotated[float, Range(0.0, 100.0)] = 0.0
    seed: Seed = 0
    """Shuffling seed (each epoch reshuffles with seed + epoch)."""
    progress: bool = True
    """Show a rich progress bar."""
    pad_id: Annotated[int, Range(0, 2**31 - 1)] = 0
    autocast_bf16: bool = False
    """Forward under bf16 autocast (fp32 master weights): ~1.8x faster on CPUs with AMX."""

    def __post_init__(self) -> None:
        check_choice("schedule", self.schedule, ("constant", "cosine"))


@dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning: a learning rate and the passes over the demos."""

    lr: Annotated[float, Range(0.0, 1.0, lo_open=True)] = 1e-4
    epochs: Annotated[int, Range(1, 100_000)] = 1
    """Passes over the segments (ignored when ``experimental.max_steps`` is set)."""
    experimental: SFTExperimental = field(default_factory=SFTExperimental)
