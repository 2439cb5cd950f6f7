"""The ``looprl`` command line. Each subsystem contributes a typer sub-app from its own ``cli.py``;
this file only wires them together. ``looprl --help`` lists every command."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="looprl: RL for coding agents, in the harness they serve in.",
                  no_args_is_help=True, pretty_exceptions_show_locals=False)

# (command name, module with a typer `app`, help). Sub-apps are imported eagerly so --help is complete.
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


@app.command()
def quickstart(
    config: Annotated[Path, typer.Option("--config", "-c", help="TOML config (see configs/)")] = Path(
        "configs/quickstart.toml"),
    override: Annotated[list[str] | None, typer.Option(
        "--override", "-o", help="dotted override, e.g. -o loop.max_minutes=5")] = None,
    runs: Annotated[Path, typer.Option(help="where run directories go")] = Path("runs"),
) -> None:
    """The main job: real tasks -> default model -> SFT -> async GRPO -> held-out eval -> report."""
    from looprl.config import load_config
    from looprl.quickstart import QuickstartConfig, run

    cfg = load_config(QuickstartConfig, config if config.exists() else None, list(override or []))
    run(cfg, runs)


@app.command()
def version() -> None:
    """Print the looprl version."""
    from importlib.metadata import version as v

    typer.echo(v("looprl"))


if __name__ == "__main__":
    app()
