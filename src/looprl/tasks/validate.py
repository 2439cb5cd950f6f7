"""Task validation: a task is kept only when its gold patch grades 1.0 and the untouched repo
0.0, through the same grader rollouts use, each in a fresh sandbox.

    kept = await validate_all(tasks, "oracle", workers=2)   # or "patch", or "none"

``oracle`` replays the gold patch through the harness tools (``OracleAgent``), which proves the
task solvable the way the policy must solve it; ``patch`` applies the patch directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from looprl.errors import RewardError, SandboxError, TaskError
from looprl.rewards.tests import grade
from looprl.tasks.timing import stage
from looprl.types import Task

Progress = Callable[[str, int], None]
"""``progress(what, n)``: ``n`` more of ``what`` done (e.g. ``("validated", 1)``)."""


async def oracle_solves(task: Task) -> bool:
    """Replay the gold patch through the harness tools (``OracleAgent``), grade the final diff."""
    from looprl.chat import ChatFormat
    from looprl.harness.agent import run_agent
    from looprl.harness.oracle import OracleAgent
    from looprl.harness.run_state import AgentConfig, AgentExperimental
    from looprl.harness.tools import make_tools
    from looprl.models.tokenizer import build_tokenizer
    from looprl.sandbox import create_sandbox

    tok = build_tokenizer(None)  # bytes only: the oracle needs no model; no context limit either
    cfg = AgentConfig(context_window=1 << 24, max_total_new_tokens=1 << 22,
                      max_new_tokens=1 << 20, experimental=AgentExperimental(wall_time_s=600))
    sb = await create_sandbox(task.repo, venv=task.venv, image=task.image)
    try:
        traj = await run_agent(task, sb, OracleAgent(task, tok), ChatFormat(tok),
                               make_tools(test_command=task.grader.test_command), cfg,
                               group_id=task.id, trajectory_id=f"{task.id}/oracle")
    finally:
        await sb.close()
    return not traj.is_infra_error and (await grade(task, traj.diff)).passed


async def validate_task(task: Task, how: str, untouched: bool = True) -> bool:
    """True when its gold patch, applied ``how``, grades 1.0 and (``untouched``) the untouched
    task grades 0.0, both through the grader in fresh sandboxes."""
    if how == "none":
        return True
    if how not in ("patch", "oracle"):
        raise TaskError(f"unknown validation {how!r}: use oracle, patch or none")
    try:
        if untouched:
            with stage("validate_untouched"):
                if (await grade(task, "")).score != 0.0:
                    return False
        with stage(f"validate_{how}"):
            if how == "patch":
                return (await grade(task, task.gold_patch or "")).passed
            return await oracle_solves(task)
    except (RewardError, SandboxError, TaskError):
        return False


async def validate_all(tasks: list[Task], how: str, workers: int = 2,
                       progress: Progress | None = None, untouched: bool = True) -> list[Task]:
    """The tasks that pass ``validate_task``, ``workers`` at a time."""
    sem = asyncio.Semaphore(workers)

    async def one(t: Task) -> bool:
        async with sem:
            ok = await validate_task(t, how, untouched)
        if progress:
            progress("validated", 1)
        return ok

    oks = await asyncio.gather(*(one(t) for t in tasks))
    return [t for t, ok in zip(tasks, oks, strict=True) if ok]
