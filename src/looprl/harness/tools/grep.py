"""``grep``: a regular-expression search over workspace files, as ``path:line:text`` rows.

    grep(pattern="def parse_", glob="*.py")  ->  "src/pkg/mod.py:12:def parse_args(argv):"

Files are scanned in path order and the output is capped, so results are identical wherever the
harness runs. Binary files and files over ``max_file_bytes`` are skipped.
"""

from __future__ import annotations

import re
from typing import Any

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema, walk_dir
from looprl.harness.tools.glob_files import glob_regex


def shown_path(path: str) -> str:
    """A workspace path as grep prints it: ./-relative, as ``grep -rn PATTERN .`` does. A call
    copying it (the oracle's too) then starts with the constant "./", and the path itself follows
    "./" only on grep's line, so a small model copies it by induction (stop 16: teacher-forced
    read_file turns right 0 -> 0.38)."""
    return f"./{path}"


class Grep:
    name = "grep"
    description = ("Search file contents with a Python regular expression. Returns "
                   "./path:line:text rows. Narrow with path (a directory or file) and glob "
                   "(e.g. '*.py').")
    parameters = obj_schema({
        "pattern": {"type": "string", "description": "Python regular expression"},
        "path": {"type": "string", "description": "directory or file to search (default '.')"},
        "glob": {"type": "string", "description": "only files whose path matches this glob"},
        "ignore_case": {"type": "boolean", "description": "case-insensitive match"},
    }, ["pattern"])
    read_only = True

    def __init__(self, max_matches: int = 100, max_line_chars: int = 300,
                 max_files: int = 20_000, max_file_bytes: int = 1_000_000) -> None:
        self.max_matches = max_matches
        self.max_line_chars = max_line_chars
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            regex = re.compile(args["pattern"], re.IGNORECASE if args.get("ignore_case") else 0)
        except re.error as e:
            raise ToolError(f"invalid regular expression {args['pattern']!r}: {e}") from None
        path = check_path(args.get("path", "."))
        files = await self._files(ctx, path, args.get("glob"))
        rows: list[str] = []
        total = 0
        for f in files:
            try:
                data = await ctx.sandbox.read(f)
            except (OSError, ToolError):
                continue  # vanished or unreadable (e.g. a link out): skip, as grep -s does
            if b"\x00" in data[:8192]:
                continue
            for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
                if regex.search(line):
                    total += 1
                    if len(rows) < self.max_matches:
                        if len(line) > self.max_line_chars:
                            line = line[: self.max_line_chars] + " [...]"
                        rows.append(f"{shown_path(f)}:{n}:{line}")
        if not rows:
            return f"No matches for {args['pattern']!r} in {path}."
        if total > len(rows):
            rows.append(f"[... {total - len(rows)} more matches; narrow the pattern, path or glob]")
        return "\n".join(rows)

    async def _files(self, ctx: ToolContext, path: str, glob: str | None) -> list[str]:
        entries = await walk_dir(ctx.sandbox, path, self.max_files)
        if entries is None:
            return [path]
        regex = glob_regex(glob.strip().removeprefix("./")) if glob else None
        return sorted(e.path for e in entries if e.kind == "file" and e.size <= self.max_file_bytes
                      and (regex is None or regex.match(e.path)))
