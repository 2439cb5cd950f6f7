"""The state one agent run carries, shared by the loop (``agent.py``) and self-summarization
(``summarize.py``): the budgets (``AgentConfig``), the open segment and counters (``AgentRun``),
and the helpers both use to wait on the engine within the run's deadline and check what it
returned. Neither of the two modules imports the other's internals: both build on this one.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

from looprl.config import Range, Tokens
from looprl.errors import PolicyError
from looprl.types import (
    Generation,
    Message,
    Routes,
    SamplingParams,
    Segment,
    SelfSummary,
    StopReason,
    TokenSpan,
)

T = TypeVar("T")


@dataclass(frozen=True)
class AgentExperimental:
    """Sampling, wall time, self-summarization and per-turn limits of one agent run: research
    switches and tuning knobs (``experimental`` in ``looprl.config``)."""

    wall_time_s: Annotated[float, Range(0.0, 1e7, lo_open=True)] = 900.0
    """Wall-clock seconds for the whole run (generation and tools) before WALL_TIME."""
    min_turn_tokens: Tokens = 32
    """A turn needs this much free context; below it the context is full (summarize or stop)."""
    temperature: Annotated[float, Range(0.0, 100.0)] = 1.0
    """Sampling temperature (1.0 keeps logprobs on-policy for RL)."""
    top_p: Annotated[float, Range(0.0, 1.0, lo_open=True)] = 1.0
    """Nucleus sampling; 1.0 for RL."""
    system_prompt: str = ""
    """System message; empty keeps the chat template's own default."""
    max_summaries: Annotated[int, Range(0, 10_000)] = 0
    """Self-summarizations per trajectory (``summarize.py``); 0 = off, a full context ends the
    run with CONTEXT_FULL. Past the cap the run goes on until the window is full, then stops
    with CONTEXT_FULL."""
    summarize_at_tokens: Annotated[int, Range(0, 2**30)] = 0
    """Open-segment size (tokens) that triggers a summary; 0 = 3/4 of ``context_window`` (room
    left for the instruction and the summary). Capped at the point the context is full."""
    summary_max_tokens: Tokens = 512
    """Tokens the summary turn may sample; a summary cut here ends the run with CONTEXT_FULL."""
    max_calls_per_turn: Annotated[int, Range(1, 100_000)] = 128
    """Tool calls one turn may run; each call past it is a broken call (the model is told to
    make it next turn). Bounds what one sampled turn can start at once (concurrent commands,
    observation size); an oracle's turn of edits stays well below it."""


@dataclass(frozen=True)
class AgentConfig:
    """Budgets of one agent run (sampling and the rest in ``experimental``)."""

    max_turns: Annotated[int, Range(1, 100_000)] = 30
    """Model turns (generations) before the run stops with MAX_TURNS."""
    max_total_new_tokens: Tokens = 16_384
    """Model-sampled tokens over the whole trajectory before MAX_TOKENS."""
    max_new_tokens: Tokens = 1_024
    """Tokens one turn may sample; a turn cut here with no tool call ends with MAX_TOKENS."""
    context_window: Tokens = 8_192
    """Tokens one segment may hold (prompt + turns + observations)."""
    experimental: AgentExperimental = field(default_factory=AgentExperimental)


@dataclass
class AgentRun:
    """The mutable state of one run: messages, closed segments and the open segment's tokens."""

    messages: list[Message]
    segments: list[Segment] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routes: list[bytes] = field(default_factory=list)
    """Per token of the open segment: its ``Routes`` bytes (layers x top_k) when the engine
    recorded them, else empty."""
    route_shape: tuple[int, int] = (0, 0)
    """(layers, top_k) of the recorded routes."""
    seen: int = 0
    """How many tokens of the open segment the policy has seen (prompted with or sampled)."""
    stop: StopReason | None = None
    """Set by a context hook that must end the run (a summary cut off, wall time while summarizing)."""
    infra_kind: str = ""
    """The class of the infrastructure failure a tool hit, when one ended the run."""
    summaries: list[SelfSummary] = field(default_factory=list)
    """One record per self-summary (``Trajectory.summaries``)."""
    broken_spans: list[TokenSpan] = field(default_factory=list)
    """The broken tool calls' own blocks (``Trajectory.broken_spans``): the trainer's
    token-level credit finds them there."""
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("turns", "tool_calls", "broken_tool_calls", "thinking_tokens", "output_tokens",
         "tool_call_tokens", "tool_output_tokens", "summaries", "summary_tokens"), 0))

    def add_context(self, ids: list[int]) -> None:
        """Tokens the policy sees but did not sample (prompt, observations)."""
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.versions += [-1] * len(ids)
        self.routes += [b""] * len(ids)

    def add_generation(self, gen: Generation) -> None:
        self.token_ids += gen.token_ids
        self.logprobs += gen.logprobs
        self.loss_mask += [1] * len(gen.token_ids)
        self.versions += gen.policy_versions
        r = gen.routes
        if r is not None and r.tokens == len(gen.token_ids):
            w, raw = r.layers * r.top_k, r.raw
            self.route_shape = (r.layers, r.top_k)
            self.routes += [raw[i * w:(i + 1) * w] for i in range(len(gen.token_ids))]
        else:
            self.routes += [b""] * len(gen.token_ids)
        self.counters["output_tokens"] += len(gen.token_ids)
        self.seen = len(self.token_ids)

    def drop_unseen(self) -> None:
        """Drop an observation the policy never got to see (the run stopped before the next
        generation), so the segment is exactly what the policy saw and emitted."""
        for buf in (self.token_ids, self.logprobs, self.loss_mask, self.versions, self.routes):
            del buf[self.seen:]

    def close_segment(self) -> None:
        """Freeze the open segment (self-summarization then starts a new one with add_context).
        Tokens after the policy's last look (an observation it never got to read) are dropped."""
        self.drop_unseen()
        if self.token_ids:
            self.segments.append(Segment(tuple(self.token_ids), tuple(self.logprobs),
                                         tuple(self.loss_mask), tuple(self.versions),
                                         _segment_routes(self.routes, *self.route_shape)))
        self.token_ids, self.logprobs, self.loss_mask, self.versions = [], [], [], []
        self.routes = []
        self.seen = 0


def _segment_routes(per_token: list[bytes], layers: int, top_k: int) -> Routes | None:
    """One segment's routes (tokens without a record: none), or None when no token has one."""
    w = layers * top_k
    if not w or not any(per_token):
        return None
    raw = b"".join(r if len(r) == w else b"\xff" * w for r in per_token)
    return Routes(layers, top_k, base64.b64encode(raw).decode())


ContextHook = Callable[[AgentRun], Awaitable[bool]]
"""Called when the open segment reaches ``summarize_at(cfg)``; may close the segment and start a
shorter one (returns True), or decline (False), or set ``run.stop`` to end the run."""


class WallTime(Exception):
    """The run's wall-clock deadline passed while it waited (``before``)."""


def summarize_at(cfg: AgentConfig) -> int:
    """Open-segment size at which ``make_room`` calls the context hook: the summary trigger when
    summarization is on, else the point where less than ``min_turn_tokens`` are left."""
    full = cfg.context_window - cfg.experimental.min_turn_tokens + 1
    if cfg.experimental.max_summaries <= 0:
        return full
    return min(full, cfg.experimental.summarize_at_tokens or cfg.context_window * 3 // 4)


async def before(deadline: float, aw: Awaitable[T]) -> T:
    """Await ``aw`` but give up (cancelling it) at the run's wall-clock deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        if hasattr(aw, "close"):
            aw.close()
        raise WallTime
    try:
        return await asyncio.wait_for(aw, remaining)
    except asyncio.TimeoutError:
        raise WallTime from None


def check_generation(gen: Generation, params: SamplingParams) -> None:
    n = len(gen.token_ids)
    if n == 0 or len(gen.logprobs) != n or len(gen.policy_versions) != n:
        raise PolicyError(f"engine returned {n} tokens, {len(gen.logprobs)} logprobs and "
                          f"{len(gen.policy_versions)} versions; each generation needs >=1 token "
                          "and one logprob and version per token")
    if n > params.max_new_tokens:
        raise PolicyError(f"engine returned {n} tokens for max_new_tokens={params.max_new_tokens}")
