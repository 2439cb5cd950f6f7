"""``looprl train``: the composition root that wires tasks, model, SFT, the rollout engine and
runner, the GRPO loop, the weight store, evaluation and the report together.

    looprl train -c configs/train_cpu.toml [-o key=value ...] [--resume]
    run(load_config(TrainConfig, path, overrides), Path("runs"), resume=False)

Stages, each with a progress bar, each leaving its result in ``runs/<name>/``:

1. **tasks** — ``tasks/{train,heldout,heldout_packages}.jsonl`` (``looprl.train.tasks``);
2. **model** — ``model.path``, another run's model (``model.start``, ``looprl.train.start``) or
   the default model from scratch (pretrained on source and the demos);
3. **SFT** — on the demos, when there are any (``demos.oracle``, ``demos.synthetic``) →
   ``model_sft/``; the validation demos' teacher-forced turn accuracy;
4. **evaluation of the start** — ``eval_start.json`` (and ``eval_start_packages.json``);
5. **async GRPO** — ``metrics.jsonl``, ``ckpt/``, ``weights/``, TensorBoard (``looprl.trainer.grpo``);
6. **evaluation of the result** — ``model_rl/``, ``eval_rl.json``; the bench gate against the start;
7. **report** — ``report.md``, ``dashboard.html``, PNGs.

``--resume`` continues a run that was stopped or killed: a stage whose result is in the run
directory is not run again, and RL continues from its newest checkpoint (``GRPOLoop.resume``).
The run's saved ``config.json`` must match the config given, except for the loop's budgets.

Several trainer processes (``looprl train --nproc N``, or ``torchrun ... -m looprl.cli train``
across machines): rank 0 runs stages 1-4 alone while the others wait, then every rank runs async
GRPO on its share of the train tasks with its own rollout engine, on ``cuda:LOCAL_RANK`` on a
GPU machine, the step wrapped as ``grpo.experimental.parallel`` says (DDP or FSDP2, ``trainer.ddp``); rank 0
publishes, checkpoints and logs, and runs stages 6-7 alone.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from looprl import runstate
from looprl.bench.turns import TurnAccuracy, turn_accuracy
from looprl.config import save_config, to_dict
from looprl.errors import ConfigError
from looprl.models.loading import load_model
from looprl.models.pretrain import save_loss_png
from looprl.rundir import RunDir
from looprl.train import stages
from looprl.train.config import TrainConfig
from looprl.train.plots import plot_curves
from looprl.train.report import Evals, loss_ends, write_report, write_stopped_report
from looprl.train.start import ModelStart, demos_config, resolve_start
from looprl.train.tasks import TaskSets, build_tasks
from looprl.trainer import ddp
from looprl.types import Trajectory

console = stages.console

RESUMABLE_CHANGES = ("loop.max_minutes", "loop.max_steps")
"""Config fields a resumed run may change (the budget of a run stopped short)."""


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_resumable(cfg: TrainConfig, run_dir: Path) -> None:
    """A resumed run must be the run that was started: same config but for its budgets."""
    saved_path = RunDir(run_dir).config
    if not saved_path.is_file():
        raise ConfigError(f"--resume: {run_dir} holds no run (no config.json); start it "
                          "without --resume")
    saved = _flat(json.loads(saved_path.read_text()))
    now = _flat(json.loads(json.dumps(to_dict(cfg), default=str)))
    changed = sorted(k for k in set(saved) | set(now)
                     if saved.get(k) != now.get(k) and k not in RESUMABLE_CHANGES)
    if changed:
        raise ConfigError(f"--resume: the config differs from the run's saved config.json in "
                          f"{', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}; "
                          f"resume with the same config (only {', '.join(RESUMABLE_CHANGES)} "
                          "may change) or start a new run with another name")


def _json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def _cached_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _on(model: torch.nn.Module, device: torch.device | str) -> torch.nn.Module:
    """``model`` moved to ``device`` (transformers types ``PreTrainedModel.to`` as taking a model)."""
    return model.to(device)


def _build_tasks(cfg: TrainConfig, run_dir: Path) -> TaskSets:
    with stages.progress_bar() as bar:
        job = bar.add_task("tasks", total=None)
        sets = build_tasks(cfg.tasks,
                           progress=lambda spec: bar.update(job, description=f"tasks: {spec}"))
    sets.save(run_dir)
    return sets


def _tasks(cfg: TrainConfig, run_dir: Path) -> TaskSets:
    sets = TaskSets.load(run_dir) or _build_tasks(cfg, run_dir)
    console.print(f"[bold]tasks[/]: {len(sets.train)} train, {len(sets.heldout)} held-out"
                  + (f", {len(sets.heldout_packages)} in held-out packages"
                     if sets.heldout_packages else ""))
    return sets


@dataclass(frozen=True)
class Start:
    """The model RL starts from (made by init, pretraining and SFT, or reloaded on resume)."""

    model: Any
    tok: Any
    dir: Path
    """Its checkpoint: what the start is evaluated on and the vLLM engine loads."""
    demos: int
    """Demos SFT trained on (0: no SFT)."""
    sft: dict[str, Any] | None
    """steps, losses and wall_s of SFT; None when there was none."""
    validation: list[Trajectory]
    """Demos kept out of SFT for the turn-accuracy diagnostic."""
    turns: dict[str, dict[str, dict[str, int]]]
    """Turn accuracies so far (``TurnAccuracy.to_json``), by checkpoint label."""
    origin: ModelStart | None
    """What the start was made from (None: a run from before ``start.json`` recorded it)."""


def _start_model(cfg: TrainConfig, run_dir: Path, sets: TaskSets, device: torch.device,
                 origin: ModelStart | None) -> Start:
    """The start of RL; ``origin`` (``model.start`` resolved) is None only once ``start.json``
    holds it."""
    rd = RunDir(run_dir)
    start_dir, record_path, val_path = rd.model_start, rd.start_record, rd.validation_demos
    record = _cached_json(record_path)
    if record is not None:  # resumed after this stage
        loaded = load_model(start_dir)
        val = [Trajectory.from_json(x) for x in val_path.read_text().splitlines() if x.strip()]
        return Start(_on(loaded.model, device), loaded.tokenizer, start_dir, record["demos"],
                     record["sft"], val, record["turns"],
                     ModelStart.from_json(record["origin"]) if "origin" in record else None)
    assert origin is not None, "the start stage runs with model.start resolved"
    console.print(f"[bold]start[/]: {origin.describe()}")
    model_dir = stages.init_model(cfg, run_dir, origin.path)
    tok = load_model(model_dir).tokenizer
    demos, val = stages.split_validation(
        stages.make_demos(sets.train, tok, demos_config(cfg, origin)),
        cfg.demos.experimental.validation, cfg.seed)
    if origin.path is None:  # a checkpoint was pretrained by whoever made it
        stages.pretrain_model(cfg, model_dir, demos, tok,
                              sets.train + sets.heldout + sets.heldout_packages)
    demos = stages.rename_demos(demos, tok, cfg)  # for SFT: pretraining reads the real code
    model = _on(load_model(model_dir).model, device)
    turns = {"init": turn_accuracy(model, tok, val).to_json()} if val else {}
    sft_record = None
    if demos:
        from looprl.trainer.sft import sft

        console.print(f"[bold]SFT[/] on {len(demos)} demos ({len(val)} kept for validation)")
        res = sft(model, demos, dataclasses.replace(cfg.sft, experimental=dataclasses.replace(
            cfg.sft.experimental, pad_id=tok.pad_token_id)))
        if val:
            acc = turn_accuracy(model, tok, val)
            turns["sft"] = acc.to_json()
            console.print("turn accuracy after SFT (exact greedy turns): " + ", ".join(
                f"{k} {s.exact_rate:.2f}" for k, s in sorted(acc.by_tool.items())))
        first, last = loss_ends(res.losses)
        console.print(f"SFT: {res.steps} steps, {res.tokens:,} model tokens, loss "
                      f"{first:.3f} -> {last:.3f} in {res.wall_s:.0f} s")
        save_loss_png(res.losses, rd.sft_loss, title="SFT",
                      ylabel="NLL per model token")
        sft_record = {"steps": res.steps, "losses": res.losses, "wall_s": res.wall_s}
    # The start of RL, SFT or not, in the run directory: what --resume reloads and the
    # start evaluation loads. Written before start.json, which marks the stage done.
    stages.save_model(model, tok, start_dir)
    val_path.write_text("".join(v.to_json() + "\n" for v in val))
    _json(record_path, {"sft": sft_record, "demos": len(demos), "turns": turns,
                        "origin": origin.to_json()})
    return Start(model, tok, start_dir, len(demos), sft_record, val, turns, origin)


def _evaluate(cfg: TrainConfig, run_dir: Path, model_dir: Path, sets: TaskSets, label: str
              ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The bench summaries of ``model_dir`` on the held-out functions and packages (cached in
    ``eval_<label>.json`` / ``eval_<label>_packages.json``; their trajectories in
    ``trajectories/eval_<label>*.jsonl``)."""
    rd = RunDir(run_dir)
    out = []
    for packages, tasks in ((False, sets.heldout), (True, sets.heldout_packages)):
        path = rd.evaluation(label, packages)
        rep = _cached_json(path)
        if rep is None and tasks:
            trajs = rd.eval_trajectories(label, packages)
            trajs.parent.mkdir(exist_ok=True)
            trajs.unlink(missing_ok=True)  # a killed evaluation's are started over
            notes = stages.notes_file(run_dir)  # RL's notes, when it kept any (none at start)
            rep = stages.evaluate(model_dir, tasks, cfg, label + ("_packages" if packages else ""),
                                  trajs, notes if notes.is_file() and label != "start" else None)
            _json(path, rep)
        out.append(rep)
    return out[0], out[1]


def run(cfg: TrainConfig, runs_root: Path = Path("runs"), *, resume: bool = False
        ) -> Path | None:
    """The whole run (module docstring); returns the report's path (None on the ranks but 0
    under torchrun)."""
    dist = ddp.init_from_env()
    try:
        report = _run(cfg, runs_root, resume, dist)
        # Under torchrun the other ranks wait here while rank 0 evaluates and reports, so all
        # tear the process group down together: a rank that tore it down and exited while rank
        # 0 still held it was seen to abort at exit ("terminate called without an active
        # exception"), and torchrun then stopped rank 0 too. A rank that raises skips this, and
        # torchrun stops the others.
        ddp.barrier(dist)
        return report
    finally:
        ddp.cleanup()


@dataclass
class _Life:
    """This process's part of the run: the stage it is in, recorded in ``state.json``
    (``looprl.runstate``) by rank 0 so the dashboard and the next ``looprl train`` can tell a
    finished, stopped, failed or killed run from one still training."""

    rd: RunDir
    main: bool
    stage: str = "tasks"

    def at(self, stage: str) -> None:
        self.stage = stage
        if self.main:
            runstate.mark(self.rd.root, "training", stage=stage)

    def end(self, status: str, error: str = "") -> None:
        if self.main and self.rd.root.is_dir():
            runstate.mark(self.rd.root, status, stage=self.stage, error=error)


def _claim(cfg: TrainConfig, rd: RunDir, resume: bool) -> None:
    """Refuse a run directory another process is training, or an earlier run's without
    ``--resume``; an earlier attempt that failed before its start model was made (bad tasks, a
    bad model path) holds nothing worth keeping, so a new start takes its name over."""
    runstate.refuse_live(rd.root)
    if resume:
        check_resumable(cfg, rd.root)
        return
    if not rd.config.is_file():
        return
    state = runstate.read(rd.root)
    if state.status == "failed" and not rd.start_record.is_file():
        console.print(f"{rd.root}: the earlier attempt failed in its {state.stage} stage "
                      "before training began; starting over")
        shutil.rmtree(rd.root)
        return
    raise ConfigError(f"{rd.root} holds an earlier run ({state.status}); continue it with "
                      "--resume, start over with --fresh, or pick another name (-o name=...)")


def _reopen_rl(cfg: TrainConfig, rd: RunDir) -> int | None:
    """On ``--resume`` of a run whose RL finished: the steps it ran (and RL's results removed,
    so RL continues from its last checkpoint) when the budget now allows more than it used;
    else None, and a line saying why there is nothing to continue."""
    done = _cached_json(rd.rl_record)
    if done is None:
        return None
    summary = stages.RLSummary(**done)
    more_steps = cfg.loop.max_steps > summary.steps
    more_minutes = cfg.loop.max_minutes > summary.minutes
    if not (more_steps and more_minutes):
        binding = (f"loop.max_steps={cfg.loop.max_steps}" if not more_steps else
                   f"loop.max_minutes={cfg.loop.max_minutes:g}")
        console.print(f"[bold]--resume[/]: RL already ran {summary.steps} steps in "
                      f"{summary.minutes:.1f} min, the budget {binding} allows no more; raise it "
                      "to train on (-o loop.max_steps=... -o loop.max_minutes=...)")
        return None
    for path in (rd.rl_record, rd.evaluation("rl"), rd.evaluation("rl", True), rd.report,
                 rd.eval_trajectories("rl"), rd.eval_trajectories("rl", True)):
        path.unlink(missing_ok=True)
    shutil.rmtree(rd.model_rl, ignore_errors=True)
    console.print(f"[bold]--resume[/]: RL ran {summary.steps} steps in {summary.minutes:.1f} min; "
                  f"continuing it to loop.max_steps={cfg.loop.max_steps}, "
                  f"loop.max_minutes={cfg.loop.max_minutes:g}")
    return summary.steps


def _minutes_before_rl(rd: RunDir, life_start: float) -> float:
    """Minutes the stages before RL took, over every life (``clock.json``, written once they
    are done; a resumed life's own start-up counts in the life that finishes them)."""
    clock = _cached_json(rd.clock)
    if clock is not None:
        return float(clock["before_rl"])
    minutes = (time.monotonic() - life_start) / 60
    _json(rd.clock, {"before_rl": minutes})
    return minutes


def _run(cfg: TrainConfig, runs_root: Path, resume: bool, dist: ddp.DistInfo) -> Path | None:
    rd = RunDir(runs_root / cfg.name)
    ddp.per_rank(cfg.loop.groups_per_step, dist, "loop.groups_per_step")  # before hours of SFT
    ddp.check_lora_parallel(cfg.model.lora.enabled, dist, cfg.grpo.experimental.parallel)
    if dist.is_main:
        _claim(cfg, rd, resume)
    else:
        console.quiet = True  # rank 0 reports
    life = _Life(rd, dist.is_main)
    try:
        return _stages(cfg, rd, resume, dist, life)
    except KeyboardInterrupt:
        life.end("stopped")
        if dist.is_main:
            _say_stopped(cfg, rd, life.stage)
        raise
    except BaseException as e:
        life.end("failed", " ".join(f"{type(e).__name__}: {e}".split())[:500])
        raise


def _say_stopped(cfg: TrainConfig, rd: RunDir, stage: str) -> None:
    """Ctrl-C: what the run kept, how to continue it, and a short report of it."""
    from looprl.trainer.loggers import read_metrics

    rows = read_metrics(rd.metrics) if stage == "RL" else []
    ckpts = sorted(p.name for p in rd.ckpt.glob("step_*")) if rd.ckpt.is_dir() else []
    report = write_stopped_report(rd.root, cfg, stage, rows, ckpts[-1] if ckpts else None)
    console.print(f"[bold yellow]stopped[/] in the {stage} stage"
                  + (f" after {len(rows)} RL steps" if rows else "")
                  + (f" (newest checkpoint {ckpts[-1]})" if ckpts else "")
                  + f"; what finished is kept in {rd.root} (report: {report}). Continue with "
                  "the same command and --resume.")


def _stages(cfg: TrainConfig, rd: RunDir, resume: bool, dist: ddp.DistInfo, life: _Life
            ) -> Path | None:
    run_dir = rd.root
    device = ddp.rank_device(stages.resolve_device(cfg.model.device), dist)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.model.experimental.threads)
    t_start = time.monotonic()

    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, rd.config)
        life.at("model")
        # minutes before the model stage would find a bad one; the runs root is the run
        # directory's parent (``name`` is one path component)
        origin = None if rd.start_record.is_file() else resolve_start(cfg, run_dir.parent)
        life.at("tasks")
    reopened_at = _reopen_rl(cfg, rd) if resume and dist.is_main else None
    reopened_at = ddp.broadcast_object(reopened_at, dist)
    cfg = stages.fit_precision(cfg, device)  # config.json keeps what was asked: --resume checks it
    if dist.is_main:
        sets = _tasks(cfg, run_dir)
        life.at("model")
        start = _start_model(cfg, run_dir, sets, device, origin)
        life.at("eval_start")
        start_eval, start_pkg = _evaluate(cfg, run_dir, start.dir, sets, "start")
        before_rl = _minutes_before_rl(rd, t_start)
    # Under torchrun rank 0 alone makes the tasks, the start model and its evaluation; the
    # other ranks wait here, then load what it saved.
    ddp.barrier(dist)
    if not dist.is_main:
        saved = TaskSets.load(run_dir)
        assert saved is not None, "rank 0 saved the tasks before the barrier"
        sets = saved
        start = _start_model(cfg, run_dir, sets, device, None)

    rl_dir, rl_path = rd.model_rl, rd.rl_record
    done = _cached_json(rl_path)
    life.at("RL")
    if done is None:
        summary, trained = stages.train_rl(cfg, start.model, start.tok, start.dir, sets.train,
                                           run_dir, resume=resume, dist=dist)
        if dist.is_main:
            if summary.history:
                plot_curves(summary.history, rd.reward_curve)
            stages.save_model(trained, start.tok, rl_dir)
            _json(rl_path, dataclasses.asdict(summary))  # marks RL done: --resume evaluates next
    else:
        summary = stages.RLSummary(**done)
    if not dist.is_main:
        return None
    t_after_rl = time.monotonic()
    if warning := summary.no_pass_warning():
        console.print(f"[bold red]warning:[/] {warning}")
    if reopened_at is not None and summary.steps == reopened_at:
        console.print("RL trained no further step: the walk over the train tasks is done "
                      f"(loop.experimental.passes={cfg.loop.experimental.passes}); raise it to "
                      "train on")
    life.at("eval_rl")
    rl_eval, rl_pkg = _evaluate(cfg, run_dir, rl_dir, sets, "rl")
    turns = {lab: TurnAccuracy.from_json(acc) for lab, acc in start.turns.items()}
    if start.validation:
        turns["rl"] = turn_accuracy(load_model(rl_dir).model, start.tok, start.validation)

    life.at("report")
    total = before_rl + summary.minutes + (time.monotonic() - t_after_rl) / 60
    report = write_report(run_dir, cfg, sets, Evals(start_eval, rl_eval, start_pkg, rl_pkg),
                          n_demos=start.demos, sft=start.sft, origin=start.origin, rl=summary,
                          total_minutes=total, turns=turns)
    life.end("finished")  # before the export: the page shows the run as finished
    from looprl.dashboard import DashboardConfig, export_html

    page = export_html(DashboardConfig(runs=(run_dir,)), rd.dashboard_page)
    console.print(f"[bold green]report:[/] {report}  (charts: {page}; live: looprl dashboard "
                  f"--run {run_dir})")
    console.print(f"[bold]trained model:[/] {rl_dir}  (serve it: looprl model serve {rl_dir})")
    console.print(report.read_text().splitlines()[-1])
    return report
