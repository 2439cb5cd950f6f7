"""OpenAIEngine: the ``Engine`` protocol over any OpenAI-compatible server (vLLM, SGLang, our own
``openai_server``, a hosted API).

    engine = OpenAIEngine("http://localhost:8000/v1", model="looprl", api="completions")
    gen = await engine.generate(prompt_ids, SamplingParams(), session_id=traj_id)

``api="completions"`` sends the token ids as the prompt and reads back ``token_ids`` (vLLM's
``return_token_ids``) and ``logprobs.token_logprobs``: token-exact. ``api="chat"`` is for servers
that only speak ``/v1/chat/completions``: the prompt is decoded with ``tokenizer`` into ChatML
messages, and the reply's token ids come from ``logprobs.content[].token_id`` when the server
returns them, else from re-encoding its text (not token-exact; say so in your run notes).

Weight updates go to ``POST /looprl/update_weights`` (looprl's server); other servers answer 404,
which raises a ``PolicyError`` naming the fix. Transport failures are ``PolicyError`` (infra).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import httpx
import torch
from safetensors.torch import save as save_safetensors

from looprl.errors import ConfigError, ContextFullError, PolicyError
from looprl.types import Generation, SamplingParams

_TURN = re.compile(r"<\|im_start\|>(system|user|assistant|tool)\n(.*?)(?:<\|im_end\|>\n?|$)", re.S)


def chatml_to_messages(text: str) -> list[dict[str, str]]:
    """Invert the ChatML rendering of ``looprl.models.tokenizer.CHAT_TEMPLATE`` (text only).

    >>> chatml_to_messages("<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n")
    [{'role': 'user', 'content': 'hi'}]
    """
    msgs = [{"role": r, "content": c} for r, c in _TURN.findall(text)]
    if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1]["content"]:
        msgs.pop()  # the generation prompt
    return msgs


class OpenAIEngine:
    """See the module docstring."""

    def __init__(self, base_url: str, model: str = "looprl", *, api: str = "completions",
                 api_key: str | None = None, tokenizer=None, timeout_s: float = 600.0) -> None:
        if api not in ("completions", "chat"):
            raise ConfigError(f"OpenAIEngine api must be 'completions' or 'chat', not {api!r}")
        if api == "chat" and tokenizer is None:
            raise ConfigError("OpenAIEngine(api='chat') needs tokenizer= to turn token ids into messages")
        self.base_url = base_url.rstrip("/")
        self.model, self.api, self.tokenizer = model, api, tokenizer
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout_s)
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    async def _post(self, path: str, **kw) -> httpx.Response:
        url = self.base_url + path
        try:
            resp = await self._client.post(url, **kw)
        except httpx.HTTPError as e:
            raise PolicyError(f"inference server {url} unreachable: {type(e).__name__}: {e}; "
                              "check that it is running and base_url is right") from e
        if resp.status_code == 400 and _context_full(resp):
            raise ContextFullError(resp.text)
        return resp

    def _server_root(self) -> str:
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        body: dict[str, Any] = {"model": self.model, "max_tokens": params.max_new_tokens,
                                "temperature": params.temperature, "top_p": params.top_p,
                                "seed": params.seed, "session_id": session_id, "group_id": group_id}
        if params.stop:
            body["stop"] = list(params.stop)
        if self.api == "completions":
            body |= {"prompt": list(prompt_ids), "logprobs": 1, "return_token_ids": True}
            data = await self._json("/completions", body)
            return self._from_completion(data["choices"][0])
        body |= {"messages": chatml_to_messages(self.tokenizer.decode(prompt_ids)), "logprobs": True}
        data = await self._json("/chat/completions", body)
        return self._from_chat(data["choices"][0])

    async def _json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self._post(path, json=body)
        if resp.status_code != 200:
            raise PolicyError(f"inference server answered {resp.status_code} on {path}: {resp.text[:500]}")
        return resp.json()

    def _versions(self, choice: dict[str, Any], n: int) -> tuple[int, ...]:
        v = choice.get("policy_versions")
        return tuple(v) if v and len(v) == n else (self._version,) * n

    def _from_completion(self, c: dict[str, Any]) -> Generation:
        lp = (c.get("logprobs") or {}).get("token_logprobs")
        ids = c.get("token_ids")
        if ids is None:
            if self.tokenizer is None:
                raise PolicyError("the server returned no token_ids; pass tokenizer= to OpenAIEngine "
                                  "or use a server that supports return_token_ids (vLLM >= 0.10)")
            ids = self.tokenizer.convert_tokens_to_ids((c.get("logprobs") or {}).get("tokens")
                                                       or self.tokenizer.tokenize(c["text"]))
        lp = lp if lp is not None and len(lp) == len(ids) else [0.0] * len(ids)
        return Generation(tuple(ids), tuple(float(x) for x in lp), self._versions(c, len(ids)),
                          _finish(c.get("finish_reason")), c.get("text", ""))

    def _from_chat(self, c: dict[str, Any]) -> Generation:
        content = (c.get("logprobs") or {}).get("content") or []
        text = c["message"].get("content") or ""
        if c.get("token_ids") is not None:
            ids = list(c["token_ids"])
        elif content and all("token_id" in t for t in content):
            ids = [t["token_id"] for t in content]
        else:
            ids = self.tokenizer.encode(text)
        lp = [float(t["logprob"]) for t in content] if len(content) == len(ids) else [0.0] * len(ids)
        return Generation(tuple(ids), tuple(lp), self._versions(c, len(ids)),
                          _finish(c.get("finish_reason")), text)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        blob = save_safetensors({k: v.detach().contiguous().cpu() for k, v in state_dict.items()})
        resp = await self._post_root("/looprl/update_weights", content=blob,
                                     headers={"X-Policy-Version": str(version)})
        if resp.status_code == 404:
            raise PolicyError(f"{self.base_url} does not accept weight updates; serve the model with "
                              "`looprl model serve` or reload the server with the new checkpoint")
        if resp.status_code != 200:
            raise PolicyError(f"update_weights failed ({resp.status_code}): {resp.text[:500]}")
        self._version = version

    async def release(self, session_id: str) -> None:
        await self._post_root("/looprl/release", json={"session_id": session_id})  # 404 is fine

    async def _post_root(self, path: str, **kw) -> httpx.Response:
        try:
            return await self._client.post(self._server_root() + path, **kw)
        except httpx.HTTPError as e:
            raise PolicyError(f"inference server unreachable: {type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        await self._client.aclose()


def _context_full(resp: httpx.Response) -> bool:
    """Whether a 400 says the prompt does not fit: OpenAI's error shape (ours, too) says so in
    ``error.code``; other servers (vLLM's) only in their message."""
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict) and "code" in err:
        return err["code"] == "context_length_exceeded"
    return "context" in resp.text.lower()


def _finish(reason: str | None) -> Literal["stop", "length", "abort"]:
    return "stop" if reason == "stop" else "length" if reason == "length" else "abort"
