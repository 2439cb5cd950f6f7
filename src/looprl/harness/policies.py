"""Engines that need no model: a scripted test double and an oracle that replays a task's gold
patch through the tools.

    policy = ScriptedPolicy(tok, ['<tool_call>{"name": "finish", "arguments": {}}</tool_call>'])
    oracle = OracleAgent(task, tok)      # proves a task solvable; its trajectories are SFT data

Both return each scripted turn tokenized, ending with the end-of-turn token, logprob 0.0, so a
trajectory they drive is in the exact harness format a model would produce.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from looprl.errors import PolicyError, TaskError
from looprl.harness.tools.edit_file import find_all
from looprl.types import Generation, SamplingParams, Task


class ScriptedPolicy:
    """An ``Engine`` test double: returns ``turns`` in order (per session), whatever the prompt.

    ``prompts`` records every prompt it was given, so tests can check token exactness.
    Running out of turns raises ``PolicyError`` (an engine failure, like a crashed server).
    """

    def __init__(self, tokenizer: Any, turns: list[str], end_of_turn: str = "<|im_end|>") -> None:
        self.tokenizer = tokenizer
        self.turns = list(turns)
        eot = tokenizer.encode(end_of_turn, add_special_tokens=False)
        assert len(eot) == 1, f"{end_of_turn!r} is not one token of this tokenizer"
        self.eot_id = eot[0]
        self.prompts: list[list[int]] = []
        self.released: list[str] = []
        self._next: dict[str | None, int] = {}
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *,
                       session_id: str | None = None, group_id: str | None = None) -> Generation:
        k = self._next.get(session_id, 0)
        if k >= len(self.turns):
            raise PolicyError(f"scripted policy has no turn {k + 1} (script has {len(self.turns)}); "
                              "add turns or end the script with a finish call")
        self._next[session_id] = k + 1
        self.prompts.append(list(prompt_ids))
        ids = list(self.tokenizer.encode(self.turns[k], add_special_tokens=False)) + [self.eot_id]
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return Generation(tuple(ids), (0.0,) * len(ids), (self._version,) * len(ids), finish,
                          self.tokenizer.decode(ids))

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self._version = version

    async def release(self, session_id: str) -> None:
        self.released.append(session_id)


# --- gold patch -> tool calls ---------------------------------------------------------------

@dataclass
class Hunk:
    old_start: int
    old_lines: list[str] = field(default_factory=list)
    new_lines: list[str] = field(default_factory=list)


@dataclass
class FilePatch:
    old_path: str | None  # None: the file is new
    new_path: str | None  # None: the file is deleted
    hunks: list[Hunk] = field(default_factory=list)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _strip_prefix(p: str) -> str | None:
    p = p.split("\t")[0].strip()
    if p == "/dev/null":
        return None
    return p[2:] if p.startswith(("a/", "b/")) else p


def parse_unified_diff(diff: str) -> list[FilePatch]:
    """Files and hunks of a unified diff (git or plain ``diff -u`` headers). Hunk bodies are read
    by the line counts of their ``@@`` header, so '--- x' inside a hunk is not a file header."""
    files: list[FilePatch] = []
    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FilePatch(_strip_prefix(ln[4:]), _strip_prefix(lines[i + 1][4:])))
            i += 2
            continue
        m = _HUNK.match(ln)
        if m and files:
            h = Hunk(int(m.group(1)))
            files[-1].hunks.append(h)
            i = _read_hunk(lines, i + 1, h, int(m.group(2) or 1), int(m.group(4) or 1))
            continue
        i += 1
    return files


def _read_hunk(lines: list[str], i: int, h: Hunk, n_old: int, n_new: int) -> int:
    last = " "
    while i < len(lines) and (n_old > 0 or n_new > 0 or lines[i].startswith("\\")):
        ln = lines[i]
        if ln.startswith("\\"):  # '\ No newline at end of file' applies to the previous line
            for side, tags in ((h.old_lines, " -"), (h.new_lines, " +")):
                if last in tags and side:
                    side[-1] = side[-1].removesuffix("\n")
        else:
            last, body = (ln[:1] or " "), ln[1:] + "\n"
            if last in " -":
                h.old_lines.append(body)
                n_old -= 1
            if last in " +":
                h.new_lines.append(body)
                n_new -= 1
        i += 1
    return i


def apply_hunks(text: str, hunks: list[Hunk], path: str) -> str:
    """Apply hunks by line number, checking the old lines match (``TaskError`` if not)."""
    base = text.splitlines(keepends=True)
    out, pos = [], 0
    for h in hunks:
        start = h.old_start - 1 if h.old_lines else h.old_start
        if base[start:start + len(h.old_lines)] != h.old_lines:
            raise TaskError(f"gold patch does not apply to {path} at line {h.old_start}")
        out += base[pos:start] + h.new_lines
        pos = start + len(h.old_lines)
    return "".join(out + base[pos:])


def _call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def oracle_turns(task: Task) -> list[str]:
    """The oracle's script: read the code around each hunk, edit it (unique snippets, else the
    whole file), run the tests, finish. Reading windows rather than whole files keeps its
    trajectories (SFT data) short, as a focused engineer's would be."""
    if not task.gold_patch:
        raise TaskError(f"task {task.id} has no gold_patch; the oracle needs one")
    patches = parse_unified_diff(task.gold_patch)
    if not patches:
        raise TaskError(f"gold_patch of task {task.id} contains no file diffs")
    reads, edits = [], []
    for fp in patches:
        if fp.old_path is None:
            assert fp.new_path is not None
            edits.append(_call("write_file", path=fp.new_path,
                               content="".join(ln for h in fp.hunks for ln in h.new_lines)))
            continue
        if fp.new_path is None or fp.new_path != fp.old_path:
            if fp.new_path is not None:
                edits += _file_edits(task, fp, target=fp.new_path)
            edits.append(_call("run_terminal", command=f"rm -f -- {shlex.quote(fp.old_path)}"))
            continue
        for offset, limit in _read_windows(fp.hunks):
            reads.append(_call("read_file", path=fp.old_path, offset=offset, limit=limit))
        edits += _file_edits(task, fp, target=fp.old_path)
    turns = []
    if reads:
        turns.append("Let me read the code the fix touches.\n" + "".join(reads))
    turns.append("Now the fix.\n" + "".join(edits))
    tests = list(task.grader.fail_to_pass)
    turns.append("Run the tests.\n" + (_call("run_tests", tests=tests) if tests else _call("run_tests")))
    turns.append(_call("finish", summary=f"Applied the fix for {task.id}."))
    return turns


READ_CONTEXT = 30
"""Lines of context the oracle reads above and below each hunk."""


def _read_windows(hunks: list[Hunk]) -> list[tuple[int, int]]:
    """(offset, limit) line windows around the hunks, merged where they overlap."""
    windows: list[list[int]] = []
    for h in sorted(hunks, key=lambda h: h.old_start):
        lo = max(1, h.old_start - READ_CONTEXT)
        hi = h.old_start + len(h.old_lines) + READ_CONTEXT
        if windows and lo <= windows[-1][1] + 1:
            windows[-1][1] = max(windows[-1][1], hi)
        else:
            windows.append([lo, hi])
    return [(lo, hi - lo + 1) for lo, hi in windows]


def _file_edits(task: Task, fp: FilePatch, target: str) -> list[str]:
    """edit_file calls for each hunk whose old text is unique in the file as it is at that point;
    one write_file of the whole new content if any hunk is not (or the file moves)."""
    assert fp.old_path is not None
    src = Path(task.repo) / fp.old_path
    try:
        text = src.read_text(encoding="utf-8")
    except OSError as e:
        raise TaskError(f"cannot read {fp.old_path} from task repo {task.repo}: {e}") from None
    new_text = apply_hunks(text, fp.hunks, fp.old_path)
    if target == fp.old_path:
        calls, cur = [], text
        for h in fp.hunks:
            old, new = "".join(h.old_lines), "".join(h.new_lines)
            if not old or len(find_all(cur, old)) != 1:
                break
            calls.append(_call("edit_file", path=target, old_string=old, new_string=new))
            cur = cur.replace(old, new)
        else:
            if cur == new_text:
                return calls
    return [_call("write_file", path=target, content=new_text)]


class OracleAgent:
    """An ``Engine`` that solves ``task`` from its gold patch through the harness tools: it plays
    the script of ``oracle_turns`` (the calls do not depend on the tool results)."""

    def __init__(self, task: Task, tokenizer: Any, end_of_turn: str = "<|im_end|>") -> None:
        self.task = task
        self.turns = oracle_turns(task)
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
