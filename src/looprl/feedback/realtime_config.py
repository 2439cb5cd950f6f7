"""The real-time RL loop's config (``looprl feedback loop -c configs/realtime.toml``), and the
task sets it names, loaded and checked.

    cfg = load_config(RealtimeConfig, "configs/realtime.toml", ["model=runs/quickstart/model_sft"])
    users_tasks(cfg)   # what the simulated users send
    gate_tasks(cfg)    # what the bench gate runs: never a task the users send

Sections: ``users`` (who sends sessions), ``serve`` (the server they talk to), ``gate`` (the bench
gate), ``ab`` (the A/B test), ``grpo`` (the objective, ``trainer.config.GRPOConfig``). What each
knob does in a cycle: ``feedback.loop``. Every numeric field declares its range
(``looprl.config.Range``), checked at load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from looprl.config import FieldError, Length, Range, Seed, Share, Tokens, check_choice
from looprl.errors import ConfigError
from looprl.feedback.signals import SIGNALS
from looprl.feedback.simulate import SimConfig
from looprl.trainer.batch import Credit
from looprl.trainer.config import GRPOConfig, GRPOExperimental
from looprl.trainer.losses import LossParams
from looprl.types import Task


@dataclass(frozen=True)
class UsersSection(SimConfig):
    """Who sends sessions: simulated users over HTTP (how they behave: ``SimConfig``'s fields),
    or real ones."""

    sessions: Annotated[int, Range(0, 10**9)] = 1_000_000
    """Sessions the simulated users plan: the loop stops them when it ends."""
    simulate: bool = True
    """Start ``looprl feedback simulate`` against the server (else wait for real users)."""
    tasks: str = ""
    """Task JSONL whose prompts the simulated users send and whose hidden tests they grade by."""
    limit: Annotated[int, Range(0, 10**9)] = 0
    """Only the first N of those tasks (0 = all): fewer requests recur more often."""


@dataclass(frozen=True)
class ServeSection:
    """The ``looprl serve`` the loop starts (what users talk to)."""

    port: Annotated[int, Range(0, 65_535)] = 0
    """0: a free port."""
    max_concurrent: Annotated[int, Range(1, 4096)] = 4
    max_turns: Annotated[int, Range(1, 100_000)] = 5
    max_new_tokens: Tokens = 256
    context_window: Tokens = 8192
    watch_s: Annotated[float, Range(0.0, 86_400.0, lo_open=True)] = 1.0
    """How often the server re-reads the policies dir (promotions, candidates)."""
    allowed_roots: list[str] = field(default_factory=list)
    """Directories users' repos may lie under (the users' task repos are added)."""


@dataclass(frozen=True)
class GateSection:
    tasks: str = ""
    """Held-out task JSONL the bench gate runs (never sent by users); empty: no gate."""
    skip: Annotated[int, Range(0, 10**9)] = 0
    """Leave out the first N tasks: the users' own file can serve as the gate's when they send
    only its first ``users.limit`` (``skip`` >= that)."""
    limit: Annotated[int, Range(0, 10**9)] = 0
    """Then only the first N tasks (0 = all)."""
    k: Annotated[int, Range(1, 10_000)] = 1
    temperature: Annotated[float, Range(0.0, 100.0)] = 1.0
    """0: greedy, so the paired difference shows what the update changed, not sampling noise."""
    max_drop: Share = 0.10
    """Reject when the pass@1 difference's 95% interval reaches below -max_drop."""
    max_turns: Annotated[int, Range(1, 100_000)] = 8
    max_new_tokens: Tokens = 256
    max_total_new_tokens: Tokens = 2048
    context_window: Tokens = 8192
    concurrency: Annotated[int, Range(1, 100_000)] = 16


@dataclass(frozen=True)
class ABSection:
    sessions: Annotated[int, Range(1, 10**9)] = 60
    """Scored sessions per arm before the A/B decides."""
    split_b: Annotated[float, Range(0.0, 1.0, lo_open=True, hi_open=True)] = 0.5
    """The share of users served by the candidate (arm B, ``ab.assign_arm``)."""
    margin: Share = 0.1
    """Promote when the ``resolved`` difference's 95% interval lies above -margin and the
    reward's above -2 * margin (and both points are >= 0): the A/B must not show the candidate
    resolving fewer requests by more than this share (``ab_decision``)."""
    max_revert_rise: Share = 0.05
    """Reject when the candidate's reverts rose by more than this at the interval's lower bound
    (``ab.ab_decision``)."""
    timeout_min: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 20.0
    """An A/B that has not reached ``sessions`` per arm by then decides on what it has."""
    final_sessions: Annotated[int, Range(0, 10**9)] = 0
    """After the cycles: an A/B of the start policy against the last promoted one, with this many
    scored sessions per arm (0: none)."""


@dataclass(frozen=True)
class RealtimeConfig:
    """The real-time RL loop (``feedback.loop``)."""

    name: Annotated[str, Length(1, 200)] = "realtime"
    """Run directory name under the runs root."""
    model: str = ""
    """The policy served first: an HF model directory (e.g. a quickstart's ``model_sft``)."""
    cycles: Annotated[int, Range(1, 1_000_000)] = 4
    max_minutes: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 60.0
    """The whole run's budget: a cycle starts only when it and the final A/B fit in what is
    left, each estimated from the run so far (``Loop.fits``)."""
    window: Annotated[int, Range(1, 10**7)] = 64
    """Scored untrained sessions of the current policy a cycle trains on."""
    steps: Annotated[int, Range(1, 1_000_000)] = 4
    """GRPO steps per cycle over the window (each session in one step)."""
    optimizer: str = ""
    """The Adam state the first window continues from: a training run's checkpoint directory
    (its newest checkpoint's, e.g. ``runs/quickstart/ckpt`` for the quickstart's ``model_rl``)
    or an ``optimizer.pt``; empty: a fresh optimizer. Each candidate keeps the state its window
    left (``optimizer.pt`` beside its weights) and the next window continues from the serving
    policy's, so the cycles train as one continuing run."""
    optimizer_momentum: bool = True
    """Whether the first window takes ``optimizer``'s first moments (momentum) too. Set false
    when ``model`` is not the policy that run ended with (e.g. the quickstart's ``model_start``
    with its RL run's state): the second moments still scale each weight's steps, but that run's
    momentum would move the start policy along the run's last direction, which the users' traffic
    never asked for."""
    signal: str = "edit_outcome"
    seed: Seed = 0
    threads: Annotated[int, Range(1, 4096)] = 1
    """Torch threads of the loop's own training and gate (the server decodes beside it)."""
    inject_bad_cycle: Annotated[int, Range(0, 1_000_000)] = 0
    """The cycle (1-based) whose candidate gets noise on its weights (0: none)."""
    inject_noise: Annotated[float, Range(0.0, 1000.0)] = 1.0
    """Noise std as a multiple of each weight tensor's own std."""
    window_timeout_min: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 30.0
    """Stop the run when a window has not filled by then (the users stopped, or fail)."""
    grpo: GRPOConfig = field(default_factory=lambda: GRPOConfig(lr=1e-4, experimental=(
        GRPOExperimental(micro_batch_tokens=8192, objective=LossParams(norm_tokens=1024),
                         credit=Credit(skip_groups_without_pass=False)))))
    users: UsersSection = field(default_factory=UsersSection)
    serve: ServeSection = field(default_factory=ServeSection)
    gate: GateSection = field(default_factory=GateSection)
    ab: ABSection = field(default_factory=ABSection)

    def __post_init__(self) -> None:
        check_choice("signal", self.signal, SIGNALS)
        if not self.model:
            raise FieldError("model", "name the policy to serve first: an HF model directory "
                                      "(e.g. runs/quickstart/model_sft)")
        if self.users.simulate and not self.users.tasks:
            raise FieldError("users.tasks", "simulated users need tasks to ask for: a task JSONL "
                                            "(e.g. runs/quickstart/tasks/heldout.jsonl)")
        fb = self.grpo.experimental.feedback
        if fb.follow_ups and not fb.coef > 0:
            raise FieldError("grpo.experimental.feedback.coef", "follow-ups as hints are "
                             "distilled with this weight: set it > 0 (e.g. 0.5), or follow_ups "
                             "false")
        if self.grpo.experimental.credit.skip_groups_without_pass:
            raise FieldError("grpo.experimental.credit.skip_groups_without_pass",
                             "users' rewards carry no test result: set it false")



def users_tasks(cfg: RealtimeConfig) -> list[Task]:
    """The tasks the simulated users send: ``users.tasks``, its first ``users.limit`` when set."""
    from looprl.tasks.taskset import load_tasks

    src = Path(cfg.users.tasks).expanduser()
    tasks = load_tasks(src)
    if not tasks:
        raise ConfigError(f"users.tasks {src} holds no tasks; build some with `looprl tasks build`")
    return tasks[:cfg.users.limit] if cfg.users.limit else tasks


def gate_tasks(cfg: RealtimeConfig) -> list[Task]:
    """The held-out tasks the gate runs (``gate.tasks`` past ``gate.skip``, its first
    ``gate.limit``); refused when the users send one of them."""
    if not cfg.gate.tasks:
        return []
    from looprl.tasks.taskset import load_tasks

    tasks = load_tasks(Path(cfg.gate.tasks).expanduser())[cfg.gate.skip:]
    if cfg.gate.limit:
        tasks = tasks[:cfg.gate.limit]
    if not tasks:
        raise ConfigError(f"gate.tasks {cfg.gate.tasks} holds no tasks after skipping "
                          f"{cfg.gate.skip}")
    if cfg.users.tasks:
        both = sorted({t.id for t in users_tasks(cfg)} & {t.id for t in tasks})
        if both:
            raise ConfigError(f"gate.tasks and the tasks users send share {len(both)} (e.g. "
                              f"{both[0]}): the gate must run tasks users never send (raise "
                              "gate.skip, or name another file)")
    return tasks
