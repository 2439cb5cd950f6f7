"""The agent loop: policy <-> tools until the model finishes, answers, or a budget runs out.

    traj = await run_agent(task, sandbox, engine, ChatFormat(tok), make_tools(), AgentConfig(),
                           group_id="g0", trajectory_id="g0/0")

Read top to bottom: ``run_agent`` -> ``_loop`` (one turn: generate -> parse -> execute) ->
``execute_calls``. The message list (OpenAI shape) is the readable trajectory; the ``Segment``s
hold exactly the tokens the policy saw and emitted — prompt, sampled tokens (loss mask 1, the
engine's logprobs and policy versions), then observation tokens appended after each turn.
Self-summarization (``summarize.py``) plugs in at ``make_room``: with ``max_summaries > 0`` the
run summarizes when its open segment reaches ``summarize_at(cfg)`` tokens and continues in a new
segment. Failures are attributed once: a malformed call is a *broken* tool result the model sees; a tool's
``ToolError`` is an *error* result; ``SandboxError`` / ``PolicyError`` end the trajectory as
``INFRA_ERROR``, which is dropped and never scored. Nothing the policy emits raises out of
``run_agent``: whatever it writes is a turn, a call, or a broken call (``looprl.chat`` says how a
turn is read). Any other exception is a bug of the harness, not the model's doing: it is logged
and ends the trajectory as ``INFRA_ERROR``. Tool results are made valid UTF-8 before the model
sees them (a file name that is not UTF-8 shows as escapes), so every trajectory saves as text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from looprl.chat import ChatFormat, ParsedTurn
from looprl.errors import (
    ContextFullError,
    InfraKind,
    PolicyError,
    SandboxError,
    ToolCallError,
    ToolError,
    infra_kind,
)
from looprl.harness.run_state import (
    AgentConfig,
    AgentRun,
    ContextHook,
    WallTime,
    before,
    check_generation,
    summarize_at,
)
from looprl.harness.summarize import Summarizer
from looprl.harness.tools import ToolContext, tool_schemas, validate_args
from looprl.models.fingerprint import METADATA_KEY, tokenizer_fingerprint
from looprl.protocols import Engine, Sandbox, Tool
from looprl.types import (
    Counters,
    Message,
    SamplingParams,
    StopReason,
    Task,
    TokenSpan,
    ToolResult,
    Trajectory,
)

log = logging.getLogger(__name__)


def initial_messages(task: Task, cfg: AgentConfig) -> list[Message]:
    prompt = cfg.experimental.system_prompt
    system: list[Message] = [{"role": "system", "content": prompt}] if prompt else []
    return system + [{"role": "user", "content": task.prompt}]


async def run_agent(task: Task, sandbox: Sandbox, policy: Engine, fmt: ChatFormat,
                    tools: list[Tool], cfg: AgentConfig, *, group_id: str, trajectory_id: str,
                    on_context_full: ContextHook | None = None) -> Trajectory:
    """Run the agent on ``task`` in ``sandbox`` until it stops; never raises for model mistakes
    or infrastructure failures (those end the trajectory with ``INFRA_ERROR``)."""
    t0 = time.monotonic()
    ctx = ToolContext(sandbox=sandbox)
    run = AgentRun(messages=initial_messages(task, cfg))
    run.add_context(fmt.prompt_ids(run.messages, tool_schemas(tools)))
    if on_context_full is None and cfg.experimental.max_summaries > 0:
        on_context_full = Summarizer(policy, fmt, cfg, list(run.messages), tool_schemas(tools),
                                     deadline=t0 + cfg.experimental.wall_time_s,
                                     session_id=trajectory_id,
                                     group_id=group_id)
    if cfg.context_window - len(run.token_ids) < cfg.experimental.min_turn_tokens:
        # Not the model's doing: the task and tool schemas alone do not fit. Never scored.
        prompt_tokens = len(run.token_ids)
        await policy.release(trajectory_id)
        run.close_segment()
        return Trajectory(
            task_id=task.id, group_id=group_id, segments=tuple(run.segments),
            messages=tuple(run.messages), counters=Counters(**run.counters),
            stop_reason=StopReason.INFRA_ERROR, id=trajectory_id, wall_s=time.monotonic() - t0,
            error=(f"the task prompt and tool schemas take {prompt_tokens} tokens, leaving "
                   f"less than min_turn_tokens={cfg.experimental.min_turn_tokens} of context_window="
                   f"{cfg.context_window}; raise agent.context_window or offer fewer tools"),
            infra_kind=InfraKind.INTERNAL.value)
    stop, error, kind, diff = await drive(run, sandbox, ctx, policy, fmt, tools, cfg, t0,
                                          group_id, trajectory_id, on_context_full)
    return Trajectory(
        task_id=task.id, group_id=group_id, segments=tuple(run.segments),
        messages=tuple(run.messages), counters=Counters(**run.counters), stop_reason=stop,
        diff=diff, error=error, wall_s=time.monotonic() - t0, id=trajectory_id,
        infra_kind=kind if stop == StopReason.INFRA_ERROR else "",
        summaries=tuple(run.summaries), broken_spans=tuple(run.broken_spans),
        metadata={"memory": json.dumps(ctx.memory), "finish_summary": ctx.finish_summary,
                  METADATA_KEY: tokenizer_fingerprint(fmt.tokenizer)})  # what made the ids


async def drive(run: AgentRun, sandbox: Sandbox, ctx: ToolContext, policy: Engine,
                fmt: ChatFormat, tools: list[Tool], cfg: AgentConfig, t0: float, group_id: str,
                trajectory_id: str, on_context_full: ContextHook | None,
                before: Callable[[], Awaitable[object]] | None = None,
                ) -> tuple[StopReason, str | None, str, str]:
    """Run ``before`` (if any) and the agent loop on ``run`` to its end: (stop reason, error,
    infrastructure kind, the sandbox's diff). A sandbox or engine failure, or a harness bug, ends
    it as ``INFRA_ERROR`` (never the model's fault, never a crash); the engine's session is
    released and the open segment closed whatever happened."""
    diff, kind = "", ""
    error: str | None
    try:
        if before is not None:
            await before()
        stop, error = await _loop(run, ctx, policy, fmt, tools, cfg, t0, group_id, trajectory_id,
                                  on_context_full)
        kind = run.infra_kind
        if stop != StopReason.INFRA_ERROR:
            diff = await sandbox.diff()
    except (SandboxError, PolicyError) as e:
        stop, error, kind = StopReason.INFRA_ERROR, f"{type(e).__name__}: {e}", infra_kind(e).value
    except Exception as e:  # noqa: BLE001 — a harness bug: never the model's fault, never a crash
        log.exception("trajectory %s: internal error in the agent loop", trajectory_id)
        stop, error = StopReason.INFRA_ERROR, f"internal error: {type(e).__name__}: {e}"
        kind = InfraKind.INTERNAL.value
    finally:
        try:
            await policy.release(trajectory_id)
        except Exception:  # noqa: BLE001 — forgetting a session cannot change the trajectory
            pass
    run.close_segment()
    return stop, error, kind, diff


async def _loop(run: AgentRun, ctx: ToolContext, policy: Engine, fmt: ChatFormat,
                tools: list[Tool], cfg: AgentConfig, t0: float, group_id: str,
                trajectory_id: str, on_context_full: ContextHook | None,
                ) -> tuple[StopReason, str | None]:
    by_name = {t.name: t for t in tools}
    deadline = t0 + cfg.experimental.wall_time_s
    while True:
        if run.counters["turns"] >= cfg.max_turns:
            return StopReason.MAX_TURNS, None
        budget = cfg.max_total_new_tokens - run.counters["output_tokens"]
        if budget <= 0:
            return StopReason.MAX_TOKENS, None
        if not await make_room(run, cfg, on_context_full):
            return run.stop or StopReason.CONTEXT_FULL, None
        params = SamplingParams(max_new_tokens=min(cfg.max_new_tokens, budget,
                                                   cfg.context_window - len(run.token_ids)),
                                temperature=cfg.experimental.temperature,
                                top_p=cfg.experimental.top_p)
        run.seen = len(run.token_ids)
        try:
            gen = await before(deadline, policy.generate(
                list(run.token_ids), params, session_id=trajectory_id, group_id=group_id))
        except WallTime:
            return StopReason.WALL_TIME, None
        except ContextFullError:  # the engine's own window is smaller than cfg.context_window
            return StopReason.CONTEXT_FULL, None
        check_generation(gen, params)
        start = len(run.token_ids)
        run.add_generation(gen)
        run.counters["turns"] += 1
        prefix = f"call_{run.counters['turns']}"
        turn = fmt.parse_ids(gen.token_ids, call_prefix=prefix)
        run.counters["thinking_tokens"] += turn.thinking_tokens
        run.counters["tool_call_tokens"] += turn.tool_call_tokens
        run.messages.append(assistant_message(turn))
        if not turn.tool_calls and not turn.errors:
            cut = gen.finish_reason == "length"
            return (StopReason.MAX_TOKENS if cut else StopReason.ANSWERED), None
        try:
            results = await before(deadline, execute_calls(
                turn, by_name, ctx, call_prefix=prefix, max_calls=cfg.experimental.max_calls_per_turn))
        except WallTime:
            return StopReason.WALL_TIME, None
        run.counters["tool_calls"] += len(results)
        run.counters["broken_tool_calls"] += sum(r.broken for r in results)
        run.broken_spans += broken_spans(turn, results, len(run.segments), start,
                                         start + len(gen.token_ids))
        tool_msgs = [tool_message(r) for r in results]
        run.messages.extend(tool_msgs)
        infra = [r for r in results if r.status == "infra_error"]
        if infra:
            run.infra_kind = infra[0].infra_kind
            return StopReason.INFRA_ERROR, f"tool {infra[0].name}: {infra[0].content}"
        if ctx.finished:
            return StopReason.FINISHED, None
        obs = fmt.observation_ids(tool_msgs)
        if gen.token_ids[-1] not in fmt.end_ids:  # the turn was cut: close it before the tool output
            obs = [fmt.eot_id] + obs
        run.add_context(obs)
        run.counters["tool_output_tokens"] += len(obs)


async def make_room(run: AgentRun, cfg: AgentConfig, on_context_full: ContextHook | None) -> bool:
    """THE self-summarization hook point: when the open segment reaches ``summarize_at(cfg)``,
    ``on_context_full`` may summarize (close the segment and start a new one). False (the run
    ends, with ``run.stop`` or CONTEXT_FULL) if a hook stopped it or a turn does not fit."""
    if len(run.token_ids) < summarize_at(cfg):
        return True
    if on_context_full is not None:
        await on_context_full(run)
    free = cfg.context_window - len(run.token_ids)
    return run.stop is None and free >= cfg.experimental.min_turn_tokens


def broken_spans(turn: ParsedTurn, results: list[ToolResult], segment: int, start: int,
                 end: int) -> list[TokenSpan]:
    """The tokens of each broken call's block in the open segment ``segment``, for a turn
    sampled as tokens ``start:end``. ``results`` come in call order, then one per unparseable
    block (``execute_calls``). Without token spans (a turn parsed from text) a broken call
    spans the whole turn."""
    blocks = list(turn.call_token_spans) + list(turn.error_token_spans)
    if len(blocks) != len(turn.tool_calls) + len(turn.errors):
        blocks = [(0, end - start)] * len(results)
    return [TokenSpan(segment, start + blocks[i][0], start + blocks[i][1])
            for i, r in enumerate(results) if r.broken]


def assistant_message(turn: ParsedTurn) -> Message:
    content = (f"<think>{turn.thinking_text}</think>\n" if turn.thinking_text else "") + turn.content
    msg: Message = {"role": "assistant", "content": content}
    if turn.tool_calls:
        msg["tool_calls"] = [c.to_openai() for c in turn.tool_calls]
    return msg


def tool_message(r: ToolResult) -> Message:
    return {"role": "tool", "tool_call_id": r.call_id, "name": r.name, "content": utf8_text(r.content)}


def utf8_text(text: str) -> str:
    """``text`` as valid Unicode, so the tokenizer can encode it and the trajectory saves: a
    file name that is not UTF-8 (Python lists its bytes as lone surrogates) shows its bytes as
    escapes (``bad\\xffname``); any other lone surrogate shows as ``\\udXXX``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


async def execute_calls(turn: ParsedTurn, tools: dict[str, Tool], ctx: ToolContext, *,
                        call_prefix: str = "call", max_calls: int | None = None) -> list[ToolResult]:
    """Run a turn's calls: consecutive read-only calls concurrently, mutating ones alone and in
    order; results in call order, then one broken result per unparseable block. Calls past
    ``max_calls`` are not run: each is a broken result."""
    prepared: list[tuple[str, str, Tool, dict[str, Any]] | ToolResult] = []
    for k, call in enumerate(turn.tool_calls):
        tool = tools.get(call.name)
        if max_calls is not None and k >= max_calls:
            prepared.append(ToolResult(call.id, call.name, f"Invalid tool call: this turn made "
                                       f"{len(turn.tool_calls)} calls and at most {max_calls} run "
                                       "per turn; make this call again in your next turn",
                                       "broken"))
            continue
        if tool is None:
            prepared.append(ToolResult(call.id, call.name, f"Invalid tool call: unknown tool "
                                       f"{call.name!r}; available: {', '.join(sorted(tools))}",
                                       "broken"))
            continue
        try:
            prepared.append((call.id, call.name, tool, validate_args(tool, json.loads(call.arguments))))
        except ToolCallError as e:
            prepared.append(ToolResult(call.id, call.name, f"Invalid tool call: {e}", "broken"))
    results: list[ToolResult] = []
    batch: list[tuple[str, str, Tool, dict[str, Any]]] = []
    for item in prepared + [None]:
        if isinstance(item, tuple) and item[2].read_only:
            batch.append(item)
            continue
        results += await asyncio.gather(*(_run_one(*b, ctx) for b in batch))
        batch = []
        if isinstance(item, ToolResult):
            results.append(item)
        elif item is not None:
            results.append(await _run_one(*item, ctx))
    for k, err in enumerate(turn.errors):
        rid = turn.error_ids[k] if k < len(turn.error_ids) else f"{call_prefix}_err{k}"
        results.append(ToolResult(rid, "invalid_tool_call",
                                  f"Invalid tool call: {err}", "broken"))
    return results


async def _run_one(call_id: str, name: str, tool: Tool, args: dict[str, Any],
                   ctx: ToolContext) -> ToolResult:
    t = time.monotonic()
    kind = ""
    try:
        content, status = await tool.run(args, ctx), "ok"
    except ToolError as e:
        content, status = f"Error: {e}", "error"
    except ToolCallError as e:
        content, status = f"Invalid tool call: {e}", "broken"
    except SandboxError as e:
        content, status, kind = f"SandboxError: {e}", "infra_error", infra_kind(e).value
    except Exception as e:  # noqa: BLE001 — a bug in a tool is not the model's fault
        content, status = f"internal error in tool {name}: {type(e).__name__}: {e}", "infra_error"
        kind = InfraKind.INTERNAL.value
    return ToolResult(call_id, name, content, status, time.monotonic() - t,  # type: ignore[arg-type]
                      infra_kind=kind)
