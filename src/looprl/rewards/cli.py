"""``looprl rewards``: inspect reward shaping without training.

    looprl rewards curve --effort 100 --effort 1000 -o length.q=0.5   # penalty at given efforts
    looprl rewards metrics runs/x/trajectories.jsonl                    # per-step style metrics
    looprl rewards flags tasks.jsonl runs/x/trajectories.jsonl          # which monitors fire where
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from looprl.config import load_config
from looprl.errors import LooprlError
from looprl.rewards.composite import RewardConfig, reward_metrics
from looprl.rewards.hacking import MonitorStats, detect
from looprl.rewards.length import penalty_of_effort
from looprl.types import Task, Trajectory

app = typer.Typer(help="Inspect reward shaping: the length curve, batch metrics, monitor flags.",
                  no_args_is_help=True)


def _config(config: Path | None, overrides: list[str] | None) -> RewardConfig:
    try:
        return load_config(RewardConfig, config, overrides or [])
    except LooprlError as e:
        raise typer.BadParameter(str(e)) from None


def _read_jsonl(path: Path) -> list[str]:
    if not path.exists():
        raise typer.BadParameter(f"{path} does not exist")
    return [ln for ln in path.read_text().splitlines() if ln.strip()]


@app.command()
def curve(
    effort: Annotated[list[float] | None, typer.Option(help="Effort values C (repeatable).")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML file of a RewardConfig.")] = None,
    override: Annotated[list[str] | None, typer.Option(
        "--override", "-o", help="Dotted override, e.g. length.q=2")] = None,
) -> None:
    """Print the (capped) length penalty at each effort value."""
    cfg = _config(config, override).length
    typer.echo(f"q={cfg.q:g} λ={cfg.coef:g} k={cfg.k:g} cap={cfg.max_penalty}")
    for c in effort or [10.0, 100.0, 1000.0, 10000.0]:
        typer.echo(f"C={c:>12g}  penalty={penalty_of_effort(c, cfg):+.6f}")


@app.command()
def metrics(
    trajectories: Annotated[Path, typer.Argument(help="JSONL of scored Trajectory records.")],
) -> None:
    """Print ``reward_metrics`` (term means, broken-call rate, flag rates) over a JSONL file."""
    trajs = [Trajectory.from_json(ln) for ln in _read_jsonl(trajectories)]
    typer.echo(json.dumps(reward_metrics(trajs), indent=2, sort_keys=True))


@app.command()
def flags(
    tasks: Annotated[Path, typer.Argument(help="JSONL of Task records.")],
    trajectories: Annotated[Path, typer.Argument(help="JSONL of Trajectory records.")],
) -> None:
    """Run the hacking detectors on each trajectory and print its flags, then the batch rates."""
    by_id = {t.id: t for t in (Task.from_json(ln) for ln in _read_jsonl(tasks))}
    flag_sets = []
    for traj in (Trajectory.from_json(ln) for ln in _read_jsonl(trajectories)):
        if traj.is_infra_error:
            continue
        task = by_id.get(traj.task_id)
        if task is None:
            raise typer.BadParameter(f"trajectory {traj.id!r} is for task {traj.task_id!r}, "
                                     f"which is not in {tasks}")
        found = detect(task, traj)
        flag_sets.append(found)
        typer.echo(f"{traj.id or traj.task_id}\t{','.join(found) or '-'}")
    typer.echo(json.dumps(MonitorStats.from_flags(flag_sets).rates, indent=2, sort_keys=True))
