"""``run_tests``: pytest in the sandbox, summarised for the model: counts, failing test ids and a
short traceback tail per failure (timings stripped so the text is the same on every run).

    run_tests(tests=["tests/test_mod.py"])  ->
      "pytest: 1 failed, 3 passed (exit code 1)\nFailing tests:\n  tests/test_mod.py::test_add\n..."

The base command is a per-task resource (``make_tools(..., test_command="python -m pytest")``).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, harness_command, obj_schema, truncate_middle

_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")
_SUMMARY = re.compile(r"^=*\s*(?P<body>.*?) in [\d.]+s(?: \([\d:.]+\))?\s*=*\s*$")
_FAIL = re.compile(r"^(FAILED|ERROR) (\S+)")
_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")


def summarize_pytest(output: str, exit_code: int | None, *, max_failures: int = 5,
                     tb_lines: int = 12) -> str:
    """Condense pytest's ``-rfE --tb=short`` output; falls back to the raw tail if it has no
    summary line (a crash or a usage error)."""
    lines = output.splitlines()
    body = next((m.group("body") for ln in reversed(lines) if (m := _SUMMARY.match(ln))), None)
    if body is None:
        return (f"pytest produced no summary (exit code {exit_code}). Output:\n"
                + truncate_middle(output.strip(), 4000))
    counts = ", ".join(f"{n} {w}" for n, w in _COUNT.findall(body)) or body.strip()
    out = [f"pytest: {counts} (exit code {exit_code})"]
    failing = list(dict.fromkeys(m.group(2) for ln in lines if (m := _FAIL.match(ln))))
    if failing:
        out.append("Failing tests:")
        out += [f"  {t}" for t in failing[:50]]
        if len(failing) > 50:
            out.append(f"  [... {len(failing) - 50} more]")
    for title, tb in _sections(lines)[:max_failures]:
        tail = tb[-tb_lines:]
        cut = f"  [... {len(tb) - tb_lines} lines above]\n" if len(tb) > tb_lines else ""
        out.append(f"--- {title} ---\n{cut}" + "\n".join(tail))
    return "\n".join(out)


def _sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(title, lines) of each ``____ test_x ____`` traceback section of pytest's report."""
    sections: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for ln in lines:
        m = _SECTION.match(ln)
        if m:
            current = []
            sections.append((m.group(1), current))
        elif ln.startswith("=") and ln.endswith("="):
            current = None  # the next '=== ... ===' banner closes the section
        elif current is not None and ln.strip():
            current.append(ln)
    return sections


class RunTests:
    name = "run_tests"
    description = ("Run the test suite (pytest) and get a summary: counts, failing tests and short "
                   "tracebacks. Pass tests (files or node ids) to run a subset.")
    parameters = obj_schema({
        "tests": {"type": "array", "items": {"type": "string"},
                  "description": "test files, directories or node ids (default: all)"},
    }, [])
    read_only = True  # tests may write caches, but the agent treats a run as an observation

    def __init__(self, test_command: str = "python -m pytest", timeout_s: float = 300.0,
                 max_chars: int = 8000, max_tests: int = 1000) -> None:
        self.test_command = test_command
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self.max_tests = max_tests  # the command line stays under the kernel's argument limit

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        tests = args.get("tests", [])
        if len(tests) > self.max_tests or sum(len(t.encode("utf-8")) for t in tests) > 100_000:
            raise ToolError(f"{len(tests)} tests given; pass at most {self.max_tests} files, "
                            "directories or node ids (a directory runs all its tests)")
        for t in tests:
            if t.startswith("-"):
                raise ToolError(f"{t!r}: run_tests takes test paths or node ids, not pytest options;"
                                " use run_terminal for custom pytest flags")
        cmd = (f"{self.test_command} --verbosity=-1 -rfE --tb=short --color=no -p no:cacheprovider "
               + " ".join(shlex.quote(t) for t in tests))
        # --verbosity=-1 after the task's own flags: exactly one summary line, whatever -q/-v
        # the task's command already holds (-qq would drop the counts)
        res = await ctx.sandbox.exec(harness_command(cmd.strip()), timeout_s=self.timeout_s)
        if res.timed_out:
            return (f"Tests timed out after {self.timeout_s:g} s and were killed. Run a subset "
                    "with tests=[...]. Output so far:\n"
                    + truncate_middle((res.stdout + res.stderr).strip(), 3000))
        text = summarize_pytest(res.stdout + ("\n" + res.stderr if res.stderr else ""), res.exit_code)
        return truncate_middle(text, self.max_chars)
