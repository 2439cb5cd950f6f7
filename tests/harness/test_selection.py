"""Selection widths (``harness.selection``) on a real task repo file: the example package's
``core.py`` with one bug written in, as ``looprl tasks build`` writes a mutation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from looprl.config import FieldError
from looprl.diffs import unified_diff
from looprl.harness.oracle import oracle_turns
from looprl.harness.selection import enclosing_lines
from looprl.train import tasks as train_tasks
from looprl.train.config import TasksExperimental, TasksSection
from looprl.train.tasks import select_code
from looprl.types import Grader, Task
from tests.example_package import write_example_package
from tests.rewards.minicalc import CORE

BUGS = {  # name -> (right line, buggy line)
    "clamp": ("    if x > hi:\n", "    if x < hi:\n"),
    "mean": ("        total += v\n", "        total -= v\n"),
    "running_total": ("    acc = start\n", "    acc = start + 1\n"),
}


def _task(tmp_path, name: str) -> Task:
    repo = write_example_package(tmp_path / name)
    core = repo / CORE
    right = core.read_text()
    good, bad = BUGS[name]
    assert right.count(good) == 1
    core.write_text(right.replace(good, bad))
    return Task(f"minicalc-{name}", str(repo), f"{name} is wrong", Grader("pytest"),
                gold_patch=unified_diff(CORE, core.read_text(), right),
                metadata={"package": "minicalc", "functions": name})


def _selected(task: Task) -> tuple[int, int, str]:
    """(first, last, code) of the one selection block of ``task``'s prompt."""
    head, code = task.prompt.split("selected in ./src/minicalc/core.py, lines ")[1].split(":\n", 1)
    first, last = map(int, head.split("-"))
    return first, last, code.removeprefix("```\n").removesuffix("\n```")


@pytest.mark.parametrize(("name", "block", "function"), [
    ("clamp", (8, 9), (4, 10)),           # the `if` around the line
    ("mean", (18, 19), (13, 20)),         # the `for` around the line
    ("running_total", (25, 26), (23, 30)),  # the simple statements before the `for`, no docstring
])
def test_each_width_selects_its_code_with_path_and_first_line(tmp_path, name, block, function):
    task = _task(tmp_path, name)
    lines = (tmp_path / name / CORE).read_text().splitlines()
    bad_line = lines.index(BUGS[name][1].rstrip("\n")) + 1
    line = select_code(task, width="line")
    first, last, code = _selected(line)
    assert first == last == bad_line and code in lines[bad_line - 1] and line.metadata["selection"] == "line"
    for width, (a, b) in (("block", block), ("function", function)):
        wide = select_code(task, width=width)
        assert _selected(wide) == (a, b, "\n".join(lines[a - 1:b])), width
        assert wide.metadata["selection"] == width
        assert BUGS[name][0] not in _selected(wide)[2] + "\n"  # the buggy code, never the fix
        # the oracle edits at once, and its old_string is in the selection the prompt shows
        edit = json.loads(oracle_turns(wide)[0].removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert edit["name"] == "edit_file" and edit["arguments"]["old_string"] in _selected(wide)[2]
    assert len(select_code(task, width="function").prompt) > len(select_code(task, width="block").prompt)


def test_code_outside_any_function_or_a_file_that_does_not_parse_keeps_its_lines():
    assert enclosing_lines("import os\nX = 1\n", 2, 2, "function") == (2, 2)
    assert enclosing_lines("def f(:\n    x = 1\n", 2, 2, "block") == (2, 2)
    with pytest.raises(ValueError, match="use one of line, block, function"):
        enclosing_lines("x = 1\n", 1, 1, "statement")


def test_held_out_evaluation_uses_the_configured_width(monkeypatch, tmp_path):
    tasks = {n: _task(tmp_path, n) for n in BUGS}

    def built(specs, cfg, seed, progress=None):  # the package build is the seam
        return {"minicalc==0.1": list(tasks.values()),
                "other==1": [dataclasses.replace(_task(tmp_path / "o", "mean"), id="other-mean",
                                                 metadata={"package": "other", "functions": "m"})]}

    monkeypatch.setattr(train_tasks, "package_tasks", built)
    for width in ("line", "block", "function"):
        cfg = TasksSection(train_packages=["minicalc==0.1"], heldout_packages=["other==1"],
                           experimental=TasksExperimental(selection=True, selection_width=width,
                                                          heldout_fraction=0.5))
        sets = train_tasks.build_tasks(cfg)
        assert sets.train and sets.heldout and sets.heldout_packages
        for t in sets.train + sets.heldout + sets.heldout_packages:
            assert t.metadata["selection"] == width, (width, t.id)
            assert t.prompt == select_code(tasks.get(t.metadata["functions"], t), width=width).prompt \
                or t.id == "other-mean"
        held = sets.heldout_packages[0]
        assert _selected(held)[:2] == {"line": (19, 19), "block": (18, 19), "function": (13, 20)}[width]
    off = train_tasks.build_tasks(TasksSection(train_packages=["minicalc==0.1"],
                                               heldout_packages=["other==1"]))
    assert not any("selected in" in t.prompt for t in off.train + off.heldout + off.heldout_packages)


def test_an_unknown_width_is_refused_with_the_choices():
    with pytest.raises(FieldError, match="did you mean function"):
        TasksSection(train_file="t.jsonl", experimental=TasksExperimental(selection_width="fucntion"))
