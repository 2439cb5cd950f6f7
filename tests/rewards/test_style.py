"""Style terms against a real repository on disk and the real ruff."""

import difflib

import pytest

from looprl.config import load_config
from looprl.errors import ConfigError, RewardError
from looprl.rewards.style import (
    StyleConfig,
    diff_size_penalty,
    diff_size_ratio,
    new_lint_diagnostics,
    style_lint_penalty,
)
from looprl.types import Counters, Grader, StopReason, Task, Trajectory

BASE = "import os\n\n\ndef f(x):\n    return x + 2\n"  # one pre-existing F401 (unused os)


def _diff(path: str, old: str | None, new: str | None) -> str:
    out = difflib.unified_diff((old or "").splitlines(keepends=True),
                               (new or "").splitlines(keepends=True),
                               f"a/{path}" if old is not None else "/dev/null",
                               f"b/{path}" if new is not None else "/dev/null")
    return "".join(out)


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(BASE)
    (tmp_path / "pkg" / "clean.py").write_text("def g():\n    return 1\n")
    (tmp_path / "README.md").write_text("readme\n")
    return tmp_path


def _task(repo, gold: str | None = None) -> Task:
    return Task("t", str(repo), "fix f", Grader("pytest"), gold_patch=gold)


def _traj(diff: str, stop: StopReason = StopReason.FINISHED) -> Trajectory:
    return Trajectory("t", "g", (), (), Counters(), stop, diff=diff)


def test_clean_fix_introduces_nothing(repo):
    diff = _diff("pkg/m.py", BASE, BASE.replace("x + 2", "x + 1"))
    assert new_lint_diagnostics(_task(repo), _traj(diff)) == 0  # the old F401 is not the model's
    assert style_lint_penalty(_task(repo), _traj(diff)) == 0.0


def test_counts_only_new_diagnostics(repo):
    new = "import os\nimport sys\n\n\ndef f(x):\n    y = undefined_name\n    return x + 1\n"
    diff = _diff("pkg/m.py", BASE, new)  # + F401 sys, + F821 undefined, + F841 unused y
    assert new_lint_diagnostics(_task(repo), _traj(diff)) == 3
    assert style_lint_penalty(_task(repo), _traj(diff)) == pytest.approx(-0.06)
    cfg = StyleConfig(lint_rules=("F821",))
    assert new_lint_diagnostics(_task(repo), _traj(diff), cfg) == 1


def test_fixing_old_diagnostics_is_not_a_bonus_and_moves_are_free(repo):
    moved = "\n\n\nimport os\n\n\ndef f(x):\n    return x + 1\n"  # F401 moved down 3 lines
    assert new_lint_diagnostics(_task(repo), _traj(_diff("pkg/m.py", BASE, moved))) == 0
    fixed = "def f(x):\n    return x + 1\n"
    assert style_lint_penalty(_task(repo), _traj(_diff("pkg/m.py", BASE, fixed))) == 0.0


def test_new_and_deleted_files_and_syntax_errors(repo):
    created = _diff("pkg/new.py", None, "import json\n")
    deleted = _diff("pkg/clean.py", "def g():\n    return 1\n", None)
    broken = _diff("pkg/m.py", BASE, BASE.replace("def f(x):", "def f(x:"))
    assert new_lint_diagnostics(_task(repo), _traj(created + deleted)) == 1
    assert new_lint_diagnostics(_task(repo), _traj(broken)) >= 1
    assert new_lint_diagnostics(_task(repo), _traj(_diff("README.md", "readme\n", "x\n"))) == 0


def test_lint_cap_and_skips(repo, tmp_path_factory):
    many = "\n".join(f"import mod{i}" for i in range(30)) + "\n"
    assert style_lint_penalty(_task(repo), _traj(_diff("pkg/new.py", None, many))) == -0.2
    assert style_lint_penalty(_task("s3://bucket/repo"), _traj("")) is None  # not local
    infra = _traj(_diff("pkg/new.py", None, many), StopReason.INFRA_ERROR)
    assert style_lint_penalty(_task(repo), infra) is None


def test_diff_not_against_base_is_an_infra_error(repo):
    wrong = _diff("pkg/m.py", "something else\n", "x\n")
    with pytest.raises(RewardError, match="does not apply"):
        new_lint_diagnostics(_task(repo), _traj(wrong))
    missing = _diff("pkg/nope.py", "a\n", "b\n")
    with pytest.raises(RewardError, match="not in the task's base snapshot"):
        new_lint_diagnostics(_task(repo), _traj(missing))
    escape = _diff("../../etc/passwd.py", "a\n", "b\n")
    with pytest.raises(RewardError, match="escapes"):
        new_lint_diagnostics(_task(repo), _traj(escape))


def test_diff_size_against_gold(repo):
    gold = _diff("pkg/m.py", BASE, BASE.replace("x + 2", "x + 1"))  # 2 lines changed
    task = _task(repo, gold)
    assert diff_size_ratio(task, _traj(gold)) == 1.0
    assert diff_size_penalty(task, _traj(gold)) == 0.0
    sprawl = BASE.replace("x + 2", "x + 1") + "".join(f"z{i} = {i}\n" for i in range(12))
    big = _diff("pkg/m.py", BASE, sprawl)  # 2 + 12 = 14 lines: ratio 7, 5 beyond tolerance 2
    assert diff_size_ratio(task, _traj(big)) == 7.0
    assert diff_size_penalty(task, _traj(big)) == pytest.approx(-0.1)
    assert diff_size_penalty(task, _traj(big), StyleConfig(diff_size_tolerance=10)) == 0.0
    assert diff_size_penalty(_task(repo, None), _traj(big)) is None  # no gold: cannot judge


def test_bad_config():
    with pytest.raises(ConfigError, match="lint_rules must have 1 to 256 entries, got 0"):
        load_config(StyleConfig, None, ["lint_rules="])
    with pytest.raises(ConfigError, match=r"max_lint_penalty must be in \[0, 1000\]"):
        load_config(StyleConfig, None, ["max_lint_penalty=-1"])
