"""``looprl model serve``'s OpenAI API in each model family's tool-call format, driven by the
official ``openai`` client: a tiny model taught (``taught.py``) to call ``read_file`` the way its
family does, through a tokenizer with the family's chat template, is served; the reply carries
``tool_calls`` (plain and streamed); the client sends the call and its result back and gets the
answer. Hermes's own round trips are ``test_openai_client.py``'s."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from typer.testing import CliRunner

from looprl.chat import FORMATS, ChatFormat
from looprl.inference.openai_chat import conversation_ids
from looprl.inference.openai_server import create_app
from looprl.inference.torch_engine import TorchEngine
from tests.chat_families import NAMES, family_tokenizer
from tests.serve.conftest import running

from .taught import teach

KEY = "test-key"
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]
ASK = [{"role": "user", "content": "What is in README.md?"}]
README = "# calc\nA tiny calculator."
ANSWER = "It describes calc, a tiny calculator."
CALL_ID = "a1b2c3d4e"  # the client names the call it sends back (nine alphanumerics: Mistral)
FAMILIES = [n for n in NAMES if n != "hermes"]


def answered() -> list[dict]:
    call = {"id": CALL_ID, "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "README.md"}'}}
    return ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": CALL_ID, "content": README}]


def turns(name: str) -> tuple[str, str, str, str]:
    """(the call turn, its end token, the answer turn, its end token) as the family writes them."""
    call = FORMATS[name].render([("read_file", {"path": "README.md"})])
    if name == "harmony":
        return call, "<|call|>", f"<|channel|>final<|message|>{ANSWER}", "<|return|>"
    eot = ChatFormat(family_tokenizer(name)).eot
    return call, eot, ANSWER, eot


@pytest.fixture(scope="module", params=FAMILIES)
def served(request, tmp_path_factory):
    name = request.param
    tok = family_tokenizer(name)
    fmt = ChatFormat(tok)
    call, call_end, answer, answer_end = turns(name)
    torch.set_num_threads(1)
    examples = [(conversation_ids(fmt, ASK, TOOLS), fmt.encode(call) + [tok.convert_tokens_to_ids(call_end)]),
                (conversation_ids(fmt, answered(), TOOLS),
                 fmt.encode(answer) + [tok.convert_tokens_to_ids(answer_end)])]
    path = teach(tok, examples, tmp_path_factory.mktemp(name), ends=tuple(dict.fromkeys(
        (call_end, answer_end))), max_steps=1500)
    engine = TorchEngine.from_path(path, num_threads=1)
    with running(create_app(engine, name, api_key=KEY, tool_format=name)) as srv:
        yield name, openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
    engine.close()


@pytest.mark.slow  # teaching a tiny model per family: ~10-30 s each
def test_tool_call_round_trip_in_the_familys_format(served):
    name, client = served
    first = client.chat.completions.create(model=name, messages=ASK, tools=TOOLS, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert not choice.message.content
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "README.md"}
    if name.startswith("mistral"):
        assert len(call.id) == 9 and call.id.isalnum()
    second = client.chat.completions.create(model=name, messages=answered(), tools=TOOLS,
                                            temperature=0)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].message.tool_calls is None


@pytest.mark.slow
def test_streamed_tool_call_in_the_familys_format(served):
    name, client = served
    chunks = list(client.chat.completions.create(model=name, messages=ASK, tools=TOOLS,
                                                 temperature=0, stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "read_file")]
    assert json.loads(calls[0].function.arguments) == {"path": "README.md"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"


def test_a_tool_format_the_template_contradicts_is_refused(tmp_path):
    tok = family_tokenizer("llama3")
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, max_position_embeddings=64))
    engine = TorchEngine(model.eval(), tok, num_threads=1, kv_budget_mb=8)
    try:
        with pytest.raises(ValueError, match="writes tool calls as 'llama3'"):
            create_app(engine, "m", tool_format="qwen3_coder")
        assert create_app(engine, "m", tool_format="llama3") is not None
    finally:
        engine.close()


def test_model_serve_names_the_formats_for_an_unknown_one(tmp_path):
    from looprl.cli import app

    r = CliRunner().invoke(app, ["model", "serve", str(tmp_path), "--tool-format", "llama"])
    assert r.exit_code == 2
    assert "unknown tool format 'llama'" in r.output and "harmony" in r.output
