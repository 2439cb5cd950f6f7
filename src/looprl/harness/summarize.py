"""Self-summarization: when a segment's context grows past a trigger, the model summarizes its own
work and the trajectory goes on in a fresh, shorter context — a new ``Segment`` of the same chain.

    cfg = AgentConfig(experimental=AgentExperimental(max_summaries=3, summarize_at_tokens=6_000,
                                                     summary_max_tokens=512))
    traj = await run_agent(task, sandbox, engine, fmt, tools, cfg, ...)  # wires a Summarizer in

``run_agent`` builds a ``Summarizer`` when ``cfg.experimental.max_summaries > 0`` and calls it
from ``make_room`` once the open segment holds ``summarize_at(cfg)`` tokens. One summary:

1. The observation the policy has not read yet (the latest tool results + the assistant header)
   is rendered again with ``SUMMARIZE_INSTRUCTION`` (a user message) after the tool results, so
   the instruction ends the CURRENT segment (loss mask 0).
2. The policy writes the summary as a normal generation — its own tokens, loss mask 1, the
   engine's logprobs and policy versions — of at most ``summary_max_tokens``, trained like any turn.
3. The segment is closed and a new one starts from a fresh context, rendered by
   ``ChatFormat.prompt_ids`` (token exact: these are the tokens the policy is prompted with next):

       system (cfg.experimental.system_prompt or the template's default, + tool schemas)
       user       task prompt
       user       SUMMARY_FRAME with the summary (thinking and tool-call blocks stripped)
       assistant  the latest action turn (its text and tool calls)
       tool ...   that turn's results
       <assistant header>

   The latest turn keeps the exact state the next action depends on (a file just read, a test
   output) which a summary tends to paraphrase. It is left out when the new context would not
   be shorter than the trigger; if even system + task + summary is not, the run ends.

Endings: a summary cut by ``summary_max_tokens`` or the window (ours, or the engine's own, which
raises ``ContextFullError``), an instruction that does not fit, or a fresh context that is not
shorter than the trigger end the run with CONTEXT_FULL (MAX_TOKENS when the trajectory's token
budget cut the summary; WALL_TIME when the clock ran out). After ``max_summaries`` summaries the
hook declines and the run goes on until the window is full.

Records: ``Counters.summaries`` counts new contexts started; ``Counters.summary_tokens`` counts
every token sampled for summaries (also part of ``output_tokens``; summary turns are not
``turns``). ``Trajectory.summaries`` holds one ``SelfSummary`` per summary (the segment
summarized, its size at the trigger, the fresh context's size, the summary's tokens). In ``messages`` a summary reads:
user ``SUMMARIZE_INSTRUCTION`` (name "summarize"), assistant summary (name "summary"), then
the framed summary (user, name "new_context") that marks where the new segment starts; the
latest turn, already shown just above, is not repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looprl.chat import ChatFormat
from looprl.errors import ContextFullError
from looprl.harness.run_state import (
    AgentConfig,
    AgentRun,
    WallTime,
    before,
    check_generation,
    summarize_at,
)
from looprl.protocols import Engine
from looprl.types import Message, SamplingParams, SelfSummary, StopReason

SUMMARIZE_INSTRUCTION = (
    "Your context is nearly full and will be reset. Write a summary of your work so far for "
    "yourself: what the task needs, what you found (files, functions, causes), what you changed, "
    "what failed, and what to do next. Be concrete and brief. Do not call tools in this reply.")
"""The user message appended to the current segment to ask for a summary."""

SUMMARY_FRAME = "Summary of your work so far (your earlier context was reset):\n{summary}"
"""How the summary is shown at the top of the new context, after the task prompt."""


def latest_turn(messages: list[Message]) -> list[Message]:
    """The last action turn: its assistant message and the tool results after it."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m["role"] == "assistant" and m.get("name") != "summary":
            return list(messages[i:])
    return []


@dataclass
class Summarizer:
    """The ``on_context_full`` hook of ``run_agent`` that summarizes; see the module docstring."""

    policy: Engine
    fmt: ChatFormat
    cfg: AgentConfig
    initial: list[Message]
    """System (if any) + task prompt: the start of every context."""
    tools: list[dict[str, Any]]
    """Tool schemas rendered into every fresh context (as in the first one)."""
    deadline: float
    session_id: str
    group_id: str

    async def __call__(self, run: AgentRun) -> bool:
        if (run.counters["summaries"] >= self.cfg.experimental.max_summaries
                or 1 not in run.loss_mask):
            return False  # capped, or nothing sampled in this context yet: nothing to summarize
        tokens_before, latest = len(run.token_ids), latest_turn(run.messages)
        if not self._ask(run, latest[1:]):
            run.stop = StopReason.CONTEXT_FULL
            return False
        written = await self._write(run)
        if written is None:
            return False
        summary, n_summary = written
        fresh = self._fresh_context(summary, latest)
        if fresh is None:
            run.stop = StopReason.CONTEXT_FULL
            return False
        ids, framed = fresh
        run.summaries.append(SelfSummary(segment=len(run.segments), tokens_before=tokens_before,
                                         tokens_after=len(ids), summary_tokens=n_summary))
        run.close_segment()
        run.add_context(ids)
        run.messages.append(framed)
        run.counters["summaries"] += 1
        return True

    def _ask(self, run: AgentRun, tool_msgs: list[Message]) -> bool:
        """Replace the unread observation with tool results + instruction + assistant header.
        False (nothing added) if that leaves less than ``min_turn_tokens`` for the summary."""
        cut_turn = run.token_ids[run.seen - 1] not in self.fmt.end_ids
        run.drop_unseen()
        instruction: Message = {"role": "user", "name": "summarize", "content": SUMMARIZE_INSTRUCTION}
        obs = self.fmt.observation_ids(tool_msgs + [instruction])
        if cut_turn:  # as in the loop: close a cut turn before what follows it
            obs = [self.fmt.eot_id] + obs
        free = self.cfg.context_window - len(run.token_ids) - len(obs)
        if free < self.cfg.experimental.min_turn_tokens:
            return False
        run.add_context(obs)
        run.messages.append(instruction)
        return True

    async def _write(self, run: AgentRun) -> tuple[str, int] | None:
        """Sample the summary into the current segment: (its text, its token count), or None
        (``run.stop`` set) if it was cut, the clock ran out or the engine's own window is full."""
        cfg, x = self.cfg, self.cfg.experimental
        budget = cfg.max_total_new_tokens - run.counters["output_tokens"]
        params = SamplingParams(
            max_new_tokens=min(x.summary_max_tokens, budget, cfg.context_window - len(run.token_ids)),
            temperature=x.temperature, top_p=x.top_p)
        run.seen = len(run.token_ids)
        try:
            gen = await before(self.deadline, self.policy.generate(
                list(run.token_ids), params, session_id=self.session_id, group_id=self.group_id))
        except WallTime:
            run.stop = StopReason.WALL_TIME
            return None
        except ContextFullError:  # the engine's window is smaller than cfg.context_window: the
            run.stop = StopReason.CONTEXT_FULL  # trajectory outgrew it, as in a turn (scored)
            return None
        check_generation(gen, params)
        run.add_generation(gen)
        run.counters["summary_tokens"] += len(gen.token_ids)
        text = self.fmt.decode(gen.token_ids)
        run.messages.append({"role": "assistant", "name": "summary", "content": text})
        if gen.finish_reason != "stop":
            spent = run.counters["output_tokens"] >= cfg.max_total_new_tokens
            run.stop = StopReason.MAX_TOKENS if spent else StopReason.CONTEXT_FULL
            return None
        return self.fmt.parse(text).content, len(gen.token_ids)  # (the template may open <think>)

    def _fresh_context(self, summary: str, latest: list[Message]
                       ) -> tuple[list[int], Message] | None:
        """Token ids of the new segment's context (with the latest turn if it fits)."""
        framed: Message = {"role": "user", "name": "new_context",
                           "content": SUMMARY_FRAME.format(summary=summary)}
        limit = summarize_at(self.cfg)
        for tail in (latest, []):
            ids = self.fmt.prompt_ids(self.initial + [framed] + tail, self.tools)
            if len(ids) < limit:
                return ids, framed
        return None
