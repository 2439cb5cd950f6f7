"""The stages of ``looprl train`` after the tasks: model, demos, SFT, evaluation, async GRPO.

Each stage is a function of the config and what the stages before it made; ``looprl.train.run``
calls them in order and saves what each made in the run directory, so ``--resume`` skips it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import os
import random
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from looprl import faults
from looprl.errors import ConfigError
from looprl.faults import InfraLedger
from looprl.progress import Bar
from looprl.protocols import Engine
from looprl.rewards.composite import reward_metrics
from looprl.rundir import RunDir
from looprl.train.config import TrainConfig
from looprl.trainer.ddp import ONE_PROCESS, DistInfo
from looprl.types import Task, Trajectory

console = Console()


def progress_bar() -> Bar:
    return Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


def resolve_device(name: str) -> torch.device:
    """``model.device``: auto picks the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device={name} but torch sees no CUDA device (torch "
                          f"{torch.__version__}); use model.device=cpu or auto")
    return dev


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` runs bf16 matmuls natively: a CUDA GPU with bf16, or a CPU with AMX or
    AVX-512 BF16. Elsewhere (an AVX2-only CPU) torch emulates them, far slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def fit_precision(cfg: TrainConfig, device: torch.device) -> TrainConfig:
    """``cfg`` with bf16 autocast (``sft.experimental.autocast_bf16``,
    ``grpo.experimental.autocast_bf16``) switched off where ``device`` has no native bf16: there
    it slows training down instead of speeding it up (docs/experiments.md, row D9), so a preset
    that asks for it runs well on every machine."""
    sft, grpo = cfg.sft.experimental, cfg.grpo.experimental
    if native_bf16(device) or not (sft.autocast_bf16 or grpo.autocast_bf16):
        return cfg
    console.print(f"bf16 autocast off: {device} has no native bf16 (AMX or AVX-512 BF16), where "
                  "fp32 is much faster")
    return dataclasses.replace(
        cfg, sft=dataclasses.replace(cfg.sft, experimental=dataclasses.replace(
            sft, autocast_bf16=False)),
        grpo=dataclasses.replace(cfg.grpo, experimental=dataclasses.replace(
            grpo, autocast_bf16=False)))


def save_model(model: Any, tok: Any, dest: Path) -> Path:
    """``save_pretrained`` into ``dest`` atomically: a run killed while saving leaves no
    half-written checkpoint that ``--resume`` would take for a finished one. A LoRA model is
    saved merged, its adapter in ``dest/lora_adapter`` (``models.lora.save_merged``)."""
    from looprl.models.lora import is_lora, save_merged

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if is_lora(model):
        save_merged(model, tok, tmp)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def has_chat_template(path: Path) -> bool:
    """Whether the HF checkpoint at ``path`` ships a chat template (in ``tokenizer_config.json``
    or beside it, as transformers saves it), read without loading the tokenizer."""
    import json

    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((path / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def check_model_path(cfg: TrainConfig) -> None:
    """``model.path`` names a HF checkpoint the harness can talk to (config.json, a chat
    template): a one-line error now, before the tasks are built, not a traceback later."""
    if not cfg.model.path:
        return
    from looprl.models.hub import resolve_model_path

    path = resolve_model_path(cfg.model.path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"model.path={cfg.model.path} is not a HF checkpoint (no "
                          f"config.json in {path}); give a directory written by "
                          "save_pretrained or a hub id, or leave it empty for the default model")
    if not has_chat_template(path):
        raise ConfigError(f"model.path={cfg.model.path}: its tokenizer has no chat template (none "
                          f"in {path}/tokenizer_config.json, no chat_template.jinja), and the "
                          "harness renders every conversation with it; use the chat/instruct "
                          "variant of the model, or set tokenizer.chat_template and "
                          "save_pretrained it there")


def init_model(cfg: TrainConfig, run_dir: Path, checkpoint: Path | None) -> Path:
    """The model this run trains: ``checkpoint`` as it is (``model.path``, or ``model.start``'s,
    resolved by ``looprl.train.start``), else a fresh copy of the default model (pretrained
    later, by ``pretrain_model``, once the demos exist)."""
    from looprl.models.tiny import default_model_dir

    if checkpoint is not None:
        return checkpoint
    with console.status(f"the default model ({cfg.model.size}) and its tokenizer"):
        cache = default_model_dir(cfg.model.size, cfg.seed)
    dest = RunDir(run_dir).model_init
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(cache, dest)
    return dest


def task_packages(cfg: TrainConfig, tasks: Iterable[Task]) -> list[str]:
    """The packages the config's tasks and ``tasks`` come from: never pretraining text or synthetic
    demos, since a held-out function's source must never be trained on."""
    ts = cfg.tasks
    names = {s.split("==")[0] for s in ts.train_packages + ts.experimental.train_only_packages
             + ts.heldout_packages}
    return sorted(names | {str(t.metadata.get("package", "")) for t in tasks} - {""})


def pretrain_model(cfg: TrainConfig, model_dir: Path, demos: list[Trajectory], tok: Any,
                   tasks: Iterable[Task] = ()) -> None:
    """``model.experimental.pretrain_steps`` of next-token pretraining of the default model on
    the source corpus (``models.corpus``, minus the packages of the config and of ``tasks``) plus
    the whole transcripts of ``demos`` (tool output included: a loss on every token, where SFT
    has one on the model's turns only), and ``drills`` copy drills per copying step of ``demos``.
    Only a fresh default model is pretrained (``init_model`` without a checkpoint)."""
    x = cfg.model.experimental
    if not x.pretrain_steps:
        return
    from looprl.models.pretrain import pretrain
    from looprl.tasks.drills import copy_drills

    demos = [d for d in demos if "slip" not in d.metadata]  # a slip is never text to learn
    drills = copy_drills(demos, tok, per_demo=x.drills, seed=cfg.seed) \
        if x.drills and demos else []
    if drills:
        console.print(f"pretraining text: + {len(drills):,} copy drills from {len(demos)} demos")
    transcripts = [list(seg.token_ids_T) for d in demos for seg in d.segments]
    pretrain(model_dir, steps=x.pretrain_steps, transcripts=transcripts + drills,
             bf16=native_bf16(torch.device("cpu")), mtp_heads=x.mtp_heads,  # on the CPU
             exclude=task_packages(cfg, tasks))


def check_demo_format(tok: Any) -> None:
    """Refuse SFT demos for a model whose chat template writes tool calls in another format
    than the demos' (the oracle writes hermes calls)."""
    from looprl.chat import ChatFormat

    found = ChatFormat(tok).tool_format
    if found != "hermes":
        raise ConfigError(f"this model's chat template writes {found!r} tool calls; the SFT "
                          "demos (demos.oracle, demos.synthetic) are hermes calls: set "
                          "demos.oracle = false and demos.synthetic = 0 (RL from the model as "
                          "it is)")


def make_demos(train: list[Task], tok: Any, cfg: TrainConfig) -> list[Trajectory]:
    """The oracle's checked trajectories on the train tasks (``demos.oracle``), then
    ``demos.synthetic`` more from the source corpus, all with the tools RL and evaluation offer
    (they are in the prompt)."""
    from looprl.tasks.demos import oracle_demos
    from looprl.tasks.synthetic import synthetic_repos, synthetic_tasks
    from looprl.train.tasks import select_code

    x = cfg.demos.experimental
    sources: list[tuple[Task, Any]] = [(t, None) for t in train] if cfg.demos.oracle else []
    n_task_sources = len(sources)
    if cfg.demos.synthetic:
        items = synthetic_tasks(synthetic_repos(exclude=task_packages(cfg, train)),
                                cfg.demos.synthetic,
                                seed=cfg.seed, kinds=tuple(x.kinds))
        selection = cfg.tasks.experimental.selection
        width = cfg.tasks.experimental.selection_width  # the width RL and evaluation see
        sources += [(select_code(i.task, i.files, width) if selection else i.task, i.files)
                    for i in items]
    if not sources:
        return []
    check_demo_format(tok)
    with progress_bar() as bar:
        job = bar.add_task("SFT demos (oracle through the harness)", total=len(sources))
        demos = asyncio.run(oracle_demos(sources, tok, tools=cfg.rollout.tools,
                                         workers=x.workers, slips=x.slips,
                                         verifies=x.verifies,
                                         seed=cfg.seed,
                                         progress=lambda n: bar.advance(job, n)))
    n_real = sum(1 for d in demos if not d.task_id.startswith("synthetic-"))
    n_slips = sum(1 for d in demos if "slip" in d.metadata)
    n_verified = sum(1 for d in demos if "verify" in d.metadata)
    console.print(f"SFT demos: {n_real}/{n_task_sources} train tasks, "
                  f"{len(demos) - n_real}/{len(sources) - n_task_sources} synthetic"
                  + (f", {n_slips} recovering from a slip" if n_slips else "")
                  + (f", {n_verified} running the tests" if n_verified else ""))
    return demos


def rename_demos(demos: list[Trajectory], tok: Any, cfg: TrainConfig) -> list[Trajectory]:
    """``demos`` with a ``demos.experimental.renamed`` share of them renamed
    (``tasks.drills.renamed_demos``)."""
    if not cfg.demos.experimental.renamed or not demos:
        return demos
    from looprl.tasks.drills import renamed_demos

    out = renamed_demos(demos, tok, share=cfg.demos.experimental.renamed, seed=cfg.seed)
    console.print(f"SFT demos: {sum(1 for d in out if 'renamed' in d.metadata)} of {len(out)} "
                  "renamed")
    return out


def split_validation(demos: list[Trajectory], n: int, seed: int
                     ) -> tuple[list[Trajectory], list[Trajectory]]:
    """(train, validation): ``n`` demos drawn at random, never more than a fifth of them."""
    n = min(n, len(demos) // 5)
    order = list(range(len(demos)))
    random.Random(seed).shuffle(order)
    held = set(order[:n])
    return ([d for i, d in enumerate(demos) if i not in held],
            [d for i, d in enumerate(demos) if i in held])


def notes_file(run_dir: Path) -> Path:
    """The notes RL kept across trajectories (``rollout.experimental.notes_chars``)."""
    return run_dir / "notes.json"


def evaluate(model_dir: Path, tasks: list[Task], cfg: TrainConfig, label: str,
             trajectories: Path | None = None, notes: Path | None = None) -> dict:
    """``eval.k`` samples per task of the checkpoint at ``model_dir``, graded by hidden tests
    (every trajectory appended to ``trajectories``, a JSONL file, when given); ``notes``: the
    training run's notes, read-only, none written on ``tasks``' functions (``harness.notes``)."""
    from looprl.bench.report import summarize
    from looprl.bench.run import BenchSettings, run_bench

    a = cfg.eval.agent
    settings = BenchSettings(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens,
                             max_total_new_tokens=a.max_total_new_tokens,
                             context_window=a.context_window,
                             temperature=a.experimental.temperature,
                             concurrency=cfg.eval.experimental.concurrency,
                             tools=tuple(cfg.rollout.tools), notes=notes)
    k = cfg.eval.k
    with progress_bar() as bar:
        job = bar.add_task(f"held-out eval: {label}", total=len(tasks) * k)
        samples = run_bench(tasks, f"model:{model_dir}", k=k, settings=settings,
                            progress=lambda n: bar.advance(job, n), trajectories=trajectories)
    return summarize(samples, k, policy=label)


@contextlib.contextmanager
def only_gpu(device: torch.device) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` names ``device``'s GPU alone inside the block, so an engine that
    starts processes of its own (vLLM) starts them on this rank's GPU, not on GPU 0 (this
    process's CUDA context is made already and keeps its devices)."""
    if device.type != "cuda":
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = before.split(",") if before else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[device.index or 0]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


@dataclass(frozen=True)
class RLSummary:
    """What the RL stage did (saved as ``rl.json``; the report reads it)."""

    steps: int
    groups_trained: int
    groups_stale: int
    zero_variance_groups: int
    idle_fraction: float
    """Share of the trainer's time spent waiting for groups."""
    minutes: float
    history: list[dict[str, Any]]
    """The loop's per-step metrics rows (``metrics.jsonl``)."""
    groups_screened_out: int = 0
    screen_rollouts: int = 0
    no_pass_groups: int = 0
    """Trained groups where no rollout passed the tests (all of them: RL had no test signal)."""

    @classmethod
    def of(cls, stats: Any, minutes: float) -> RLSummary:
        from looprl.trainer.loggers import groups_without_pass

        return cls(stats.steps, stats.groups_trained, stats.groups_stale,
                   stats.zero_variance_groups, stats.idle_fraction, minutes, stats.history,
                   stats.groups_screened_out, stats.screen_rollouts,
                   groups_without_pass(stats.history)[1])

    @property
    def learned_from_no_pass(self) -> bool:
        """RL trained groups, and none had a passing rollout: the tests never rewarded it."""
        return self.groups_trained > 0 and self.no_pass_groups >= self.groups_trained

    def no_pass_warning(self) -> str:
        """One line saying so (empty when some group had a pass)."""
        if not self.learned_from_no_pass:
            return ""
        return (f"RL had no test signal: none of the {self.groups_trained} groups it trained on "
                "had a rollout that passed the tests, so only the shaping terms (length, broken "
                "calls, ...) moved the policy; start from a stronger model (more SFT demos, "
                "demos.synthetic), use easier tasks, or a larger rollout.group_size")


def train_rl(cfg: TrainConfig, model: Any, tok: Any, start_dir: Path, train: list[Task],
             run_dir: Path, *, resume: bool = False, dist: DistInfo = ONE_PROCESS
             ) -> tuple[RLSummary, Any]:
    """Async GRPO from ``model`` on ``train`` for ``loop.max_minutes``; returns what it did and,
    on rank 0, the trained model (``model`` itself unless FSDP sharded it; None on the other
    ranks). With ``resume``, the loop continues from the newest checkpoint in ``run_dir/ckpt``.
    Under torchrun (``dist``) every rank rolls out its share of ``train`` with its own engine
    (``trainer.grpo``); rank 0 publishes to the weight store."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.model.experimental.rl_threads)
    try:
        return _train_rl(cfg, model, tok, start_dir, train, run_dir, resume, dist)
    finally:
        torch.set_num_threads(threads)


def _train_rl(cfg: TrainConfig, model: Any, tok: Any, start_dir: Path, train: list[Task],
              run_dir: Path, resume: bool, dist: DistInfo) -> tuple[RLSummary, Any]:
    from looprl.inference import TorchEngine, make_engine
    from looprl.models.lora import with_lora
    from looprl.trainer.grpo import GRPOLoop
    from looprl.trainer.sampler import TaskSampler
    from looprl.trainer.step import GRPOStep
    from looprl.weights.retry import RetryingStore
    from looprl.weights.store import FsspecWeightStore

    if cfg.fleet.backend == "ray":
        engine: Engine | None = None  # each node's replica loads start_dir itself
    elif cfg.model.engine == "torch":
        engine = TorchEngine(copy.deepcopy(model).eval(), tok,
                             speculative=cfg.model.experimental.speculative,
                             lookup=cfg.model.experimental.lookup)
    else:  # the engine loads the starting checkpoint itself (e.g. vLLM on a GPU)
        with only_gpu(next(model.parameters()).device):
            # a server (openai) has its model loaded already; the others load the start
            where = {} if cfg.model.engine == "openai" else {"model_path": str(start_dir)}
            engine = make_engine(cfg.model.engine, **where, **cfg.model.engine_options)
    # absolute: a Ray node's workers resolve a relative path against their own directory
    weights_url = cfg.fleet.experimental.weights_url or str(RunDir(run_dir).weights.absolute())
    # rank 0 counts the run's infrastructure failures and alone is failed on purpose (drills)
    ledger = InfraLedger(RunDir(run_dir).infra_ledger if dist.is_main else None, resumed=resume)
    store = RetryingStore(FsspecWeightStore(
        weights_url, storage_options=cfg.fleet.experimental.weights_options),
        ledger=ledger) if dist.is_main else None
    # KL is measured against the model RL starts from (the SFT checkpoint), frozen
    ref = copy.deepcopy(model).eval() if cfg.grpo.experimental.objective.kl_coef else None
    # LoRA: the adapter goes on the trained model only; the engine's and the reference's copies
    # above are the base model, and the engine is sent merged weights under its names
    model = with_lora(model, cfg.model.lora)
    # under torchrun the step wraps the model (DDP, or FSDP in place): the copies come first
    step = GRPOStep(model.train(), cfg.grpo, ref_model=ref, pad_id=tok.pad_token_id, dist=dist)
    tasks = train[dist.rank::dist.world_size]  # this rank's share
    t_rl = time.monotonic()

    async def rl() -> Any:
        runner, sink, close = await _rollouts(cfg, engine, tok, start_dir, run_dir, weights_url,
                                              dist, tasks, ledger)
        notes = notes_file(run_dir)
        if runner.notebook is not None and resume and notes.is_file():  # an earlier life's
            runner.notebook.notes = type(runner.notebook).load(notes).notes
        try:
            walk = cfg.loop.experimental
            sampler = TaskSampler(tasks, cfg.seed, passes=walk.passes,
                                  signal_first=walk.signal_first,
                                  max_screens=walk.max_screens
                                  if cfg.rollout.experimental.screen else 0)
            # a server (openai) holds whatever it was started with or last given, not this start
            # (a Ray fleet's replicas load the start themselves)
            loop = GRPOLoop(step, sink, runner, sampler, cfg.loop, store=store, run_dir=run_dir,
                            config_to_save=cfg, batch_metrics=reward_metrics, infra=ledger,
                            push_start=engine is not None and cfg.model.engine == "openai")
            if resume and loop.resume() is not None:
                console.print(f"resumed RL at step {loop.stats.steps} (weights v{loop.version})")
            kept_s = loop.kept_s  # the earlier lives' RL time, counted in RL's minutes
            with progress_bar() as bar:
                job = bar.add_task("GRPO", total=None)

                def tick(stats: Any) -> None:
                    last = stats.history[-1]
                    if "loop/schedule_decision" in last:  # auto's choice, once
                        bar.console.print(last["loop/schedule_decision"])
                    bar.update(job, completed=stats.steps, description=(
                        f"GRPO step {stats.steps} reward {last.get('reward/total_mean', 0):+.3f} "
                        f"pass {last.get('rollout/pass_rate', 0):.2f}"))
                stats = await loop.run(progress=tick)
            loop.checkpoint(keep=1)  # the run is over: resume needs the newest only
            ledger.close()
            return stats, kept_s
        finally:
            if runner.notebook is not None:  # what evaluation reads (``evaluate``'s ``notes``)
                runner.notebook.save(notes)
            await close()

    before = faults.install(_injector(cfg, run_dir) if dist.is_main else None)
    try:
        stats, kept_s = asyncio.run(rl())
    finally:
        faults.install(before)
    minutes = (kept_s + time.monotonic() - t_rl) / 60
    return RLSummary.of(stats, minutes), step.sharding.gathered()


def _injector(cfg: TrainConfig, run_dir: Path) -> faults.FaultInjector | None:
    """The RL stage's fault injector: the ``faults`` section, else ``LOOPRL_FAULTS``; None when
    neither sets a rate. Its books go to ``faults.jsonl`` in the run directory."""
    fc = cfg.faults if cfg.faults.active else faults.FaultsConfig.from_env()
    if not fc.active:
        return None
    console.print(f"[bold red]fault injection on[/]: {fc.rates} (seed {fc.seed}); books in "
                  f"{RunDir(run_dir).fault_books}")
    return faults.FaultInjector(fc, books=RunDir(run_dir).fault_books)


async def _rollouts(cfg: TrainConfig, engine: Any, tok: Any, start_dir: Path, run_dir: Path,
                    weights_url: str, dist: DistInfo, tasks: list[Task], ledger: InfraLedger
                    ) -> tuple[Any, Any, Callable[[], Awaitable[None]]]:
    """The rollouts' runner, what takes each new policy version, and how to close them: ``engine``
    and a sandbox pool in this process (``fleet.experimental.sandboxes = "http"``: behind an environment
    server in a thread), or a Ray fleet (``fleet.backend = "ray"``: an engine replica and an
    environment server on every node, ``looprl.fleet``). Every attempt is counted in ``ledger``."""
    from looprl.rollout.runner import RolloutRunner
    from looprl.rollout.score import make_scorer

    if cfg.fleet.backend == "ray":
        if dist.world_size > 1:
            raise ConfigError("fleet.backend=ray rolls out for one trainer process; run the "
                              "trainer without torchrun, or use fleet.backend=inprocess")
        if cfg.grpo.experimental.feedback.hints_per_group:
            raise ConfigError("grpo.experimental.feedback needs fleet.backend=inprocess (the Ray "
                              "fleet runs no hinted continuations); or set "
                              "-o grpo.experimental.feedback.coef=0")
        from looprl.fleet.ray_fleet import MemberSpec, RayFleet
        from looprl.sandbox.remote_pool import task_roots

        injector = faults.active()
        fleet = await RayFleet.start(cfg.fleet, MemberSpec(
            str(Path(start_dir).absolute()), tok, weights_url, cfg.rollout, cfg.reward, cfg.model.engine,
            engine_options=dict(cfg.model.engine_options),
            weights_options=dict(cfg.fleet.experimental.weights_options),
            faults=injector.cfg if injector is not None else None,
            http_roots=task_roots(tasks) if cfg.fleet.experimental.sandboxes == "http" else None),
            snapshot=RunDir(run_dir).fleet, ledger=ledger)
        return RolloutRunner.over(fleet, cfg.rollout, ledger=ledger), fleet, fleet.close
    from looprl.chat import ChatFormat
    from looprl.sandbox import SandboxPool

    served = contextlib.ExitStack()
    if cfg.fleet.experimental.sandboxes == "http":
        from looprl.sandbox.remote_pool import serving

        pool: Any = served.enter_context(serving(tasks, max_running=cfg.rollout.max_in_flight))
    else:
        pool = SandboxPool(max_running=cfg.rollout.max_in_flight)

    async def close() -> None:
        await pool.close()
        await asyncio.to_thread(served.close)  # the env server drains: not on this loop
        if callable(getattr(engine, "close", None)):
            engine.close()

    fmt = ChatFormat(tok, tool_format=cfg.model.experimental.tool_format or None)
    return (RolloutRunner(engine, fmt, pool, make_scorer(cfg.reward), cfg.rollout, ledger=ledger,
                          hints_per_group=cfg.grpo.experimental.feedback.hints_per_group),
            engine, close)
