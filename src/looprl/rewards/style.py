"""Style terms: lint diagnostics the edit introduced, and the edit's size against the gold patch.

``style_lint``: copy only the Python files the diff changes out of ``task.repo`` (the immutable
base snapshot), apply the diff to a second copy, run ``ruff check --output-format json`` with a
fixed rule set on both sides and count the diagnostics that are new (per file and rule code, after
minus before, never below zero). Each new diagnostic costs a little.

``style_diff_size``: lines changed by the trajectory's diff over lines changed by the gold patch;
beyond a tolerance ratio each extra unit of ratio costs a little (sprawling edits are harder to
review, even when the tests pass).

    from looprl.rewards.style import StyleConfig, style_lint_penalty, diff_size_penalty
    style_lint_penalty(task, trajectory, StyleConfig())    # -0.04 for two new diagnostics

Failures of the machinery (ruff missing or crashing, a diff that does not apply to the base) raise
``RewardError``: infrastructure, so the trajectory is not scored rather than scored wrong.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path

from looprl.diffs import SYMLINK, apply_patch, lines_changed, parse_diff
from looprl.errors import ConfigError, DiffError, RewardError
from looprl.paths import installed_program
from looprl.sandbox.beneath import Root
from looprl.types import Task, Trajectory


@dataclass(frozen=True)
class StyleConfig:
    """Weights and limits of the two style terms."""

    lint_rules: tuple[str, ...] = ("E4", "E7", "E9", "F", "B")
    """Ruff rule selectors, fixed so rewards do not depend on each repository's own config:
    syntax errors, pyflakes (unused/undefined names) and bugbear (likely bugs)."""
    lint_penalty_per_diagnostic: float = 0.02
    """Size of the penalty per new diagnostic."""
    max_lint_penalty: float = 0.2
    """Cap on the lint term's size."""
    diff_size_tolerance: float = 2.0
    """Ratio of lines changed (trajectory / gold patch) allowed before any penalty."""
    diff_size_penalty_per_ratio: float = 0.02
    """Size of the penalty per unit of ratio beyond the tolerance."""
    max_diff_size_penalty: float = 0.2
    """Cap on the diff-size term's size."""
    ruff_timeout_s: float = 60.0
    """Wall-clock limit of one ruff run."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and (not math.isfinite(value) or value < 0):
                raise ConfigError(f"rewards.style.{f.name} must be a finite number >= 0, "
                                  f"got {value!r}")
        if not self.lint_rules:
            raise ConfigError("rewards.style.lint_rules is empty; give ruff selectors such as "
                              "'F,E9' or drop 'style_lint' from rewards.terms")


def ruff_binary() -> str:
    """The ruff executable of this environment (next to the interpreter), else the one on PATH."""
    found = installed_program("ruff")
    if found is None:
        raise RewardError("ruff is not installed; `pip install ruff` (it is a looprl dependency) "
                          "or drop 'style_lint' from rewards.terms")
    return found


def _ruff_counts(root: Path, rules: tuple[str, ...], timeout_s: float) -> Counter[tuple[str, str]]:
    """Diagnostics under ``root`` keyed by (relative file, rule code)."""
    if not any(root.rglob("*.py")):
        return Counter()
    cmd = [ruff_binary(), "check", "--isolated", "--no-cache", "--exit-zero", "--output-format",
           "json", "--select", ",".join(rules), "."]
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "NO_COLOR": "1"})
    except subprocess.TimeoutExpired:
        raise RewardError(f"ruff took over {timeout_s}s; raise rewards.style.ruff_timeout_s") from None
    if proc.returncode != 0:
        raise RewardError(f"ruff failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}")
    counts: Counter[tuple[str, str]] = Counter()
    for d in json.loads(proc.stdout or "[]"):
        rel = os.path.relpath(d["filename"], root)
        counts[(rel, d.get("code") or "invalid-syntax")] += 1
    return counts


def _safe_join(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise RewardError(f"diff path {rel!r} escapes the repository")
    return path


@functools.lru_cache(maxsize=256)
def _lint_delta_cached(repo: str, diff: str, rules: tuple[str, ...], timeout_s: float) -> int:
    # The base snapshot is immutable, so (repo, diff, rules) determines the answer.
    # Python files only: not binary content, not a symlink's target (both sides of a type change
    # are their own patches)
    patches = [fp for fp in parse_diff(diff) if fp.path.endswith(".py") and not fp.binary
               and SYMLINK not in (fp.old_mode, fp.new_mode)]
    if not patches:
        return 0
    with tempfile.TemporaryDirectory(prefix="looprl-style-") as tmp:
        before, after = Path(tmp, "before"), Path(tmp, "after")
        for fp in patches:
            original = ""
            if fp.old_path is not None:
                try:  # looked up beneath the base, no link followed
                    with Root(repo) as base:
                        original = base.read_text(fp.old_path, errors="surrogateescape")
                except OSError as e:
                    if e.errno == errno.EXDEV:
                        raise RewardError(f"diff path {fp.old_path!r} escapes the repository") \
                            from None
                    raise RewardError(f"diff edits {fp.old_path!r}, which is not in the task's "
                                      f"base snapshot {repo}; the diff is not against this task") \
                        from None
                dst = _safe_join(before, fp.old_path)
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text(original, encoding="utf-8", errors="surrogateescape")
            if fp.new_path is not None:
                dst = _safe_join(after, fp.new_path)
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    after_text = apply_patch(original, fp)
                except DiffError as e:
                    raise RewardError(f"the diff does not apply to the task's base: {e}") from None
                dst.write_text(after_text, encoding="utf-8", errors="surrogateescape")
        # one ruff run over both trees (ruff's start-up dominates), split by side afterwards
        counts = _ruff_counts(Path(tmp), rules, timeout_s)
    old: Counter[tuple[str, str]] = Counter()
    new: Counter[tuple[str, str]] = Counter()
    for (rel, code), n in counts.items():
        side, _, path = rel.partition(os.sep)
        (old if side == "before" else new)[(path, code)] += n
    return sum(max(0, n - old.get(key, 0)) for key, n in new.items())


def new_lint_diagnostics(task: Task, trajectory: Trajectory,
                         cfg: StyleConfig = StyleConfig()) -> int | None:
    """Ruff diagnostics the diff introduced; None when the base snapshot is not a local directory."""
    if not Path(task.repo).is_dir():
        return None
    return _lint_delta_cached(task.repo, trajectory.diff, tuple(cfg.lint_rules), cfg.ruff_timeout_s)


def lint_penalty_of(n_new: int, cfg: StyleConfig = StyleConfig()) -> float:
    """The lint term for ``n_new`` new diagnostics.

    >>> lint_penalty_of(3), lint_penalty_of(50)
    (-0.06, -0.2)
    """
    return -min(cfg.lint_penalty_per_diagnostic * n_new, cfg.max_lint_penalty) + 0.0


def style_lint_penalty(task: Task, trajectory: Trajectory,
                       cfg: StyleConfig = StyleConfig()) -> float | None:
    """Reward term ``style_lint``: a small negative term per new ruff diagnostic.

    >>> import shutil, tempfile
    >>> from looprl.types import Counters, Grader, StopReason
    >>> repo = tempfile.mkdtemp()
    >>> _ = Path(repo, "m.py").write_text("x = 1\\n")
    >>> diff = "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1,3 @@\\n+import os\\n+import re\\n x = 1\\n"
    >>> traj = Trajectory("t", "g", (), (), Counters(), StopReason.FINISHED, diff=diff)
    >>> style_lint_penalty(Task("t", repo, "p", Grader("pytest")), traj)   # two unused imports
    -0.04
    >>> shutil.rmtree(repo)
    """
    if trajectory.is_infra_error:
        return None
    n = new_lint_diagnostics(task, trajectory, cfg)
    return None if n is None else lint_penalty_of(n, cfg)


def diff_size_ratio(task: Task, trajectory: Trajectory) -> float | None:
    """Lines changed by the trajectory over lines changed by the gold patch (None: no gold patch).

    >>> from looprl.types import Counters, Grader, StopReason
    >>> gold = "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-x = 1\\n+x = 2\\n"
    >>> ours = "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1,3 @@\\n-x = 1\\n+x = 2\\n+y = 3\\n+z = 4\\n"
    >>> task = Task("t", "/r", "p", Grader("pytest"), gold_patch=gold)
    >>> diff_size_ratio(task, Trajectory("t", "g", (), (), Counters(), StopReason.FINISHED, ours))
    2.0
    """
    if not task.gold_patch:
        return None
    gold = lines_changed(task.gold_patch)
    return None if gold == 0 else lines_changed(trajectory.diff) / gold


def diff_size_penalty_of(ratio: float, cfg: StyleConfig = StyleConfig()) -> float:
    """The diff-size term for a size ratio (trajectory / gold).

    >>> diff_size_penalty_of(1.5), round(diff_size_penalty_of(7.0), 6), diff_size_penalty_of(1e3)
    (0.0, -0.1, -0.2)
    """
    excess = max(0.0, ratio - cfg.diff_size_tolerance)
    return -min(cfg.diff_size_penalty_per_ratio * excess, cfg.max_diff_size_penalty) + 0.0


def diff_size_penalty(task: Task, trajectory: Trajectory,
                      cfg: StyleConfig = StyleConfig()) -> float | None:
    """Reward term ``style_diff_size``: small negative term for edits far larger than the gold.

    >>> from looprl.types import Counters, Grader, StopReason
    >>> gold = "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-x = 1\\n+x = 2\\n"
    >>> ours = gold + "--- a/n.py\\n+++ b/n.py\\n@@ -1 +1,9 @@\\n" + "+y\\n" * 8 + " z\\n"
    >>> task = Task("t", "/r", "p", Grader("pytest"), gold_patch=gold)
    >>> diff_size_penalty(task, Trajectory("t", "g", (), (), Counters(), StopReason.FINISHED, ours))
    -0.06
    """
    if trajectory.is_infra_error:
        return None
    ratio = diff_size_ratio(task, trajectory)
    return None if ratio is None else diff_size_penalty_of(ratio, cfg)
