"""The OpenAI chat shape of the harness's format (``inference/openai_chat.py``): a conversation
sent back by an OpenAI client renders to the harness's own tokens, replies carry the parsed
calls, and streamed deltas join to exactly the non-streamed reply."""

from __future__ import annotations

import asyncio
import random

from looprl.chat import ChatFormat
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.run_state import AgentExperimental
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.tools import make_tools, tool_schemas
from looprl.inference.openai_chat import ReplyStream, conversation_ids, parse_reply
from looprl.inference.openai_params import chat_messages
from looprl.models.tokenizer import build_tokenizer
from looprl.types import Grader, Task
from tests.harness.dir_sandbox import DirSandbox
from tests.harness.turn_fuzz import fuzz_turn

TOK = build_tokenizer(None)
FMT = ChatFormat(TOK)
READ = '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'


def test_a_conversation_from_an_openai_client_renders_to_the_harness_tokens(tmp_path):
    """What the model saw in the harness is what it sees through the server: the harness's
    trajectory and the same conversation as an OpenAI client sends it back give equal tokens."""
    (tmp_path / "README.md").write_text("# calc\nA tiny calculator.\n")
    turns = ["<think>Start with the docs.</think>\nLet me read it." + READ, "It is a calculator."]
    tools = make_tools(["read_file", "grep"])
    task = Task(id="t", repo=str(tmp_path), prompt="What does this repo do?", grader=Grader("true"))
    traj = asyncio.run(run_agent(task, DirSandbox(tmp_path), ScriptedPolicy(TOK, turns), FMT,
                                 tools, AgentConfig(experimental=AgentExperimental(
                                     system_prompt="Be brief.")), group_id="g",
                                 trajectory_id="t0"))
    assert traj.counters.turns == 2 and traj.counters.tool_calls == 1
    harness_ids = list(traj.segments[0].token_ids_T)
    turn1 = TOK.encode(turns[0]) + [FMT.eot_id]
    reply = parse_reply(FMT, turn1, "call_abc")
    assert reply.finish_reason == "tool_calls"
    assert reply.content == "<think>Start with the docs.</think>\nLet me read it."
    [call] = reply.message()["tool_calls"]
    assert call == {"id": "call_abc_0", "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "README.md"}'}}
    result = traj.messages[3]["content"]
    assert "A tiny calculator." in result
    sent = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What does this repo do?"}]},
            {**reply.message(), "refusal": None, "function_call": None},  # as clients echo it
            {"role": "tool", "tool_call_id": "call_abc_0", "content": result}]
    ids = conversation_ids(FMT, chat_messages(sent), tool_schemas(tools))
    turn2 = TOK.encode(turns[1]) + [FMT.eot_id]
    assert ids + turn2 == harness_ids


def test_broken_blocks_stay_in_content_and_valid_calls_come_out():
    text = ('Trying.<tool_call>{"name": "grep", "arguments": {"pattern": "x"}}</tool_call>'
            '<tool_call>{"name": oops}</tool_call> done')
    reply = parse_reply(FMT, TOK.encode(text) + [FMT.eot_id], "c")
    assert [c.name for c in reply.tool_calls] == ["grep"]
    assert reply.content == 'Trying.<tool_call>{"name": oops}</tool_call> done'
    assert reply.finish_reason == "tool_calls"
    cut = parse_reply(FMT, TOK.encode('Fix.<tool_call>{"name": "grep", "argu'), "c", "length")
    assert cut.tool_calls == [] and cut.finish_reason == "length"
    assert cut.content == 'Fix.<tool_call>{"name": "grep", "argu'
    plain = parse_reply(FMT, TOK.encode("Hello") + [FMT.eot_id], "c")
    assert plain.message() == {"role": "assistant", "content": "Hello"}
    assert plain.finish_reason == "stop"
    only = parse_reply(FMT, TOK.encode(READ) + [FMT.eot_id], "c").message()
    assert only["content"] is None and len(only["tool_calls"]) == 1


def _stream(ids: list[int], cuts: list[int], finish: str):
    live = ReplyStream(FMT, "c")
    text, calls = "", []
    for k in cuts:
        delta, new = live.feed(ids[:k])
        text += delta
        calls += new
    delta, new, reply = live.finish(ids, finish)
    return text + delta, calls + new, reply


def test_streamed_deltas_join_to_the_reply_for_fuzzed_turns():
    """Every turn the harness's fuzzer makes (thinking, valid and broken calls, markers inside
    JSON strings, stray markers, multi-byte characters, truncated blocks), cut anywhere: the
    content sent never has to be taken back, and the calls come out once each, in order."""
    rng = random.Random(27)
    for _ in range(60):
        turn = fuzz_turn(rng, big=200, needs_action=False)
        ids = TOK.encode(turn.text)
        ended = rng.random() < 0.7
        if ended:
            ids = ids + [FMT.eot_id]
        cuts = sorted(rng.sample(range(1, len(ids) + 1), min(len(ids), 25)))
        text, calls, reply = _stream(ids, cuts, "stop" if ended else "length")
        assert text == reply.content, turn.text
        assert calls == reply.tool_calls
        assert reply == parse_reply(FMT, ids, "c", "stop" if ended else "length")


def test_content_streams_before_the_turn_ends_and_calls_when_their_block_closes():
    text = ("<think>Plan: read.</think>\nReading the README now " + READ
            + "then grepping é😀" + '<tool_call>{"name": "grep", "arguments": {"pattern": "a"}}</tool_call>')
    ids = TOK.encode(text) + [FMT.eot_id]
    live = ReplyStream(FMT, "c")
    seen: list[tuple[int, str, list[str]]] = []
    for k in range(1, len(ids) + 1):
        delta, calls = live.feed(ids[:k])
        if delta or calls:
            seen.append((k, delta, [c.name for c in calls]))
    assert seen[0][1] == "<think>P"  # the thinking streams as it is written
    first_call = next(k for k, _, names in seen if names == ["read_file"])
    assert TOK.decode(ids[:first_call]).endswith("</tool_call>")  # sent when its block closed
    before_call = "".join(d for k, d, _ in seen if k < first_call)
    assert before_call == "<think>Plan: read.</think>\nReading the README now"
    assert all("\ufffd" not in d for _, d, _ in seen)  # no half-decoded characters
    assert [n for _, _, names in seen for n in names] == ["read_file", "grep"]
