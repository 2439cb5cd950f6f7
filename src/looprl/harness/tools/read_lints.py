"""``read_lints``: ruff diagnostics for the files the agent changed (or the given paths), one
``path:line:col CODE message`` row each, sorted.

    read_lints()  ->  "pkg/calc.py:1:8 F401 `os` imported but unused\n1 diagnostic in 1 file."

Ruff runs inside the sandbox, as one command over all the files: the harness's own ruff, which
every sandbox has at ``Sandbox.tools_dir`` (``sandbox/mounts.py``), with ``--isolated`` (ruff's
default rules: syntax errors, undefined names, unused imports, ...). So the tool works in any
sandbox, whether or not the task's environment has ruff; its output does not depend on the
repository's lint config; and model-written files are handled by a program on the sandbox's
side of the isolation, never on the host.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from looprl.diffs import SYMLINK, parse_diff
from looprl.errors import SandboxError, ToolError
from looprl.harness.tools.base import ToolContext, check_path, obj_schema, walk_dir

_ROW = re.compile(r"(\d+):(\d+): (?:([A-Z]+[0-9]+) (?:\[\*\] )?|([\w-]+): )(.*)")
"""The rest of a ``--output-format=concise`` row after ``path:``: ``line:col: CODE [*] message``,
or ``line:col: invalid-syntax: message`` (``SyntaxError:`` before ruff 0.9)."""


def changed_python_files(diff: str) -> list[str]:
    """Workspace paths of .py files added or modified in a unified diff (deleted ones, symlinks
    and binary content excluded).

    >>> from looprl.diffs import unified_diff
    >>> d = unified_diff("a b.py", "x\\n", "y\\n") + unified_diff("n.md", None, "++ b/x.py\\n")
    >>> changed_python_files(d)   # the added line '+++ b/x.py' of n.md is no file
    ['a b.py']
    """
    return sorted({fp.new_path for fp in parse_diff(diff)
                   if fp.new_path and fp.new_path.endswith(".py") and not fp.binary
                   and fp.new_mode != SYMLINK})


def ruff_command(ruff: str, files: list[str]) -> str:
    """The command line that lints ``files`` (workspace-relative) with ``ruff`` (its path inside
    the sandbox)."""
    return shlex.join([ruff, "check", "--isolated", "--no-cache", "--exit-zero",
                       "--quiet", "--output-format=concise", "--", *files])


def parse_rows(stdout: str, files: list[str]) -> list[tuple[str, int, int, str, str]]:
    """(path, line, col, code, message) rows of ruff's concise output for ``files``. A row is
    matched by the file it starts with (paths may hold ':'); other lines are skipped.

    >>> parse_rows("a.py:1:8: F401 [*] `os` imported but unused\\n", ["a.py"])
    [('a.py', 1, 8, 'F401', '`os` imported but unused')]
    >>> parse_rows("a:b.py:2:1: invalid-syntax: unexpected EOF\\n", ["a:b.py"])
    [('a:b.py', 2, 1, 'invalid-syntax', 'unexpected EOF')]
    """
    by_len = sorted(files, key=len, reverse=True)
    out = []
    for line in stdout.splitlines():
        for f in by_len:
            if line.startswith(f + ":") and (m := _ROW.fullmatch(line, len(f) + 1)):
                code = m.group(3) or m.group(4)
                code = "invalid-syntax" if code == "SyntaxError" else code
                out.append((f, int(m.group(1)), int(m.group(2)), code, " ".join(m.group(5).split())))
                break
    return out


class ReadLints:
    name = "read_lints"
    description = ("Lint Python files with ruff. Without paths, lints the .py files you changed. "
                   "Returns path:line:col CODE message rows.")
    parameters = obj_schema({
        "paths": {"type": "array", "items": {"type": "string"},
                  "description": "files or directories to lint (default: changed .py files)"},
    }, [])
    read_only = True

    def __init__(self, max_files: int = 200, max_rows: int = 200,
                 lint_timeout_s: float = 60.0) -> None:
        self.max_files = max_files
        self.max_rows = max_rows
        self.timeout_s = lint_timeout_s

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        if "paths" in args:
            if not args["paths"]:
                raise ToolError("paths is empty; omit it to lint the files you changed")
            if len(args["paths"]) > self.max_files:
                raise ToolError(f"{len(args['paths'])} paths given; lint at most {self.max_files} "
                                "at a time (a directory lints the .py files below it)")
            files = await self._expand(ctx, [check_path(p) for p in args["paths"]])
        else:
            files = changed_python_files(await ctx.sandbox.diff())
            if not files:
                return "No changed Python files to lint (pass paths to lint others)."
        if not files:
            return "No Python files in the given paths."
        keys, cut = await self._lint(ctx, files[: self.max_files])
        rows = [f"{p}:{line}:{col} {code} {msg}" for p, line, col, code, msg in sorted(set(keys))]
        skipped = (f" ({len(files) - self.max_files} more files not linted)"
                   if len(files) > self.max_files else "")
        if not rows:
            n = min(len(files), self.max_files)
            return f"No lint errors in {n} file{'s' if n != 1 else ''}.{skipped}"
        n_files = len({k[0] for k in keys})
        total = len(rows)
        summary = (f"{'At least ' if cut else ''}{total} diagnostic{'s' if total != 1 else ''} in "
                   f"{n_files} file{'s' if n_files != 1 else ''}.{skipped}"
                   + (" (ruff's report was too long to read whole; lint fewer paths for all of "
                      "it)" if cut else ""))
        if total > self.max_rows:
            rows = rows[: self.max_rows] + [f"[... {total - self.max_rows} more]"]
        return "\n".join(rows + [summary])

    async def _lint(self, ctx: ToolContext,
                    files: list[str]) -> tuple[list[tuple[str, int, int, str, str]], bool]:
        """The rows for ``files``, and whether the sandbox cut ruff's report (its output cap)."""
        ruff = f"{ctx.sandbox.tools_dir}/ruff"
        res = await ctx.sandbox.exec(ruff_command(ruff, files), timeout_s=self.timeout_s)
        if res.timed_out:
            raise ToolError(f"ruff took over {self.timeout_s:g} s on {len(files)} files; lint "
                            "fewer paths at a time")
        if res.exit_code in (126, 127):  # the harness's setup, not the model's call
            raise SandboxError(f"the harness's ruff is not in this sandbox ({ruff}: "
                               f"{res.stderr.strip()[:300]}); pip install ruff where the sandbox "
                               "server runs")
        if res.exit_code != 0:
            raise ToolError(f"ruff failed (exit {res.exit_code}): {res.stderr.strip()[:500]}")
        return parse_rows(res.stdout, files), res.truncated

    async def _expand(self, ctx: ToolContext, paths: list[str]) -> list[str]:
        """Files as given; directories to the .py files below them."""
        out: set[str] = set()
        for p in paths:
            entries = await walk_dir(ctx.sandbox, p)
            if entries is None:
                out.add(p)
            else:
                out.update(e.path for e in entries if e.kind == "file" and e.path.endswith(".py"))
        return sorted(out)
