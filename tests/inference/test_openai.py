"""OpenAIEngine against a real HTTP server (uvicorn + our OpenAI-compatible app over TorchEngine)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import torch
import uvicorn

from looprl.errors import PolicyError
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


def test_vllm_engine_without_vllm_says_how_to_install():
    pytest.importorskip("looprl.inference.vllm_engine")
    from looprl.inference import vllm_engine
    if vllm_engine.vllm is not None:
        pytest.skip("vLLM is installed: covered by test_vllm.py")
    with pytest.raises(Exception, match="pip install looprl\\[vllm\\]"):
        make_engine("vllm", model_path="/nonexistent")
