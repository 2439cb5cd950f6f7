"""Hinted continuations (issue 54): re-run the policy from turn ``k`` of a finished trajectory
with a hint inserted after that turn's tool results, through the same agent loop, token-exact.

    teacher = await continue_with_hint(task, sandbox, engine, fmt, tools, cfg, traj,
                                       turn=2, text="this call is malformed: ...",
                                       group_id="g0", trajectory_id="g0/0+hint")
    teacher.hint      # HintSpan: where the hint sits, and the unhinted tokens it replaced

The sandbox is brought to the state after turn ``k`` by running the trajectory's mutating calls
of turns ``1..k`` again, in order (read-only calls and ``finish`` are skipped; a replayed result
is not shown to the model: the context keeps the recorded tokens, so a command whose output
changes between runs still shows what the policy saw). The continuation's context is the
recorded segment up to the end of turn ``k``'s sampled tokens, then turn ``k``'s tool results
and the hint as one user message, rendered by ``fmt`` (loss mask 0: the hint is never a model
token). Every model token of the returned trajectory is the continuation's: the prefix is
context here (its model tokens are trained in the original trajectory). What the unhinted
policy saw at that point (the recorded observation, or for the last turn the same rendering
without the hint) is kept in ``HintSpan.student_ids_T`` for the trainer's distillation
(``trainer.distill``).

Budgets: the continuation keeps the trajectory's turn and token counts, but always has at least
one turn and one turn's worth of tokens left (a hint after the last allowed turn would otherwise
have no continuation). Self-summarized trajectories (several segments) are not continued.
"""

from __future__ import annotations

import json
import time

from looprl.chat import ChatFormat
from looprl.errors import ToolCallError, ToolError
from looprl.harness.agent import drive
from looprl.harness.run_state import AgentConfig, AgentRun
from looprl.harness.tools import ToolContext, validate_args
from looprl.models.fingerprint import METADATA_KEY, tokenizer_fingerprint
from looprl.protocols import Engine, Sandbox, Tool
from looprl.types import Counters, HintSpan, Message, StopReason, Task, Trajectory


def turn_messages(messages: tuple[Message, ...]) -> list[tuple[int, int]]:
    """Per assistant turn: (its index in ``messages``, one past its last tool result)."""
    out: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            out.append((i, i + 1))
        elif m.get("role") == "tool" and out:
            out[-1] = (out[-1][0], i + 1)
    return out


async def replay_calls(messages: list[Message], tools: dict[str, Tool], ctx: ToolContext) -> int:
    """Run again the mutating calls of these assistant ``messages``, in order; the calls that
    cannot run now (malformed, unknown, failing) are skipped as they were. Returns calls run."""
    ran = 0
    for m in messages:
        for call in m.get("tool_calls") or ():
            fn = call.get("function", call)
            tool = tools.get(str(fn.get("name")))
            if tool is None or tool.read_only or tool.name == "finish":
                continue
            try:
                raw = fn.get("arguments")
                args = validate_args(tool, json.loads(raw) if isinstance(raw, str) else raw)
                await tool.run(args, ctx)
                ran += 1
            except (ToolError, ToolCallError, json.JSONDecodeError, TypeError):
                continue
    return ran


async def continue_with_hint(task: Task, sandbox: Sandbox, policy: Engine, fmt: ChatFormat,
                             tools: list[Tool], cfg: AgentConfig, prefix: Trajectory, *,
                             turn: int, text: str, kind: str = "", group_id: str,
                             trajectory_id: str) -> Trajectory:
    """The policy's continuation of ``prefix`` after turn ``turn`` (1-based) with ``text``
    inserted as a user message; never raises for the model's mistakes or infrastructure failures
    (``INFRA_ERROR``, as ``run_agent``). A ``prefix`` it cannot continue is a ``ValueError``."""
    t0 = time.monotonic()
    if len(prefix.segments) != 1:
        raise ValueError(f"trajectory {prefix.id} has {len(prefix.segments)} segments: only "
                         "one-segment trajectories (no self-summary) can be continued with a hint")
    seg = prefix.segments[0]
    spans, turns = seg.model_turns(), turn_messages(prefix.messages)
    if len(spans) != len(turns) or not 1 <= turn <= len(turns):
        raise ValueError(f"trajectory {prefix.id}: turn {turn} is not one of its {len(turns)} "
                         f"turns ({len(spans)} runs of model tokens)")
    end = spans[turn - 1][1]
    first, past = turns[turn - 1]
    tool_msgs = list(prefix.messages[first + 1:past])
    hint_msg: Message = {"role": "user", "content": text}
    lead = [] if seg.token_ids_T[end - 1] in fmt.end_ids else [fmt.eot_id]  # a cut turn: close it
    teacher_obs = lead + fmt.observation_ids(tool_msgs + [hint_msg])
    student_obs = (list(seg.token_ids_T[end:spans[turn][0]]) if turn < len(turns)
                   else lead + fmt.observation_ids(tool_msgs))
    ctx = ToolContext(sandbox=sandbox)
    run = AgentRun(messages=list(prefix.messages[:past]) + [hint_msg])
    run.add_context(list(seg.token_ids_T[:end]) + teacher_obs)
    run.counters["turns"] = min(turn, cfg.max_turns - 1)
    run.counters["output_tokens"] = max(0, min(sum(seg.loss_mask_T[:end]),
                                        cfg.max_total_new_tokens - cfg.max_new_tokens))
    by_name = {t.name: t for t in tools}
    stop, error, kind_, diff = await drive(
        run, sandbox, ctx, policy, fmt, tools, cfg, t0, group_id, trajectory_id, None,
        before=lambda: replay_calls([prefix.messages[i] for i, _ in turns[:turn]], by_name, ctx))
    hint = HintSpan(turn, text, end, end + len(teacher_obs), tuple(student_obs), kind)
    return Trajectory(
        task_id=task.id, group_id=group_id, segments=tuple(run.segments),
        messages=tuple(run.messages), counters=Counters(**run.counters), stop_reason=stop,
        diff=diff, error=error, wall_s=time.monotonic() - t0, id=trajectory_id,
        infra_kind=kind_ if stop == StopReason.INFRA_ERROR else "",
        broken_spans=tuple(run.broken_spans), hint=hint,
        metadata={"hinted_from": prefix.id, METADATA_KEY: tokenizer_fingerprint(fmt.tokenizer)})
