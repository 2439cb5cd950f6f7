"""Copy drills: each drill's call copies its (randomised) source from its own context, the
original name/path/line is gone, and turns that copy nothing give no drill."""

from __future__ import annotations

import json
import re

import pytest

from looprl.errors import ConfigError
from looprl.harness.format import ChatFormat
from looprl.models.tokenizer import build_tokenizer
from looprl.tasks.drills import _call, _steps, copy_drills
from looprl.types import Counters, Segment, StopReason, Trajectory

FILLER = "\n".join(f"pkg/other_{i}.py:{i}:def helper_{i}(item_{i}, value_{i}):" for i in range(30))


def _call_text(name: str, **args: object) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def _demo(tok, prompt: str = "fix parse_value, it is off by one") -> Trajectory:
    blocks = [
        ("user", prompt),
        ("assistant", _call_text("grep", pattern="def parse_value\\b")),
        ("tool", f"pkg/util.py:12:def parse_value(raw):\n{FILLER}"),
        ("assistant", _call_text("read_file", path="pkg/util.py", offset=12, limit=30)),
        ("tool", "    12\tdef parse_value(raw):\n    13\t    return int(raw) - 1\n"),
        ("assistant", _call_text("edit_file", path="pkg/util.py",
                                 old_string="    return int(raw) - 1",
                                 new_string="    return int(raw)")),
    ]
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
