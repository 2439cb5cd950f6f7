"""``read_file``: a text file with line numbers, optionally a range of lines.

    read_file(path="src/pkg/mod.py", offset=40, limit=20)  ->  "    40\tdef f():\n ..."
"""

from __future__ import annotations

from typing import Any

from looprl.harness.tools.base import ToolContext, check_path, decode_text, obj_schema, read_bytes


class ReadFile:
    name = "read_file"
    description = ("Read a text file of the workspace with line numbers. Use offset (1-based first "
                   "line) and limit (number of lines) to read part of a long file.")
    parameters = obj_schema({
        "path": {"type": "string", "description": "workspace-relative file path"},
        "offset": {"type": "integer", "minimum": 1, "description": "first line to show (1-based)"},
        "limit": {"type": "integer", "minimum": 1, "description": "number of lines to show"},
    }, ["path"])
    read_only = True

    def __init__(self, max_lines: int = 1000, max_line_chars: int = 1000,
                 max_chars: int = 60_000) -> None:
        self.max_lines = max_lines  # default window: enough for most modules, small for context
        self.max_line_chars = max_line_chars  # minified lines would otherwise flood the context
        self.max_chars = max_chars

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = check_path(args["path"])
        text = decode_text(await read_bytes(ctx.sandbox, path), path)
        lines = text.splitlines()
        if not lines:
            return f"{path} is empty (0 lines)."
        start = args.get("offset", 1)
        if start > len(lines):
            return f"{path} has {len(lines)} lines; offset {start} is past the end."
        limit = min(args.get("limit", self.max_lines), self.max_lines)
        out: list[str] = []
        size, end = 0, start - 1
        for i in range(start - 1, min(len(lines), start - 1 + limit)):
            line = lines[i]
            if len(line) > self.max_line_chars:
                line = line[: self.max_line_chars] + f" [... line cut at {self.max_line_chars} chars]"
            row = f"{i + 1:>6}\t{line}"
            if size + len(row) > self.max_chars and out:
                break
            out.append(row)
            size += len(row) + 1
            end = i + 1
        if end < len(lines):
            out.append(f"[showing lines {start}-{end} of {len(lines)}; call read_file with "
                       f"offset={end + 1} to continue]")
        return "\n".join(out)
