"""Copy drills: each drill's call copies its (randomised) source from its own context, the
original name/path/line is gone, and turns that copy nothing give no drill."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from looprl.chat import ChatFormat
from looprl.errors import ConfigError
from looprl.models.tokenizer import build_tokenizer
from looprl.tasks.drills import _call, _steps, copy_drills, renamed_demos
from looprl.types import Counters, Segment, StopReason, Trajectory

FILLER = "\n".join(f"pkg/other_{i}.py:{i}:def helper_{i}(item_{i}, value_{i}):" for i in range(30))


def _call_text(name: str, **args: object) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def _demo(tok, prompt: str = "fix parse_value, it is off by one") -> Trajectory:
    blocks = _demo_blocks(prompt)
    text = "".join(f"<|im_start|>{r}\n{b}<|im_end|>\n" for r, b in blocks)
    ids = tuple(tok.encode(text, add_special_tokens=False))
    seg = Segment(ids, (0.0,) * len(ids), (0,) * len(ids), (-1,) * len(ids))
    return Trajectory(task_id="t", group_id="g", segments=(seg,), messages=(),
                      counters=Counters(), stop_reason=StopReason.FINISHED)


def _drills(tok, kind: str, demo: Trajectory | None = None, n: int = 3):
    fmt = ChatFormat(tok)
    out = []
    for ids in copy_drills([demo or _demo(tok)], tok, per_demo=n, seed=1, kinds=[kind]):
        (ctx_role, ctx, tool, args, _), = list(_steps(fmt.decode(ids)))
        assert tool == kind
        out.append((ctx, args))
    return out


def test_grep_drills_copy_a_random_name_from_the_prompt():
    tok = build_tokenizer(None)
    drills = _drills(tok, "grep")
    assert len(drills) == 3
    names = set()
    for ctx, args in drills:
        name = re.match(r"def (\w+)", args["pattern"]).group(1)
        assert name != "parse_value" and "parse_value" not in ctx
        assert ctx == f"fix {name}, it is off by one"
        names.add(name)
    assert len(names) == 3  # a different name each time


def test_read_drills_copy_a_random_path_and_line_from_the_grep_output():
    tok = build_tokenizer(None)
    for ctx, args in _drills(tok, "read_file"):
        assert args["path"] != "pkg/util.py" and args["path"].endswith(".py")
        assert args["path"].count("/") == 1
        assert f"{args['path']}:{args['offset']}:def parse_value(raw):" in ctx
        assert "pkg/util.py" not in ctx and "pkg/other_3.py:3:" in ctx  # other hits untouched


def test_edit_drills_copy_old_string_with_random_identifiers():
    tok = build_tokenizer(None)
    for ctx, args in _drills(tok, "edit_file"):
        old = args["old_string"]
        assert old in ctx and not re.search(r"\braw\b", old) and "int(" in old  # builtins kept
        assert args["new_string"] == old.replace(" - 1", "")  # renamed alike in the fix


def test_a_turn_that_copies_nothing_gives_no_drill():
    tok = build_tokenizer(None)
    demo = _demo(tok, prompt="something is wrong in the parser")  # the name is not given
    assert _drills(tok, "grep", demo) == []
    assert len(_drills(tok, "read_file", demo)) == 3


def test_call_parsing_rejects_turns_without_exactly_one_call():
    assert _call("no call here") is None
    assert _call(_call_text("grep", pattern="x") * 2) is None
    assert _call("<tool_call>{not json}</tool_call>") is None
    assert _call(_call_text("grep", pattern="x")) == ("grep", {"pattern": "x"})


def test_a_non_chatml_transcript_is_refused():
    tok = build_tokenizer(None)
    ids = tuple(tok.encode("User: fix it\nAssistant: done", add_special_tokens=False))
    seg = Segment(ids, (0.0,) * len(ids), (0,) * len(ids), (-1,) * len(ids))
    demo = Trajectory(task_id="t", group_id="g", segments=(seg,), messages=(),
                      counters=Counters(), stop_reason=StopReason.FINISHED)
    with pytest.raises(ConfigError, match="ChatML"):
        copy_drills([demo], tok)


def _harness_demo(tok, blocks: list[tuple[str, str]] | None = None) -> Trajectory:
    """``_demo`` (or ``blocks``) as the harness records it: the loss on the assistant turns
    (their text and end-of-turn token), the headers and tool results context."""
    ids: list[int] = []
    mask: list[int] = []
    ctx = ""
    for role, body in blocks or _demo_blocks():
        if role != "assistant":
            ctx += ("\n" if ctx or mask else "") + f"<|im_start|>{role}\n{body}<|im_end|>"
            continue
        for text, loss in ((ctx + "\n<|im_start|>assistant\n", 0), (f"{body}<|im_end|>", 1)):
            piece = tok.encode(text, add_special_tokens=False)
            ids += piece
            mask += [loss] * len(piece)
        ctx = ""
    seg = Segment(tuple(ids), (0.0,) * len(ids), tuple(mask), tuple(0 if m else -1 for m in mask))
    return Trajectory(task_id="t", group_id="g", segments=(seg,), messages=(),
                      counters=Counters(), stop_reason=StopReason.FINISHED)


def _demo_blocks(prompt: str = "fix parse_value, it is off by one") -> list[tuple[str, str]]:
    return [
        ("user", prompt),
        ("assistant", _call_text("grep", pattern="def parse_value\\b")),
        ("tool", f"pkg/util.py:12:def parse_value(raw):\n{FILLER}"),
        ("assistant", _call_text("read_file", path="pkg/util.py", offset=12, limit=30)),
        ("tool", "    12\tdef parse_value(raw):\n    13\t    return int(raw) - 1\n"),
        ("assistant", _call_text("edit_file", path="pkg/util.py",
                                 old_string="    return int(raw) - 1",
                                 new_string="    return int(raw)")),
    ]


def test_a_renamed_demo_is_the_same_fix_of_renamed_code_with_the_loss_on_the_same_turns():
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    demo = _harness_demo(tok)
    (new,) = renamed_demos([demo], tok, share=1.0, seed=3)
    assert new.metadata["renamed"] == "raw" and new.task_id == "t/renamed"
    seg, old_seg = new.segments[0], demo.segments[0]
    text = fmt.tokenizer.decode(list(seg.token_ids_T), skip_special_tokens=False)
    assert not re.search(r"\braw\b", text) and "parse_value" in text  # only the edited names
    turns = [fmt.decode(seg.token_ids_T[a:b]) for a, b in seg.model_turns()]
    assert len(turns) == len(old_seg.model_turns()) == 3
    assert all(seg.token_ids_T[b - 1] == fmt.eot_id for _, b in seg.model_turns())
    (_, edit), = [_call(t) for t in turns[2:]]
    new_name = re.search(r"int\((\w+)\)", edit["old_string"]).group(1)
    assert edit == {"path": "pkg/util.py", "old_string": f"    return int({new_name}) - 1",
                    "new_string": f"    return int({new_name})"}
    before_edit = fmt.tokenizer.decode(list(seg.token_ids_T[:seg.model_turns()[2][0]]),
                                       skip_special_tokens=False)
    assert f"def parse_value({new_name}):" in before_edit  # copied from the context, as before
    assert new_name not in fmt.tokenizer.decode(list(old_seg.token_ids_T), skip_special_tokens=False)


def test_renaming_leaves_demos_without_an_edit_and_a_zero_share_alone():
    tok = build_tokenizer(None)
    demo = _harness_demo(tok)
    no_edit = Trajectory(task_id="n", group_id="g", segments=(Segment(
        *(x[:demo.segments[0].model_turns()[1][1]] for x in (
            demo.segments[0].token_ids_T, demo.segments[0].logprobs_T,
            demo.segments[0].loss_mask_T, demo.segments[0].policy_version_T))),),
        messages=(), counters=Counters(), stop_reason=StopReason.FINISHED)
    assert renamed_demos([demo, no_edit], tok, share=0.0) == [demo, no_edit]
    assert renamed_demos([no_edit], tok, share=1.0) == [no_edit]


def test_renaming_touches_code_only_never_json_keys_escapes_or_the_system_prompt():
    tok = build_tokenizer(None)
    fmt = ChatFormat(tok)
    code = 'def clean(path, n):\n    return re.sub(r"\\w+", path, n)'
    old = '    return re.sub(r"\\w+", path, n)'
    system = 'tools: edit_file(path, old_string, new_string); n is a count'
    demo = _harness_demo(tok, [
        ("system", system), ("user", f"fix clean\n```\n{code}\n```"),
        ("assistant", _call_text("edit_file", path="pkg/a.py", old_string=old,
                                 new_string=old.replace(", n)", ", n - 1)"))),
        ("tool", "Edited pkg/a.py"), ("assistant", _call_text("finish", summary="done"))])
    edit_args = json.dumps({"path": "pkg/a.py", "old_string": old, "new_string": old})
    demo = dataclasses.replace(demo, messages=(
        {"role": "system", "content": system}, {"role": "user", "content": code},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c0", "type": "function",
             "function": {"name": "edit_file", "arguments": edit_args}}]}))
    (new,) = renamed_demos([demo] + [_demo(tok)], tok, share=1.0, seed=0)[:1]
    assert new.metadata["renamed"] == "n path re sub"
    seg = new.segments[0]
    text = fmt.tokenizer.decode(list(seg.token_ids_T), skip_special_tokens=False)
    assert system in text  # the system prompt and the role headers are not code
    (a, b), (c, d) = seg.model_turns()
    edit = _call(fmt.decode(seg.token_ids_T[a:b]))
    assert edit is not None and edit[0] == "edit_file" and set(edit[1]) == {"path", "old_string", "new_string"}
    got = edit[1]["old_string"]
    assert 'r"\\w+"' in got and not re.search(r"\b(path|n|re|sub)\b(?!\+)", got.replace("\\w", ""))
    assert got in fmt.tokenizer.decode(list(seg.token_ids_T[:a]))  # still copied from the selection
    assert edit[1]["new_string"] == got.replace(", ", ", ", 1)[:-1] + " - 1)"
    assert _call(fmt.decode(seg.token_ids_T[c:d])) == ("finish", {"summary": "done"})
    system_msg, user_msg, assistant_msg = new.messages  # the record renamed as the tokens are
    assert system_msg["content"] == system and got in user_msg["content"]
    recorded = json.loads(assistant_msg["tool_calls"][0]["function"]["arguments"])
    assert recorded == {"path": "pkg/a.py", "old_string": got, "new_string": got}
