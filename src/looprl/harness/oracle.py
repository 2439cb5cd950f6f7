"""The oracle agent: an ``Engine`` that solves a task from its gold patch through the harness
tools (read, grep, edit, test), proving the task solvable; its trajectories are SFT data.

    oracle = OracleAgent(task, tok)
    turns = oracle_turns(task)           # the same script as tool-call turns
"""

from __future__ import annotations

import ast
import io
import json
import random
import re
import shlex
import tokenize
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from looprl.chat import TOOL_CLOSE, TOOL_OPEN
from looprl.diffs import FilePatch, Hunk, apply_patch, parse_diff
from looprl.errors import DiffError, TaskError
from looprl.harness.scripted import ScriptedPolicy
from looprl.harness.selection import widen as widen_selection
from looprl.harness.tools.edit_file import find_all
from looprl.harness.tools.grep import shown_path
from looprl.types import Generation, SamplingParams, Task

# --- gold patch -> tool calls ---------------------------------------------------------------


def gold_patches(task: Task) -> tuple[FilePatch, ...]:
    """The per-file patches of ``task``'s gold patch (``TaskError`` if it has none or they do
    not parse)."""
    if not task.gold_patch:
        raise TaskError(f"task {task.id} has no gold_patch; the oracle needs one")
    try:
        patches = parse_diff(task.gold_patch)
    except DiffError as e:
        raise TaskError(f"gold_patch of task {task.id} is malformed: {e}") from None
    if not patches:
        raise TaskError(f"gold_patch of task {task.id} contains no file diffs")
    return patches


def patched(text: str, fp: FilePatch) -> str:
    """``text`` with the gold patch ``fp`` applied (``TaskError`` if it does not apply)."""
    try:
        return apply_patch(text, fp)
    except DiffError as e:
        raise TaskError(f"gold patch does not apply: {e}") from None


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def oracle_turns(task: Task, *, verify: bool = False,
                 files: Mapping[str, str] | None = None) -> list[str]:
    """The oracle's script, written the way a focused engineer works from what the prompt and
    the tool results show: grep for the definition of each function the fix touches, read it
    from its ``def`` line (following the "continue at offset" hint of ``read_file``), then edit
    the smallest unique snippet. Only the edit itself uses the gold patch, so the trajectories
    are learnable SFT data: every path, line number and snippet a call names appeared in an
    earlier observation. Changes outside any function (new files, module-level code) read a
    window around the change instead. A task whose prompt carries the user's selection of the
    code to change (``metadata["selection"]``, see ``selections``) is edited at once: the
    selection shows the path and the snippet. ``verify`` adds a ``run_tests`` turn on the task's
    failing tests before ``finish`` (validation does not need it: the grader runs them).
    ``files`` (path -> text) stands in for files of ``task.repo`` that the workspace holds in
    another version (a synthetic bug written into a sandbox over a pristine tree)."""
    patches = gold_patches(task)
    greps: list[str] = []
    reads: list[list[str]] = []  # reads[k]: the k-th read window of every located change
    edits: list[str] = []
    for fp in patches:
        if fp.old_path is None:
            assert fp.new_path is not None
            edits.append(_call("write_file", path=fp.new_path,
                               content="".join(ln for h in fp.hunks for ln in h.new_lines)))
            continue
        if fp.new_path is None or fp.new_path != fp.old_path:
            if fp.new_path is not None:
                edits += _file_edits(fp, fp.new_path, repo_file_text(task, fp.old_path, files))
            edits.append(_call("run_terminal", command=f"rm -f -- {shlex.quote(fp.old_path)}"))
            continue
        text = repo_file_text(task, fp.old_path, files)
        if task.metadata.get("selection"):  # the prompt shows the code to change: edit at once
            edits += _file_edits(fp, fp.old_path, text, pick=_selected)
            continue
        for k, window in enumerate(_locate(text, fp, greps, task.prompt)):
            while len(reads) <= k:
                reads.append([])
            reads[k].append(window)
        edits += _file_edits(fp, fp.old_path, text)
    turns = [_turn(greps)] if greps else []
    turns += [_turn(r) for r in reads]
    turns.append(_turn(edits))
    if verify:
        tests = list(task.grader.fail_to_pass)
        turns.append(_call("run_tests", tests=tests) if tests else _call("run_tests"))
    turns.append(_call("finish", summary="Fixed it."))
    return turns


def slipped_turns(turns: list[str], rng: random.Random) -> list[str]:
    """``turns`` with a broken try of its edit turn before it: the call cut off inside its
    arguments, before its closing tag, the slip policies make most. The script of an engineer
    who slipped once and, told so by the tool, made the edit right. The edit turn must be one
    ``edit_file`` call (a ``TaskError`` otherwise).

    The slip is a cut, never an ``old_string`` a character off: the right edit then follows a
    near copy of its own text, and SFT on it teaches the model not to copy what it just saw
    (docs/experiments.md, stop 38)."""
    at = next((i for i, t in enumerate(turns) if '"name": "edit_file"' in t), None)
    if at is None or turns[at].count(TOOL_OPEN) != 1:
        raise TaskError("a slip needs an edit turn of one edit_file call")
    good = turns[at]
    body = len(TOOL_OPEN) + good.index('"arguments"')
    return turns[:at] + [good[:rng.randrange(body, len(good) - len(TOOL_CLOSE) - 1)]] + turns[at:]


def _turn(calls: list[str]) -> str:
    return "".join(dict.fromkeys(calls))  # the same call twice in a turn would be noise


READ_LIMIT = 30
"""Lines per ``read_file`` window of the oracle (a function is read window by window)."""
READ_CONTEXT = 20
"""Lines above and below a change outside any function that the oracle reads."""


def repo_file_text(task: Task, path: str, files: Mapping[str, str] | None = None) -> str:
    """``path`` as the task's workspace starts: from ``files`` (text written over the repo, e.g.
    a synthetic bug) if there, else from ``task.repo``."""
    if files and path in files:
        return files[path]
    try:
        return (Path(task.repo) / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"cannot read {path} from task repo {task.repo}: {e}") from None


def _common_ends(old: Sequence[str], new: Sequence[str]) -> tuple[int, int]:
    """Items (lines, or characters of a text) the two sides share at the start and (not
    overlapping those) at the end."""
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    s = 0
    while s < min(len(old), len(new)) - p and old[-1 - s] == new[-1 - s]:
        s += 1
    return p, s


def _changed_span(h: Hunk) -> tuple[int, int]:
    """First and last line (1-based, in the file before the fix) a hunk really changes: its
    leading and trailing context trimmed. A pure insertion spans the line before it."""
    old, new = h.old_lines, h.new_lines
    p, s = _common_ends(old, new)
    first = h.old_start + p if old else h.old_start
    last = max(first, h.old_start + len(old) - s - 1) if old else first
    return max(1, first if len(old) - p - s > 0 else first - 1), max(1, last)


def _enclosing_def(tree: ast.Module | None, line: int, prompt: str = ""
                   ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function to look for: of the functions whose body holds ``line``, the innermost one
    the prompt names, else the outermost (a nested helper is found by reading its parent)."""
    defs = sorted((node for node in (ast.walk(tree) if tree is not None else ())
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and node.lineno <= line <= (node.end_lineno or node.lineno)),
                  key=lambda n: n.lineno)
    named = [d for d in defs if re.search(rf"\b{re.escape(d.name)}\b", prompt)]
    return named[-1] if named else (defs[0] if defs else None)


def _locate(text: str, fp: FilePatch, greps: list[str], prompt: str = "") -> list[str]:
    """The read windows (as calls, in order) that show each change of ``fp``; the grep that
    finds each enclosing function (see ``_enclosing_def``) is appended to ``greps``."""
    assert fp.old_path is not None
    try:
        tree: ast.Module | None = ast.parse(text)
    except SyntaxError:
        tree = None
    n_lines = len(text.splitlines())
    windows: list[tuple[int, int]] = []
    for h in sorted(fp.hunks, key=lambda h: h.old_start):
        first, last = _changed_span(h)
        fn = _enclosing_def(tree, first, prompt)
        if fn is None:
            lo = max(1, first - READ_CONTEXT)
            windows.append((lo, last + READ_CONTEXT - lo + 1))
            continue
        greps.append(_call("grep", pattern=rf"def {fn.name}\b"))
        offset = fn.lineno
        while True:  # window by window from the def line, as read_file's hint says
            windows.append((offset, READ_LIMIT))
            if offset + READ_LIMIT > last or offset + READ_LIMIT > n_lines:
                break
            offset += READ_LIMIT
    out: list[str] = []
    for offset, limit in windows:
        call = _call("read_file", path=shown_path(fp.old_path), offset=offset, limit=limit)
        if call not in out:
            out.append(call)
    return out


def _file_edits(fp: FilePatch, target: str, text: str,
                pick: Callable[[FilePatch, str], list[tuple[str, str, int]] | None] | None = None
                ) -> list[str]:
    """The smallest ``edit_file`` calls that apply ``fp``'s hunks to ``text`` (the file before
    the fix): each hunk's changed lines (common indentation and the final newline dropped),
    widened line by line upwards until unique in the file as it is at that point; one
    ``write_file`` of the whole new content if that fails (or the file moves). ``pick`` chooses
    the snippets instead (``_selected``: the user's selection)."""
    assert fp.old_path is not None
    if target == fp.old_path and (snippets := (pick or _snippets)(fp, text)) is not None:
        return [_call("edit_file", path=shown_path(target), old_string=old, new_string=new)
                for old, new, _ in snippets]
    return [_call("write_file", path=target, content=patched(text, fp))]


def _snippets(fp: FilePatch, text: str) -> list[tuple[str, str, int]] | None:
    """(old, new, line) of each ``edit_file`` that applies ``fp``'s hunks to ``text`` in turn,
    ``line`` being where ``old`` starts in the file as it is at that point; None when some hunk
    has no small unique snippet or the edits do not give the patched file."""
    assert fp.old_path is not None
    out, cur = [], text
    for h in fp.hunks:
        snippet = _edit_snippet(h, cur)
        if snippet is None:
            return None
        old, new = snippet
        at = cur.index(old)
        out.append((old, new, cur.count("\n", 0, at) + 1))
        cur = cur[:at] + new + cur[at + len(old):]
    return out if cur == patched(text, fp) else None


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _line_tokens(line: str) -> list[tuple[int, int]]:
    """Column spans of the Python tokens of one line (a string literal is one token), as far as
    the line tokenizes on its own (a continuation line may not, to its end)."""
    spans: list[tuple[int, int]] = []
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.start[0] != 1:
                break
            if tok.type not in skip:
                spans.append((tok.start[1], tok.end[1] if tok.end[0] == 1 else len(line)))
    except (tokenize.TokenError, SyntaxError):
        pass
    return spans


def _balanced(snippet: str) -> bool:
    return all(snippet.count(o) == snippet.count(c) for o, c in ("()", "[]", "{}"))


def tight_edit(old: str, new: str) -> tuple[str, str, int] | None:
    r"""(old snippet, new snippet, line) of the smallest edit turning file text ``old`` into
    ``new`` when they differ in one place on one line: the fewest whole Python tokens around
    the change that hold a word and are unique in ``old`` (brackets balanced where that fits)
    — what a user selects to say "this is wrong" (``>= c``, ``funcs[1]``). None when the
    change spans lines, the line does not tokenize, or nothing on it is unique.

    >>> tight_edit("x = a >= b\ny = a >= c\n", "x = a >= b\ny = a < c\n")
    ('>= c', '< c', 2)
    >>> tight_edit('f(1, "a b")\nf(2, "a b")\n', 'f(1, "a b")\nf(2, "a c")\n')
    ('2, "a b"', '2, "a c"', 2)
    """
    p, s = _common_ends(old, new)
    if "\n" in old[p:len(old) - s] or "\n" in new[p:len(new) - s]:
        return None
    start = old.rfind("\n", 0, p) + 1
    end = old.find("\n", p)
    line = old[start:len(old) if end < 0 else end]
    ca, cb = p - start, len(old) - s - start  # the change, in columns of the line
    spans = _line_tokens(line)
    hit = [k for k, (a, b) in enumerate(spans) if a < cb and b > ca or a <= ca <= b and ca == cb]
    if not hit or spans[hit[-1]][1] < cb:
        return None
    best: tuple[tuple[int, bool], str, int] | None = None
    for i in range(hit[0], -1, -1):
        for j in range(hit[-1], len(spans)):
            a, b = spans[i][0], spans[j][1]
            snippet = line[a:b]
            open_ = not _balanced(snippet)
            key = (j - i + 2 * open_, open_)  # an unclosed bracket costs two more tokens
            if best is not None and key >= best[0]:
                continue
            if any(map(_is_word, snippet)) and len(find_all(old, snippet)) == 1:
                best = (key, snippet, a)
    if best is None:
        return None
    _, snippet, a = best
    b = a + len(snippet)
    return (snippet, new[start + a:len(new) - (len(old) - start - b)],
            old.count("\n", 0, start) + 1)


def selections(task: Task, files: Mapping[str, str] | None = None,
               width: str = "line") -> list[tuple[str, int, str]]:
    """(path as shown, first line, text) of each snippet the oracle's ``edit_file`` calls replace
    when the prompt carries them: the code a user would select in the editor to say "this is
    wrong" (``files`` as in ``oracle_turns``), or the block or function around it (``width``,
    ``selection.widen``). Empty when the fix is not a set of in-place edits."""
    out: list[tuple[str, int, str]] = []
    for fp in gold_patches(task):
        if fp.old_path is None or fp.new_path != fp.old_path:
            return []
        text = repo_file_text(task, fp.old_path, files)
        picked = _selected(fp, text)
        if picked is None:
            return []
        spans = widen_selection(text, [(line, old) for old, _, line in picked], width)
        out += [(shown_path(fp.old_path), line, code) for line, code in spans]
    return out


def _selected(fp: FilePatch, text: str) -> list[tuple[str, str, int]] | None:
    """(old, new, line) of the edits a user's selection points at: the tightest snippet
    (``tight_edit``) for a change on one line, else the line snippets of ``_snippets``."""
    assert fp.old_path is not None
    one = tight_edit(text, patched(text, fp))
    return [one] if one else _snippets(fp, text)


def _edit_snippet(h: Hunk, cur: str, max_widen: int = 6) -> tuple[str, str] | None:
    """(old, new) for one hunk, unique in ``cur``; None when no small unique snippet exists."""
    old, new = h.old_lines, h.new_lines
    p, s = _common_ends(old, new)
    core_old, core_new = old[p: len(old) - s], new[p: len(new) - s]
    above = old[:p]  # context lines of the hunk above the change, nearest last
    for widen in range(max_widen + 1):
        if widen > len(above):
            return None
        ctx = above[len(above) - widen:] if widen else ()
        if not core_old and not ctx:
            continue  # a pure insertion needs an anchor line
        o, n = "".join(ctx + core_old), "".join(ctx + core_new)
        if o.endswith("\n") and n.endswith("\n"):
            o, n = o[:-1], n[:-1]
        lead = len(o) - len(o.lstrip(" \t"))
        if lead and n[:lead] == o[:lead]:
            o, n = o[lead:], n[lead:]
        if o and len(find_all(cur, o)) == 1:
            return o, n
    return None


class OracleAgent:
    """An ``Engine`` that solves ``task`` from its gold patch through the harness tools: it plays
    the script of ``oracle_turns`` (the calls do not depend on the tool results), with a
    broken first try of its edit when ``slip`` (``slipped_turns``, drawn from ``seed``)."""

    def __init__(self, task: Task, tokenizer: Any, end_of_turn: str = "<|im_end|>", *,
                 verify: bool = False, files: Mapping[str, str] | None = None,
                 slip: bool = False, seed: int = 0) -> None:
        self.task = task
        self.turns = oracle_turns(task, verify=verify, files=files)
        if slip:
            self.turns = slipped_turns(self.turns, random.Random(seed))
        self._script = ScriptedPolicy(tokenizer, self.turns, end_of_turn)

    @property
    def policy_version(self) -> int:
        return self._script.policy_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        return await self._script.generate(prompt_ids, params, session_id=session_id,
                                           group_id=group_id)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        await self._script.update_weights(state_dict, version)

    async def release(self, session_id: str) -> None:
        await self._script.release(session_id)
