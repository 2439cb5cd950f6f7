"""``grep``: a regular-expression search over workspace files, as ``path:line:text`` rows.

    grep(pattern="def parse_", glob="*.py")  ->  "src/pkg/mod.py:12:def parse_args(argv):"

Files are scanned in path order and the output is capped, so results are identical wherever the
harness runs. Binary files and files over ``max_file_bytes`` are skipped. Patterns are Python
regular expressions, matched by the ``regex`` package (compatible with ``re``) under a time
budget, off the event loop: a pattern that backtracks exponentially (``(a|aa)+$``) is the model's
error after ``timeout_s``, never a frozen run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import regex

from looprl.errors import ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema, walk_dir
from looprl.harness.tools.glob_files import glob_regex


def shown_path(path: str) -> str:
    """A workspace path as grep prints it: ./-relative, as ``grep -rn PATTERN .`` does. A call
    copying it (the oracle's too) then starts with the constant "./", and the path itself follows
    "./" only on grep's line, so a small model copies it by induction (``docs/experiments.md``,
    row A18)."""
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
                 max_files: int = 20_000, max_file_bytes: int = 1_000_000,
                 timeout_s: float = 10.0) -> None:
        self.max_matches = max_matches
        self.max_line_chars = max_line_chars
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        self.timeout_s = timeout_s
        """Matching time one call may spend, over all files."""

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            pattern = regex.compile(args["pattern"],
                                    regex.IGNORECASE if args.get("ignore_case") else 0)
        except (regex.error, OverflowError, RecursionError, ValueError) as e:  # 'a{99999999999}'
            raise ToolError(f"invalid regular expression {args['pattern'][:200]!r}: "
                            f"{type(e).__name__}: {e}") from None
        path = check_path(args.get("path", "."))
        files = await self._files(ctx, path, args.get("glob"))
        rows: list[str] = []
        total = 0
        deadline = time.monotonic() + self.timeout_s
        for f in files:
            try:
                data = await ctx.sandbox.read(f)
            except (OSError, ToolError):
                continue  # vanished or unreadable (e.g. a link out): skip, as grep -s does
            if b"\x00" in data[:8192]:
                continue
            hits = await asyncio.to_thread(_matches, pattern, data, deadline, args["pattern"])
            total += len(hits)
            for n, line in hits[: self.max_matches - len(rows)]:
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


def _matches(pattern: regex.Pattern[str], data: bytes, deadline: float, shown: str
             ) -> list[tuple[int, str]]:
    """(line number, line) of the lines of ``data`` that ``pattern`` matches, or ``ToolError``
    once matching runs past ``deadline``."""
    out = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            if pattern.search(line, timeout=left):
                out.append((n, line))
        except TimeoutError:
            raise ToolError(f"grep stopped: matching {shown[:200]!r} took too long; nested "
                            "repetition such as (a|aa)+ backtracks exponentially: simplify the "
                            "pattern, or narrow path or glob") from None
    return out
