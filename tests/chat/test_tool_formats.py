"""Each family's tool-call format (``looprl.chat.tool_formats``) with a tokenizer carrying that
family's chat template (``tests/chat_families.py``): the template is probed to its format, a call
the template writes parses back to the call, token-in/token-out contexts equal the template's
own rendering, and malformed calls are broken calls with a one-line reason, never exceptions
and never evaluated."""

from __future__ import annotations

import json

import pytest

from looprl.chat import FORMATS, ChatFormat, parse_turn
from looprl.inference.openai_chat import assistant_text
from tests.chat_families import NAMES, family_tokenizer

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "offset": {"type": "integer"}},
                   "required": ["path"]}}}]
ASK = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Read a.py"}]
ARGS = {"path": "a.py", "offset": 3}


def fmt_of(name: str) -> ChatFormat:
    return ChatFormat(family_tokenizer(name))


def call_message(name: str, call_id: str = "a1b2c3d4e", args: dict | None = None) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": name, "arguments": json.dumps(args or ARGS)}}]}


@pytest.mark.parametrize("name", NAMES)
def test_the_template_is_probed_to_its_own_format(name):
    fmt = fmt_of(name)
    assert fmt.tool_format == name
    assert ChatFormat(family_tokenizer(name), tool_format=name).tool_format == name


@pytest.mark.parametrize("name", NAMES)
def test_a_call_the_template_writes_parses_back_to_that_call(name):
    """What the template puts in an assistant turn for a call is what a model trained on it
    writes: it parses to the same name and arguments, one call, no error."""
    fmt = fmt_of(name)
    fmt.prompt_ids(ASK, TOOLS)  # the tools' types (Qwen3-Coder's values are text)
    text = assistant_text(fmt, call_message("read_file"))
    turn = fmt.parse_ids(fmt.encode(text) + [fmt.eot_id], call_prefix="t1")
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [("read_file", ARGS)]
    assert turn.errors == [] and turn.content == ""
    assert len(turn.call_token_spans) == 1 and turn.tool_call_tokens > 0


@pytest.mark.parametrize("name", NAMES)
def test_our_render_round_trips_several_calls_with_markers_in_strings(name):
    fmt = fmt_of(name)
    fmt.prompt_ids(ASK, TOOLS)
    tricky = "x [TOOL_CALLS] <|python_tag|> <|call|> <|end|> [ARGS] {\"q\": 1}; é漢😀"
    calls = [("read_file", {"path": tricky, "offset": 7}), ("glob", {"pattern": "*.py"})]
    if name == "qwen3_coder":  # XML cannot quote </tool_call> (Qwen's parser cannot either)
        calls[0] = ("read_file", {"path": tricky + " <think> <function=x>", "offset": 7})
    text = FORMATS[name].render(calls)
    turn = fmt.parse_ids(fmt.encode(text) + [fmt.eot_id], call_prefix="t4")
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == calls, turn.errors
    assert len({c.id for c in turn.tool_calls}) == 2 and turn.errors == []
    spans = turn.call_token_spans
    assert len(spans) == 2 and spans[0][1] == spans[1][0] and spans[1][1] == len(fmt.encode(text))


@pytest.mark.parametrize("name", NAMES)
def test_prompt_turn_and_observation_are_the_templates_own_rendering(name):
    """Token-in/token-out: the first context, the model's turn as the template writes it and
    the tool result appended by ``observation_ids`` decode to the template's rendering of the
    whole conversation (Mistral pre-v11 writes the call id into the turn: ours is in it).
    Mistral v0.3's template moves the system message to the last user message, so a longer
    conversation re-renders the first one differently: it is checked without one."""
    fmt = fmt_of(name)
    ask = ASK[1:] if name == "mistral" else ASK
    prompt = fmt.prompt_ids(ask, TOOLS)
    probe = fmt.parse(assistant_text(fmt, call_message("read_file")), call_prefix="t1")
    call_id = probe.tool_calls[0].id
    msg = call_message("read_file", call_id)
    text = assistant_text(fmt, msg)
    native = msg if name == "hermes" else _dict_args(msg)  # HF templates take objects
    end = [i for i in fmt.end_ids if fmt.tokenizer.decode([i]) in
           fmt.render(ask + [native], TOOLS, add_generation_prompt=False)[-12:]] or [fmt.eot_id]
    result = {"role": "tool", "tool_call_id": call_id, "name": "read_file", "content": "1\tx = 1"}
    obs = fmt.observation_ids([result])
    want = fmt.render(ask + [native, result], TOOLS)
    assert fmt.tokenizer.decode(prompt + fmt.encode(text) + end[:1] + obs) == want


def _dict_args(msg: dict) -> dict:
    calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
             for c in msg["tool_calls"]]
    return {**msg, "tool_calls": calls}


def test_a_named_format_the_template_contradicts_is_refused_in_one_line():
    with pytest.raises(ValueError, match="writes tool calls as 'llama3'; set tool_format") as e:
        ChatFormat(family_tokenizer("llama3"), tool_format="hermes")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown tool format 'llama'; use one of hermes"):
        ChatFormat(family_tokenizer("llama3"), tool_format="llama")


def test_a_named_format_on_a_template_without_tool_calls_is_refused():
    bare = _bare_tokenizer()
    assert ChatFormat(bare).tool_format == "hermes"  # today's behaviour, unchanged
    with pytest.raises(ValueError, match="renders no tool calls"):
        ChatFormat(bare, tool_format="qwen3_coder")


def _bare_tokenizer():
    import copy

    tok = copy.deepcopy(family_tokenizer("qwen3_coder"))
    tok.chat_template = ("{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + "
                         "(m['content'] or '') + '<|im_end|>\\n' -}}{%- endfor -%}"
                         "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
                         "{%- endif -%}")
    return tok


BROKEN = {
    "qwen3_coder": {
        "<tool_call>\n{\"name\": \"read_file\"}\n</tool_call>": "must start with <function=NAME>",
        "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</function>\n</tool_call>":
            "has no </parameter>",
        "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n</tool_call>":
            "expected <parameter=NAME>...</parameter> or </function>",
        "<tool_call>\n<function=read_file>\n<parameter=path>\na": "unclosed <tool_call>",
        "done</tool_call>": "without a matching",
        "<tool_call>\n<function=>\n</function>\n</tool_call>": 'no "name" string',
    },
    "llama3": {
        "<|python_tag|>brave_search.call(query=\"x\")": "not followed by a JSON call",
        '{"name": "read_file", "parameters": {"path": "a"': "not valid JSON",
        '{"name": "a", "parameters": {}, "arguments": {}}': "both",
        '<|python_tag|>["read_file"]': "not followed by a JSON call",
        '{"name": "a", "parameters": [1]}': "must be a JSON object, got list",
        '{"parameters": {}}': 'no "name" string',
    },
    "mistral": {
        '[TOOL_CALLS] {"name": "a", "arguments": {}}': "expected a JSON array",
        '[TOOL_CALLS] [{"name": "a", "arguments": {}': "not a valid JSON list",
        "[TOOL_CALLS] []": "empty list",
        "[TOOL_CALLS] [3]": "must be a JSON object",
        '[TOOL_CALLS] [{"name": "a", "arguments": {}, "extra": 1}]': "unexpected key",
    },
    "mistral_v11": {
        '[TOOL_CALLS]read_file{"path": "a"}': "not followed by [ARGS]",
        '[TOOL_CALLS][ARGS]{"path": "a"}': "no tool name",
        "[TOOL_CALLS]read_file[ARGS]{oops": "not valid JSON",
        'say [ARGS]{"path": "a"}': "outside a call",
        "[TOOL_CALLS]read_file[ARGS][1]": "must be a JSON object, got list",
    },
    "harmony": {
        "<|channel|>commentary to=python<|message|>print(1)": "is not a function",
        "<|channel|>commentary to=functions.read_file <|constrain|>json<|message|>{oops":
            "not valid JSON",
        "<|channel|>commentary to=functions.read_file<|message|>{\"path\": \"a\"} x<|call|>":
            "extra text",
        "just text<|call|>": "without <|message|>",
        "<|channel|>final<|message|>hi<|end|><|call|>": "outside a message",
    },
}


@pytest.mark.parametrize("name,text,why", [(n, t, w) for n, cases in BROKEN.items()
                                           for t, w in cases.items()])
def test_malformed_calls_are_one_broken_call_with_a_reason(name, text, why):
    turn = parse_turn(text, tool_format=name)
    assert turn.tool_calls == [] and len(turn.errors) == 1, turn
    assert why in turn.errors[0] and "\n" not in turn.errors[0].replace("\\n", ""), turn.errors


def test_nothing_in_a_call_is_evaluated(tmp_path):
    """verl's Qwen3 XML parser ran eval() on arguments (#6542): here a value is text, or JSON
    read by the guarded decoder, whatever it looks like."""
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    fmt = fmt_of("qwen3_coder")
    fmt.prompt_ids(ASK, [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"o": {"type": "object"}, "s": {"type": "string"}}}}}])
    text = (f"<tool_call>\n<function=f>\n<parameter=o>\n{payload}\n</parameter>\n"
            f"<parameter=s>\n{payload}\n</parameter>\n</function>\n</tool_call>")
    [c] = fmt.parse(text).tool_calls
    assert json.loads(c.arguments) == {"o": payload, "s": payload} and not marker.exists()
    turn = parse_turn(f"<|python_tag|>{payload}", tool_format="llama3")
    assert turn.tool_calls == [] and len(turn.errors) == 1 and not marker.exists()


def test_qwen3_coder_values_are_typed_by_the_tool_schema():
    fmt = fmt_of("qwen3_coder")
    fmt.prompt_ids(ASK, [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"},
                                         "b": {"type": "boolean"}, "l": {"type": "array"}}}}}])
    text = FORMATS["qwen3_coder"].render([("f", {"n": 5, "s": "5", "b": True, "l": [1, "a"]})])
    text = text.replace("true", "True")  # Qwen's template writes Python's spelling
    [c] = fmt.parse(text).tool_calls
    assert json.loads(c.arguments) == {"n": 5, "s": "5", "b": True, "l": [1, "a"]}
    bad = text.replace("\n5\n</parameter>\n<parameter=s>", "\nfive\n</parameter>\n<parameter=s>")
    [c] = fmt.parse(bad).tool_calls  # stays text: the tool's own check tells the model
    assert json.loads(c.arguments)["n"] == "five"


def test_content_around_calls_and_harmony_thinking():
    turn = parse_turn('Let me look.<|python_tag|>{"name": "glob", "parameters": {"pattern": "*"}}',
                      tool_format="llama3")
    assert turn.content == "Let me look." and [c.name for c in turn.tool_calls] == ["glob"]
    turn = parse_turn('Reading it.[TOOL_CALLS]glob[ARGS]{"pattern": "*"}', tool_format="mistral_v11")
    assert turn.content == "Reading it." and [c.name for c in turn.tool_calls] == ["glob"]
    text = ("<|channel|>analysis<|message|>Look first.<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.glob <|constrain|>json<|message|>{"pattern": "*"}')
    turn = parse_turn(text, tool_format="harmony")
    assert turn.thinking_text == "Look first." and turn.content == ""
    assert [c.name for c in turn.tool_calls] == ["glob"] and turn.errors == []
    final = parse_turn("<|channel|>final<|message|>All done.", tool_format="harmony")
    assert final.content == "All done." and final.tool_calls == [] and final.errors == []


def test_mistral_call_ids_are_nine_alphanumerics():
    turn = parse_turn(FORMATS["mistral"].render([("a", {}), ("b", {})]), tool_format="mistral",
                      call_prefix="t3")
    ids = [c.id for c in turn.tool_calls]
    assert all(len(i) == 9 and i.isalnum() for i in ids) and len(set(ids)) == 2
    again = parse_turn(FORMATS["mistral"].render([("a", {})]), tool_format="mistral",
                       call_prefix="t4")
    assert again.tool_calls[0].id not in ids
