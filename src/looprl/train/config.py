"""The typed config of ``looprl train`` (and of ``looprl quickstart``, a preset of it).

    cfg = load_config(TrainConfig, "configs/train_cpu.toml", ["loop.max_minutes=5"])

One section per stage: ``tasks`` (where tasks come from and how they split), ``model`` (which
model, on which device), ``demos`` + ``sft`` (the optional supervised warm start), ``grpo`` +
``loop`` + ``rollout`` + ``reward`` (async GRPO), ``eval`` (held-out evaluation and the gate),
``fleet`` (where rollouts run: in-process, or on a Ray cluster), ``faults`` (injected failures,
for drills).

The fields a user sets sit at the top of each section (``tests/test_configs.py`` keeps them at
most 41); each section's ``experimental`` sub-section holds the component's research switches
and tuning knobs, with the measured defaults: ``-o
grpo.experimental.credit.negative_advantage_scale=0``. Every numeric field declares its range
(``looprl.config.Range``), checked at load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated

from looprl.bench.gate import GateSettings
from looprl.config import FieldError, Length, Range, Seed, Share, check_choice
from looprl.errors import ConfigError
from looprl.faults import FaultsConfig
from looprl.fleet.config import FleetConfig
from looprl.harness.run_state import AgentConfig
from looprl.harness.selection import WIDTHS
from looprl.inference.config import MODES as SPEC_MODES
from looprl.models.config import MAX_HEADS, SIZES, LoraSettings
from looprl.plugins import find
from looprl.pypi import spec_name
from looprl.rewards.composite import RewardConfig
from looprl.rollout.config import RolloutConfig
from looprl.tasks.build import BuildConfig
from looprl.tasks.mutate import LOCAL_KINDS, SINGLE_KINDS
from looprl.trainer.config import GRPOConfig, LoopConfig, SFTConfig


@dataclass(frozen=True)
class TasksExperimental:
    """How the tasks are built and split: research switches and tuning knobs (``experimental``
    in ``looprl.config``); the defaults build the library's usual mix."""

    train_only_packages: list[str] = field(default_factory=list)
    """NAME==VERSION specs trained on whole: none of their functions is held out, so more of
    them adds train tasks and leaves the held-out functions of ``train_packages`` as they were."""
    seed: Seed = 0
    """Seeds the task build, the held-out split and the held-out packages' sample: apart from
    the run's seed, so runs with different seeds train and evaluate on the same tasks."""
    max_tasks_per_package: Annotated[int, Range(1, 100_000)] = 60
    heldout_fraction: Annotated[float, Range(0.0, 1.0, lo_open=True, hi_open=True)] = 0.3
    """The share of functions held out for evaluation at most; functions stop being held out
    once their tasks reach ``max_heldout`` (the rest train)."""
    max_heldout: Annotated[int, Range(1, 1_000_000)] = 100
    """Held-out tasks of the train packages (or of ``train_file``) at most."""
    budget_s: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 90.0
    """Screening budget per package (seconds): with ``max_tries`` only a safety cap."""
    max_tries: Annotated[int, Range(0, 10**8)] = 0
    """Candidate bugs screened per package at most (``BuildConfig.max_tries``): the same config
    then builds the same tasks on any machine; 0 = ``budget_s`` alone decides."""
    kinds: Annotated[list[str], Length(1, 256)] = field(default_factory=lambda: list(SINGLE_KINDS))
    """Mutation kinds (``looprl.tasks.mutate``); ``LOCAL_KINDS`` are the bugs whose fix can be
    read off the mutated line, the ones a small model can learn."""
    mix: Annotated[dict[str, Share], Length(1, 16)] = field(
        default_factory=lambda: dict(BuildConfig().mix))
    """Share of each source kind: mutation, multi_site, feature_deletion."""
    selection: bool = False
    """Prompts carry the user's editor selection: the buggy code with its path and lines, as
    Cursor attaches selected code to a chat message (``prompts.with_selection``). It says where
    the bug is, never what the fix is; the same for train, held-out and synthetic tasks."""
    selection_width: str = "line"
    """How much code the selection holds (``harness.selection``): ``line`` the code the fix
    replaces, ``block`` its enclosing block, ``function`` its enclosing function; SFT demos, RL
    and evaluation all see the same. No selection at all is ``selection = false``."""


@dataclass(frozen=True)
class TasksSection:
    """Where tasks come from: a task file (``looprl tasks build`` writes one, or write your own
    in the ``Task`` schema) or real packages fetched from PyPI; and how they split."""

    train_file: str = ""
    """A task JSONL to train on. Empty = build tasks from ``train_packages``."""
    train_packages: list[str] = field(default_factory=list)
    """NAME==VERSION specs whose tasks are trained on (fetched from PyPI, cached)."""
    heldout_file: str = ""
    """A task JSONL to evaluate on. Empty = the held-out split of the train tasks: those whose
    ``metadata.split`` is ``test`` if any are, else whole functions
    (``experimental.heldout_fraction``)."""
    heldout_packages: list[str] = field(default_factory=list)
    """Packages never trained on, evaluated beside the held-out functions of the train packages
    (a seeded sample of ``experimental.max_heldout`` of their tasks at most)."""
    sources: list[str] = field(default_factory=list)
    """Task source plugins (``looprl.plugins``, kind ``task_sources``: an entry point or
    ``module:attr`` of a function ``(seed) -> list[Task]``) whose tasks join the train file's or
    packages' (and are held out by function like them)."""
    experimental: TasksExperimental = field(default_factory=TasksExperimental)

    def __post_init__(self) -> None:
        if not (self.train_file or self.train_packages or self.sources):
            raise ConfigError("no tasks: set tasks.train_file (a task JSONL, e.g. from `looprl "
                              "tasks build`), tasks.train_packages (NAME==VERSION specs) or "
                              "tasks.sources (task source plugins)")
        for name in self.sources:
            try:
                find("task_sources", name, {})
            except ConfigError as e:
                raise FieldError("sources", f"has {e}") from None
        if self.train_file and self.train_packages:
            raise ConfigError("set tasks.train_file or tasks.train_packages, not both")
        both = {spec_name(s) for s in self.experimental.train_only_packages} & {
            spec_name(s) for s in self.train_packages + self.heldout_packages}
        if both:
            raise FieldError("experimental.train_only_packages", f"{sorted(both)[0]} is also in "
                             "train_packages or heldout_packages; list each package once")
        check_choice("experimental.selection_width", self.experimental.selection_width, WIDTHS)
        self.build_config(seed=0)  # kinds and mix are checked where they are used

    def build_config(self, seed: int) -> BuildConfig:
        """How ``looprl.tasks.build`` screens and validates each package's tasks."""
        x = self.experimental
        return BuildConfig(max_tasks=x.max_tasks_per_package, budget_s=x.budget_s,
                           max_tries=x.max_tries, seed=seed, kinds=tuple(x.kinds), mix=dict(x.mix))


@dataclass(frozen=True)
class ModelExperimental:
    """The default model's pretraining, speculative decoding and threads: research switches and
    tuning knobs (``experimental`` in ``looprl.config``)."""

    pretrain_steps: Annotated[int, Range(0, 10**8)] = 0
    """Next-token pretraining steps on the pinned source corpus (``models.corpus``) before SFT
    (default model only; 0 = skip)."""
    mtp_heads: Annotated[int, Range(0, MAX_HEADS)] = 0
    """Multi-token-prediction heads added to the default model and distilled from its own head
    during pretraining (``looprl.models.mtp``; needs ``pretrain_steps``), then kept current by
    the RL steps; the torch engine drafts with them (``speculative``). 0 = none."""
    speculative: str = "auto"
    """Speculative decoding in the torch engine when the model has MTP heads or ``lookup`` is
    set: auto (per batch size, only where it measures faster), on, off
    (``looprl.inference.spec``)."""
    lookup: Annotated[int, Range(0, 1024)] = 0
    """Tokens a decoding step may draft per rollout by prompt lookup (copied from what followed
    the last earlier occurrence of the rollout's final tokens in its own context; exact, no
    training) in the torch engine's RL rollouts. 0 = none."""
    drills: Annotated[int, Range(0, 10_000)] = 0
    """Copy drills (``looprl.tasks.drills``) per copying step of each SFT demo, added to the
    pretraining text (0 = none; needs ``pretrain_steps``)."""
    threads: Annotated[int, Range(1, 4096)] = 2
    """torch's intra-op threads (tasks, pretraining, SFT, evaluation)."""
    rl_threads: Annotated[int, Range(1, 4096)] = 1
    """torch's threads during async RL, where decoding and a training step run at once in one
    process (torch's thread count is per process). On 2 cores, 1 each beats 2 each contending."""
    tool_format: str = ""
    """The tool-call format of ``model.path``'s chat template (``looprl.chat.tool_formats``:
    hermes, qwen3_coder, llama3, mistral, mistral_v11, harmony); empty = probed from the
    template. A name the template contradicts is refused (docs/formats.md)."""

    def __post_init__(self) -> None:
        check_choice("speculative", self.speculative, SPEC_MODES)
        if self.tool_format:
            from looprl.chat.tool_formats import FORMATS

            check_choice("tool_format", self.tool_format, tuple(FORMATS))
        if self.mtp_heads and not self.pretrain_steps:
            raise FieldError("mtp_heads", "(MTP heads distilled during pretraining) needs "
                             "model.experimental.pretrain_steps > 0; set both or mtp_heads=0")
        if self.drills and not self.pretrain_steps:
            raise FieldError("drills", "(copy drills per demo step, added to pretraining) needs "
                             "model.experimental.pretrain_steps > 0; set both or drills=0")


START_KINDS = ("auto", "quickstart", "scratch")
"""``model.start``'s named values (else it names a directory)."""


@dataclass(frozen=True)
class ModelSection:
    path: str = ""
    """An HF checkpoint to train (safetensors, a tokenizer with a chat template): a local
    directory or a hub id ``org/name[@revision]`` (``looprl.models.hub``); empty = the default
    model, started as ``start`` says."""
    start: str = "scratch"
    """Where the default model starts (``looprl.train.start``): scratch (a fresh default model,
    pretrained and SFT'd by this run), quickstart (the quickstart run's model under the runs
    root: ``model_rl``, or ``model_start`` before its RL ran), auto (quickstart when it has a
    model, else scratch, saying so), or a directory (another run's, or a checkpoint in it). A
    checkpoint must be a default model of ``size``; it skips pretraining and the synthetic
    demos (the quickstart's SFT had thousands from the same corpus: more only costs minutes),
    while the oracle's demos on this run's own tasks still SFT it briefly: the one supervised
    look at the user's code, in the harness, before RL. Recorded in ``start.json`` and the
    report."""
    engine: str = "torch"
    """Rollout engine: torch (in-process, CPU or GPU), vllm (a worker in ``make vllm``'s venv),
    openai (a server at ``engine_options.base_url`` that takes weight updates: ``looprl model
    serve``) or an engine plugin (``looprl.plugins``) built with ``model_path=`` the starting
    checkpoint."""
    engine_options: dict[str, bool | int | float | str] = field(default_factory=dict)
    """Keyword options of a non-torch engine, e.g. vLLM's ``gpu_memory_utilization = 0.4`` when
    the trainer shares its GPU (``[model.engine_options]`` in a config)."""
    device: str = "auto"
    """Where the trainer and the torch engine run: auto (cuda when present), cpu, cuda, cuda:N."""
    size: str = "small"
    """A name in ``looprl.models.tiny.SIZES`` (default model only)."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA RL (``looprl.models.lora``): ``model.lora.rank=8`` trains an adapter, not the
    weights; engines get the merged weights, ``model_rl/`` holds them and ``lora_adapter/``."""
    experimental: ModelExperimental = field(default_factory=ModelExperimental)

    def __post_init__(self) -> None:
        if self.engine != "torch":
            from looprl.inference import ENGINES

            try:
                find("engines", self.engine, ENGINES)
            except ConfigError as e:
                raise FieldError("engine", f"has {e}") from None
        if self.engine == "openai" and "base_url" not in self.engine_options:
            raise FieldError("engine_options", "has no base_url: model.engine=openai rolls out on "
                             "a server that takes each step's weights, e.g. `looprl model serve "
                             "DIR --port 8000` and -o model.engine_options.base_url="
                             "http://127.0.0.1:8000/v1")
        check_choice("size", self.size, SIZES)
        if not self.start.strip():
            raise FieldError("start", f"is empty: give one of {', '.join(START_KINDS)} or a "
                             "directory (a run's, or its model_rl)")
        if self.path and self.start not in ("auto", "scratch"):
            raise FieldError("start", f"is {self.start!r}: it starts the default model, but model.path "
                             "trains its own checkpoint: set one of them (model.start=scratch "
                             "beside model.path)")
        if self.experimental.tool_format not in ("", "hermes") and not self.path:
            raise FieldError("experimental.tool_format", f"{self.experimental.tool_format!r} "
                             "needs model.path (a checkpoint whose chat template writes it); "
                             "the default model writes hermes")
        if self.lora.enabled and self.experimental.mtp_heads:
            raise FieldError("lora.rank", "does not adapt MTP heads; set "
                             "model.experimental.mtp_heads=0 or model.lora.rank=0")
        if self.experimental.lookup and self.engine != "torch":
            raise FieldError("experimental.lookup", f"drafts in the torch engine only, not "
                             f"{self.engine!r}; set model.experimental.lookup = 0 (or "
                             "model.engine = \"torch\")")
        if not (self.device in ("auto", "cpu", "cuda") or
                re.fullmatch(r"cuda:\d+", self.device)):
            raise FieldError("device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")


@dataclass(frozen=True)
class DemosExperimental:
    """Which synthetic demos, and how they are varied: research switches (``experimental`` in
    ``looprl.config``)."""

    kinds: Annotated[list[str], Length(1, 256)] = field(default_factory=lambda: list(LOCAL_KINDS))
    """Mutation kinds of the synthetic demos."""
    slips: Share = 0.0
    """Share of the demos that first try their edit broken (the call cut off before its
    closing tag) and, told so by the tool, make it right; the broken try is context only in
    SFT, and these demos are left out of pretraining. Demos that never fail never show what to
    do after a failed call, and a policy then finishes or flails (docs/experiments.md, stop 38)."""
    verifies: Share = 0.0
    """Share of the demos that run the task's failing tests (``run_tests``) after their edit and
    before ``finish``: a policy that checks its fix runs commands, so the exec boundary is
    crossed in RL (the fault drill's start, docs/faults.md)."""
    renamed: Share = 0.0
    """Share of the SFT demos (validation ones aside) whose edit's names are renamed at random
    throughout the demo (``tasks.drills.renamed_demos``): the same fix of code no prior can
    predict, so SFT trains copying the edit from the context, not guessing it."""
    workers: Annotated[int, Range(1, 4096)] = 4
    """Sandboxes making demos at once."""
    validation: Annotated[int, Range(0, 1_000_000)] = 32
    """Demos kept out of SFT to measure teacher-forced per-tool turn accuracy before SFT, after
    SFT and after RL (``looprl.bench.turns``): which turns the model can reproduce."""


@dataclass(frozen=True)
class DemosSection:
    """SFT data: the oracle's checked trajectories on the train tasks, plus synthetic ones.
    No demos = no SFT (RL starts from the model as it is)."""

    oracle: bool = False
    """Replay each train task's gold patch through the harness (``looprl.tasks.demos``) and
    keep the checked trajectories as demos."""
    synthetic: Annotated[int, Range(0, 10**8)] = 0
    """Synthetic bug-fix demos from packages installed in this venv (``looprl.tasks.synthetic``;
    the task packages are excluded); 0 = none."""
    experimental: DemosExperimental = field(default_factory=DemosExperimental)


@dataclass(frozen=True)
class EvalExperimental:
    """Evaluation throughput and the gate's thresholds (``experimental`` in ``looprl.config``)."""

    concurrency: Annotated[int, Range(1, 100_000)] = 16
    """Evaluation samples in flight (decoded as one batch)."""
    gate: GateSettings = field(default_factory=GateSettings)
    """The bench gate (``looprl.bench.gate``): the RL checkpoint against the starting one."""


@dataclass(frozen=True)
class EvalSection:
    """Held-out evaluation before and after RL, and the gate the RL checkpoint must pass."""

    k: Annotated[int, Range(1, 10_000)] = 1
    """Samples per held-out task; pass@1 is their mean (more samples, a tighter interval)."""
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(
        max_turns=8, max_new_tokens=256, max_total_new_tokens=2048, context_window=8192))
    """Budgets of evaluation samples (pass@1 at temperature 1, as trained)."""
    experimental: EvalExperimental = field(default_factory=EvalExperimental)


@dataclass(frozen=True)
class TrainConfig:
    """RL of a coding agent, end to end: tasks -> model -> (SFT) -> async GRPO -> eval -> report.
    A newcomer sets the fields at the top of each section (module docstring)."""

    name: Annotated[str, Length(1, 200)] = "train"
    """Run directory name under the runs root (``--runs``, default ``runs/``): one path
    component."""
    seed: Seed = 0
    tasks: TasksSection = field(default_factory=lambda: TasksSection(
        train_packages=["inflection==0.5.1"]))
    model: ModelSection = field(default_factory=ModelSection)
    demos: DemosSection = field(default_factory=DemosSection)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalSection = field(default_factory=EvalSection)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    """Where rollouts and sandboxes run: this process, or the nodes of a Ray cluster."""
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    """Fault injection for drills (``looprl.faults``; off: no rate set, unless ``LOOPRL_FAULTS``)."""

    def __post_init__(self) -> None:
        if self.name in (".", "..") or "/" in self.name or "\\" in self.name:
            raise FieldError("name", f"names a directory under the runs root: one path "
                             f"component, not {self.name!r}")
        if self.model.experimental.lookup and self.fleet.backend == "ray":
            raise FieldError("model.experimental.lookup", "drafts in this process's torch "
                             "engine; a Ray fleet's replicas decode without it: set "
                             "model.experimental.lookup = 0")
        sampled, scored = self.rollout.agent.experimental.temperature, self.grpo.experimental.temperature
        if sampled != scored:  # else every IS ratio and engine KL compares two distributions
            raise FieldError("grpo.experimental.temperature", f"is {scored:g} but rollouts sample "
                             f"at rollout.agent.experimental.temperature = {sampled:g}: the trainer "
                             "divides the logits by it to score the engine's tokens; set both to "
                             "the same value")
        fmt = self.model.experimental.tool_format
        if fmt not in ("", "hermes") and (self.demos.oracle or self.demos.synthetic):
            raise FieldError("model.experimental.tool_format", f"{fmt!r}: the SFT demos "
                             "(demos.oracle, demos.synthetic) are written as hermes calls; set "
                             "demos.oracle = false and demos.synthetic = 0 (RL from the model "
                             "as it is)")
        if self.demos.experimental.verifies and "run_tests" not in self.rollout.tools:
            raise FieldError("demos.experimental.verifies", "needs run_tests among "
                             "rollout.tools (its demos run the tests): add it, or set "
                             "demos.experimental.verifies = 0")
