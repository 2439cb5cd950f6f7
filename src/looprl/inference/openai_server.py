"""An OpenAI-compatible HTTP server over an engine (a TorchEngine, or a VLLMEngine): any looprl
model (the default one, or any local Llama/Qwen2 checkpoint) behind the API that agent
frameworks speak.

    looprl model serve ~/.cache/looprl/models/default --port 8000 --api-key s3cret
    in code:  app = create_app(engine, model_name="looprl", api_key="s3cret")
              asgi.run(app, host="127.0.0.1", port=8000, drain=app.state.drain, drain_s=30)

Routes: ``GET /health`` (no key; 503 while draining); ``GET /v1/models``;
``POST /v1/completions`` (``prompt`` as text or token ids; the choice carries ``token_ids`` and
``logprobs.token_logprobs``, as vLLM does with ``return_token_ids``); ``POST /v1/chat/completions``.
looprl extensions: request fields ``session_id`` / ``group_id`` (KV reuse), choice fields
``token_ids`` and ``policy_versions``, and ``POST /looprl/update_weights`` (a safetensors body,
``X-Policy-Version`` header), ``POST /looprl/release``, ``GET /looprl/version``.

Chat is the harness's format (``openai_chat``): the conversation is rendered token for token as
the harness renders a trajectory (``role: "tool"`` results and assistant messages with
``tool_calls`` included); the reply's ``<tool_call>`` blocks come back as ``message.tool_calls``
with ``finish_reason="tool_calls"``; broken blocks stay in ``content``. ``stream=true`` sends
Server-Sent Events in OpenAI's chunk shape (content deltas, tool-call deltas, the finish reason,
``usage`` with ``stream_options.include_usage``, then ``data: [DONE]``), generated in chunks on
one KV session (``streaming``). ``n`` choices are ``n`` generations that share the prompt's KV
(one ``group_id``); a seeded request's choice ``i`` uses ``seed + i``.

Requests are validated before anything runs (``openai_params.check_request``, the one place): a
parameter out of range, of the wrong type, unknown, or one this server cannot honour (penalties,
top-logprob alternatives, a forced or forbidden tool choice, JSON mode, images) is a 400 in
OpenAI's error shape naming it (``error.param``); an unknown model name is a 404
``model_not_found``, as OpenAI and vLLM answer; a prompt longer than the context is a 400
``context_length_exceeded``.

HTTP is ``looprl.asgi``'s: the API key (``Authorization: Bearer``) is checked from the headers
before any body byte is read (401; ``/health`` is open), bodies are capped (413; a weight update
may be as large as the model's weights), and on SIGTERM waiting requests answer 503 while running
ones get the drain's seconds. What this does NOT protect against: anyone holding the key can
sample and replace the weights (there is one key, no per-client identity or quotas, no TLS);
without a key the server is open to whoever reaches its port (``looprl model serve`` then binds
loopback only); see ``looprl.asgi`` for the HTTP-level limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from looprl.asgi import (
    ClientGone,
    Drain,
    Draining,
    Guard,
    bearer,
    unless_gone,
    validation_message,
)
from looprl.chat import ChatFormat
from looprl.errors import ContextFullError, PolicyError
from looprl.inference.openai_chat import ReplyStream, conversation_ids, parse_reply
from looprl.inference.openai_params import (
    BadParam,
    ChatRequest,
    CompletionRequest,
    ReleaseRequest,
    chat_messages,
    check_request,
)
from looprl.inference.streaming import StreamPart, stream_generate
from looprl.protocols import Engine
from looprl.types import Generation, SamplingParams

MAX_BODY = 16 << 20
"""Bytes of a generation request: a full context of a long-context model, JSON-escaped."""
API_KEY_ENV = "LOOPRL_API_KEY"
"""Where ``looprl model serve`` reads the API key when ``--api-key`` is not given."""


def _error_body(message: str, param: str | None, code: str | None = None,
                kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(status: int, message: str, param: str | None, code: str | None = None) -> JSONResponse:
    return JSONResponse(_error_body(message, param, code), status_code=status)


def _params(r: CompletionRequest | ChatRequest, choice: int, budget: int) -> SamplingParams:
    """Choice ``i`` of a seeded request samples with ``seed + i`` (n choices, not n copies)."""
    stop = (r.stop,) if isinstance(r.stop, str) else tuple(r.stop or ())
    seed = None if r.seed is None else (r.seed + choice) % 2**63
    return SamplingParams(max_new_tokens=budget, temperature=r.temperature, top_p=r.top_p,
                          stop=stop, seed=seed)


def _usage(n_prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": n_prompt, "completion_tokens": completion,
            "total_tokens": n_prompt + completion}


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


def _call_prefix() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ServedEngine(Engine, Protocol):
    """What the server needs of an engine beyond the ``Engine`` protocol."""

    tokenizer: Any
    max_len: int

    @property
    def vocab_size(self) -> int: ...

    @property
    def weights_bytes(self) -> int:
        """Bytes of a safetensors file holding every weight (a full update's body)."""
        ...


async def _merge(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """Items of several async iterators as they come; the first error ends all of them."""
    queue: asyncio.Queue[tuple[str | None, BaseException | None]] = asyncio.Queue()

    async def pump(s: AsyncIterator[str]) -> None:
        try:
            async for item in s:
                await queue.put((item, None))
            await queue.put((None, None))
        except Exception as e:  # noqa: BLE001 — handed to the consumer, which re-raises it
            await queue.put((None, e))

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            item, err = await queue.get()
            if err is not None:
                raise err
            if item is None:
                running -= 1
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Server:
    """The routes' work over one engine; ``create_app`` wires its methods to the paths."""

    def __init__(self, engine: ServedEngine, model_name: str, drain: Drain, drain_s: float,
                 tool_format: str | None = None) -> None:
        self.engine, self.model_name, self.drain, self.drain_s = engine, model_name, drain, drain_s
        self.tok = engine.tokenizer
        self.max_len = engine.max_len
        self.vocab = engine.vocab_size
        try:
            self.fmt: ChatFormat | None = ChatFormat(self.tok, tool_format=tool_format)
        except ValueError:  # a base model's tokenizer without a chat template: completions only
            if tool_format is not None and getattr(self.tok, "chat_template", None):
                raise  # the template contradicts the format asked for: a one-line error
            self.fmt = None

    def budget(self, r: CompletionRequest | ChatRequest, ids: list[int], param: str) -> int:
        """The tokens a choice may sample (after checking the prompt fits the context)."""
        if len(ids) >= self.max_len:
            raise BadParam(param, f"the prompt is {len(ids)} tokens; this model's context is "
                           f"{self.max_len} tokens", code="context_length_exceeded")
        asked = r.max_completion_tokens if isinstance(r, ChatRequest) else None
        return asked or r.max_tokens or self.max_len - len(ids)

    @staticmethod
    def group_of(r: CompletionRequest | ChatRequest, ids: list[int]) -> str | None:
        """n choices share the prompt's KV: one group per prompt unless the client names one."""
        if r.group_id is not None or r.n == 1:
            return r.group_id
        return "prompt-" + hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:24]

    async def run(self, request: Request, ids: list[int], r: CompletionRequest | ChatRequest,
                  param: str) -> list[Generation]:
        n_new, group = self.budget(r, ids, param), self.group_of(r, ids)
        work = asyncio.gather(*(self.engine.generate(ids, _params(r, i, n_new),
                                                     session_id=r.session_id, group_id=group)
                                for i in range(r.n)))
        try:
            return list(await unless_gone(request, self.drain, work,
                                          grace_s=max(0.1, self.drain_s - 0.5)))
        except ContextFullError as e:
            raise BadParam(param, str(e), code="context_length_exceeded") from None
        except ValueError as e:
            raise BadParam(param, str(e)) from None

    def streamed(self, events: AsyncGenerator[str, None]) -> StreamingResponse:
        """SSE of ``events``, then ``[DONE]``; a failure mid-stream is an error event (as OpenAI
        sends one) instead of a cut connection."""
        async def body() -> AsyncIterator[str]:
            try:
                async with contextlib.aclosing(events) as items:
                    async for item in items:
                        yield item
            except (PolicyError, ContextFullError, ValueError) as e:
                yield _sse(_error_body(f"{type(e).__name__}: {e}", None, "generation_failed",
                                       "server_error"))
                return
            yield _sse("[DONE]")

        if self.drain.started:
            raise Draining
        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def stream_parts(self, r: CompletionRequest | ChatRequest, ids: list[int], i: int, n_new: int,
                     group: str | None) -> AsyncGenerator[StreamPart, None]:
        return stream_generate(self.engine, ids, _params(r, i, n_new), tokenizer=self.tok,
                               session_id=r.session_id, group_id=group)

    async def health(self) -> JSONResponse:
        if self.drain.started:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.model_name,
                             "policy_version": self.engine.policy_version})

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                            "created": 0, "owned_by": "looprl",
                                            "max_model_len": self.max_len}]}

    async def completions(self, r: CompletionRequest, request: Request
                          ) -> dict[str, Any] | StreamingResponse:
        check_request(r, model_name=self.model_name, max_len=self.max_len)
        tok = self.tok
        ids = list(r.prompt) if isinstance(r.prompt, list) else tok.encode(r.prompt)
        if not ids or not all(0 <= i < self.vocab for i in ids):
            raise BadParam("prompt", f"the prompt must be text or token ids between 0 and "
                           f"{self.vocab - 1} (at least one)")
        base = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.model_name}
        if r.stream:  # the prompt is checked before the stream starts: a 400, not an event
            return self.streamed(self.completion_events(r, ids, base, self.budget(r, ids, "prompt")))
        gens = await self.run(request, ids, r, "prompt")
        choices = []
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {"index": i, "text": g.text, "finish_reason": g.finish_reason,
                                      "policy_versions": list(g.policy_versions), "logprobs": None}
            if r.return_token_ids:
                choice["token_ids"] = list(g.token_ids)
            if r.logprobs is not None:
                choice["logprobs"] = {"tokens": tok.convert_ids_to_tokens(list(g.token_ids)),
                                      "token_logprobs": list(g.logprobs)}
            choices.append(choice)
        return {**base, "choices": choices,
                "usage": _usage(len(ids), sum(len(g.token_ids) for g in gens))}

    async def completion_events(self, r: CompletionRequest, ids: list[int], base: dict[str, Any],
                                n_new: int) -> AsyncGenerator[str, None]:
        group, done, tok = self.group_of(r, ids), [0] * r.n, self.tok

        async def choice(i: int) -> AsyncIterator[str]:
            out: list[int] = []
            sent = ""
            async with contextlib.aclosing(self.stream_parts(r, ids, i, n_new, group)) as parts:
                async for part in parts:
                    out += part.token_ids
                    text = tok.decode(out, skip_special_tokens=False)
                    if part.finish_reason is None:  # a UTF-8 character may still be arriving
                        text = text.rstrip("\ufffd")
                    c: dict[str, Any] = {"index": i, "text": text[len(sent):], "logprobs": None,
                                         "finish_reason": part.finish_reason}
                    sent = text
                    if r.return_token_ids:
                        c["token_ids"] = list(part.token_ids)
                    if r.logprobs is not None:
                        c["logprobs"] = {"tokens": tok.convert_ids_to_tokens(list(part.token_ids)),
                                         "token_logprobs": list(part.logprobs)}
                    done[i] = len(out)
                    yield _sse({**base, "choices": [c]})

        async for event in _merge([choice(i) for i in range(r.n)]):
            yield event
        if (r.stream_options or {}).get("include_usage"):
            yield _sse({**base, "choices": [], "usage": _usage(len(ids), sum(done))})

    async def chat(self, r: ChatRequest, request: Request) -> dict[str, Any] | StreamingResponse:
        check_request(r, model_name=self.model_name, max_len=self.max_len)
        fmt = self.fmt
        if fmt is None:
            raise BadParam("messages", "this model's tokenizer has no chat template: use "
                           "/v1/completions, or serve a chat checkpoint")
        try:
            ids = conversation_ids(fmt, chat_messages(r.messages), r.tools)
        except Exception as e:  # noqa: BLE001 — the template rejects a malformed conversation
            raise BadParam("messages", f"the chat template cannot render these messages: "
                           f"{type(e).__name__}: {e}") from None
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": self.model_name}
        if r.stream:  # the prompt is checked before the stream starts: a 400, not an event
            return self.streamed(self.chat_events(r, ids, fmt,
                                                  {**base, "object": "chat.completion.chunk"},
                                                  self.budget(r, ids, "messages")))
        gens = await self.run(request, ids, r, "messages")
        return {**base, "object": "chat.completion",
                "choices": [self.chat_choice(r, fmt, i, g) for i, g in enumerate(gens)],
                "usage": _usage(len(ids), sum(len(g.token_ids) for g in gens))}

    def chat_choice(self, r: ChatRequest, fmt: ChatFormat, i: int, g: Generation
                    ) -> dict[str, Any]:
        reply = parse_reply(fmt, g.token_ids, _call_prefix(), g.finish_reason)
        choice: dict[str, Any] = {"index": i, "finish_reason": reply.finish_reason,
                                  "message": reply.message(), "token_ids": list(g.token_ids),
                                  "policy_versions": list(g.policy_versions), "logprobs": None}
        if r.logprobs:
            choice["logprobs"] = {"content": [
                {"token": t, "logprob": lp, "token_id": t_id} for t, lp, t_id in
                zip(self.tok.convert_ids_to_tokens(list(g.token_ids)), g.logprobs, g.token_ids,
                    strict=True)]}
        return choice

    async def chat_events(self, r: ChatRequest, ids: list[int], fmt: ChatFormat,
                          base: dict[str, Any], n_new: int) -> AsyncGenerator[str, None]:
        group, done = self.group_of(r, ids), [0] * r.n

        def chunk(i: int, delta: dict[str, Any], finish: str | None = None) -> str:
            return _sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": None,
                                              "finish_reason": finish}]})

        async def choice(i: int) -> AsyncIterator[str]:
            live = ReplyStream(fmt, _call_prefix())
            out: list[int] = []
            yield chunk(i, {"role": "assistant", "content": ""})
            async with contextlib.aclosing(self.stream_parts(r, ids, i, n_new, group)) as parts:
                async for part in parts:
                    out += part.token_ids
                    done[i] = len(out)
                    first = live.calls_sent
                    if part.finish_reason is None:
                        text, calls = live.feed(out)
                    else:
                        text, calls, reply = live.finish(out, part.finish_reason)
                    if text:
                        yield chunk(i, {"content": text})
                    if calls:
                        yield chunk(i, {"tool_calls": [{"index": first + k, **c.to_openai()}
                                                       for k, c in enumerate(calls)]})
                    if part.finish_reason is not None:
                        yield chunk(i, {}, reply.finish_reason)

        async for event in _merge([choice(i) for i in range(r.n)]):
            yield event
        if (r.stream_options or {}).get("include_usage"):
            yield _sse({**base, "choices": [], "usage": _usage(len(ids), sum(done))})

    async def update_weights(self, request: Request) -> dict[str, int]:
        version = request.headers.get("x-policy-version")
        if version is None or not version.lstrip("-").isdigit():
            raise HTTPException(400, "send the new version as an integer X-Policy-Version header")
        try:
            state_dict = load_safetensors(await request.body())
        except (SafetensorError, ValueError) as e:
            raise HTTPException(400, f"the body is not a safetensors file: {e}") from None
        try:
            await self.engine.update_weights(state_dict, int(version))
        except Exception as e:
            raise HTTPException(400, f"update_weights failed: {e}") from None
        return {"policy_version": self.engine.policy_version}

    async def release(self, body: ReleaseRequest) -> dict[str, bool]:
        await self.engine.release(body.session_id)
        return {"ok": True}

    async def version(self) -> dict[str, int]:
        return {"policy_version": self.engine.policy_version}


async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
    errors = e.errors()
    message, _detail = validation_message(errors)
    loc = [str(x) for x in (errors[0].get("loc", ()) if errors else ()) if x != "body"]
    return _error(400, message, loc[0] if loc else None)


async def _bad(_: Request, e: BadParam) -> JSONResponse:
    return _error(e.status, str(e), e.param, e.code)


async def _gone(_: Request, e: Exception) -> JSONResponse:
    return JSONResponse(_error_body("the server is shutting down; retry against another "
                                    "server or after it restarts", None, "shutting_down",
                                    "server_error"), status_code=503)


def create_app(engine: ServedEngine, model_name: str = "looprl", *, api_key: str | None = None,
               drain_s: float = 30.0, tool_format: str | None = None) -> FastAPI:
    """The FastAPI app (serve it with ``looprl.asgi.run(app, ..., drain=app.state.drain)``).
    ``api_key``: the bearer key every route but ``/health`` needs (None: open).
    ``tool_format``: the chat template's tool-call format (``looprl.chat.tool_formats``; None:
    probed from the template), refused with ``ValueError`` where the template writes another."""
    app = FastAPI(title="looprl OpenAI-compatible server")
    drain = app.state.drain = Drain()
    server = _Server(engine, model_name, drain, drain_s, tool_format)
    app.state.tool_format = server.fmt.tool_format if server.fmt is not None else None
    weights_limit = engine.weights_bytes + (1 << 20)
    app.add_middleware(
        Guard, authorized=bearer(api_key) if api_key else None, open_paths={"/health"},
        max_body=lambda path: weights_limit if path == "/looprl/update_weights" else MAX_BODY,
        auth_hint=f"send 'Authorization: Bearer <key>' (the server's --api-key or {API_KEY_ENV})")
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(BadParam, _bad)  # type: ignore[arg-type]
    app.add_exception_handler(Draining, _gone)
    app.add_exception_handler(ClientGone, _gone)  # nobody reads this one
    app.get("/health")(server.health)
    app.get("/v1/models")(server.models)
    app.post("/v1/completions", response_model=None)(server.completions)
    app.post("/v1/chat/completions", response_model=None)(server.chat)
    app.post("/looprl/update_weights")(server.update_weights)
    app.post("/looprl/release")(server.release)
    app.get("/looprl/version")(server.version)
    return app
