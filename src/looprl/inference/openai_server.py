"""An OpenAI-compatible HTTP server over a TorchEngine (serve the default model, or any local
Llama/Qwen2 checkpoint, to anything that speaks the OpenAI API).

    uvicorn-style:  looprl model serve ~/.cache/looprl/models/default --port 8000
    in code:        app = create_app(engine, model_name="looprl-default")

Routes: ``GET /v1/models``; ``POST /v1/completions`` (``prompt`` as text or token ids; the choice
carries ``token_ids`` and ``logprobs.token_logprobs``, as vLLM does with ``return_token_ids``);
``POST /v1/chat/completions`` (messages rendered by the model's chat template). looprl extensions:
request fields ``session_id`` / ``group_id`` (KV reuse), choice field ``policy_versions``, and
``POST /looprl/update_weights`` (a safetensors body, ``X-Policy-Version`` header),
``POST /looprl/release``, ``GET /looprl/version``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel
from safetensors.torch import load as load_safetensors

from looprl.errors import ContextFullError
from looprl.inference.torch_engine import TorchEngine
from looprl.types import Generation, SamplingParams


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str | list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    return_token_ids: bool = True
    session_id: str | None = None
    group_id: str | None = None


class ChatRequest(BaseModel):
    model: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    session_id: str | None = None
    group_id: str | None = None


def _params(r: CompletionRequest | ChatRequest) -> SamplingParams:
    stop = (r.stop,) if isinstance(r.stop, str) else tuple(r.stop or ())
    return SamplingParams(max_new_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p,
                          stop=stop, seed=r.seed)


def _usage(n_prompt: int, g: Generation) -> dict[str, int]:
    return {"prompt_tokens": n_prompt, "completion_tokens": len(g.token_ids),
            "total_tokens": n_prompt + len(g.token_ids)}


def create_app(engine: TorchEngine, model_name: str = "looprl") -> FastAPI:
    """The FastAPI app; run it with uvicorn."""
    app = FastAPI(title="looprl OpenAI-compatible server")
    tok = engine.tokenizer

    async def run(ids: list[int], r, params: SamplingParams) -> Generation:
        try:
            return await engine.generate(ids, params, session_id=r.session_id, group_id=r.group_id)
        except (ContextFullError, ValueError) as e:
            raise HTTPException(status_code=400, detail=str(e)) from None

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "looprl"}]}

    @app.post("/v1/completions")
    async def completions(r: CompletionRequest) -> dict[str, Any]:
        ids = list(r.prompt) if isinstance(r.prompt, list) else tok.encode(r.prompt)
        g = await run(ids, r, _params(r))
        choice: dict[str, Any] = {"index": 0, "text": g.text, "finish_reason": g.finish_reason,
                                  "policy_versions": list(g.policy_versions), "logprobs": None}
        if r.return_token_ids:
            choice["token_ids"] = list(g.token_ids)
        if r.logprobs is not None:
            choice["logprobs"] = {"tokens": tok.convert_ids_to_tokens(list(g.token_ids)),
                                  "token_logprobs": list(g.logprobs)}
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": model_name, "choices": [choice],
                "usage": _usage(len(ids), g)}

    @app.post("/v1/chat/completions")
    async def chat(r: ChatRequest) -> dict[str, Any]:
        ids = tok.apply_chat_template(r.messages, tools=r.tools, add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        g = await run(list(ids), r, _params(r))
        content = tok.decode(list(g.token_ids), skip_special_tokens=True)
        choice: dict[str, Any] = {"index": 0, "finish_reason": g.finish_reason,
                                  "message": {"role": "assistant", "content": content},
                                  "token_ids": list(g.token_ids),
                                  "policy_versions": list(g.policy_versions), "logprobs": None}
        if r.logprobs:
            choice["logprobs"] = {"content": [
                {"token": t, "logprob": lp, "token_id": i} for t, lp, i in
                zip(tok.convert_ids_to_tokens(list(g.token_ids)), g.logprobs, g.token_ids, strict=True)]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": model_name, "choices": [choice],
                "usage": _usage(len(ids), g)}

    @app.post("/looprl/update_weights")
    async def update_weights(request: Request) -> dict[str, int]:
        version = request.headers.get("x-policy-version")
        if version is None or not version.lstrip("-").isdigit():
            raise HTTPException(400, "send the new version as an integer X-Policy-Version header")
        state_dict = load_safetensors(await request.body())
        try:
            await engine.update_weights(state_dict, int(version))
        except Exception as e:
            raise HTTPException(400, f"update_weights failed: {e}") from None
        return {"policy_version": engine.policy_version}

    @app.post("/looprl/release")
    async def release(body: dict[str, str]) -> dict[str, bool]:
        await engine.release(body["session_id"])
        return {"ok": True}

    @app.get("/looprl/version")
    async def version() -> dict[str, int]:
        return {"policy_version": engine.policy_version}

    return app
