"""The ``looprl`` command line. Each subsystem contributes a typer sub-app from its own ``cli.py``;
this file only wires them together. ``looprl --help`` lists every command."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="looprl: RL for coding agents, in the harness they serve in.",
                  no_args_is_help=True, pretty_exceptions_show_locals=False)

# (command name, module with a typer `app`, help). Sub-apps are imported eagerly so --help is complete.
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("agent", "looprl.harness.cli", "The agent harness: list tools, replay gold patches (oracle)."),
    ("sandbox", "looprl.sandbox.cli", "Sandboxes: run a command isolated over a repo; the env server."),
    ("rewards", "looprl.rewards.cli", "Inspect reward shaping: length curve, batch metrics, monitor flags."),
]

for _name, _module, _help in SUBCOMMANDS:
    app.add_typer(importlib.import_module(_module).app, name=_name, help=_help)


@app.command()
def version() -> None:
    """Print the looprl version."""
    from importlib.metadata import version as v

    typer.echo(v("looprl"))


if __name__ == "__main__":
    app()
