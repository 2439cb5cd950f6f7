"""Release-diff tasks between two local 'releases' of the example package (no network)."""

import asyncio
import shutil
from pathlib import Path

import pytest

from looprl.rewards.tests import grade
from looprl.tasks.build import BuildConfig
from looprl.tasks.releases import release_tasks_from_repos

pytestmark = pytest.mark.slow  # sandboxed runs of old code with new tests (~15 s)


def test_tests_added_by_a_newer_release_become_tasks(example_snapshot, tmp_path):
    old = tmp_path / "minicalc-0.0"
    shutil.copytree(example_snapshot.repo, old)
    core, tests = old / "src/minicalc/core.py", old / "tests/test_core.py"
    # the older release: is_sorted had no `reverse`, and no test for it
    core.write_text(core.read_text()
                    .replace("def is_sorted(xs, reverse=False):", "def is_sorted(xs):")
                    .replace("if (a > b and not reverse) or (a < b and reverse):", "if a > b:"))
    tests.write_text(tests.read_text().split("def test_is_sorted_reverse")[0])
    tasks = asyncio.run(release_tasks_from_repos(example_snapshot, old, "0.0", BuildConfig()))
    assert len(tasks) == 1
    t = tasks[0]
    assert t.grader.fail_to_pass == ("tests/test_core.py::test_is_sorted_reverse",)
    assert len(t.grader.pass_to_pass) == 13
    assert "test_is_sorted_reverse" in t.grader.test_patch and "test_is_sorted_reverse" not in \
        Path(t.repo, "tests/test_core.py").read_text()  # hidden from the agent
    assert "reverse=False" in t.gold_patch and "tests/" not in t.gold_patch
    assert t.metadata["source_kind"] == "release" and t.metadata["from_version"] == "0.0"
    assert asyncio.run(grade(t, "")).score == 0.0
    assert asyncio.run(grade(t, t.gold_patch)).score == 1.0
