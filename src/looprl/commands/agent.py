"""``looprl agent ...``: inspect the harness and replay tasks' gold patches through it.

    looprl agent tools                              # every tool's signature and description
    looprl agent oracle tasks.jsonl -o sft.jsonl    # solve tasks from gold patches (SFT data)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="The agent harness: tools, oracle replays.")


@app.command("tools")
def tools_cmd() -> None:
    """List the registered tools with their signatures."""
    from looprl.harness.tools import make_tools, signature

    for t in make_tools():
        ro = "read-only" if t.read_only else "mutating"
        typer.echo(f"{signature(t)}  [{ro}]\n    {t.description}")


@app.command("oracle")
def oracle_cmd(
    tasks_path: Annotated[Path, typer.Argument(help="JSONL task file (with gold_patch)", exists=True,
                                               dir_okay=False)],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="write trajectories (JSONL)",
                                             dir_okay=False)] = None,
    limit: Annotated[int, typer.Option(help="at most this many tasks (0 = all)", min=0)] = 0,
    tokenizer: Annotated[Path | None, typer.Option(help="local HF tokenizer dir (default: bytes-only)",
                                                   exists=True, file_okay=False)] = None,
) -> None:
    """Run the OracleAgent on each task in a real sandbox: proves tasks solvable through the
    tools and writes the trajectories in exact harness format."""
    import asyncio

    from looprl.errors import TaskError
    from looprl.tasks.taskset import load_tasks

    tasks = load_tasks(tasks_path)[: limit or None]
    if not tasks:
        raise TaskError(f"{tasks_path} holds no tasks; build some with `looprl tasks build`")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)  # before the run: its trajectories are kept
    trajs = asyncio.run(_run_oracles(tasks, tokenizer))
    if out is not None:
        out.write_text("".join(t.to_json() + "\n" for t in trajs))
    ok = sum(t.stop_reason.value == "finished" and t.counters.broken_tool_calls == 0 for t in trajs)
    for t in trajs:
        typer.echo(f"{t.task_id}\t{t.stop_reason.value}\tturns={t.counters.turns}\t"
                   f"broken={t.counters.broken_tool_calls}\t{t.error or ''}")
    typer.echo(f"{ok}/{len(trajs)} tasks finished by the oracle with no broken call")
    if ok < len(trajs):
        raise typer.Exit(1)


async def _run_oracles(tasks: list, tokenizer_dir: Path | None) -> list:
    from looprl.chat import ChatFormat
    from looprl.harness.agent import AgentConfig, run_agent
    from looprl.harness.oracle import OracleAgent
    from looprl.harness.tools import make_tools
    from looprl.sandbox import create_sandbox

    if tokenizer_dir:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    else:
        from looprl.models.tokenizer import build_tokenizer

        tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    cfg = AgentConfig(context_window=1_000_000, max_total_new_tokens=1_000_000,
                      max_new_tokens=1_000_000)  # the oracle's turns are whole patches
    out = []
    for task in tasks:
        sandbox = await create_sandbox(task.repo, venv=task.venv, image=task.image)
        try:
            tools = make_tools(test_command=task.grader.test_command)
            out.append(await run_agent(task, sandbox, OracleAgent(task, tok), fmt, tools, cfg,
                                       group_id=f"oracle/{task.id}", trajectory_id=f"oracle/{task.id}/0"))
        finally:
            await sandbox.close()
    return out
