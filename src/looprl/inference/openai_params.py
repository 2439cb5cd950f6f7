"""The request bodies of the OpenAI-compatible server and their validation (``check_request``,
the one place a request's parameters are judged), with the conversion of validated messages to
the chat template's input (``chat_messages``).

    check_request(ChatRequest(**body), model_name="looprl", max_len=4096)   # or BadParam(param, ...)

A value the server cannot honour is refused, never silently ignored or clamped: a parameter out
of range, of the wrong type or unknown, penalties, top-logprob alternatives, a forced or forbidden
tool choice, JSON mode, images, a message of an unknown role or with unknown keys, a tool result
answering no call, call arguments that are not a JSON object. Keys a client echoes back as null
(OpenAI's ``refusal``, ``function_call``, ...) are ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any

from looprl.asgi import StrictBody
from looprl.types import Message

MAX_N = 16
"""Choices per request (each is one more generation in the engine's batch)."""
MAX_STOPS = 4
"""Stop strings per request (OpenAI's limit)."""
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_ROLES = {"system": {"content", "name"}, "developer": {"content", "name"},
          "user": {"content", "name"}, "assistant": {"content", "name", "tool_calls", "refusal"},
          "tool": {"content", "tool_call_id", "name"}}
"""Each role's keys besides ``role``; a key sent as null (clients echo OpenAI's nulls) is ignored."""


class CompletionRequest(StrictBody):
    model: str | None = None
    prompt: str | list[int]
    max_tokens: int | None = None
    """None: up to the end of the model's context, as OpenAI does."""
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    """Accepted and ignored, as OpenAI documents it (an end-user id for abuse monitoring)."""
    return_token_ids: bool = True
    session_id: str | None = None
    group_id: str | None = None


class ChatRequest(StrictBody):
    model: str | None = None
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    """OpenAI's newer name for ``max_tokens``; send one of them."""
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    session_id: str | None = None
    group_id: str | None = None


class ReleaseRequest(StrictBody):
    session_id: str


class BadParam(Exception):
    """One request field is invalid: answered 400 (404 for an unknown model) in OpenAI's shape."""

    def __init__(self, param: str, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def check_request(r: CompletionRequest | ChatRequest, *, model_name: str, max_len: int) -> None:
    """Every parameter in range, or ``BadParam`` naming the first one that is not.

    The one place request parameters are judged (types and unknown fields are the body model's):
    a value this server cannot honour is refused, never silently ignored or clamped.
    """
    if r.model is not None and r.model != model_name:
        raise BadParam("model", f"The model `{r.model}` does not exist; this server serves "
                       f"`{model_name}` (GET /v1/models)", 404, "model_not_found")
    limit: int | None
    if isinstance(r, ChatRequest) and r.max_completion_tokens is not None:
        if r.max_tokens is not None and r.max_tokens != r.max_completion_tokens:
            raise BadParam("max_completion_tokens", "max_tokens and max_completion_tokens "
                           "differ; send one of them")
        name, limit = "max_completion_tokens", r.max_completion_tokens
    else:
        name, limit = "max_tokens", r.max_tokens
    if limit is not None and not 1 <= limit < max_len:
        raise BadParam(name, f"{name} must be between 1 and {max_len - 1} (the model's context "
                       f"is {max_len} tokens), got {limit}")
    if not 0.0 <= r.temperature <= 2.0:
        raise BadParam("temperature", f"temperature must be between 0 and 2, got {r.temperature}")
    if not 0.0 < r.top_p <= 1.0:
        raise BadParam("top_p", f"top_p must be in (0, 1], got {r.top_p}")
    if not 1 <= r.n <= MAX_N:
        raise BadParam("n", f"n must be between 1 and {MAX_N}, got {r.n}")
    if r.n > 1 and r.session_id is not None:
        raise BadParam("n", "session_id keeps one conversation's cache: send n=1 with a "
                       "session_id (or group_id to share a prompt across choices)")
    stops = [r.stop] if isinstance(r.stop, str) else r.stop or []
    if len(stops) > MAX_STOPS or not all(stops):
        raise BadParam("stop", f"stop takes up to {MAX_STOPS} non-empty strings")
    if r.seed is not None and not 0 <= r.seed < 2**63:
        raise BadParam("seed", f"seed must be between 0 and 2**63 - 1, got {r.seed}")
    if r.stream_options is not None:
        if not r.stream:
            raise BadParam("stream_options", "stream_options is only allowed with stream=true")
        if set(r.stream_options) - {"include_usage"} or not isinstance(
                r.stream_options.get("include_usage", False), bool):
            raise BadParam("stream_options", "stream_options takes one key, include_usage "
                           "(true or false)")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(r, name) != 0.0:
            raise BadParam(name, f"{name} is not supported by this server; send 0")
    for name in ("session_id", "group_id", "user"):
        value = getattr(r, name)
        if value is not None and not 0 < len(value) <= 256:
            raise BadParam(name, f"{name} must be 1 to 256 characters")
    if isinstance(r, CompletionRequest):
        if r.logprobs is not None and not 0 <= r.logprobs <= 1:
            raise BadParam("logprobs", "logprobs: only the sampled tokens' log-probabilities "
                           "are returned (no alternatives); send 0 or 1")
        return
    _check_chat_options(r)
    _check_tools(r.tools)
    _check_messages(r.messages)


def _check_chat_options(r: ChatRequest) -> None:
    if r.top_logprobs:
        raise BadParam("top_logprobs", "only the sampled tokens' log-probabilities are returned "
                       "(no alternatives); send top_logprobs=0 or leave it out")
    if r.logprobs and r.stream:
        raise BadParam("logprobs", "log-probabilities come with stream=false; send one of them")
    if r.tool_choice not in (None, "auto"):
        raise BadParam("tool_choice", "the model decides itself whether to call a tool: this "
                       "server cannot force or forbid calls; send tool_choice='auto' or leave it out")
    if r.parallel_tool_calls is False:
        raise BadParam("parallel_tool_calls", "the model may write several calls in one turn "
                       "(the harness runs them all); send parallel_tool_calls=true or leave it out")
    if r.response_format not in (None, {"type": "text"}):
        raise BadParam("response_format", "only text replies are produced (no JSON mode or "
                       "schema); send response_format={'type': 'text'} or leave it out")


def _check_tools(tools: list[Any] | None) -> None:
    for i, t in enumerate(tools or []):
        where = f"tools[{i}]"
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type") != "function" or set(t) - {"type", "function"}:
            raise BadParam(where, f"{where} must be {{'type': 'function', 'function': {{'name': "
                           "..., 'description': ..., 'parameters': {...}}}")
        if not isinstance(fn.get("name"), str) or not _TOOL_NAME.fullmatch(fn["name"]):
            raise BadParam(f"{where}.function.name", "a tool name is 1 to 64 letters, digits, "
                           "'_' or '-'")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise BadParam(f"{where}.function", f"{where}.function has unknown key(s) {unknown}")
        if not isinstance(fn.get("description", ""), str) or not isinstance(
                fn.get("parameters", {}), dict):
            raise BadParam(f"{where}.function", "description must be a string and parameters "
                           "a JSON schema object")


def _text(content: Any, where: str, *, nullable: bool = False) -> str:
    """A message's content as text: a string, or a list of text parts (joined by newlines)."""
    if content is None and nullable:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "\n".join(p["text"] for p in content)
    raise BadParam(where, f"{where} must be a string or a list of {{'type': 'text', 'text': ...}} "
                   "parts (this model reads text only)")


def _check_messages(messages: list[Any]) -> None:
    if not messages:
        raise BadParam("messages", "messages is empty; send at least one user message")
    open_calls: set[str] = set()  # ids of the last assistant turn's calls
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in _ROLES:
            raise BadParam(f"{where}.role", f"{where}.role must be one of {sorted(_ROLES)}")
        unknown = sorted(k for k, v in m.items()
                         if k != "role" and v is not None and k not in _ROLES[role])
        if unknown:
            raise BadParam(f"{where}.{unknown[0]}", f"{where} ({role}) has unknown key "
                           f"{unknown[0]!r}; a {role} message takes {sorted(_ROLES[role])}")
        _text(m.get("content"), f"{where}.content", nullable=role == "assistant")
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise BadParam(f"{where}.tool_calls", "tool_calls must be a list")
            for j, c in enumerate(calls):
                _check_call(c, f"{where}.tool_calls[{j}]")
            open_calls = {c["id"] for c in calls}
        elif role == "tool" and m.get("tool_call_id") not in open_calls:
            raise BadParam(f"{where}.tool_call_id", f"{where} answers no call of the assistant "
                           "message before it; send the id of one of its tool_calls")
    if messages[-1]["role"] == "assistant":
        raise BadParam(f"messages[{len(messages) - 1}]", "the last message is the assistant's: "
                       "this server starts a new assistant turn (end with a user or tool message)")


def _check_call(c: Any, where: str) -> None:
    fn = c.get("function") if isinstance(c, dict) else None
    keys = {k for k, v in c.items() if v is not None} if isinstance(c, dict) else set()
    if (not isinstance(fn, dict) or not isinstance(c.get("id"), str) or not c["id"]
            or c.get("type", "function") != "function" or keys - {"id", "type", "function", "index"}):
        raise BadParam(where, f"{where} must be {{'id': ..., 'type': 'function', 'function': "
                       "{'name': ..., 'arguments': '<JSON object>'}}")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadParam(f"{where}.function.name", "a call needs its tool's name")
    try:
        args = json.loads(fn.get("arguments", ""))  # missing: "" is no JSON, as None is no str
    except (TypeError, ValueError):
        args = None
    if not isinstance(args, dict):
        raise BadParam(f"{where}.function.arguments", "arguments must be a JSON object encoded as "
                       "a string, as the reply gave it")


def chat_messages(messages: list[dict[str, Any]]) -> list[Message]:
    """Validated OpenAI messages as the chat template takes them (``developer`` is ``system``,
    text parts joined, null keys dropped, calls in OpenAI's shape with their arguments as sent)."""
    out: list[Message] = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), "", nullable=True)}
        if m.get("tool_calls"):
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["function"]["name"],
                                               "arguments": c["function"]["arguments"]}}
                                 for c in m["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)  # type: ignore[arg-type]
    return out
