"""Hints from the environment: for a failed rollout, the first turn that went wrong and a short
message saying what the environment knows and the policy did not (issue 54, targeted textual
feedback).

    hint = find_hint(task, trajectory)      # None: it passed, was not scored, or nothing to say
    hint.turn, hint.kind, hint.text         # 2, "broken_call", "This call is malformed: ..."

Where a rollout first went wrong, in this order of evidence:

1. ``broken_call``: the first turn with a malformed call (bad JSON, unknown tool, bad
   arguments): "This call is malformed: <the parse error>".
2. ``wrong_location``: the first turn that edits a file the gold patch does not touch:
   "The change belongs in <file>::<function>" (the gold hunk's enclosing ``def``/``class``).
3. ``failing_test``: the last editing turn (the state that was graded), when a hidden test
   fails: the test's name and the grader's assertion message (``grade_assertion``).

A hint is *where* and *why*, never the fix: every line of the gold patch's added code that
could identify it (``_secret_lines``) is cut out of the text (``redact``), whatever quoted it
(an assertion message that prints the expected source, a parse error echoing the call). What
it does not protect against: a hint naming a test whose *name* spells the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from looprl.diffs import FilePatch, parse_diff
from looprl.types import Message, Task, Trajectory

EDIT_TOOLS = ("edit_file", "write_file")
"""Tools whose ``path`` argument is the file a turn changes."""
MAX_HINT_CHARS = 400
"""A hint is one short message: the policy must still do the work."""
MIN_SECRET_CHARS = 4
"""Gold lines shorter than this once stripped (``)``, ``pass``-like stubs) are too common to
identify the fix, and cutting them would shred every hint."""
_DEF_RE = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)")
_HEADER_RE = re.compile(r"^@@ [^@]* @@\s*(.*)$", re.M)


@dataclass(frozen=True)
class Hint:
    """A message to insert after assistant turn ``turn`` (1-based, the trajectory's own count)
    and its tool results."""

    turn: int
    kind: str
    """broken_call, wrong_location or failing_test."""
    text: str


def _turns(messages: tuple[Message, ...]) -> list[tuple[Message, list[Message]]]:
    """Each assistant message with the tool messages that answer it, in order."""
    out: list[tuple[Message, list[Message]]] = []
    for m in messages:
        if m.get("role") == "assistant":
            out.append((m, []))
        elif m.get("role") == "tool" and out:
            out[-1][1].append(m)
    return out


def edited_paths(msg: Message) -> list[str]:
    """The files an assistant message's edit calls name (unparseable arguments name none)."""
    out = []
    for call in msg.get("tool_calls") or ():
        fn = call.get("function", call)
        if fn.get("name") not in EDIT_TOOLS:
            continue
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            continue
        if isinstance(args, dict) and isinstance(args.get("path"), str):
            path = args["path"]
            out.append(path[2:] if path.startswith("./") else path)
    return out


def gold_location(patch: FilePatch) -> str:
    """``file::function`` of a gold patch's first hunk (the ``def``/``class`` before its first
    change, else git's hunk header), or the file alone.

    >>> p = parse_diff("--- a/m.py\\n+++ b/m.py\\n@@ -1,2 +1,2 @@\\n def f(x):\\n-    return x\\n+    return x + 1\\n")[0]
    >>> gold_location(p)
    'm.py::f'
    """
    for h in patch.hunks[:1]:
        name = ""
        for ln in h.lines:
            if ln[:1] in "+-":
                break
            m = _DEF_RE.match(ln[1:])
            name = m.group(1) if m else name
        if not name:
            header = _HEADER_RE.search(patch.text)
            m = _DEF_RE.match(header.group(1)) if header else None
            name = m.group(1) if m else ""
        if name:
            return f"{patch.path}::{name}"
    return patch.path


def _secret_lines(gold_patch: str | None) -> list[str]:
    lines = {ln.strip() for p in parse_diff(gold_patch or "") for ln in p.added_lines}
    return sorted((ln for ln in lines if len(ln) >= MIN_SECRET_CHARS
                   and any(c.isalnum() for c in ln)), key=len, reverse=True)


def redact(text: str, gold_patch: str | None) -> str:
    """``text`` with every identifying added line of ``gold_patch`` cut out, capped at
    ``MAX_HINT_CHARS``.

    >>> redact("expected 'return a + b' here", "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-return a\\n+return a + b\\n")
    "expected '…' here"
    """
    secrets = _secret_lines(gold_patch)
    text = text[:MAX_HINT_CHARS]
    changed = True
    while changed:  # a cut can join two halves into a secret again
        changed = False
        for s in secrets:
            if s in text:
                text, changed = text.replace(s, "…"), True
    return text


def _broken(turn: int, tools: list[Message]) -> str | None:
    for t in tools:
        content = str(t.get("content", ""))
        if content.startswith("Invalid tool call"):
            reason = content.removeprefix("Invalid tool call").lstrip(": ")
            return f"Turn {turn}: this call is malformed: {reason.splitlines()[0] if reason else ''}"
    return None


def find_hint(task: Task, trajectory: Trajectory) -> Hint | None:
    """The hint for ``trajectory``'s first wrong turn; None when it passed, has no reward
    (infra errors are never the model's doing) or no turn can be blamed."""
    if trajectory.reward is None or trajectory.passed or trajectory.is_infra_error:
        return None
    turns = _turns(trajectory.messages)
    gold = [p for p in parse_diff(task.gold_patch or "") if p.path]
    gold_paths = {q for p in gold for q in p.paths}
    hint: Hint | None = None
    for i, (msg, tools) in enumerate(turns, start=1):
        text = _broken(i, tools)
        if text is not None:
            hint = Hint(i, "broken_call", text)
            break
        wrong = [p for p in edited_paths(msg) if gold_paths and p not in gold_paths]
        if wrong:
            where = ", ".join(gold_location(p) for p in gold)
            hint = Hint(i, "wrong_location", f"Turn {i} edited {wrong[0]}, but the change belongs "
                        f"in {where}.")
            break
    if hint is None:
        hint = _failing_test(trajectory, turns)
    if hint is None:
        return None
    return Hint(hint.turn, hint.kind, redact(hint.text, task.gold_patch))


def _failing_test(trajectory: Trajectory, turns: list[tuple[Message, list[Message]]]) -> Hint | None:
    assert trajectory.reward is not None
    details = trajectory.reward.details
    failed = str(details.get("failed_tests") or "").split()
    if not failed or not turns:
        return None
    edits = [i for i, (msg, _) in enumerate(turns, start=1) if edited_paths(msg)]
    turn = edits[-1] if edits else len(turns)
    why = str(details.get("grade_assertion") or "").strip()
    text = f"After turn {turn}, the hidden test {failed[0]} fails" + (f": {why}" if why else ".")
    return Hint(turn, "failing_test", text)
