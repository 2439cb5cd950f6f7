"""``looprl model serve --engine vllm``: the project's OpenAI server decoding on vLLM (its CPU build
here), driven by the official ``openai`` client as a user drives it — a tool-call round trip whose
greedy replies the test knows (a model taught them, ``taught.py``), then a weight update pushed to
the server that vLLM takes.

Needs `make vllm`'s .venv-vllm; skips without it, fails under CI.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import openai
import pytest

from looprl.chat import ChatFormat
from looprl.inference.openai_chat import conversation_ids
from looprl.models.tokenizer import build_tokenizer
from tests.vllm_support import free_port, require_vllm, serving

from .taught import teach
from .test_openai_client import ANSWER, ASK, CALL, README, TOOLS, answered

KEY = "test-key"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    require_vllm()
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    model = teach(tok, [(conversation_ids(fmt, ASK, TOOLS), tok.encode(CALL) + [fmt.eot_id]),
                        (conversation_ids(fmt, answered("x"), TOOLS),
                         tok.encode(ANSWER) + [fmt.eot_id])],
                  tmp_path_factory.mktemp("taught"), max_positions=1024, hidden=64, heads=2)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serving([sys.executable, "-m", "looprl", "model", "serve", str(model), "--engine", "vllm",
                  "--port", str(port), "--api-key", KEY], f"{url}/health",
                 {**os.environ, "OMP_NUM_THREADS": "1"}, "looprl model serve"):
        yield model, url


@pytest.mark.slow
def test_a_tool_call_round_trip_and_a_weight_update_on_vllm(served):
    model, url = served
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    first = client.chat.completions.create(model="looprl", messages=ASK, tools=TOOLS, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "README.md"}
    messages = ASK + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": README}]
    second = client.chat.completions.create(model="looprl", messages=messages, tools=TOOLS,
                                            temperature=0)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == ANSWER

    auth = {"Authorization": f"Bearer {KEY}"}
    body = (Path(model) / "model.safetensors").read_bytes()
    r = httpx.post(f"{url}/looprl/update_weights", content=body, timeout=120,
                   headers={**auth, "X-Policy-Version": "1"})
    assert r.status_code == 200, r.text
    assert httpx.get(f"{url}/looprl/version", headers=auth).json()["policy_version"] == 1
    again = client.chat.completions.create(model="looprl", messages=ASK, tools=TOOLS, temperature=0)
    assert again.choices[0].message.tool_calls[0].function.name == "read_file"
