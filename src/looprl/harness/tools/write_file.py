"""``write_file``: create a file or replace its whole content (parent directories are created).

    write_file(path="src/pkg/new.py", content="X = 1\n")  ->  "Wrote src/pkg/new.py (1 line, 6 bytes)."
"""

from __future__ import annotations

from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema, write_bytes
from looprl.harness.tools.edit_file import python_syntax_note


class WriteFile:
    name = "write_file"
    description = ("Create a file, or overwrite an existing one, with the given content. Prefer "
                   "edit_file for changing part of an existing file.")
    parameters = obj_schema({
        "path": {"type": "string", "description": "workspace-relative file path"},
        "content": {"type": "string", "description": "the complete new content"},
    }, ["path", "content"])
    read_only = False

    def __init__(self, max_bytes: int = 2_000_000) -> None:
        self.max_bytes = max_bytes

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        path = check_path(args["path"])
        if path == ".":
            raise ToolError("write_file needs a file path, not the workspace root")
        data = args["content"].encode("utf-8")
        if len(data) > self.max_bytes:
            raise ToolError(f"content is {len(data)} bytes; write_file accepts at most "
                            f"{self.max_bytes}. Split the file or generate it with run_terminal.")
        await write_bytes(ctx.sandbox, path, data)
        n = args["content"].count("\n") + (0 if args["content"].endswith("\n") or not data else 1)
        return (f"Wrote {path} ({n} line{'s' if n != 1 else ''}, {len(data)} bytes)."
                + python_syntax_note(path, args["content"]))
