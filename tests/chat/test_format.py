"""ChatFormat: token-in/token-out rendering, tool-call parsing, token counters."""

from __future__ import annotations

import json

import pytest

from looprl.chat import ChatFormat, parse_turn
from looprl.harness.tools import make_tools, tool_schemas
from looprl.models.tokenizer import build_tokenizer
from tests.harness.conftest import call


def test_observation_delta_extends_the_full_render_exactly(fmt, tok):
    """prompt + model turn + observation == tokenizing the full conversation (for this template)."""
    msgs = [{"role": "user", "content": "fix it"}]
    prompt = fmt.prompt_ids(msgs)
    reply = call("read_file", path="a.py")
    turn = fmt.encode(reply) + [fmt.eot_id]
    tool_msgs = [{"role": "tool", "tool_call_id": "c0", "name": "read_file", "content": "1\tx = 1"}]
    obs = fmt.observation_ids(tool_msgs)
    full = msgs + [{"role": "assistant", "content": reply}] + tool_msgs
    assert tok.decode(prompt + turn + obs) == fmt.render(full)
    assert tok.decode(obs).startswith("\n<|im_start|>tool\n") and tok.decode(obs).endswith("<|im_start|>assistant\n")


def test_parse_several_calls_and_thinking():
    turn = parse_turn("<think>look first</think>Reading." + call("read_file", path="a") + call("glob", pattern="*"))
    assert turn.thinking_text == "look first" and turn.content == "Reading."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("call_0", "read_file", '{"path": "a"}'), ("call_1", "glob", '{"pattern": "*"}')]
    assert turn.errors == []


def test_parse_errors_never_raise():
    cases = {
        "<tool_call>{bad json</tool_call>": "not valid JSON",
        '<tool_call>["read_file"]</tool_call>': "must be a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': 'no "name"',
        '<tool_call>{"name": "a", "arguments": [1]}</tool_call>': "must be a JSON object, got list",
        '<tool_call>{"name": "a", "arguments": {}, "x": 1}</tool_call>': "unexpected key",
        '<tool_call>{"name": "a", "arguments": {}}': "unclosed",
        "done</tool_call>": "without a matching",
        '<tool_call>{"name": "a", "arguments": "{oops"}</tool_call>': "string that is not JSON",
    }
    for text, match in cases.items():
        turn = parse_turn(text)
        assert turn.tool_calls == [] and len(turn.errors) == 1 and match in turn.errors[0], text


def test_parse_unclosed_block_then_valid_call():
    turn = parse_turn('<tool_call>{"name": "a"' + call("finish"))
    assert [c.name for c in turn.tool_calls] == ["finish"] and len(turn.errors) == 1


def test_parse_accepts_double_encoded_arguments():
    turn = parse_turn('<tool_call>{"name": "glob", "arguments": "{\\"pattern\\": \\"*\\"}"}</tool_call>')
    assert turn.tool_calls[0].arguments == '{"pattern": "*"}'


def test_token_counters(fmt):
    ids = fmt.encode("<think>ab</think>x" + call("finish")) + [fmt.eot_id]
    assert fmt.thinking_tokens(ids) == 4  # <think> a b </think>
    assert fmt.tool_call_tokens(ids) == len(fmt.encode(call("finish")))
    assert fmt.decode(ids).endswith("</tool_call>")


def test_counters_without_single_token_markers(fmt):
    """The slow path (markers split over several tokens) counts the same spans."""
    slow = ChatFormat(fmt.tokenizer)
    slow._marker_ids = {}
    ids = fmt.encode("pre<think>abc</think>" + call("finish") + "post")
    assert slow.thinking_tokens(ids) == fmt.thinking_tokens(ids)
    assert slow.tool_call_tokens(ids) == fmt.tool_call_tokens(ids)


# A Qwen2.5-style template (written for this test): consecutive tool messages are grouped into ONE
# user turn of <tool_response> blocks, so a tool message's rendering depends on its neighbours.
GROUPING_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def test_observation_ids_with_a_grouping_template():
    from looprl.models.tokenizer import build_tokenizer

    tok = build_tokenizer(None)
    tok.chat_template = GROUPING_TEMPLATE
    fmt = ChatFormat(tok)
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    reply = call("glob", pattern="*") + call("list_dir")
    tool_msgs = [{"role": "tool", "content": "a.py"}, {"role": "tool", "content": "b/"}]
    obs = fmt.observation_ids(tool_msgs)
    assert tok.decode(obs) == ("\n<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n"
                               "<tool_response>\nb/\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    ids = fmt.prompt_ids(msgs) + fmt.encode(reply) + [fmt.eot_id] + obs
    assert tok.decode(ids) == fmt.render(msgs + [{"role": "assistant", "content": reply}] + tool_msgs)


def test_chat_format_needs_a_template():
    import pytest

    from looprl.models.tokenizer import build_tokenizer

    tok = build_tokenizer(None)
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        ChatFormat(tok)


# --- how think blocks and tool-call markers interact (the rules of format.py's docstring) ------

def test_a_later_think_marker_neither_hides_nor_breaks_calls():
    """Only a leading <think> block is thinking; a later </think> or <think> is plain text."""
    turn = parse_turn(call("read_file", path="a") + " done </think> " + call("finish"))
    assert [c.name for c in turn.tool_calls] == ["read_file", "finish"] and turn.errors == []
    assert turn.content == "done </think>" and turn.thinking_text == ""
    turn = parse_turn("ok <think>later</think>" + call("finish"))
    assert [c.name for c in turn.tool_calls] == ["finish"] and turn.thinking_text == ""
    turn = parse_turn("  <think>plan " + call("read_file", path="x") + "</think>" + call("finish"))
    assert [c.name for c in turn.tool_calls] == ["finish"]  # a call inside the thinking is thought
    assert turn.thinking_text == "plan " + call("read_file", path="x")
    turn = parse_turn("<think>cut while thinking, no call")
    assert turn.tool_calls == [] and turn.errors == [] and turn.thinking_text == "cut while thinking, no call"


def test_a_call_inside_thinking_that_never_closes_is_one_broken_call(fmt):
    """It ran nothing: the model is told so (a broken call), never left to wonder in silence."""
    text = "<think>plan it " + call("read_file", path="a") + call("finish")
    turn = parse_turn(text)
    assert turn.tool_calls == [] and len(turn.errors) == 1
    assert "never closes" in turn.errors[0] and "</think>" in turn.errors[0]
    assert turn.thinking_text == "plan it"
    ids = fmt.encode(text) + [fmt.eot_id]
    parsed = fmt.parse_ids(ids)
    assert parsed.errors == turn.errors
    assert parsed.thinking_tokens + parsed.tool_call_tokens == len(ids) - 1  # every sampled token
    assert parsed.error_token_spans == ((parsed.thinking_tokens, len(ids) - 1),)


def test_markers_inside_json_strings_are_data():
    args = {"path": "a.py", "content": "s = '</tool_call>' + '<tool_call>' + '<think></think>'"}
    turn = parse_turn(call("write_file", **args) + call("grep", pattern="</tool_call>"))
    assert [c.name for c in turn.tool_calls] == ["write_file", "grep"] and turn.errors == []
    assert json.loads(turn.tool_calls[0].arguments) == args
    # a string left open runs past its own block: the block is broken at the first close marker
    # and the next call still parses
    turn = parse_turn('<tool_call>{"name": "a", "arguments": {"x": "oops</tool_call>'
                      + call("finish"))
    assert [c.name for c in turn.tool_calls] == ["finish"] and len(turn.errors) == 1


def test_template_that_opens_thinking_in_the_prompt():
    """A DeepSeek-R1 style template ends the generation prompt with <think>: the turn starts
    inside its thinking, which the first </think> ends."""
    tok = build_tokenizer(None)
    tok.chat_template = tok.chat_template.replace("'<|im_start|>assistant\\n' -}}{%- endif -%}",
                                                  "'<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}")
    fmt = ChatFormat(tok)
    assert fmt.thinking_open and not ChatFormat(build_tokenizer(None)).thinking_open
    text = "weigh " + call("read_file", path="x") + "</think>go" + call("finish")
    turn = fmt.parse_ids(fmt.encode(text) + [fmt.eot_id])
    assert [c.name for c in turn.tool_calls] == ["finish"] and turn.content == "go"
    assert turn.thinking_tokens == len(fmt.encode(text[:text.index("</think>") + 8]))
    assert parse_turn(text).thinking_text == ""  # the same text, thinking not opened


@pytest.mark.parametrize("body,match", [
    ('{"name": "a", "arguments": {"n": ' + "1" * 5000 + "}}", "a number of 5000 characters"),
    ('{"name": "a", "arguments": {"n": NaN}}', "NaN is not a JSON number"),
    ('{"name": "a", "arguments": {"n": -Infinity}}', "-Infinity is not a JSON number"),
    ('{"name": "a", "arguments": {"n": 1e400}}', "too large for a double"),
    ('{"name": "a", "arguments": {"p": "\\ud800"}}', "lone surrogate"),
    ('{"name": "a\\udfff", "arguments": {}}', "lone surrogate"),
    ('{"name": "a", "arguments": "{\\"p\\": \\"\\\\ud800\\"}"}', "lone surrogate"),
    ('{"name": "a", "arguments": {"p": ' + "[" * 40 + "]" * 40 + "}}", "deeper than 32"),
    ("[" * 100_000, "deeper than 32"),
    ('{"name": "a", "arguments": {}} trailing', "extra text after the JSON value"),
])
def test_calls_no_tool_could_take_are_broken_calls_not_exceptions(body, match):
    turn = parse_turn("<tool_call>" + body + "</tool_call>" + call("finish"))
    assert [c.name for c in turn.tool_calls] == ["finish"]
    assert len(turn.errors) == 1 and match in turn.errors[0], turn.errors
    turn.errors[0].encode("utf-8")  # the message itself is valid text for the model


def test_thousands_of_calls_in_one_turn():
    turn = parse_turn("".join(call("read_file", path=f"f{i}.py") for i in range(5000)))
    assert len(turn.tool_calls) == 5000 and turn.tool_calls[-1].id == "call_4999"


def test_token_counts_follow_the_parsed_spans(fmt):
    """thinking_tokens / tool_call_tokens count the spans the parser found, on the fast path
    (single-token markers) and on the slow one (markers sampled in pieces) alike."""
    think, valid = "<think>a</think>", call("write_file", path="a", content="</tool_call>")
    broken, stray = "<tool_call>{bad</tool_call>", "</tool_call>"
    text = think + "x </think> " + valid + broken + "y" + stray + "<tool_call>{cut"
    ids = fmt.encode(text) + [fmt.eot_id]
    slow = ChatFormat(fmt.tokenizer)
    slow._marker_ids = {}
    for f in (fmt, slow):
        turn = f.parse_ids(ids)
        assert turn.thinking_tokens == len(fmt.encode(think))
        assert turn.tool_call_tokens == len(fmt.encode(valid + broken + stray + "<tool_call>{cut"))
        assert [c.name for c in turn.tool_calls] == ["write_file"] and len(turn.errors) == 3
    # a marker spelled out in pieces (as a model can sample it): the slow path splits there
    pieces = [t for ch in "<think>" for t in fmt.encode(ch)] + fmt.encode("ab</think>" + valid)
    turn = fmt.parse_ids(pieces)
    assert turn.thinking_tokens == len(pieces) - len(fmt.encode(valid))
    assert turn.tool_call_tokens == len(fmt.encode(valid))


def test_default_template_lists_each_tool_in_the_shape_of_its_call(tok):
    """The default model's prompt lists each tool as its call's JSON with the argument types as
    values (``"offset"?`` optional), then its description: the call's own tokens at a third of
    the JSON schemas' length; schemas without parameters or with odd types still render."""
    tools = make_tools(test_command="python -m pytest")
    fmt = ChatFormat(tok)
    text = fmt.render([{"role": "user", "content": "fix it"}], tool_schemas(tools))
    listed = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
    assert [line.split('"', 4)[3] for line in listed] == [t.name for t in tools]
    assert all(line.endswith("}} " + t.description) for line, t in zip(listed, tools, strict=True))
    assert ('{"name": "edit_file", "arguments": {"path": string, "old_string": string, '
            '"new_string": string, "replace_all"?: boolean}} Replace old_string') in text
    assert '{"name": "memory", "arguments": {"action": "add" | "list", "note"?: string}} Keep' in text
    assert '{"name": "read_lints", "arguments": {"paths"?: array of string}} Lint' in text
    odd = [{"type": "function", "function": {"name": "ping"}},
           {"type": "function", "function": {"name": "put", "description": "Store.", "parameters": {
               "type": "object", "properties": {"key": {"type": ["string", "null"]}, "blob": {}},
               "required": ["blob"]}}}]
    text = fmt.render([{"role": "user", "content": "x"}], odd)
    assert ('<tools>\n{"name": "ping", "arguments": {}}\n'
            '{"name": "put", "arguments": {"key"?: [\'string\', \'null\'], "blob": any}} Store.\n</tools>') in text
