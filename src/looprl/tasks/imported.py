"""What every task importer shares: the report of one import and the validation each imported
task passes before it is written (its gold solution scores 1, the untouched task less).

    report = ImportReport()
    report.skip("django__django-11099", "repository django/django not available offline ...")
    task = await validated(task)                 # TaskError (one line) unless it is sound
    report.print()                               # one line per skipped task and per note

Nothing is dropped or degraded silently: a task that cannot be realised offline is skipped with
one line saying why, and a task imported with a difference from its source (an ENV that only
reaches the verifier, say) carries a note of one line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace

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


def patch_metadata(gold: str) -> dict[str, str | int]:
    """The metadata a task table shows of a gold patch: lines and files it changes, and that
    the import validated the task with it."""
    from looprl.diffs import changed_files, lines_changed

    return {"lines_changed": lines_changed(gold), "files": ",".join(changed_files(gold)),
            "validated": "gold"}


async def validated(task: Task) -> Task:
    """``task`` with ``metadata.untouched_score`` once it is sound: its gold patch scores 1 and
    the untouched task less (a task already solved teaches nothing). ``TaskError`` with the
    reason, in one line, otherwise; grading failures are reasons too: an import never writes
    a task it could not grade."""
    from looprl.rewards.tests import grade

    try:
        gold = await grade(task, task.gold_patch or "", cache=False)
    except RewardError as e:
        raise TaskError(f"its gold solution could not be graded: {e}") from None
    if gold.score != 1.0:
        why = gold.error or (gold.output_tail.strip().splitlines() or ["no output"])[-1]
        raise TaskError(f"its gold solution scores {gold.score:g}, not 1 ({why})")
    try:
        base = await grade(task, "", cache=False)
    except RewardError as e:
        raise TaskError(f"the untouched task could not be graded (a failure must be scorable): "
                        f"{e}") from None
    if base.score >= 1.0:
        raise TaskError("the untouched task already scores 1: there is nothing to solve")
    return replace(task, metadata={**task.metadata, "untouched_score": base.score})
