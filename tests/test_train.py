"""`looprl train` helpers that need no run (the run itself: README's first command)."""

import dataclasses
import math

from looprl.harness.policies import oracle_turns
from looprl.train.report import loss_ends
from looprl.train.tasks import select_code
from looprl.types import Grader, Task


def test_loss_ends_average_a_tenth_of_the_steps_at_each_end():
    losses = [5.0] * 10 + [3.0] * 80 + [1.0, 2.0] * 5
    assert loss_ends(losses) == (5.0, 1.5)
    assert loss_ends([2.0]) == (2.0, 2.0)
    assert all(math.isnan(x) for x in loss_ends([]))


def test_select_code_appends_the_buggy_code_never_the_fix(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f(a, b):\n    return a >= b\n")
    patch = ("--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,2 +1,2 @@\n def f(a, b):\n"
             "-    return a >= b\n+    return a < b\n")
    task = Task(id="t", repo=str(tmp_path), prompt="fix f", grader=Grader("pytest"),
                gold_patch=patch)
    sel = select_code(task)
    assert sel.prompt == "fix f\n\nselected in ./pkg/m.py, lines 2-2:\n```\n>= b\n```"
    assert "< b" not in sel.prompt and sel.metadata["selection"] is True
    # the oracle edits the selection at once: the prompt shows the path and the snippet
    assert oracle_turns(sel) == [
        '<tool_call>{"name": "edit_file", "arguments": {"path": "./pkg/m.py", "old_string": '
        '">= b", "new_string": "< b"}}</tool_call>',
        '<tool_call>{"name": "finish", "arguments": {"summary": "Fixed it."}}</tool_call>']
    # a synthetic bug lives in `files`, over a pristine tree
    files = {"pkg/m.py": "def f(a, b):\n    return a >= b\n"}
    (tmp_path / "pkg" / "m.py").write_text("def f(a, b):\n    return a < b\n")
    assert select_code(task, files).prompt == sel.prompt
    # nothing to point at (a new file): the task as it was
    new_file = "--- /dev/null\n+++ b/pkg/n.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert select_code(dataclasses.replace(task, gold_patch=new_file)) == \
        dataclasses.replace(task, gold_patch=new_file)
