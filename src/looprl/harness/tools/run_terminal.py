"""``run_terminal``: a shell command in the sandbox (workspace as cwd, no network), with a timeout
and head+tail truncation of its output.

    run_terminal(command="python -c 'print(1)'")  ->  "Exit code: 0\n--- stdout ---\n1\n"
"""

from __future__ import annotations

from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, obj_schema, truncate_middle
from looprl.types import ExecResult


def format_exec(res: ExecResult, timeout_s: float, max_chars: int) -> str:
    """Exit status then stdout and stderr sections, each capped head+tail; no timings (they would
    make the text differ between runs)."""
    if res.timed_out:
        head = f"Command timed out after {timeout_s:g} s and was killed."
    elif res.exit_code is None:
        head = "Command was killed (resource limit)."
    else:
        head = f"Exit code: {res.exit_code}"
    parts = [head]
    budget = max_chars // 2 if res.stdout and res.stderr else max_chars
    if res.stdout:
        parts.append("--- stdout ---\n" + truncate_middle(res.stdout, budget))
    if res.stderr:
        parts.append("--- stderr ---\n" + truncate_middle(res.stderr, budget))
    if not res.stdout and not res.stderr:
        parts.append("(no output)")
    return "\n".join(parts)


class RunTerminal:
    name = "run_terminal"
    description = ("Run a shell command (/bin/sh -c) in the workspace. No network. Output is "
                   "truncated in the middle when long. Use timeout_s for slow commands.")
    parameters = obj_schema({
        "command": {"type": "string", "description": "shell command"},
        "timeout_s": {"type": "number", "minimum": 1, "description": "seconds before the command "
                      "is killed (default 60, max 600)"},
    }, ["command"])
    read_only = False

    def __init__(self, default_timeout_s: float = 60.0, max_timeout_s: float = 600.0,
                 max_chars: int = 16_000, max_command_bytes: int = 100_000) -> None:
        self.default_timeout_s = default_timeout_s
        self.max_timeout_s = max_timeout_s
        self.max_chars = max_chars  # ~6k tokens: long logs cost context, their ends matter most
        self.max_command_bytes = max_command_bytes  # under the kernel's 128 KiB per argument

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        # min before float: an int of 400 digits is a valid JSON number but no float
        timeout = float(min(args.get("timeout_s", self.default_timeout_s), self.max_timeout_s))
        size = len(args["command"].encode("utf-8"))
        if size > self.max_command_bytes:
            raise ToolError(f"command is {size} bytes; at most {self.max_command_bytes}: write a "
                            "long script to a file with write_file and run that file")
        res = await ctx.sandbox.exec(args["command"], timeout_s=timeout)
        return format_exec(res, timeout, self.max_chars)
