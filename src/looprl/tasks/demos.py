"""SFT demonstrations: the oracle's trajectories through the harness, each checked against the
state its gold patch leads to.

    demos = asyncio.run(oracle_demos([(task, None) for task in train_tasks], tok,
                                     tools=("grep", "read_file", "edit_file", "finish")))

A demo is kept only if the oracle finished with no broken call and every file its gold patch
touches ends exactly as the gold patch makes it (deleted files gone). That is the state the task
build validated with the hidden tests (``tasks.validate.validate_task``), so the tests need not run
again; a task that was never validated is never a demo source here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from looprl.chat import ChatFormat
from looprl.errors import LooprlError, TaskError, ToolError
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.oracle import OracleAgent, gold_patches, patched, repo_file_text
from looprl.harness.tools import make_tools
from looprl.protocols import Sandbox
from looprl.types import StopReason, Task, Trajectory

DemoSource = tuple[Task, Mapping[str, str] | None]
"""A task and the files (path -> text) written into its workspace before the oracle starts
(a synthetic bug over a pristine tree), or None for a task repo used as it is."""


def expected_files(task: Task, files: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """path -> text after the gold patch (None: the file is deleted)."""
    out: dict[str, str | None] = {}
    for fp in gold_patches(task):
        if fp.old_path is None:
            assert fp.new_path is not None
            out[fp.new_path] = "".join(ln for h in fp.hunks for ln in h.new_lines)
            continue
        after = patched(repo_file_text(task, fp.old_path, files), fp)
        if fp.new_path != fp.old_path:
            out[fp.old_path] = None
        if fp.new_path is not None:
            out[fp.new_path] = after
    return out


async def matches(sb: Sandbox, expected: Mapping[str, str | None]) -> bool:
    """Every file in ``sb`` is as ``expected`` says."""
    for path, text in expected.items():
        try:
            data = await sb.read(path)
        except ToolError:
            if text is None:
                continue
            return False
        if text is None or data.decode("utf-8", "replace") != text:
            return False
    return True


def without_turn_loss(traj: Trajectory, turn: int) -> Trajectory:
    """``traj`` with its model turn number ``turn`` (from 0, ``Segment.model_turns`` of its one
    segment) made context only: SFT learns what follows a slip, never the slip."""
    seg, *rest = traj.segments
    a, b = seg.model_turns()[turn]
    mask = seg.loss_mask_T[:a] + (0,) * (b - a) + seg.loss_mask_T[b:]
    return dataclasses.replace(traj, segments=(dataclasses.replace(seg, loss_mask_T=mask), *rest))


async def oracle_demo(task: Task, files: Mapping[str, str] | None, tok: Any, fmt: ChatFormat,
                      tools: list, cfg: AgentConfig, slip: bool = False,
                      seed: int = 0, verify: bool = False) -> Trajectory | None:
    """The oracle's trajectory on one task in a fresh sandbox, or None when it does not check
    out (see the module docstring). With ``slip`` the oracle first tries its edit broken
    (``policies.slipped_turns``); the demo then fails exactly there, and that turn is context
    only (``without_turn_loss``). With ``verify`` it runs the task's failing tests after its edit
    (``oracle_turns``)."""
    from looprl.sandbox import create_sandbox

    expected = expected_files(task, files)
    sb = await create_sandbox(task.repo, venv=task.venv, image=task.image)
    try:
        for path, text in (files or {}).items():
            await sb.write(path, text.encode())
        oracle = OracleAgent(task, tok, files=files, slip=slip, seed=seed, verify=verify)
        traj = await run_agent(task, sb, oracle, fmt, tools, cfg, group_id=task.id,
                               trajectory_id=f"{task.id}/oracle")
        # a slipped demo's one broken call is its cut call
        if traj.stop_reason != StopReason.FINISHED or traj.counters.broken_tool_calls != int(slip):
            return None
        if not await matches(sb, expected):
            return None
        if verify:
            traj = dataclasses.replace(traj, metadata={**traj.metadata, "verify": "run_tests"})
        if not slip:
            return traj
        ((_, cut, _),) = traj.broken_spans
        turn = next(k for k, (a, b) in enumerate(traj.segments[0].model_turns()) if a <= cut < b)
        return without_turn_loss(dataclasses.replace(
            traj, metadata={**traj.metadata, "slip": "cut"}), turn)
    finally:
        await sb.close()


async def oracle_demos(sources: list[DemoSource], tok: Any, *, tools: Iterable[str] | None = None,
                       cfg: AgentConfig | None = None, workers: int = 4, slips: float = 0.0,
                       verifies: float = 0.0, seed: int = 0, progress: Callable[[int], None] | None = None
                       ) -> list[Trajectory]:
    """Checked oracle trajectories for ``sources`` (in order, failures left out), ``workers``
    sandboxes at once. A failure (sandbox, bad gold patch) loses that demo only. A ``slips``
    share of them, drawn from ``seed``, recover from a slip (``oracle_demo``); a source whose
    edit cannot slip (several calls in its edit turn) gives its demo without one. A ``verifies``
    share, drawn apart, runs the task's failing tests before it finishes."""
    fmt = ChatFormat(tok)
    tool_objs = make_tools(list(tools)) if tools is not None else make_tools()
    cfg = cfg or AgentConfig(max_turns=16, context_window=1 << 20, max_new_tokens=1 << 16,
                             max_total_new_tokens=1 << 20)
    sem = asyncio.Semaphore(workers)
    rng = random.Random(seed)
    slipped = [rng.random() < slips for _ in sources]
    verify_rng = random.Random(f"verify-{seed}")  # apart: the slips of a seed stay as they were
    verified = [verify_rng.random() < verifies for _ in sources]

    async def one(i: int, task: Task, files: Mapping[str, str] | None) -> Trajectory | None:
        async with sem:
            try:
                for slip in dict.fromkeys((slipped[i], False)):
                    with contextlib.suppress(TaskError):
                        demo = await oracle_demo(task, files, tok, fmt, tool_objs, cfg, slip,
                                                 seed=seed * 1_000_003 + i, verify=verified[i])
                        if demo is not None:
                            return demo
                return None
            except (LooprlError, OSError):
                return None
            finally:
                if progress:
                    progress(1)

    got = await asyncio.gather(*(one(i, t, f) for i, (t, f) in enumerate(sources)))
    return [t for t in got if t is not None]
