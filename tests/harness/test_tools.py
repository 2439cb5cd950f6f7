"""Each tool against the DirSandbox double: results the model sees, errors that say how to fix."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from looprl.errors import ConfigError, PathEscapeError, SandboxError, ToolCallError, ToolError
from looprl.harness.tools import TOOLS, ToolContext, make_tools, validate_args
from looprl.harness.tools.edit_file import EditFile
from looprl.harness.tools.glob_files import Glob, glob_regex
from looprl.harness.tools.grep import Grep
from looprl.harness.tools.list_dir import ListDir
from looprl.harness.tools.memory import Memory
from looprl.harness.tools.read_file import ReadFile
from looprl.harness.tools.read_lints import ReadLints
from looprl.harness.tools.run_terminal import RunTerminal
from looprl.harness.tools.run_tests import RunTests
from looprl.harness.tools.write_file import WriteFile

from .conftest import CALC, make_sandbox, needs_bwrap, ws_root


def run(tool, ctx, **args):
    return asyncio.run(tool.run(validate_args(tool, args), ctx))


def test_read_file_numbers_lines_and_ranges(ctx):
    assert run(ReadFile(), ctx, path="pkg/calc.py").splitlines()[:2] == [
        "     1\tdef add(a, b):", "     2\t    return a - b"]
    part = run(ReadFile(), ctx, path="pkg/calc.py", offset=5, limit=1)
    assert part == ("     5\tdef sub(a, b):\n[showing lines 5-5 of 6; call read_file with offset=6 "
                    "to continue]")
    assert "offset 99 is past the end" in run(ReadFile(), ctx, path="pkg/calc.py", offset=99)
    with pytest.raises(ToolError, match="no such file"):
        run(ReadFile(), ctx, path="pkg/nope.py")
    with pytest.raises(ToolError, match="is a directory|not a regular file"):
        run(ReadFile(), ctx, path="pkg")


def test_read_file_caps_size(ctx, sandbox):
    asyncio.run(sandbox.write("big.txt", ("x" * 50 + "\n").encode() * 5000))
    out = run(ReadFile(max_lines=100), ctx, path="big.txt")
    assert out.count("\n") == 100 and out.endswith("offset=101 to continue]")
    out = run(ReadFile(max_chars=1000), ctx, path="big.txt")
    assert len(out) < 1200


def test_list_dir_and_glob_are_sorted(ctx):
    assert run(ListDir(), ctx) == "README.md (27 B)\npkg/\ntests/"
    assert run(ListDir(), ctx, path="pkg") == "pkg/__init__.py (0 B)\npkg/calc.py (66 B)"
    assert run(Glob(), ctx, pattern="**/*.py") == "pkg/__init__.py\npkg/calc.py\ntests/test_calc.py"
    assert run(Glob(), ctx, pattern="test_*.py") == "tests/test_calc.py"
    assert run(Glob(), ctx, pattern="*.py", path="pkg") == "pkg/__init__.py\npkg/calc.py"
    assert "No files match" in run(Glob(), ctx, pattern="*.rs")


def test_glob_regex_semantics():
    assert glob_regex("src/**/*.py").match("src/a.py") and glob_regex("src/**/*.py").match("src/a/b/c.py")
    assert not glob_regex("src/*.py").match("src/a/b.py")
    assert glob_regex("[!t]*.md").match("README.md") and not glob_regex("[!t]*.md").match("t.md")


def test_grep_rows_filters_and_cap(ctx):
    assert run(Grep(), ctx, pattern=r"return a - b") == "./pkg/calc.py:2:    return a - b\n./pkg/calc.py:6:    return a - b"
    assert run(Grep(), ctx, pattern="ADD", ignore_case=True, glob="tests/*.py").startswith(
        "./tests/test_calc.py:1:from pkg.calc import add, sub")
    assert run(Grep(), ctx, pattern="def", path="pkg/calc.py") == "./pkg/calc.py:1:def add(a, b):\n./pkg/calc.py:5:def sub(a, b):"
    capped = run(Grep(max_matches=1), ctx, pattern="def")
    assert capped.splitlines()[1].startswith("[... 3 more matches")
    with pytest.raises(ToolError, match="invalid regular expression"):
        run(Grep(), ctx, pattern="(")


def test_grep_with_an_exponential_pattern_is_the_models_error_not_a_frozen_run(ctx, sandbox):
    asyncio.run(sandbox.write("pkg/long.txt", b"a" * 40 + b"!\n"))

    async def grep_while_the_loop_ticks():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        t0 = time.monotonic()
        try:
            with pytest.raises(ToolError, match="took too long"):
                await Grep(timeout_s=0.5).run({"pattern": "(a|aa)+$"}, ctx)
        finally:
            ticker.cancel()
        return time.monotonic() - t0, ticks

    wall, ticks = asyncio.run(grep_while_the_loop_ticks())
    assert wall < 5 and ticks >= 10  # bounded, and other rollouts' coroutines kept running


def test_edit_zero_and_two_matches_then_unique(ctx, sandbox):
    with pytest.raises(ToolError, match="0 matches"):
        run(EditFile(), ctx, path="pkg/calc.py", old_string="return a * b", new_string="x")
    with pytest.raises(ToolError, match=r"matches 2 times in pkg/calc.py \(lines 2, 6\)"):
        run(EditFile(), ctx, path="pkg/calc.py", old_string="return a - b", new_string="return a + b")
    out = run(EditFile(), ctx, path="pkg/calc.py", old_string="def add(a, b):\n    return a - b",
              new_string="def add(a, b):\n    return a + b")
    assert out == "Edited pkg/calc.py: replaced 1 occurrence (line 1)."
    assert asyncio.run(sandbox.read("pkg/calc.py")).decode().count("a + b") == 1
    out = run(EditFile(), ctx, path="pkg/calc.py", old_string="b):", new_string="b) :", replace_all=True)
    assert out == "Edited pkg/calc.py: replaced 2 occurrences (lines 1, 5)."


def test_edit_warns_on_python_syntax_error(ctx):
    out = run(EditFile(), ctx, path="pkg/calc.py", old_string="def sub(a, b):", new_string="def sub(a, b)")
    assert "no longer parses as Python" in out and "line 5" in out


def test_code_that_python_warns_about_is_written_without_a_warning_on_our_console(ctx, recwarn):
    out = run(WriteFile(), ctx, path="w.py", content="x = None\nif x is 1:\n    y = None(1)\n")
    assert out.startswith("Wrote w.py") and "no longer parses" not in out
    assert not [w for w in recwarn if issubclass(w.category, SyntaxWarning)]


def test_write_file_creates_parents(ctx, sandbox):
    assert run(WriteFile(), ctx, path="pkg/sub/new.py", content="X = 1\n") == "Wrote pkg/sub/new.py (1 line, 6 bytes)."
    assert asyncio.run(sandbox.read("pkg/sub/new.py")) == b"X = 1\n"
    assert "no longer parses" in run(WriteFile(), ctx, path="bad.py", content="def (:\n")


def test_run_terminal_exit_code_and_streams(ctx):
    out = run(RunTerminal(), ctx, command="echo hi; echo oops >&2; exit 3")
    assert out == "Exit code: 3\n--- stdout ---\nhi\n\n--- stderr ---\noops\n"


def test_run_terminal_timeout(ctx):
    out = run(RunTerminal(), ctx, command="echo started; sleep 30", timeout_s=1)
    assert out.startswith("Command timed out after 1 s and was killed.")


def test_run_terminal_huge_output_keeps_head_and_tail(ctx):
    out = run(RunTerminal(max_chars=2000), ctx, command="seq 1 100000")
    assert out.startswith("Exit code: 0\n--- stdout ---\n1\n2\n3\n")
    assert out.rstrip().endswith("99999\n100000")
    assert "characters omitted" in out and len(out) < 2200


def test_read_lints_on_changed_files(ctx, sandbox):
    assert run(ReadLints(), ctx) == "No changed Python files to lint (pass paths to lint others)."
    asyncio.run(sandbox.write("pkg/calc.py", b"import os\n\n\ndef add(a, b):\n    return a + b\n"))
    assert run(ReadLints(), ctx) == ("pkg/calc.py:1:8 F401 `os` imported but unused\n"
                                     "1 diagnostic in 1 file.")
    assert run(ReadLints(), ctx, paths=["tests"]) == "No lint errors in 1 file."
    asyncio.run(sandbox.write("pkg/bad.py", b"def f(:\n    return undefined_name\n"))
    out = run(ReadLints(), ctx, paths=["pkg"])
    assert out.startswith("pkg/bad.py:1:7 invalid-syntax") and out.endswith("in 2 files.")


def test_read_lints_finds_changed_files_by_the_diff_not_by_lines_that_look_like_headers(ctx,
                                                                                     sandbox):
    asyncio.run(sandbox.write("pkg/a b.py", b"import os\n"))
    asyncio.run(sandbox.write("notes.md", b"++ b/pkg/ghost.py\n"))  # the diff's line '+++ b/...'
    out = run(ReadLints(), ctx)
    assert "pkg/a b.py:1:8 F401 `os` imported but unused" in out and out.endswith(" in 1 file.")


class Recorded:
    """Sandbox seam double: the real sandbox, with its commands recorded (or a tools_dir that
    holds no ruff)."""

    def __init__(self, inner, tools_dir=None):
        self.inner, self.cmds = inner, []
        self.tools_dir = tools_dir or inner.tools_dir

    async def exec(self, cmd, **kw):
        self.cmds.append(cmd)
        return await self.inner.exec(cmd, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_read_lints_runs_ruff_once_inside_the_sandbox(sandbox):
    asyncio.run(sandbox.write("pkg/a b.py", b"import os\n"))
    asyncio.run(sandbox.write("pkg/c.py", b"import sys\n"))
    rec = Recorded(sandbox)
    out = run(ReadLints(), ToolContext(sandbox=rec), paths=["pkg"])
    assert out == ("pkg/a b.py:1:1 N999 Invalid module name: 'a b'\n"
                   "pkg/a b.py:1:8 F401 `os` imported but unused\n"
                   "pkg/c.py:1:8 F401 `sys` imported but unused\n3 diagnostics in 2 files.")
    assert len(rec.cmds) == 1 and rec.cmds[0].startswith(f"{sandbox.tools_dir}/ruff check ")
    # a sandbox without the harness's ruff is the setup's failure, not the model's
    with pytest.raises(SandboxError, match="harness's ruff is not in this sandbox"):
        run(ReadLints(), ToolContext(sandbox=Recorded(sandbox, "/no/such/dir")), paths=["pkg"])


def test_read_lints_says_when_the_report_was_cut(sandbox):
    asyncio.run(sandbox.write("pkg/many.py", b"".join(b"import m%d\n" % i for i in range(6000))))
    out = run(ReadLints(), ToolContext(sandbox=sandbox), paths=["pkg/many.py"])
    lines = out.splitlines()
    assert lines[-1].startswith("At least ") and "too long to read whole" in lines[-1]
    assert lines[0] == "pkg/many.py:1:8 F401 `m0` imported but unused" and len(lines) == 202


def test_run_tests_summary(ctx, sandbox):
    out = run(RunTests(), ctx)
    assert out.startswith("pytest: 1 failed, 1 passed (exit code 1)\nFailing tests:\n"
                          "  tests/test_calc.py::test_add\n--- test_add ---")
    assert "assert -1 == 5" in out and " in 0." not in out  # timings are stripped
    asyncio.run(sandbox.write("pkg/calc.py", b"def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"))
    assert run(RunTests(), ctx, tests=["tests/test_calc.py::test_add"]) == "pytest: 1 passed (exit code 0)"
    with pytest.raises(ToolError, match="not pytest options"):
        run(RunTests(), ctx, tests=["-x"])


def test_memory_and_finish(ctx):
    mem = Memory()
    assert run(mem, ctx, action="list") == "No notes yet."
    assert run(mem, ctx, action="add", note="tests in tests/") == "Saved note 1."
    assert run(mem, ctx, action="list") == "1. tests in tests/"
    with pytest.raises(ToolError, match="non-empty note"):
        run(mem, ctx, action="add")
    assert run(TOOLS["finish"](), ctx, summary="done") == "Finished." and ctx.finished


@pytest.mark.parametrize("path,match", [
    ("/etc/passwd", "is absolute"), ("../outside.txt", "leaves the workspace"),
    ("pkg/../../x", "leaves the workspace"), ("~/x", "is absolute"), ("", "empty path"),
])
def test_path_escapes_are_refused(ctx, path, match):
    for tool, args in [(ReadFile(), {"path": path}), (WriteFile(), {"path": path, "content": "x"}),
                       (EditFile(), {"path": path, "old_string": "a", "new_string": "b"}),
                       (ListDir(), {"path": path}), (Grep(), {"pattern": "x", "path": path})]:
        with pytest.raises(ToolError, match=match) as e:
            run(tool, ctx, **args)
        assert "relative to the workspace root" in str(e.value)
        assert isinstance(e.value, PathEscapeError) == bool(path)  # an empty path escapes nothing


def test_a_missing_file_named_like_an_escape_is_just_missing(ctx):
    """Refusals are told apart by type, not by words in the message (the path's own included)."""
    for tool, args in [(ReadFile(), {"path": "outside/symlink..txt"}),
                       (ListDir(), {"path": "absolute_outside"})]:
        with pytest.raises(ToolError, match="no such file") as e:
            run(tool, ctx, **args)
        assert not isinstance(e.value, PathEscapeError)


def test_symlink_out_is_refused(ctx, sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    os.symlink(secret, ws_root(sandbox) / "link.txt")
    os.symlink(tmp_path, ws_root(sandbox) / "linkdir")
    for tool, args in [(ReadFile(), {"path": "link.txt"}), (ReadFile(), {"path": "linkdir/secret.txt"}),
                       (WriteFile(), {"path": "linkdir/new.txt", "content": "x"}),
                       (EditFile(), {"path": "link.txt", "old_string": "top", "new_string": "x"}),
                       (ListDir(), {"path": "linkdir"}), (Glob(), {"pattern": "*", "path": "linkdir"})]:
        with pytest.raises(PathEscapeError, match="outside the workspace"):
            run(tool, ctx, **args)
    assert "top secret" not in run(Grep(), ctx, pattern="secret")
    assert secret.read_text() == "top secret\n"


def test_validate_args_errors_name_the_signature():
    tool = ReadFile()
    sig = "expected read_file(path: string, offset?: integer, limit?: integer)"
    for args, match in [({}, "missing required argument"), ({"path": "a", "lines": 3}, "unknown argument"),
                        ({"path": 3}, "must be string"), ({"path": "a", "offset": "2"}, "must be integer"),
                        ({"path": "a", "offset": True}, "must be integer"), ({"path": "a", "offset": 0}, ">= 1"),
                        ([1], "must be a JSON object")]:
        with pytest.raises(ToolCallError, match=match) as e:
            validate_args(tool, args)
        assert sig in str(e.value) or "JSON object" in str(e.value)
    assert validate_args(tool, {"path": "a", "offset": 2.0}) == {"path": "a", "offset": 2}


def test_make_tools_passes_only_accepted_resources():
    tools = make_tools(["run_tests", "read_lints", "finish"], test_command="pytest -x",
                       max_rows=7, index=object())
    assert tools[0].test_command == "pytest -x" and tools[1].max_rows == 7
    with pytest.raises(ConfigError, match="unknown tool 'teleport': choose one of edit_file, "):
        make_tools(["read_file", "teleport"])


@pytest.mark.slow
@pytest.mark.parametrize("kinds", [("dir", "dir"), pytest.param(("dir", "bwrap"), marks=needs_bwrap)])
def test_outputs_are_identical_across_sandboxes(repo, kinds):
    """Same repo, two sandboxes (the double and the real one too): byte-identical tool outputs —
    no temp paths, timings or listing order leak into what the model sees."""
    outs = []
    for kind in kinds:
        sb = make_sandbox(kind, repo)
        c = ToolContext(sandbox=sb)
        outs.append([run(ListDir(), c, depth=3), run(Grep(), c, pattern="a"),
                     run(Glob(), c, pattern="**/*"), run(RunTests(), c), run(ReadLints(), c, paths=["pkg"])])
        asyncio.run(sb.close())
    assert outs[0] == outs[1]


def test_run_tests_with_a_task_command_that_is_already_quiet(ctx):
    out = run(RunTests(test_command="PYTHONPATH=. python -m pytest -q -rA -p no:cacheprovider"), ctx,
              tests=["tests/test_calc.py"])
    assert out.startswith("pytest: 1 failed, 1 passed (exit code 1)\nFailing tests:\n  tests/test_calc.py::test_add")


@pytest.mark.parametrize("kind", [pytest.param("bwrap", marks=needs_bwrap)])
def test_run_tests_sees_a_same_size_edit_made_within_the_second(repo, kind):
    """Python trusts a cached .pyc by source mtime (whole seconds) and size: the task's test
    command must not leave bytecode behind, or re-running the tests right after a same-size
    edit (``-`` -> ``+``) would still run the old code."""
    from looprl.rewards.tests import pytest_command

    sb = make_sandbox(kind, repo)
    try:
        c = ToolContext(sandbox=sb)
        tool = RunTests(test_command=pytest_command())
        outs = []
        for body in (CALC, CALC.replace("return a - b", "return a + b", 1), CALC):
            asyncio.run(sb.write("pkg/calc.py", body.encode()))
            outs.append(run(tool, c, tests=["tests/test_calc.py"]).splitlines()[0])
    finally:
        asyncio.run(sb.close())
    assert outs == ["pytest: 1 failed, 1 passed (exit code 1)", "pytest: 2 passed (exit code 0)",
                    "pytest: 1 failed, 1 passed (exit code 1)"]


def test_absurd_argument_values_are_tool_errors(ctx, sandbox):
    """Arguments that pass the schema but no tool can honour: a ``ToolError`` saying so (an
    error result the model sees), never another exception (which would be counted as the
    harness's failure)."""
    huge = 10**90
    assert "past the end" in run(ReadFile(), ctx, path="pkg/calc.py", offset=huge)
    assert run(ReadFile(), ctx, path="pkg/calc.py", limit=huge).startswith("     1\tdef add")
    assert run(ListDir(), ctx, depth=huge) == run(ListDir(), ctx, depth=10)
    assert run(RunTerminal(), ctx, command="echo ok", timeout_s=huge).startswith("Exit code: 0")
    refused = [
        (Glob(), {"pattern": "[z-a]"}, "invalid glob pattern"),
        (Grep(), {"pattern": "x", "glob": "[z-a]"}, "invalid glob pattern"),
        (Grep(), {"pattern": "a{99999999999}"}, "invalid regular expression"),
        (Grep(), {"pattern": "(" * 5000 + ")" * 5000}, "invalid regular expression"),
        (ReadFile(), {"path": "a/" * 3000}, "too long"),
        (ReadFile(), {"path": "x" * 300}, "too long"),
        (RunTerminal(), {"command": "echo " + "x" * 200_000}, "write a long script to a file"),
        (RunTests(), {"tests": ["tests/test_calc.py"] * 2000}, "pass at most 1000"),
        (ReadLints(), {"paths": ["pkg/calc.py"] * 500}, "lint at most 200"),
    ]
    for tool, args, match in refused:
        with pytest.raises(ToolError, match=match):
            run(tool, ctx, **args)
    for content in ("x = " + "1 + " * 100_000 + "1\n", "x = " + "-" * 100_000 + "1\n"):
        out = run(WriteFile(), ctx, path="deep.py", content=content)
        assert out.startswith("Wrote deep.py") and "nested too deeply" in out


def test_file_names_that_are_not_utf8_reach_the_model_as_escapes(task, sandbox, fmt, tok):
    """A command can create a file whose name is not UTF-8; listing it must neither crash the
    loop (the tokenizer refuses such text) nor make the trajectory unsavable."""
    from looprl.harness.agent import AgentConfig, run_agent
    from looprl.harness.scripted import ScriptedPolicy
    from looprl.types import StopReason, Trajectory

    from .conftest import call

    name = os.fsencode(ws_root(sandbox)) + b"/bad\xffname.txt"
    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"needle\n")
    os.close(fd)
    turns = [call("list_dir") + call("glob", pattern="*.txt") + call("grep", pattern="needle"),
             call("finish")]
    traj = asyncio.run(run_agent(task, sandbox, ScriptedPolicy(tok, turns), fmt,
                                 make_tools(["list_dir", "glob", "grep", "finish"]), AgentConfig(),
                                 group_id="g", trajectory_id="g/0"))
    assert traj.stop_reason == StopReason.FINISHED, traj.error
    outs = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "bad\\xffname.txt" in outs[0] and "bad\\xffname.txt" in outs[1]
    assert "bad\\xffname.txt:1:needle" in outs[2]
    text = traj.to_json()
    text.encode("utf-8")
    assert Trajectory.from_json(text) == traj
