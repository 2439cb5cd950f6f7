"""The ``looprl`` command line. Each subsystem contributes a typer sub-app from its own ``cli.py``;
this file only wires them together. ``looprl --help`` lists every command.

Errors a user can fix (any ``LooprlError``: a bad config, a missing file, ...; a bad option) end a
command with one line on stderr, ``error: <what is wrong and how to fix it>``, and exit code 2;
``looprl --debug ...`` (or ``LOOPRL_DEBUG=1``) prints the traceback too. Any other exception is a
bug and keeps its traceback.

Start-up stays light (``looprl --help`` well under a second): the sub-apps' modules and their
packages import nothing heavy at import time; torch, transformers, servers and the like are
imported inside the commands that use them (``tests/test_cli.py`` checks it).
"""

from __future__ import annotations

import importlib
import os
import traceback
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer._click.exceptions import NoArgsIsHelpError, UsageError  # typer vendors click
from typer.core import TyperGroup

from looprl.errors import LooprlError


class _Root(TyperGroup):
    """The ``looprl`` group: turns the errors a user can fix into one line and exit code 2."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except NoArgsIsHelpError:
            raise  # a bare `looprl` prints its help: no error
        except UsageError as e:  # an option of `looprl` itself
            _fail(ctx, e)

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise  # a bare group prints its help: no error
        except (LooprlError, UsageError) as e:  # a sub-command's options, or its work
            _fail(ctx, e)


def _fail(ctx: typer.Context, e: Exception) -> NoReturn:
    if ctx.params.get("debug"):
        traceback.print_exception(e)
    typer.echo(f"error: {_one_line(e)}", err=True)
    raise typer.Exit(2) from None


def _one_line(e: Exception) -> str:
    msg = e.format_message() if isinstance(e, UsageError) else str(e) or type(e).__name__
    msg = " ".join(line.strip() for line in msg.splitlines() if line.strip())
    if isinstance(e, UsageError) and e.ctx is not None:
        msg += f" (see '{e.ctx.command_path} --help')"
    return msg


app = typer.Typer(cls=_Root, help="looprl: RL for coding agents, in the harness they serve in.",
                  no_args_is_help=True, pretty_exceptions_show_locals=False)


@app.callback()
def _root(debug: Annotated[bool, typer.Option(
        "--debug", envvar="LOOPRL_DEBUG", help="on an error, print its traceback too")] = False,
          ) -> None:
    # --debug is read by _Root from the context's params; the group's help is the Typer's.
    if debug:  # also for what reads the environment: HF's progress bars (models.loading)
        os.environ["LOOPRL_DEBUG"] = "1"


# (command name, module with a typer `app`, help). Sub-apps are imported eagerly so --help is
# complete; their modules are light (heavy imports live inside the commands).
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("agent", "looprl.harness.cli", "The agent harness: list tools, replay gold patches (oracle)."),
    ("sandbox", "looprl.sandbox.cli", "Sandboxes: run a command isolated over a repo; the env server."),
    ("trainer", "looprl.trainer.cli", "Trainer utilities: SFT on harness trajectories."),
    ("weights", "looprl.weights.cli", "The weight store: list and verify published versions."),
    ("model", "looprl.models.cli", "The default model: init, pretrain, serve (OpenAI-compatible)."),
    ("embed", "looprl.search.cli", "Train/evaluate the code-embedding model."),
    ("search", "looprl.search.search_cli", "Semantic code search over a directory."),
    ("tasks", "looprl.tasks.cli", "Real tasks from real packages: fetch, build, show."),
    ("bench", "looprl.bench.cli", "Run a policy on a task set (pass@k) and gate checkpoints (compare)."),
    ("rewards", "looprl.rewards.cli", "Inspect reward shaping: length curve, batch metrics, monitor flags."),
    ("serve", "looprl.serve.cli", "Serve the agent to users: sessions, feedback, A/B arms."),
    ("feedback", "looprl.feedback.cli", "Real-time RL: feedback -> rewards -> GRPO cycle; A/B; promote."),
    ("dashboard", "looprl.dashboard.cli", "Training, fleet and feedback dashboards; static HTML export."),
]

for _name, _module, _help in SUBCOMMANDS:
    app.add_typer(importlib.import_module(_module).app, name=_name, help=_help)


def _run_training(config: Path, override: list[str] | None, runs: Path, resume: bool,
                  fresh: bool) -> None:
    import shutil

    if resume and fresh:
        raise typer.BadParameter("--resume continues runs/<name>, --fresh deletes it: pick one")

    from looprl.config import load_config
    from looprl.train import TrainConfig, run

    cfg = load_config(TrainConfig, config, list(override or []))
    if fresh and os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 owns the run dir
        shutil.rmtree(runs / cfg.name, ignore_errors=True)
    run(cfg, runs, resume=resume)


def _launch_torchrun(nproc: int, config: Path, override: list[str] | None, runs: Path,
                     resume: bool, fresh: bool) -> None:
    """``looprl train`` in ``nproc`` processes of one machine, under torchrun (which ends them
    all when one fails); exits with its status."""
    import shutil
    import subprocess
    import sys

    from looprl.config import load_config
    from looprl.train import TrainConfig
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
        "grpo.parallel picks DDP or FSDP); on several machines run torchrun -m looprl.cli "
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
    preset = Path(__file__).parent / "configs" / "quickstart.toml"
    _run_training(config or preset, override, runs, resume, fresh)


@app.command()
def version() -> None:
    """Print the looprl version."""
    from importlib.metadata import version as v

    typer.echo(v("looprl"))


if __name__ == "__main__":
    app()
