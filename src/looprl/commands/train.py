"""``looprl train`` and ``looprl quickstart`` (the main job: a preset of ``train``), and
``looprl version``.

    looprl train -c configs/train_cpu.toml -o tasks.train_file=tasks.jsonl -o loop.max_minutes=15
    looprl train -c configs/train_cpu.toml --nproc 2      # the trainer in 2 processes (torchrun)
    looprl quickstart                                      # configs/quickstart.toml
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer()


def _run_training(config: Path, override: list[str] | None, runs: Path, resume: bool,
                  fresh: bool) -> None:
    import shutil

    if resume and fresh:
        raise typer.BadParameter("--resume continues runs/<name>, --fresh deletes it: pick one")

    from looprl.config import load_config
    from looprl.train.config import TrainConfig

    # the config is read and checked before the composition root imports torch, so a bad key or
    # value is one line in well under a second (tests/commands/test_train_cli.py)
    cfg = load_config(TrainConfig, config, list(override or []))
    if cfg.model.engine == "openai":
        _check_rollout_server(cfg.model.engine_options)
    from looprl.train.run import run

    if fresh and os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 owns the run dir
        from looprl.runstate import refuse_live

        refuse_live(runs / cfg.name)  # never delete a run another process is training
        shutil.rmtree(runs / cfg.name, ignore_errors=True)
    run(cfg, runs, resume=resume)


def _check_rollout_server(options: dict[str, bool | int | float | str]) -> None:
    """``model.engine=openai`` rolls out on a server this run does not start: if it cannot be
    reached, or base_url is not its API root, that is one line now, not a run whose every rollout
    fails as an infrastructure error after SFT."""
    import httpx

    from looprl.errors import ConfigError

    url = str(options["base_url"]).rstrip("/") + "/models"
    key = options.get("api_key")
    try:
        status = httpx.get(url, headers={"Authorization": f"Bearer {key}"} if key else {},
                           timeout=10).status_code
    except httpx.HTTPError as e:
        raise ConfigError(f"model.engine_options.base_url: {url} unreachable ({type(e).__name__}); "
                          "start the server first, e.g. `looprl model serve DIR --port 8000`") from None
    if status == 404:
        raise ConfigError(f"model.engine_options.base_url: GET {url} answered 404; give the "
                          "server's API root, e.g. http://127.0.0.1:8000/v1")
    if status in (401, 403):
        raise ConfigError(f"model.engine_options.base_url: GET {url} answered {status}; set "
                          "model.engine_options.api_key to the server's key")
    if status != 200:
        raise ConfigError(f"model.engine_options.base_url: GET {url} answered {status}")


def _launch_torchrun(nproc: int, config: Path, override: list[str] | None, runs: Path,
                     resume: bool, fresh: bool) -> None:
    """``looprl train`` in ``nproc`` processes of one machine, under torchrun (which ends them
    all when one fails); exits with its status."""
    import shutil
    import subprocess
    import sys

    from looprl.config import load_config
    from looprl.train.config import TrainConfig
    from looprl.trainer.ddp import DistInfo, per_rank

    # a bad config is one line here, not one per rank inside torchrun's report
    cfg = load_config(TrainConfig, config, list(override or []))
    per_rank(cfg.loop.groups_per_step, DistInfo(world_size=nproc), "loop.groups_per_step")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or \
        shutil.which("torchrun")
    if torchrun is None:
        raise typer.BadParameter("--nproc needs torchrun (it comes with torch) next to this "
                                 "Python or on PATH")
    args = ["train", "-c", str(config), "--runs", str(runs)]
    args += [a for o in override or [] for a in ("-o", o)]
    args += ["--resume"] * resume + ["--fresh"] * fresh
    cmd = [torchrun, "--standalone", "--nproc_per_node", str(nproc), "-m", "looprl.cli", *args]
    raise typer.Exit(subprocess.run(cmd, check=False).returncode)


RunsOption = Annotated[Path, typer.Option(help="where run directories go")]
OverrideOption = Annotated[list[str] | None, typer.Option(
    "--override", "-o", help="dotted override, e.g. -o loop.max_minutes=5")]
ResumeOption = Annotated[bool, typer.Option(
    "--resume", help="continue the run runs/<name> from where it stopped (same config)")]
FreshOption = Annotated[bool, typer.Option(
    "--fresh", help="delete runs/<name> first and start over")]


@app.command()
def train(
    config: Annotated[Path, typer.Option("--config", "-c", help="TOML config (see configs/)",
                                         exists=True, dir_okay=False)],
    override: OverrideOption = None, runs: RunsOption = Path("runs"),
    resume: ResumeOption = False, fresh: FreshOption = False,
    nproc: Annotated[int, typer.Option(
        "--nproc", min=1, help="trainer processes on this machine (torchrun --standalone; "
        "grpo.experimental.parallel picks DDP or FSDP); on several machines run torchrun -m looprl.cli "
        "train ... yourself")] = 1,
) -> None:
    """RL on your model and tasks: tasks -> model -> (SFT) -> async GRPO -> eval + gate -> report."""
    if nproc > 1:
        _launch_torchrun(nproc, config, override, runs, resume, fresh)
    else:
        _run_training(config, override, runs, resume, fresh)


@app.command()
def quickstart(
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="TOML config (default: the quickstart preset, configs/quickstart.toml)",
        exists=True, dir_okay=False)] = None,
    override: OverrideOption = None, runs: RunsOption = Path("runs"),
    resume: ResumeOption = False, fresh: FreshOption = False,
) -> None:
    """The main job on the embedded default: `looprl train` with the quickstart preset."""
    preset = Path(__file__).parents[1] / "configs" / "quickstart.toml"
    _run_training(config or preset, override, runs, resume, fresh)


@app.command()
def version() -> None:
    """Print the looprl version."""
    from importlib.metadata import version as v

    typer.echo(v("looprl"))
