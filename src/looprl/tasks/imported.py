"""What every task importer shares: the report of one import and the validation each imported
task passes before it is written (its gold solution scores 1, the untouched task less).

    report = ImportReport()
    report.skip("django__django-11099", "repository django/django not available offline ...")
    reason = await validation_failure(task)      # None when the task is sound
    report.print()                               # one line per skipped task and per note

Nothing is dropped or degraded silently: a task that cannot be realised offline is skipped with
one line saying why, and a task imported with a difference from its source (an ENV that only
reaches the verifier, say) carries a note of one line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from looprl.errors import RewardError, TaskError
from looprl.types import Task


@dataclass
class ImportReport:
    """The tasks an import made, and one line for each source it skipped or noted."""

    tasks: list[Task] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(source, why) of every source that gave no task."""
    notes: list[tuple[str, str]] = field(default_factory=list)
    """(task id, what differs) for tasks imported with a difference worth knowing."""

    def skip(self, source: str, why: str) -> None:
        self.skipped.append((source, one_line(why)))

    def note(self, task_id: str, what: str) -> None:
        self.notes.append((task_id, one_line(what)))

    def lines(self) -> list[str]:
        return ([f"{s}: skipped: {why}" for s, why in self.skipped]
                + [f"{t}: note: {what}" for t, what in self.notes])

    def print(self) -> None:
        for line in self.lines():
            print(line, file=sys.stderr)


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters.

    >>> one_line("a\\n  b\\tc")
    'a b c'
    """
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def safe_id(name: str) -> str:
    """A task id made of ``[A-Za-z0-9._-]`` from any source name ('org/task' -> 'org-task').

    >>> safe_id("terminal-bench/hello world")
    'terminal-bench-hello-world'
    """
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    if not out:
        raise TaskError(f"{name!r} gives no usable task id")
    return out


async def validation_failure(task: Task) -> str | None:
    """Why ``task`` is not sound, in one line, or None: its gold patch must score 1 and the
    untouched task less (a task already solved teaches nothing). Grading failures are reasons
    too: an import never writes a task it could not grade."""
    from looprl.rewards.tests import grade

    try:
        gold = await grade(task, task.gold_patch or "", cache=False)
    except RewardError as e:
        return f"its gold solution could not be graded: {e}"
    if gold.score != 1.0:
        why = gold.error or (gold.output_tail.strip().splitlines() or ["no output"])[-1]
        return f"its gold solution scores {gold.score:g}, not 1 ({why})"
    try:
        base = await grade(task, "", cache=False)
    except RewardError as e:
        return f"the untouched task could not be graded (a failure must be scorable): {e}"
    if base.score >= 1.0:
        return "the untouched task already scores 1: there is nothing to solve"
    return None
