"""OpenAIEngine against a real HTTP server (uvicorn + our OpenAI-compatible app over TorchEngine)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import torch
import uvicorn

from looprl.errors import ContextFullError, PolicyError
from looprl.inference import make_engine
from looprl.inference.openai_engine import OpenAIEngine, chatml_to_messages
from looprl.inference.openai_server import create_app
from looprl.inference.torch_engine import TorchEngine
from looprl.types import SamplingParams

from .conftest import make_tiny

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def server():
    model, tok = make_tiny("llama")
    engine = TorchEngine(model, tok, stop_on_eos=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(engine, "tiny"), host="127.0.0.1", port=port,
                                        log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", model, tok
    srv.should_exit = True
    t.join(timeout=10)
    engine.close()


def reference(model, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                         pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_completions_are_token_exact(server):
    url, model, tok = server
    ids = tok.encode("def add(a, b):\n    return")

    async def main():
        engine = make_engine("openai", base_url=url, model="tiny")
        g = await engine.generate(ids, GREEDY, session_id="s1")
        sampled = await engine.generate(ids, SamplingParams(max_new_tokens=12, seed=1))
        await engine.release("s1")
        await engine.aclose()
        return g, sampled

    g, sampled = asyncio.run(main())
    assert list(g.token_ids) == reference(model, ids, 16)
    assert g.finish_reason == "length" and g.policy_versions == (0,) * 16
    with torch.no_grad():
        logits = model(torch.tensor([ids + list(sampled.token_ids)])).logits[0, len(ids) - 1:-1]
    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(sampled.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(sampled.logprobs), ref, atol=1e-4)


def test_chat_fallback_round_trips_the_conversation(server):
    url, model, tok = server
    msgs = [{"role": "user", "content": "fix the bug"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert chatml_to_messages(tok.decode(ids))[1:] == msgs  # [0] is the default system message

    async def main():
        engine = OpenAIEngine(url, "tiny", api="chat", tokenizer=tok)
        g = await engine.generate(list(ids), GREEDY)
        await engine.aclose()
        return g

    g = asyncio.run(main())
    assert list(g.token_ids) == reference(model, list(ids), 16)
    assert len(g.logprobs) == 16 and all(lp <= 0 for lp in g.logprobs)


def test_weight_update_over_http(server):
    url, model, tok = server
    name = "model.layers.1.mlp.up_proj.weight"
    new = model.state_dict()[name] * 1.5

    async def main():
        engine = OpenAIEngine(url, "tiny")
        await engine.update_weights({name: new}, version=7)
        g = await engine.generate([1, 2, 3], GREEDY)
        await engine.aclose()
        return g

    g = asyncio.run(main())
    assert set(g.policy_versions) == {7}
    assert torch.equal(model.state_dict()[name], new)
    assert httpx.get(url[:-3] + "/looprl/version").json() == {"policy_version": 7}


def test_unreachable_server_is_an_infra_error():
    async def main():
        engine = OpenAIEngine("http://127.0.0.1:9/v1", "x", timeout_s=2)
        await engine.generate([1], GREEDY)

    with pytest.raises(PolicyError, match="unreachable") as e:
        asyncio.run(main())
    assert e.value.is_infra


def test_vllm_engine_without_its_venv_says_how_to_install(tmp_path):
    from looprl.errors import ConfigError
    with pytest.raises(ConfigError, match="run `make vllm`"):
        make_engine("vllm", model_path=str(tmp_path), python=str(tmp_path / "no-python"))


BAD_PARAMS = [  # (route, body changes, status, the field the error names)
    ("completions", {"temperature": -1}, 400, "temperature"),
    ("completions", {"temperature": 2.5}, 400, "temperature"),
    ("completions", {"top_p": 0}, 400, "top_p"),
    ("completions", {"top_p": 1.5}, 400, "top_p"),
    ("completions", {"max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"max_tokens": -5}, 400, "max_tokens"),
    ("completions", {"max_tokens": 10**9}, 400, "max_tokens"),
    ("completions", {"n": 0}, 400, "n"),
    ("completions", {"n": 1000}, 400, "n"),
    ("completions", {"n": 2, "session_id": "s"}, 400, "n"),
    ("completions", {"seed": -1}, 400, "seed"),
    ("completions", {"seed": 2**70}, 400, "seed"),
    ("completions", {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("completions", {"stop": ""}, 400, "stop"),
    ("completions", {"stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("completions", {"presence_penalty": 0.5}, 400, "presence_penalty"),
    ("completions", {"logprobs": 5}, 400, "logprobs"),
    ("completions", {"model": "gpt-4"}, 404, "model"),
    ("completions", {"temperature": "hot"}, 400, "temperature"),
    ("completions", {"max_tokens": 1.5}, 400, "max_tokens"),
    ("completions", {"best_of": 3}, 400, "best_of"),  # unknown: refused, not ignored
    ("completions", {"prompt": [1, 2, 10**9]}, 400, "prompt"),
    ("completions", {"prompt": []}, 400, "prompt"),
    ("completions", {"prompt": "\ud800"}, 400, "prompt"),
    ("completions", {"prompt": [5] * 600}, 400, "prompt"),  # over the 512-token context
    ("completions", {"prompt": [5] * 600, "stream": True}, 400, "prompt"),  # before any event
    ("chat/completions", {"messages": [{"role": "user", "content": "x" * 600}], "stream": True},
     400, "messages"),
    ("chat/completions", {"temperature": -1}, 400, "temperature"),
    ("chat/completions", {"n": 17}, 400, "n"),
    ("chat/completions", {"messages": "hi"}, 400, "messages"),
    ("chat/completions", {"model": "other"}, 404, "model"),
    ("chat/completions", {"tool_choice": "required"}, 400, "tool_choice"),
    ("chat/completions", {"tool_choice": "none"}, 400, "tool_choice"),
    ("chat/completions", {"parallel_tool_calls": False}, 400, "parallel_tool_calls"),
    ("chat/completions", {"response_format": {"type": "json_object"}}, 400, "response_format"),
    ("chat/completions", {"top_logprobs": 3, "logprobs": True}, 400, "top_logprobs"),
    ("chat/completions", {"logprobs": True, "stream": True}, 400, "logprobs"),
    ("chat/completions", {"max_tokens": 4, "max_completion_tokens": 8}, 400,
     "max_completion_tokens"),
    ("chat/completions", {"max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("chat/completions", {"stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("chat/completions", {"stream": True, "stream_options": {"chunks": 1}}, 400, "stream_options"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400,
     "messages[0].role"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
     400, "messages[0].tool_calls"),
    ("chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400,
     "messages[0].content"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"},
                                       {"role": "tool", "tool_call_id": "c1", "content": "x"}]},
     400, "messages[1].tool_call_id"),
    ("chat/completions", {"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"}]}, 400,
     "messages[1].tool_calls[0].function.arguments"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "hello"}]}, 400,
     "messages[1]"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     400, "tools[0].function.name"),
    ("chat/completions", {"tools": [{"type": "retrieval"}]}, 400, "tools[0]"),
]


@pytest.mark.parametrize("route, change, status, param", BAD_PARAMS)
def test_bad_parameters_are_refused_naming_the_field(server, route, change, status, param):
    url, _, _ = server
    base = ({"prompt": [1, 2, 3]} if route == "completions"
            else {"messages": [{"role": "user", "content": "hi"}]})
    body = {"model": "tiny", "max_tokens": 4, **base, **change}
    r = httpx.post(f"{url}/{route}", content=json.dumps(body), timeout=30,  # \ud800 escaped
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_n_gives_n_distinct_choices(server):
    url, _, _ = server
    r = httpx.post(f"{url}/completions", timeout=60, json={
        "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 12, "n": 3, "seed": 7})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({tuple(c["token_ids"]) for c in choices}) > 1  # seed + i: not three copies
    assert r.json()["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
    again = httpx.post(f"{url}/completions", timeout=60, json={
        "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 12, "n": 3, "seed": 7}).json()
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in choices]


def test_bad_weight_bodies_are_400(server):
    url, _, _ = server
    root = url[:-3]
    r = httpx.post(root + "/looprl/update_weights", content=b"not safetensors",
                   headers={"X-Policy-Version": "3"})
    assert r.status_code == 400 and "safetensors" in r.text
    assert httpx.post(root + "/looprl/release", json={}).status_code == 400


def test_a_prompt_over_the_context_is_told_from_other_refusals(server):
    """The engine over this server raises ContextFullError (the agent ends the segment) only
    when the prompt does not fit, not for every 400 whose message mentions the context."""
    url, _, _ = server

    async def main():
        engine = OpenAIEngine(url, "tiny")
        try:
            with pytest.raises(ContextFullError):
                await engine.generate([5] * 600, GREEDY)  # the tiny model's context is 512
            with pytest.raises(PolicyError, match="max_tokens") as e:
                await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=10_000))
            assert not isinstance(e.value, ContextFullError)
        finally:
            await engine.aclose()

    asyncio.run(main())
