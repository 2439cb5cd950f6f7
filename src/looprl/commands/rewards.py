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
from looprl.errors import ConfigError

app = typer.Typer(help="Inspect reward shaping: the length curve, batch metrics, monitor flags.",
                  no_args_is_help=True)


@app.command()
def curve(
    effort: Annotated[list[float] | None, typer.Option(help="Effort values C (repeatable).")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML file of a RewardConfig.")] = None,
    override: Annotated[list[str] | None, typer.Option(
        "--override", "-o", help="Dotted override, e.g. experimental.length.q=2")] = None,
) -> None:
    """Print the (capped) length penalty at each effort value."""
    from looprl.rewards.composite import RewardConfig
    from looprl.rewards.length import penalty_of_effort

    cfg = load_config(RewardConfig, config, override or []).experimental.length
    typer.echo(f"q={cfg.q:g} λ={cfg.coef:g} k={cfg.k:g} cap={cfg.max_penalty}")
    for c in effort or [10.0, 100.0, 1000.0, 10000.0]:
        typer.echo(f"C={c:>12g}  penalty={penalty_of_effort(c, cfg):+.6f}")


@app.command()
def metrics(
    trajectories: Annotated[Path, typer.Argument(help="JSONL of scored Trajectory records.",
                                                 exists=True, dir_okay=False)],
) -> None:
    """Print ``reward_metrics`` (term means, broken-call rate, flag rates) over a JSONL file."""
    from looprl.records import read_trajectories
    from looprl.rewards.composite import reward_metrics

    trajs = read_trajectories(trajectories)
    typer.echo(json.dumps(reward_metrics(trajs), indent=2, sort_keys=True))


@app.command()
def flags(
    tasks: Annotated[Path, typer.Argument(help="JSONL of Task records.", exists=True,
                                          dir_okay=False)],
    trajectories: Annotated[Path, typer.Argument(help="JSONL of Trajectory records.",
                                                 exists=True, dir_okay=False)],
) -> None:
    """Run the hacking detectors on each trajectory and print its flags, then the batch rates."""
    from looprl.records import read_trajectories
    from looprl.rewards.hacking import MonitorStats, detect
    from looprl.tasks.taskset import load_tasks

    by_id = {t.id: t for t in load_tasks(tasks)}
    trajs = [t for t in read_trajectories(trajectories) if not t.is_infra_error]
    missing = sorted({t.task_id for t in trajs} - set(by_id))
    if missing:
        raise ConfigError(f"trajectories of {len(missing)} task(s) not in {tasks} (e.g. "
                          f"{missing[0]!r}); pass the task file they were sampled from")
    flag_sets = []
    for traj in trajs:
        found = detect(by_id[traj.task_id], traj)
        flag_sets.append(found)
        typer.echo(f"{traj.id or traj.task_id}\t{','.join(found) or '-'}")
    typer.echo(json.dumps(MonitorStats.from_flags(flag_sets).rates, indent=2, sort_keys=True))
