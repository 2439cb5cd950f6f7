"""Memory across trajectories: the notes the agent keeps with the ``memory`` tool, carried from
one task to the next tasks of the same repository within a run (``rollout.experimental.notes_chars``).

    book = Notebook(budget_chars=1500)
    shown = book.show(task)          # the task, its prompt headed by the repository's notes
    ...                              # run the group on ``shown``
    book.add(task, [json.loads(t.metadata["memory"]) for t in group.trajectories])

Notes are keyed by repository: the task's ``package`` (its versions share the code), else its
``repo`` path. Each repository keeps its newest notes within ``budget_chars``; an older note leaves
when a newer one does not fit. A note is shown once even if several trajectories wrote it.

Leakage guard (what keeps a held-out pass@1 honest):

- A task never reads notes written on its own function (``function_key``, the key
  ``split_by_function`` holds out by), in training as in evaluation, so a policy never learns to
  lean on notes about the very function it fixes: at evaluation no such note can exist.
- Evaluation reads a read-only copy (``for_evaluation``): no held-out trajectory writes a note
  another held-out task reads, and every note written on a function of the evaluated tasks is
  dropped at the source (a belt to the split's braces: training never runs those functions).

What it does not guard against: a note that names another function's fix in words; notes about a
package evaluated as "never trained on" when it is also trained on (the task split forbids it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from looprl.types import Task

HEADER = "Notes you kept on earlier tasks in this repository (they may be out of date):"


def repo_key(task: Task) -> str:
    """Which notes a task shares: its package's, else its repository's."""
    return str(task.metadata.get("package") or task.repo)


def function_key(task: Task) -> str:
    """The function a task's bug is in, as the held-out split names it (``split_by_function``)."""
    return f"{task.metadata.get('package', '')}/{task.metadata.get('functions') or task.id}"


@dataclass(frozen=True)
class Note:
    text: str
    function: str
    """``function_key`` of the task whose trajectory wrote it."""


@dataclass
class Notebook:
    """Notes per repository within a budget; see the module docstring."""

    budget_chars: int = 1500
    """Characters of notes a repository keeps (and a prompt shows) at most; newest kept."""
    read_only: bool = False
    """Evaluation's copy: ``add`` changes nothing."""
    notes: dict[str, list[Note]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.budget_chars < 1:
            raise ValueError(f"budget_chars is {self.budget_chars}; give a positive budget "
                             "(rollout.experimental.notes_chars, 0 there turns notes off)")

    def add(self, task: Task, memories: Iterable[list[str]]) -> None:
        """Keep the notes each trajectory of ``task`` wrote (its ``memory`` tool's list)."""
        if self.read_only:
            return
        kept = self.notes.setdefault(repo_key(task), [])
        for memory in memories:
            for text in memory:
                text = text.strip()[:self.budget_chars]
                kept[:] = [n for n in kept if n.text != text]  # rewritten: it moves to the newest
                if text:
                    kept.append(Note(text, function_key(task)))
        while sum(len(n.text) for n in kept) > self.budget_chars:
            kept.pop(0)

    def readable(self, task: Task) -> list[str]:
        """The notes ``task`` may read: its repository's, none written on its own function."""
        own = function_key(task)
        return [n.text for n in self.notes.get(repo_key(task), []) if n.function != own]

    def show(self, task: Task) -> Task:
        """``task`` with its readable notes heading the prompt (unchanged when there are none).

        >>> from looprl.types import Grader
        >>> book = Notebook(100)
        >>> t = Task("a-1", "/r", "fix f", Grader("pytest"), metadata={"package": "a", "functions": "f"})
        >>> book.add(t, [["tests: tests/test_a.py"]])
        >>> book.show(t) == t   # never its own function's notes
        True
        >>> u = Task("a-2", "/r", "fix g", Grader("pytest"), metadata={"package": "a", "functions": "g"})
        >>> print(book.show(u).prompt)
        Notes you kept on earlier tasks in this repository (they may be out of date):
        - tests: tests/test_a.py
        <BLANKLINE>
        fix g
        """
        notes = self.readable(task)
        if not notes:
            return task
        block = "\n".join([HEADER, *(f"- {n}" for n in notes)])
        return dataclasses.replace(task, prompt=f"{block}\n\n{task.prompt}",
                                   metadata={**task.metadata, "notes": len(notes)})

    def for_evaluation(self, tasks: Iterable[Task]) -> Notebook:
        """A read-only copy without a note written on any function of ``tasks``."""
        held = {function_key(t) for t in tasks}
        return Notebook(self.budget_chars, True, {
            k: [n for n in v if n.function not in held] for k, v in self.notes.items()})

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"budget_chars": self.budget_chars, "notes": {
            k: [dataclasses.asdict(n) for n in v] for k, v in self.notes.items()}}, indent=1))

    @classmethod
    def load(cls, path: Path) -> Notebook:
        d = json.loads(path.read_text())
        return cls(d["budget_chars"], notes={k: [Note(**n) for n in v]
                                             for k, v in d["notes"].items()})
