"""ScriptedPolicy and the OracleAgent (gold patch -> tool calls -> a solved task)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import sys

import pytest

from looprl.diffs import parse_diff
from looprl.errors import TaskError
from looprl.harness.agent import AgentConfig, run_agent
from looprl.harness.policies import (
    READ_LIMIT,
    OracleAgent,
    ScriptedPolicy,
    oracle_turns,
    patched,
    selections,
    slipped_turns,
    tight_edit,
)
from looprl.harness.tools import make_tools
from looprl.types import SamplingParams, StopReason, Trajectory
from tests.bwrap_support import skip_without_sandbox

from .dir_sandbox import DirSandbox, tree_diff


def gold_patch(repo, tmp_path, change) -> str:
    solved = tmp_path / "solved"
    shutil.copytree(repo, solved)
    change(solved)
    return tree_diff(repo, solved)


def solve(task, fmt, tok):
    sb = DirSandbox(task.repo)
    try:
        oracle = OracleAgent(task, tok)
        traj = asyncio.run(run_agent(task, sb, oracle, fmt, make_tools(), AgentConfig(context_window=100_000),
                                     group_id="oracle", trajectory_id="oracle/0"))
    finally:
        asyncio.run(sb.close())
    return traj


def test_oracle_solves_edit_new_and_deleted_files(task, repo, tmp_path, fmt, tok):
    def change(root):
        calc = root / "pkg" / "calc.py"
        calc.write_text(calc.read_text().replace("def add(a, b):\n    return a - b",
                                                 "def add(a, b):\n    return a + b"))
        (root / "pkg" / "extra.py").write_text("def mul(a, b):\n    return a * b\n")
        (root / "README.md").unlink()

    patch = gold_patch(repo, tmp_path, change)
    traj = solve(dataclasses.replace(task, gold_patch=patch), fmt, tok)
    assert traj.stop_reason == StopReason.FINISHED and traj.counters.broken_tool_calls == 0
    assert traj.diff == patch
    tools_used = [m["name"] for m in traj.messages if m["role"] == "tool"]
    assert tools_used == ["grep", "read_file", "run_terminal", "edit_file", "write_file", "finish"]
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert results[0] == "./pkg/calc.py:1:def add(a, b):"
    assert results[3].startswith("Edited pkg/calc.py")
    assert all(not m["content"].startswith(("Error", "Invalid")) for m in traj.messages if m["role"] == "tool")


def test_oracle_only_names_what_it_has_seen(task, repo, tmp_path, fmt, tok):
    """Paths, offsets and snippets of the oracle's calls all come from earlier observations
    (the prompt or tool results), so a model can learn to make the same calls; a change past
    the first window is reached through read_file's continue hint."""
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (repo / "pkg" / "long.py").write_text(f"import os\n\n\ndef long_one(a):\n{body}    return a < x59\n")

    def change(root):
        p = root / "pkg" / "long.py"
        p.write_text(p.read_text().replace("return a < x59", "return a >= x59"))

    patch = gold_patch(repo, tmp_path, change)
    t = dataclasses.replace(task, gold_patch=patch)
    sb = DirSandbox(t.repo)
    try:
        traj = asyncio.run(run_agent(t, sb, OracleAgent(t, tok, verify=True), fmt, make_tools(),
                                     AgentConfig(context_window=100_000), group_id="o",
                                     trajectory_id="o/0"))
    finally:
        asyncio.run(sb.close())
    assert traj.diff == patch
    seen, calls = "", []
    for m in traj.messages:
        if m["role"] == "assistant":
            for c in m.get("tool_calls", []):
                args = json.loads(c["function"]["arguments"])
                calls.append(c["function"]["name"])
                for key in ("path", "old_string"):
                    if key in args:
                        assert args[key] in seen, (key, args[key])
                if "offset" in args:
                    assert f":{args['offset']}:" in seen or f"offset={args['offset']}" in seen
        else:
            seen += "\n" + m["content"]
    reads = 1 + (66 - 4 - 1) // READ_LIMIT  # windows from the def (line 4) to the change (line 65)
    assert calls == ["grep", *["read_file"] * reads, "edit_file", "run_tests", "finish"]
    edit = [m for m in traj.messages if m.get("name") == "edit_file"][0]
    assert edit["content"].startswith("Edited pkg/long.py")


def test_oracle_greps_the_function_the_prompt_names_not_a_nested_helper(task, repo, tmp_path):
    """A bug inside a nested helper is found the way a user's words lead: grep the function the
    prompt names, read down from it; with no name in the prompt, the outermost function."""
    (repo / "pkg" / "nest.py").write_text(
        "def outer(xs):\n    def helper(x):\n        return x - 1\n    return [helper(x) for x in xs]\n")

    def change(root):
        p = root / "pkg" / "nest.py"
        p.write_text(p.read_text().replace("return x - 1", "return x + 1"))

    patch = gold_patch(repo, tmp_path, change)
    for prompt, name in [("fix outer", "outer"), ("helper in outer is off by two", "helper"),
                         ("something is wrong", "outer")]:
        turns = oracle_turns(dataclasses.replace(task, gold_patch=patch, prompt=prompt))
        assert json.loads(turns[0].removeprefix("<tool_call>").removesuffix("</tool_call>")) == \
            {"name": "grep", "arguments": {"pattern": rf"def {name}\b"}}, prompt


def test_oracle_falls_back_to_write_file_when_a_hunk_is_not_unique(task, repo, tmp_path, fmt, tok):
    block = "".join(f"{c} = 1\n" for c in "abcdefg")
    (repo / "pkg" / "rep.py").write_text(block * 3)

    def change(root):
        (root / "pkg" / "rep.py").write_text(block + block.replace("d = 1", "d = 2") + block)

    patch = gold_patch(repo, tmp_path, change)
    traj = solve(dataclasses.replace(task, gold_patch=patch), fmt, tok)
    assert traj.stop_reason == StopReason.FINISHED and traj.diff == patch
    assert "write_file" in [m["name"] for m in traj.messages if m["role"] == "tool"]


def test_selection_is_the_code_the_oracle_replaces_never_the_fix(task, repo, tmp_path):
    """What a user would select in the editor: the oracle's old_string, with the path as grep
    shows it and the line it starts on, widened like the snippet when the line is not unique."""
    (repo / "pkg" / "sel.py").write_text(
        "def f(a, b):\n    x = 1\n    return a < b\n" + "\n" * 8 + "def g(a, b):\n    y = 2\n    x = 1\n")

    def change(root):
        p = root / "pkg" / "sel.py"
        p.write_text(p.read_text().replace("a < b", "a >= b").replace("y = 2\n    x = 1",
                                                                       "y = 2\n    x = 3"))

    patch = gold_patch(repo, tmp_path, change)
    t = dataclasses.replace(task, gold_patch=patch)
    assert selections(t) == [("./pkg/sel.py", 3, "return a < b"), ("./pkg/sel.py", 13, "y = 2\n    x = 1")]
    calls = [json.loads(c.removeprefix("<tool_call>"))
             for turn in oracle_turns(t) for c in turn.split("</tool_call>")[:-1]]
    edits = [c["arguments"] for c in calls if c["name"] == "edit_file"]
    assert [e["old_string"] for e in edits] == ["return a < b", "y = 2\n    x = 1"]


def test_no_selection_when_the_fix_is_not_an_in_place_edit(task, repo, tmp_path):
    block = "".join(f"{c} = 1\n" for c in "abcdefg")
    (repo / "pkg" / "rep.py").write_text(block * 3)

    def change(root):
        (root / "pkg" / "rep.py").write_text(block + block.replace("d = 1", "d = 2") + block)
        (root / "pkg" / "new.py").write_text("z = 1\n")

    assert selections(dataclasses.replace(task, gold_patch=gold_patch(repo, tmp_path, change))) == []
    with pytest.raises(TaskError, match="no gold_patch"):
        selections(dataclasses.replace(task, gold_patch=None))


def test_gold_patch_without_trailing_newline_and_bad_patches(task):
    patch = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ No newline at end of file\n"
    (fp,) = parse_diff(patch)
    assert patched("a\nb\n", fp) == "a\nc"
    with pytest.raises(TaskError, match="does not apply"):
        patched("z\nb\n", fp)
    with pytest.raises(TaskError, match="malformed"):
        oracle_turns(dataclasses.replace(task, gold_patch=patch.replace("@@ -1,2", "@@ -1,3")))
    with pytest.raises(TaskError, match="no gold_patch"):
        oracle_turns(task)
    with pytest.raises(TaskError, match="no file diffs"):
        oracle_turns(dataclasses.replace(task, gold_patch="hello"))


def test_scripted_policy_truncates_and_tracks_sessions(tok):
    policy = ScriptedPolicy(tok, ["abcdef", "gh"])
    gen = asyncio.run(policy.generate([1], SamplingParams(max_new_tokens=3), session_id="a"))
    assert gen.finish_reason == "length" and len(gen.token_ids) == 3 and gen.logprobs == (0.0,) * 3
    gen = asyncio.run(policy.generate([1], SamplingParams(), session_id="b"))
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == policy.eot_id  # session b starts over
    asyncio.run(policy.update_weights({}, 7))
    gen = asyncio.run(policy.generate([1], SamplingParams(), session_id="a"))
    assert gen.policy_versions == (7,) * len(gen.token_ids) and policy.policy_version == 7


@pytest.mark.needs_bwrap
@skip_without_sandbox
def test_oracle_cli_in_the_real_sandbox(task, repo, tmp_path):
    from typer.testing import CliRunner

    from looprl.commands.agent import app
    from looprl.tasks.taskset import write_tasks

    def change(root):
        calc = root / "pkg" / "calc.py"
        calc.write_text(calc.read_text().replace("def add(a, b):\n    return a - b",
                                                 "def add(a, b):\n    return a + b"))

    patch = gold_patch(repo, tmp_path, change)
    tasks = write_tasks([dataclasses.replace(task, gold_patch=patch, venv=sys.prefix)], tmp_path / "t.jsonl")
    out = tmp_path / "trajs.jsonl"
    res = CliRunner().invoke(app, ["oracle", str(tasks), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "1/1 tasks finished by the oracle with no broken call" in res.output
    traj = Trajectory.from_json(out.read_text().splitlines()[0])
    assert traj.diff == patch
    assert [m["name"] for m in traj.messages if m["role"] == "tool"] == ["grep", "read_file", "edit_file", "finish"]


@pytest.mark.parametrize("old,new,want", [
    ("if len(xs) == 1 and not f(xs[1]):\n", "if len(xs) == 1 and not f(xs[0]):\n", ("[1]", "[0]", 1)),
    ("a\n    if not (n < 2):\n", "a\n    if n < 2:\n", ("not (n < 2)", "n < 2", 2)),
    # a string literal is one token: never cut inside it
    ('x.replace("_", "-")\ny.replace("_", "+")\n', 'x.replace("_", " ")\ny.replace("_", "+")\n',
     ('"_", "-"', '"_", " "', 1)),
    ("g(b=True)\n", "g(b=False)\n", ("True", "False", 1)),
    ("v = n // 100\nw = n // 10\n", "v = n * 100\nw = n // 10\n", ("// 100", "* 100", 1)),
])
def test_tight_edit_selects_the_fewest_whole_tokens_that_are_unique(old, new, want):
    got = tight_edit(old, new)
    assert got == want
    snippet, fixed, line = got
    assert old.count(snippet) == 1 and old.replace(snippet, fixed) == new
    assert old.splitlines()[line - 1].find(snippet) >= 0


def test_tight_edit_gives_up_across_lines_or_when_nothing_is_unique():
    assert tight_edit("a = 1\nb = 2\n", "a = 2\nb = 3\n") is None  # two places
    assert tight_edit("f(a, b)\nf(a, b)\n", "f(a, b)\nf(b, a)\n") is None  # the whole line repeats
    assert tight_edit("x = (1 +\n     2)\n", "x = (1 -\n     2)\n") == ("1 +", "1 -", 1)


def test_a_slip_cuts_only_the_first_try_of_the_edit():
    one = ['<tool_call>{"name": "edit_file", "arguments": {"path": "a.py", "old_string": "x = 1", '
           '"new_string": "x = 2"}}</tool_call>',
           '<tool_call>{"name": "finish", "arguments": {}}</tool_call>']
    cuts = set()
    for seed in range(20):
        cut, *rest = slipped_turns(one, random.Random(seed))
        assert rest == one and one[0].startswith(cut) and '"arguments"' in cut
        assert "</tool_call>" not in cut
        cuts.add(cut)
    assert len(cuts) > 5  # cut anywhere in the arguments
    with pytest.raises(TaskError, match="one edit_file call"):
        slipped_turns([one[0] + one[0], one[1]], random.Random(0))
