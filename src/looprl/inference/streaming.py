"""Token streaming over any ``Engine``: one generation continued in chunks on one KV session.

    async with aclosing(stream_generate(engine, prompt_ids, params, tokenizer=tok)) as parts:
        async for part in parts:          # part.token_ids: the new tokens; finish_reason on the last
            ...

The ``Engine`` protocol answers whole generations, so a stream asks for 1, 2, 4, 8 and then 16
tokens at a time: the first token comes back as soon as the prompt is prefilled, and later
chunks cost one extra one-token prefill per 16 tokens. Every chunk is a request on the same
session (the caller's ``session_id``, else a private one released at the end), so an engine that
keeps a session's KV (``TorchEngine``) prefills only the one token it has not seen; ``group_id``
still shares the prompt's KV between the choices of one request. The engine checks stop strings
within a chunk; one that spans two chunks is caught here, and the tokens after it are dropped,
as the engine would have stopped there. A seeded request seeds each chunk from its seed and the
chunk's offset: a streamed sample is reproducible, but it is not the sample the same request
draws without streaming (greedy decoding is the same either way).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from looprl.errors import ContextFullError
from looprl.protocols import Engine
from looprl.types import SamplingParams

CHUNKS = (1, 2, 4, 8, 16)
"""Tokens asked for by the first chunks of a stream; every later chunk asks for the last."""


@dataclass(frozen=True)
class StreamPart:
    """Tokens sampled since the previous part (possibly none on the last part)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_versions: tuple[int, ...]
    finish_reason: str | None = None
    """None until the last part: then stop, length or abort (as ``Generation``'s)."""


def chunk_seed(seed: int, offset: int) -> int:
    """The seed of the chunk that starts ``offset`` tokens into a seeded stream."""
    return (seed * 1_000_003 + offset) % 2**63


def stop_at(tokenizer: Any, before: list[int], new: list[int], stops: tuple[str, ...]) -> int | None:
    """How many of ``new`` to keep when a stop string ends inside them (None: none does), read
    as the engine reads it: on the decoded tail of the output, the longest stop's byte length
    plus one tokens long."""
    if not stops:
        return None
    longest = max(len(s.encode()) for s in stops)
    out = before + new
    for k in range(len(before) + 1, len(out) + 1):
        tail = tokenizer.decode(out[max(0, k - longest - 1):k])
        if any(s in tail for s in stops):
            return k - len(before)
    return None


async def stream_generate(engine: Engine, prompt_ids: list[int], params: SamplingParams, *,
                          tokenizer: Any, session_id: str | None = None,
                          group_id: str | None = None) -> AsyncGenerator[StreamPart, None]:
    """The generation ``engine.generate(prompt_ids, params)`` would make, in parts as it is
    sampled (module docstring). Close it (``contextlib.aclosing``) to release its session."""
    session = session_id or f"stream-{uuid.uuid4().hex}"
    out: list[int] = []
    k = 0
    try:
        while True:
            want = min(CHUNKS[min(k, len(CHUNKS) - 1)], params.max_new_tokens - len(out))
            seed = None if params.seed is None else chunk_seed(params.seed, len(out))
            try:
                gen = await engine.generate(
                    list(prompt_ids) + out,
                    dataclasses.replace(params, max_new_tokens=want, seed=seed),
                    session_id=session, group_id=group_id)
            except ContextFullError:
                if not out:
                    raise  # the prompt alone does not fit: the caller's error to report
                yield StreamPart((), (), (), "length")  # the context filled on a chunk's edge
                return
            new = list(gen.token_ids)
            keep = stop_at(tokenizer, out, new, params.stop)
            finish: str | None = None
            if keep is not None:
                new, finish = new[:keep], "stop"
            elif gen.finish_reason != "length":
                finish = gen.finish_reason
            elif len(out) + len(new) >= params.max_new_tokens or len(new) < want:
                finish = "length"  # the budget, or the engine's context, ran out
            n = len(new)
            out += new
            yield StreamPart(tuple(new), tuple(gen.logprobs[:n]), tuple(gen.policy_versions[:n]),
                             finish)
            if finish is not None:
                return
            k += 1
    finally:
        if session_id is None:
            await engine.release(session)
