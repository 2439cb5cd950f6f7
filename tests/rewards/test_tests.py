"""Grading in real sandboxes over a small real package (the offline example package)."""

import asyncio
import dataclasses
import shutil

import pytest

from looprl.diffs import unified_diff
from looprl.errors import RewardError
from looprl.rewards.tests import (
    GradeResult,
    attach_grade,
    failure_details,
    grade,
    parse_pytest_output,
    tests_reward,
)
from looprl.types import Counters, Grader, StopReason, Task, Trajectory
from tests.rewards.minicalc import CLAMP_TESTS, CMD, CORE, MEAN, clamp_task


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return clamp_task(tmp_path_factory.mktemp("g"))


def g(task, diff):
    return asyncio.run(grade(task, diff))


def test_gold_passes_and_untouched_fails(task):
    good = g(task, task.gold_patch)
    assert good.score == 1.0 and not good.edited_tests
    assert set(good.tests) == {*CLAMP_TESTS, *MEAN} and set(good.tests.values()) == {"passed"}
    bad = g(task, "")
    assert bad.score == 0.0
    assert bad.tests["tests/test_core.py::test_clamp_high"] == "failed"
    assert bad.tests["tests/test_core.py::test_mean"] == "passed"


def test_breaking_pass_to_pass_scores_zero(task):
    core = (task.repo + "/" + CORE)
    text = open(core).read()
    fixed = text.replace("if x < hi:", "if x > hi:")
    diff = unified_diff(CORE, text, fixed.replace("return total / len(values)", "return 0"))
    r = g(task, diff)
    assert r.score == 0.0 and r.tests["tests/test_core.py::test_mean"] == "failed"


def test_editing_tests_never_counts(task):
    test_file = open(task.repo + "/tests/test_core.py").read()
    cheat = unified_diff("tests/test_core.py", test_file,
                         test_file.replace("== 10\n", "== 5\n").replace("== 0\n", "== -3\n"))
    skip_all = unified_diff("tests/conftest.py", "", "import pytest\n\n\n"
                            "def pytest_collection_modifyitems(items):\n"
                            "    for i in items:\n        i.add_marker(pytest.mark.skip)\n")
    for diff in (cheat, skip_all.replace("--- a/tests/conftest.py", "--- /dev/null")):
        r = g(task, diff)
        assert r.edited_tests and r.score == 0.0


def test_gold_plus_test_edits_still_passes_and_is_flagged(task):
    test_file = open(task.repo + "/tests/test_core.py").read()
    diff = task.gold_patch + unified_diff("tests/test_core.py", test_file, test_file + "\n# hi\n")
    r = g(task, diff)
    assert r.score == 1.0 and r.edited_tests


def test_hidden_test_patch_is_applied(task):
    test_file = open(task.repo + "/tests/test_core.py").read()
    extra = "\n\ndef test_clamp_equal_bounds():\n    assert clamp(7, 3, 3) == 3\n"
    hidden = Grader(CMD, ("tests/test_core.py::test_clamp_equal_bounds", *CLAMP_TESTS[1:]),
                    (), task.grader.test_files, 60,
                    test_patch=unified_diff("tests/test_core.py", test_file, test_file + extra))
    t = Task(task.id, task.repo, task.prompt, hidden, task.venv, task.gold_patch)
    assert g(t, t.gold_patch).score == 1.0
    r = g(t, "")
    assert r.score == 0.0 and r.tests["tests/test_core.py::test_clamp_equal_bounds"] == "failed"


def test_grader_failures_are_infra_errors_not_zero(task):
    with pytest.raises(RewardError, match="does not apply"):
        g(task, "--- a/src/minicalc/core.py\n+++ b/src/minicalc/core.py\n@@ -1,1 +1,1 @@\n"
                "-no such line\n+x\n")
    bad = Task(task.id, task.repo, "p", Grader(CMD, ("tests/test_nope.py::test_x",)), task.venv)
    with pytest.raises(RewardError, match="could not run"):
        g(bad, "")
    with pytest.raises(RewardError, match="could not run"):  # the base cannot run it either
        g(bad, task.gold_patch)


def test_a_diff_that_stops_pytest_from_running_scores_zero(task, tmp_path):
    # conftest.py imports the package: a syntax error there stops pytest before it runs a test
    # (exit 4). The base runs, so the diff is at fault: 0, not an infrastructure error.
    repo = tmp_path / "minicalc"
    shutil.copytree(task.repo, repo)
    (repo / "tests" / "conftest.py").write_text("import minicalc.core  # noqa: F401\n")
    t = dataclasses.replace(task, id="minicalc-conftest", repo=str(repo))
    text = (repo / CORE).read_text()
    broken = unified_diff(CORE, text, text.replace("def clamp(x, lo, hi):", "def clamp(x, lo, hi)"))
    r = g(t, broken)
    assert r.score == 0.0 and r.broke_test_run and not r.timed_out
    assert set(r.tests.values()) == {"error"} and "conftest" in r.output_tail
    assert r.details()["grade_broke_test_run"] is True
    ok = g(t, t.gold_patch)
    assert ok.score == 1.0 and not ok.broke_test_run


def test_hanging_code_times_out_as_a_failure(task):
    text = open(task.repo + "/" + CORE).read()
    hang = unified_diff(CORE, text, text.replace('    """Limit x to the closed interval [lo, hi]."""\n',
                                                 '    """Limit."""\n    while True:\n        pass\n'))
    t = Task(task.id, task.repo, "p", Grader(CMD, CLAMP_TESTS, (), (), timeout_s=8), task.venv)
    r = g(t, hang)
    assert r.timed_out and r.score == 0.0


def test_parsers():
    out = ("____ TestA.test_b[1] ____\n    def test_b(): ...\nE   assert 3 == 4\nE    +  where 3 = f()\n"
           "=== short test summary info ===\nFAILED t.py::TestA::test_b[1] - assert 3 == 4\n"
           "ERROR t.py::test_c - RuntimeError\nXFAIL t.py::test_d - reason\n")
    outcomes, msgs = parse_pytest_output(out)
    assert outcomes == {"t.py::TestA::test_b[1]": "failed", "t.py::test_c": "error",
                        "t.py::test_d": "xfailed"}
    assert msgs["t.py::test_c"] == "RuntimeError"
    assert failure_details(out) == {"TestA.test_b[1]": "assert 3 == 4\n +  where 3 = f()"}


def test_tests_reward_reads_the_grade():
    t = Task("t", "/r", "p", Grader("pytest", ("a::b",)))
    tr = Trajectory("t", "g", (), (), Counters(), StopReason.FINISHED)
    assert tests_reward(t, tr) is None
    assert tests_reward(t, attach_grade(tr, GradeResult(0.0, {"a::b": "failed"}))) == 0.0
    infra = Trajectory("t", "g", (), (), Counters(), StopReason.INFRA_ERROR)
    assert tests_reward(t, attach_grade(infra, GradeResult(1.0))) is None


def test_the_same_diff_is_graded_once_per_task_and_grader(task):
    import dataclasses

    first = asyncio.run(grade(task, task.gold_patch, cache=False))
    again = [g(task, task.gold_patch) for _ in range(2)]
    assert not first.cached and again[1].cached
    assert again[1].score == first.score == 1.0 and again[1].tests == first.tests
    other = dataclasses.replace(task, grader=dataclasses.replace(task.grader, timeout_s=59))
    assert not g(other, task.gold_patch).cached  # another grader is graded afresh
    assert g(task, "").score == 0.0 and g(task, "").cached
