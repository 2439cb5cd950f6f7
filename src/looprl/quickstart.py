"""The main job: real tasks -> default model -> SFT on oracle trajectories -> async GRPO -> held-out
evaluation before and after -> ``runs/<name>/report.md``.

    looprl quickstart                                  # configs/quickstart.toml
    looprl quickstart -c configs/quickstart.toml -o loop.max_minutes=5 -o name=short

Every stage shows progress and is cached where it can be (packages, tasks, the initial model), so a
second run starts training at once. The report ends with one machine-readable line:
``heldout_pass1_sft=… heldout_pass1_rl=… delta_ci_low=… delta_ci_high=… rl_minutes=…``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from looprl.config import save_config
from looprl.errors import ConfigError, TaskError
from looprl.harness.agent import AgentConfig
from looprl.harness.format import ChatFormat
from looprl.rewards.composite import RewardConfig
from looprl.rollout.runner import RolloutConfig, RolloutRunner
from looprl.rollout.score import make_scorer
from looprl.sandbox import SandboxPool
from looprl.tasks.build import BuildConfig
from looprl.tasks.mutate import LOCAL_KINDS, SINGLE_KINDS
from looprl.trainer.diagnostics import TurnAccuracy, turn_accuracy
from looprl.trainer.grpo import GRPOLoop, LoopConfig, TaskSampler
from looprl.trainer.sft import SFTConfig, sft
from looprl.trainer.step import GRPOConfig, GRPOStep
from looprl.types import Task, Trajectory
from looprl.weights.store import LocalWeightStore

console = Console()


@dataclass
class TasksSection:
    """Which real packages become tasks, and how they split."""

    train_packages: list[str] = field(default_factory=lambda: ["inflection==0.5.1"])
    """NAME==VERSION specs whose tasks are trained on (fetched from PyPI, cached)."""
    heldout_packages: list[str] = field(default_factory=list)
    """Packages never trained on; empty = hold out functions of the train packages instead."""
    max_tasks_per_package: int = 60
    heldout_fraction: float = 0.3
    """With no held-out packages: the share of functions held out for evaluation, or fewer:
    functions stop being held out once their tasks reach ``max_heldout`` (the rest train)."""
    max_heldout: int = 100
    """Evaluation tasks (held-out) at most."""
    budget_s: float = 90.0
    """Screening budget per package (seconds)."""
    kinds: list[str] = field(default_factory=lambda: list(SINGLE_KINDS))
    """Mutation kinds (``looprl.tasks.mutate``); ``LOCAL_KINDS`` are the bugs whose fix can be
    read off the mutated line, the ones a small model can learn."""
    mix: dict[str, float] = field(default_factory=lambda: dict(BuildConfig().mix))
    """Share of each source kind: mutation, multi_site, feature_deletion."""
    selection: bool = False
    """Prompts carry the user's editor selection: the buggy code with its path and lines, as
    Cursor attaches selected code to a chat message (``prompts.with_selection``). It says where
    the bug is, never what the fix is; the same for train, held-out and synthetic tasks."""


@dataclass
class DemosSection:
    """SFT data: the oracle's checked trajectories on the train tasks, plus synthetic ones."""

    synthetic: int = 0
    """Synthetic bug-fix demos from packages installed in this venv (``looprl.tasks.synthetic``;
    the task packages are excluded); 0 = only the train tasks' own."""
    kinds: list[str] = field(default_factory=lambda: list(LOCAL_KINDS))
    """Mutation kinds of the synthetic demos."""
    workers: int = 4
    """Sandboxes making demos at once."""
    validation: int = 32
    """Demos kept out of SFT to measure teacher-forced per-tool turn accuracy before SFT, after
    SFT and after RL (``looprl.trainer.diagnostics``): which turns the model can reproduce."""


@dataclass
class ModelSection:
    path: str = ""
    """A local HF checkpoint to train (e.g. a Qwen coder model); empty = init the default model."""
    engine: str = "torch"
    """Rollout engine: torch (in-process, CPU or GPU) or vllm (GPU; ``pip install -e .[vllm]``)."""
    size: str = "small"
    """A name in ``looprl.models.tiny.SIZES`` (default model only)."""
    pretrain_steps: int = 0
    """Next-token pretraining steps on installed Python source before SFT (0 = skip)."""
    drills: int = 0
    """Copy drills (``looprl.tasks.drills``) per copying step of each SFT demo, added to the
    pretraining text (0 = none; needs ``pretrain_steps``)."""
    threads: int = 2
    """torch's intra-op threads (tasks, pretraining, SFT, evaluation)."""
    rl_threads: int = 1
    """torch's threads during async RL, where decoding and a training step run at once in one
    process (torch's thread count is per process). On 2 cores, 1 each beats 2 each contending:
    8 groups rolled out in 90 s against 104 s at the same training speed (stop 18)."""


@dataclass
class QuickstartConfig:
    """The main job, end to end on the embedded defaults."""

    name: str = "quickstart"
    """Run directory name under ``runs/``."""
    seed: int = 0
    tasks: TasksSection = field(default_factory=TasksSection)
    model: ModelSection = field(default_factory=ModelSection)
    demos: DemosSection = field(default_factory=DemosSection)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval_agent: AgentConfig = field(default_factory=lambda: AgentConfig(
        max_turns=8, max_new_tokens=256, max_total_new_tokens=2048, context_window=8192,
        temperature=1.0))
    """Budgets of evaluation samples (pass@1 at temperature 1, as trained)."""
    eval_k: int = 1
    """Samples per held-out task; pass@1 is their mean (more samples, a tighter interval)."""
    eval_concurrency: int = 16
    """Evaluation samples in flight (decoded as one batch)."""


# ----------------------------------------------------------------------------- stages

def build_tasks(cfg: QuickstartConfig) -> tuple[list[Task], list[Task]]:
    """Real tasks from the registry: (train, held-out)."""
    from looprl.tasks.build import build_package_tasks
    from looprl.tasks.sources import fetch_package

    bcfg = BuildConfig(max_tasks=cfg.tasks.max_tasks_per_package, budget_s=cfg.tasks.budget_s,
                       seed=cfg.seed, kinds=tuple(cfg.tasks.kinds), mix=dict(cfg.tasks.mix))
    by_package: dict[str, list[Task]] = {}
    specs = list(cfg.tasks.train_packages) + list(cfg.tasks.heldout_packages)
    with _progress() as bar:
        job = bar.add_task("tasks from real packages", total=len(specs))
        for spec in specs:
            bar.update(job, description=f"tasks: {spec}")
            try:
                snap = fetch_package(spec)
                by_package[spec] = build_package_tasks(snap, bcfg)
            except TaskError as e:
                console.print(f"[yellow]{spec}: skipped ({e})")
            bar.advance(job)
    train = [t for s in cfg.tasks.train_packages for t in by_package.get(s, [])]
    held = [t for s in cfg.tasks.heldout_packages for t in by_package.get(s, [])]
    if not held:  # hold out whole functions of the train packages
        train, held = split_by_function(train, cfg.tasks.heldout_fraction, cfg.tasks.max_heldout,
                                        cfg.seed)
    held = held[: cfg.tasks.max_heldout]
    if cfg.tasks.selection:
        train, held = [select_code(t) for t in train], [select_code(t) for t in held]
    if not train or not held:
        raise TaskError("no tasks were built; check the package specs in tasks.train_packages "
                        "(NAME==VERSION of packages whose sdists ship pytest suites)")
    return train, held


def split_by_function(tasks: list[Task], fraction: float, max_held: int, seed: int = 0
                      ) -> tuple[list[Task], list[Task]]:
    """(train, held-out): whole functions held out, a ``fraction`` of them at most, and no more
    once ``max_held`` tasks are held out; a held-out task's function is never trained on.

    >>> from looprl.types import Grader
    >>> ts = [Task(f"t{i}", "/r", "p", Grader("pytest"), metadata={"functions": f"f{i % 10}"})
    ...       for i in range(40)]
    >>> train, held = split_by_function(ts, 0.5, 8)
    >>> len(held), len(train), {t.metadata["functions"] for t in train} & {
    ...     t.metadata["functions"] for t in held}
    (8, 32, set())
    >>> len(split_by_function(ts, 0.5, 100)[1])  # half the functions
    20
    """
    def func(t: Task) -> str:
        return str(t.metadata.get("functions") or t.id)

    funcs = sorted({func(t) for t in tasks})
    random.Random(seed).shuffle(funcs)
    per = Counter(func(t) for t in tasks)
    out: set[str] = set()
    n = 0
    for f in funcs[: max(1, int(len(funcs) * fraction))]:
        if n >= max_held:
            break
        out.add(f)
        n += per[f]
    return [t for t in tasks if func(t) not in out], [t for t in tasks if func(t) in out]


def select_code(task: Task, files: dict[str, str] | None = None) -> Task:
    """``task`` with the code its fix replaces appended to the prompt as the user's selection
    (``policies.selections``); unchanged when the fix is not a set of in-place edits."""
    from looprl.harness.policies import selections
    from looprl.tasks.prompts import with_selection

    picked = selections(task, files)
    if not picked:
        return task
    return dataclasses.replace(task, prompt=with_selection(task.prompt, picked),
                               metadata={**task.metadata, "selection": True})


def init_model(cfg: QuickstartConfig, run_dir: Path) -> Path:
    """The model this run trains: a checkpoint given in ``model.path``, or a fresh copy of the
    default model (pretrained later, by ``pretrain_model``, once the demos exist)."""
    from looprl.models.tiny import default_model_dir

    if cfg.model.path:  # a real checkpoint: train it as it is
        return Path(cfg.model.path).expanduser()
    with console.status(f"the default model ({cfg.model.size}) and its tokenizer"):
        cache = default_model_dir(cfg.model.size, cfg.seed)
    dest = run_dir / "model_init"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(cache, dest)
    return dest


def pretrain_model(cfg: QuickstartConfig, model_dir: Path, demos: list[Trajectory], tok) -> None:
    """``model.pretrain_steps`` of next-token pretraining of the default model on installed
    Python source plus the whole transcripts of ``demos`` (tool output included: a loss on every
    token, where SFT has one on the model's turns only), and ``model.drills`` copy drills per
    copying step of ``demos``."""
    if cfg.model.path or not cfg.model.pretrain_steps:
        return
    from looprl.models.pretrain import pretrain
    from looprl.tasks.drills import copy_drills

    drills = copy_drills(demos, tok, per_demo=cfg.model.drills, seed=cfg.seed) \
        if cfg.model.drills and demos else []
    if drills:
        console.print(f"pretraining text: + {len(drills):,} copy drills from {len(demos)} demos")
    transcripts = [list(seg.token_ids_T) for d in demos for seg in d.segments]
    pretrain(model_dir, steps=cfg.model.pretrain_steps, transcripts=transcripts + drills,
             bf16=True)


def sft_demos(train: list[Task], tok, cfg: QuickstartConfig) -> list[Trajectory]:
    """The oracle's checked trajectories on the train tasks, then ``demos.synthetic`` more from
    installed packages, all with the tools RL and evaluation offer (they are in the prompt)."""
    from looprl.tasks.demos import oracle_demos
    from looprl.tasks.synthetic import synthetic_repos, synthetic_tasks

    sources = [(t, None) for t in train]
    if cfg.demos.synthetic:
        task_pkgs = [s.split("==")[0] for s in cfg.tasks.train_packages + cfg.tasks.heldout_packages]
        task_pkgs += sorted({str(t.metadata.get("package", "")) for t in train})
        items = synthetic_tasks(synthetic_repos(exclude=task_pkgs), cfg.demos.synthetic,
                                seed=cfg.seed, kinds=tuple(cfg.demos.kinds))
        sources += [(select_code(i.task, i.files) if cfg.tasks.selection else i.task, i.files)
                    for i in items]
    with _progress() as bar:
        job = bar.add_task("SFT demos (oracle through the harness)", total=len(sources))
        demos = asyncio.run(oracle_demos(sources, tok, tools=cfg.rollout.tools,
                                         workers=cfg.demos.workers,
                                         progress=lambda n: bar.advance(job, n)))
    n_real = sum(1 for d in demos if not d.task_id.startswith("synthetic-"))
    console.print(f"SFT demos: {n_real}/{len(train)} train tasks, "
                  f"{len(demos) - n_real}/{len(sources) - len(train)} synthetic")
    return demos


def split_validation(demos: list[Trajectory], n: int, seed: int
                     ) -> tuple[list[Trajectory], list[Trajectory]]:
    """(train, validation): ``n`` demos drawn at random, never more than a fifth of them."""
    n = min(n, len(demos) // 5)
    order = list(range(len(demos)))
    random.Random(seed).shuffle(order)
    held = set(order[:n])
    return ([d for i, d in enumerate(demos) if i not in held],
            [d for i, d in enumerate(demos) if i in held])


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


def evaluate(model_dir: Path, tasks: list[Task], cfg: QuickstartConfig, label: str) -> dict:
    from looprl.bench.report import summarize
    from looprl.bench.run import BenchSettings, run_bench

    a = cfg.eval_agent
    settings = BenchSettings(max_turns=a.max_turns, max_new_tokens=a.max_new_tokens,
                             max_total_new_tokens=a.max_total_new_tokens,
                             context_window=a.context_window, temperature=a.temperature,
                             concurrency=cfg.eval_concurrency, tools=tuple(cfg.rollout.tools))
    k = cfg.eval_k
    with _progress() as bar:
        job = bar.add_task(f"held-out eval: {label}", total=len(tasks) * k)
        samples = run_bench(tasks, f"model:{model_dir}", k=k, settings=settings,
                            progress=lambda n: bar.advance(job, n))
    return summarize(samples, k, policy=label)


def bootstrap_delta(a: list[float], b: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% CI of mean(b) - mean(a) over paired tasks."""
    rng = random.Random(seed)
    pairs = list(zip(a, b, strict=True))
    deltas = []
    for _ in range(n):
        s = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        deltas.append(sum(y - x for x, y in s) / len(s))
    deltas.sort()
    return deltas[int(0.025 * n)], deltas[int(0.975 * n) - 1]


# ----------------------------------------------------------------------------- the job

def run(cfg: QuickstartConfig, runs_root: Path = Path("runs")) -> Path:
    """Run the whole main job; returns the report path."""
    from looprl.models.loading import load_model

    if cfg.model.drills < 0 or (cfg.model.drills and not cfg.model.pretrain_steps):
        raise ConfigError("model.drills (copy drills per demo step, added to pretraining) must "
                          "be >= 0 and needs model.pretrain_steps > 0; set both or drills=0")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.model.threads)
    run_dir = runs_root / cfg.name
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.json")
    t_start = time.monotonic()

    train, held = build_tasks(cfg)
    console.print(f"[bold]tasks[/]: {len(train)} train, {len(held)} held-out")
    model_dir = init_model(cfg, run_dir)
    tok = load_model(model_dir).tokenizer
    demos, val = split_validation(sft_demos(train, tok, cfg), cfg.demos.validation, cfg.seed)
    pretrain_model(cfg, model_dir, demos, tok)
    model = load_model(model_dir).model
    turns = {"init": turn_accuracy(model, tok, val)} if val else {}
    console.print(f"[bold]SFT[/] on {len(demos)} oracle trajectories ({len(val)} kept for validation)")
    sft_res = sft(model, demos, dataclasses.replace(cfg.sft, pad_id=tok.pad_token_id))
    if val:
        turns["sft"] = turn_accuracy(model, tok, val)
        console.print("turn accuracy after SFT (exact greedy turns): " + ", ".join(
            f"{k} {s.exact_rate:.2f}" for k, s in sorted(turns["sft"].by_tool.items())))
    if sft_res.losses:
        first, last = loss_ends(sft_res.losses)
        console.print(f"SFT: {sft_res.steps} steps, {sft_res.tokens:,} model tokens, loss "
                      f"{first:.3f} -> {last:.3f} (means of the first and last tenth) in "
                      f"{sft_res.wall_s:.0f} s")
        from looprl.models.pretrain import save_loss_png
        save_loss_png(sft_res.losses, run_dir / "sft_loss.png", title="SFT",
                      ylabel="NLL per model token")
    sft_dir = run_dir / "model_sft"
    model.save_pretrained(sft_dir, safe_serialization=True)
    tok.save_pretrained(sft_dir)

    before = evaluate(sft_dir, held, cfg, "sft")
    # written now too: a run stopped during RL keeps its SFT baseline (RL can restart from it)
    (run_dir / "eval_sft.json").write_text(json.dumps(before, indent=1, default=str))

    stats, rl_minutes = train_rl(cfg, model, tok, sft_dir, train, run_dir)
    rl_model = model
    rl_dir = run_dir / "model_rl"
    rl_model.save_pretrained(rl_dir, safe_serialization=True)
    tok.save_pretrained(rl_dir)
    after = evaluate(rl_dir, held, cfg, "rl")
    if val:
        turns["rl"] = turn_accuracy(model, tok, val)

    report = write_report(run_dir, cfg, train, held, demos, sft_res, before, after, stats, rl_minutes,
                          (time.monotonic() - t_start) / 60, turns)
    from looprl.dashboard import DashboardConfig, export_html

    page = export_html(DashboardConfig(runs=(run_dir,)), run_dir / "dashboard.html")
    console.print(f"[bold green]report:[/] {report}  (charts: {page}; live: looprl dashboard --run {run_dir})")
    console.print(report.read_text().splitlines()[-1])
    return report


def train_rl(cfg: QuickstartConfig, model, tok, sft_dir: Path, train: list[Task], run_dir: Path
             ) -> tuple[object, float]:
    """Async GRPO from ``model`` (trained in place) on ``train`` for ``loop.max_minutes``;
    returns the loop's stats and the minutes it took."""
    if cfg.model.rl_threads < 1:
        raise ConfigError(f"model.rl_threads must be >= 1 (got {cfg.model.rl_threads})")
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.model.rl_threads)
    try:
        return _train_rl(cfg, model, tok, sft_dir, train, run_dir)
    finally:
        torch.set_num_threads(threads)


def _train_rl(cfg: QuickstartConfig, model, tok, sft_dir: Path, train: list[Task], run_dir: Path
              ) -> tuple[object, float]:
    from looprl.inference import TorchEngine

    if cfg.model.engine == "torch":
        engine = TorchEngine(copy.deepcopy(model).eval(), tok)
    else:  # the engine loads the SFT checkpoint itself (e.g. vLLM on a GPU)
        from looprl.inference import make_engine

        engine = make_engine(cfg.model.engine, model_path=str(sft_dir))
    store = LocalWeightStore(str(run_dir / "weights"))
    step = GRPOStep(model.train(), cfg.grpo, pad_id=tok.pad_token_id)
    t_rl = time.monotonic()

    async def rl() -> object:
        pool = SandboxPool(max_running=cfg.rollout.max_in_flight)
        try:
            runner = RolloutRunner(engine, ChatFormat(tok), pool, make_scorer(cfg.reward), cfg.rollout)
            loop = GRPOLoop(step, engine, runner, TaskSampler(train, cfg.seed), cfg.loop,
                            store=store, run_dir=run_dir, config_to_save=cfg)
            with _progress() as bar:
                job = bar.add_task("async GRPO", total=None)

                def tick(stats) -> None:
                    last = stats.history[-1]
                    bar.update(job, completed=stats.steps, description=(
                        f"GRPO step {stats.steps} reward {last.get('reward/total_mean', 0):+.3f} "
                        f"pass {last.get('rollout/pass_rate', 0):.2f}"))
                stats = await loop.run(progress=tick)
            loop.checkpoint()
            return stats
        finally:
            await pool.close()
            close = getattr(engine, "close", None)
            if callable(close):
                close()

    stats = asyncio.run(rl())
    return stats, (time.monotonic() - t_rl) / 60


def _turns_md(turns: dict[str, TurnAccuracy]) -> list[str]:
    """Per-tool exact-turn rates on the validation demos, one column per checkpoint."""
    if not turns:
        return []
    labels = list(turns)
    tools = sorted({k for acc in turns.values() for k in acc.by_tool})
    n = {k: max(acc.by_tool[k].turns for acc in turns.values() if k in acc.by_tool) for k in tools}
    lines = ["## Turn accuracy on validation demos", "",
             "Share of the demos' assistant turns that greedy decoding reproduces exactly, given "
             "the demo's own context (teacher-forced; `looprl.trainer.diagnostics`).", "",
             "| turn | n | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for k in tools:
        lines.append(f"| {k} | {n[k]} | " + " | ".join(
            f"{turns[lab].exact_rate(k):.3f}" for lab in labels) + " |")
    lines.append("| all | " + str(turns[labels[0]].total.turns) + " | " + " | ".join(
        f"{turns[lab].total.exact_rate:.3f}" for lab in labels) + " |")
    return [*lines, ""]


def _per_task_pass(rep: dict, tasks: list[Task]) -> list[float]:
    per = rep.get("per_task", {})
    return [float(per.get(t.id, {}).get("pass@1", 0.0)) for t in tasks]


def loss_ends(losses: list[float]) -> tuple[float, float]:
    """Mean loss of the first and of the last tenth of the steps (nan, nan: none)."""
    if not losses:
        return float("nan"), float("nan")
    n = max(1, len(losses) // 10)
    return sum(losses[:n]) / n, sum(losses[-n:]) / n


def write_report(run_dir: Path, cfg: QuickstartConfig, train, held, demos, sft_res, before, after,
                 stats, rl_minutes: float, total_minutes: float,
                 turns: dict[str, TurnAccuracy] | None = None) -> Path:
    a, b = _per_task_pass(before, held), _per_task_pass(after, held)
    lo, hi = bootstrap_delta(a, b) if held else (0.0, 0.0)
    p_sft, p_rl = sum(a) / max(len(a), 1), sum(b) / max(len(b), 1)
    table = Table("metric", "SFT", "RL", title="held-out evaluation")
    rows = [("pass@1", "pass@1"), ("mean output tokens", "mean_output_tokens"),
            ("mean tool calls", "mean_tool_calls"), ("mean turns", "mean_turns"),
            ("broken tool calls / call", "broken_tool_call_rate")]
    md = ["| metric | SFT | RL |", "|---|---|---|"]
    for label, key in rows:
        x, y = before["metrics"].get(key, float("nan")), after["metrics"].get(key, float("nan"))
        md.append(f"| {label} | {x:.3f} | {y:.3f} |")
        table.add_row(label, f"{x:.3f}", f"{y:.3f}")
    console.print(table)
    hist = stats.history
    lines = [
        f"# looprl quickstart — {cfg.name}", "",
        f"Total {total_minutes:.1f} min; RL {rl_minutes:.1f} min, {stats.steps} steps, "
        f"{stats.groups_trained} groups trained, {stats.groups_stale} stale, "
        f"{stats.zero_variance_groups} zero-variance, trainer idle {stats.idle_fraction:.0%}.", "",
        f"Tasks: {len(train)} train, {len(held)} held-out (real packages: "
        f"{', '.join(cfg.tasks.train_packages + cfg.tasks.heldout_packages)}).",
        f"Task kinds: {', '.join(f'{k} {v:.0%}' for k, v in cfg.tasks.mix.items())}; mutations: "
        f"{', '.join(cfg.tasks.kinds)}.",
        *([f"Prompts carry the user's editor selection (the buggy code with its path and lines, "
           f"never the fix) in {sum(bool(t.metadata.get('selection')) for t in held)} of "
           f"{len(held)} held-out tasks."] if cfg.tasks.selection else []),
        f"SFT: {len(demos)} oracle trajectories, {sft_res.steps} steps, loss "
        "{:.3f} → {:.3f} (means of the first and last tenth of the steps; one step's loss "
        "swings with the demos it draws).".format(*loss_ends(sft_res.losses)), "",
        "![SFT loss](sft_loss.png)", "",
        "## Held-out evaluation", "", *md, "",
        *_turns_md(turns or {}),
        "## Training", "", "![reward curve](reward_curve.png)", "",
        f"First step reward {hist[0].get('reward/total_mean', 0):+.3f} → last "
        f"{hist[-1].get('reward/total_mean', 0):+.3f}." if hist else "No RL step ran.", "",
        f"heldout_pass1_sft={p_sft:.4f} heldout_pass1_rl={p_rl:.4f} delta_ci_low={lo:.4f} "
        f"delta_ci_high={hi:.4f} rl_minutes={rl_minutes:.2f}",
    ]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (run_dir / "eval_sft.json").write_text(json.dumps(before, indent=1, default=str))
    (run_dir / "eval_rl.json").write_text(json.dumps(after, indent=1, default=str))
    if turns:
        (run_dir / "turn_accuracy.json").write_text(json.dumps(
            {lab: acc.to_json() for lab, acc in turns.items()}, indent=1))
    return path
