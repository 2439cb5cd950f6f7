"""``looprl model serve``'s API driven by the official ``openai`` client: tool-call round trips,
streaming, ``n`` choices sharing the prompt's KV, the API key, and requests abandoned mid-stream.

The tool-call tests serve a tiny model taught to answer one conversation (``taught.py``): real
weights through the real engine and server, whose greedy replies the test knows."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from looprl.chat import ChatFormat
from looprl.inference.openai_chat import conversation_ids
from looprl.inference.openai_server import create_app
from looprl.inference.torch_engine import TorchEngine
from looprl.models.tokenizer import build_tokenizer
from tests.serve.conftest import running

from .taught import teach

KEY = "test-key"
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]
ASK = [{"role": "user", "content": "What is in README.md?"}]
README = "# calc\nA tiny calculator."
CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'
ANSWER = "It describes calc, a tiny calculator."


def answered(call_id: str) -> list[dict]:
    """The conversation after the model's call, as the client sends it back."""
    call = {"id": call_id, "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "README.md"}'}}
    return ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": call_id, "content": README}]


@pytest.fixture(scope="module")
def random_server():
    tok = build_tokenizer(None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(  # a long context: room for a stream to run a while
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        initializer_range=0.1, pad_token_id=tok.pad_token_id))
    engine = TorchEngine(model.eval(), tok, num_threads=1, kv_budget_mb=64, stop_on_eos=False)
    with running(create_app(engine, "tiny", api_key=KEY)) as srv:
        yield srv.url, engine
    engine.close()


@pytest.fixture(scope="module")
def taught_server(tmp_path_factory):
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    torch.set_num_threads(1)
    path = teach(tok, [(conversation_ids(fmt, ASK, TOOLS), tok.encode(CALL) + [fmt.eot_id]),
                       (conversation_ids(fmt, answered("x"), TOOLS),
                        tok.encode(ANSWER) + [fmt.eot_id])],
                 tmp_path_factory.mktemp("taught"))
    engine = TorchEngine.from_path(path, num_threads=1)
    with running(create_app(engine, "taught", api_key=KEY)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
    engine.close()


@pytest.mark.slow
def test_tool_call_round_trip(taught_server):
    client = taught_server
    first = client.chat.completions.create(model="taught", messages=ASK, tools=TOOLS,
                                           temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "README.md"}
    # the client sends the reply object back as it got it, then the tool's result
    messages = ASK + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": README}]
    second = client.chat.completions.create(model="taught", messages=messages, tools=TOOLS,
                                            temperature=0)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].message.tool_calls is None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.slow
def test_streamed_tool_call_and_streamed_answer(taught_server):
    client = taught_server
    chunks = list(client.chat.completions.create(model="taught", messages=ASK, tools=TOOLS,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "read_file")]
    assert json.loads(calls[0].function.arguments) == {"path": "README.md"}
    assert calls[0].id and "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"

    stream = client.chat.completions.create(
        model="taught", messages=answered(calls[0].id), tools=TOOLS, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == ANSWER and len(texts) >= 4  # it arrives in pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ANSWER) + 1


def test_streaming_gives_what_the_plain_request_gives(random_server):
    url, _ = random_server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    kw = dict(model="tiny", prompt="def add(a, b):", max_tokens=40, temperature=0)
    plain = client.completions.create(**kw).choices[0]
    events = list(client.completions.create(**kw, stream=True))
    assert "".join(e.choices[0].text for e in events) == plain.text
    assert len(events) >= 5 and events[-1].choices[0].finish_reason == "length"
    msgs = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=30,
                                          temperature=0).choices[0]
    streamed = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=30,
                                                   temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == (chat.message.content or "")
    assert streamed[-1].choices[0].finish_reason == chat.finish_reason


def test_n_choices_share_the_prompt_kv(random_server):
    url, engine = random_server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    prompt = list(range(3, 200))
    before = (engine.stats.prefilled_tokens, engine.stats.reused_group_tokens)
    out = client.completions.create(model="tiny", prompt=prompt, n=4, max_tokens=8, seed=5)
    prefilled = engine.stats.prefilled_tokens - before[0]
    reused = engine.stats.reused_group_tokens - before[1]
    assert len({c.text for c in out.choices}) > 1  # four samples, not four copies
    assert prefilled == len(prompt) + 3 and reused == 3 * len(prompt)  # one prefill, 3 copies
    before = engine.stats.prefilled_tokens
    streamed = list(client.completions.create(model="tiny", prompt=prompt[:150], n=2,
                                              max_tokens=4, seed=1, stream=True))
    assert {e.choices[0].index for e in streamed} == {0, 1}
    first_chunks = len(prompt[:150]) + 1  # the prompt once, then a 1-token copy for choice 1
    later_chunks = 2 * 2  # each choice's 3 more tokens come in 2 chunks of one new token each
    assert engine.stats.prefilled_tokens - before == first_chunks + later_chunks


def test_the_api_key_is_checked_and_health_is_open(random_server):
    url, _ = random_server
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(url + "/v1/models").status_code == 401  # no key at all
    good = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in good.models.list()] == ["tiny"]
    assert httpx.get(url + "/health").json()["status"] == "ok"
    r = httpx.post(url + "/looprl/update_weights", content=b"x" * 10)
    assert r.status_code == 401  # replacing the weights needs the key too


def test_a_stream_the_client_abandons_stops_decoding(random_server):
    url, engine = random_server
    before = engine.stats.generated_tokens
    with httpx.stream("POST", url + "/v1/completions", timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8000,
                            "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    time.sleep(1.0)
    settled = engine.stats.generated_tokens
    time.sleep(1.0)
    assert engine.stats.generated_tokens == settled  # nothing decodes for the gone client
    assert settled - before < 8000
