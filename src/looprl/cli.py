"""The ``looprl`` command line. Every command lives in the ``looprl.commands`` package (one module
per command group: composition roots at the top of the layering, never inside the packages they
wire); this file only wires them together. ``looprl --help`` lists every command.

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
import inspect
import os
import re
import traceback
from typing import Annotated, Any, NoReturn

import typer
from typer._click.core import Context  # TyperGroup's methods take click's (typer's subclasses it)
from typer._click.exceptions import NoArgsIsHelpError, UsageError  # typer vendors click
from typer.core import TyperGroup, TyperOption

from looprl.errors import LooprlError


class _Root(TyperGroup):
    """The ``looprl`` group: turns the errors a user can fix into one line and exit code 2."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except NoArgsIsHelpError:
            raise  # a bare `looprl` prints its help: no error
        except UsageError as e:  # an option of `looprl` itself
            _fail(ctx, e)

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise  # a bare group prints its help: no error
        except (LooprlError, UsageError) as e:  # a sub-command's options, or its work
            _fail(ctx, e)


def _fail(ctx: Context, e: Exception) -> NoReturn:
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


# (command name, "module:typer app", help). Sub-apps are imported eagerly so --help is complete;
# their modules are light (heavy imports live inside the commands).
SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("agent", "agent:app", "The agent harness: list tools, replay gold patches (oracle)."),
    ("sandbox", "sandbox:app", "Sandboxes: run a command isolated over a repo; the env server."),
    ("trainer", "trainer:app", "Trainer utilities: SFT on harness trajectories."),
    ("weights", "weights:app", "The weight store: list and verify published versions."),
    ("model", "model:app", "The default model: init, pretrain, serve (OpenAI-compatible)."),
    ("embed", "search:embed_app", "Train/evaluate the code-embedding model."),
    ("search", "search:search_app", "Semantic code search over a directory."),
    ("tasks", "tasks:app", "Real tasks from real packages: fetch, build, show."),
    ("bench", "bench:app", "Run a policy on a task set (pass@k) and gate checkpoints (compare)."),
    ("rewards", "rewards:app", "Inspect reward shaping: length curve, batch metrics, monitor flags."),
    ("serve", "serve:app", "Serve the agent to users: sessions, feedback, A/B arms."),
    ("feedback", "feedback:app", "Real-time RL: feedback -> rewards -> GRPO cycle; A/B; promote."),
    ("dashboard", "dashboard:app", "Training, fleet and feedback dashboards; static HTML export."),
]

for _name, _where, _help in SUBCOMMANDS:
    _module, _attr = _where.split(":")
    app.add_typer(getattr(importlib.import_module(f"looprl.commands.{_module}"), _attr),
                  name=_name, help=_help)

# train, quickstart and version are commands of the root itself
app.registered_commands += importlib.import_module("looprl.commands.train").app.registered_commands


def _plain(doc: str) -> str:
    """A docstring as terminal help: RST's ``code`` as `code`, each paragraph's lines joined
    (help text is wrapped to the terminal; the docstring's own breaks would show as ragged)."""
    doc = re.sub(r"``([^`]+)``", r"`\1`", inspect.cleandoc(doc))
    return "\n\n".join(p if p.startswith(" ") else " ".join(p.split())  # examples kept
                       for p in re.split(r"\n\s*\n", doc))


def _plain_help(typer_app: typer.Typer) -> None:
    for cmd in typer_app.registered_commands:
        doc = cmd.help or (cmd.callback.__doc__ if cmd.callback else None)
        if doc:
            cmd.help = _plain(doc)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _plain_help(group.typer_instance)


_plain_help(app)

# A flag takes no value: typer's help would show it as `--debug <bool>`.
_option_type = TyperOption.display_type_rich
TyperOption.display_type_rich = (  # type: ignore[method-assign]
    lambda self, ctx: None if self.is_flag and not self.count else _option_type(self, ctx))


if __name__ == "__main__":
    app()
