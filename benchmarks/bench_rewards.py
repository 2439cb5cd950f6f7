"""How long does scoring one trajectory take, and what does linting only the changed files save?

    .venv/bin/python benchmarks/bench_rewards.py [--repeats 5]

Task repo: a copy of an installed package (``rich``, ~100 Python files), a one-line edit to one
file. Measures, in the same run:
- ``compute_reward`` with every term (length, monitors, ruff on the changed file, diff size),
  the lint cache cleared each time so ruff really runs;
- the baseline: the naive way, copy the whole repository twice, apply the edit to one copy and run
  ruff over both trees.
Prints the median of each and the ratio.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from looprl.rewards import RewardConfig, compute_reward
from looprl.rewards.style import _lint_delta_cached, ruff_binary
from looprl.types import Counters, Grader, StopReason, Task, Trajectory


def _setup(tmp: Path) -> tuple[Task, Trajectory, str]:
    spec = importlib.util.find_spec("rich")
    assert spec and spec.origin, "benchmark needs the 'rich' package (a looprl dependency)"
    repo = tmp / "repo"
    shutil.copytree(Path(spec.origin).parent, repo / "rich",
                    ignore=shutil.ignore_patterns("__pycache__"))
    rel = "rich/console.py"
    old = (repo / rel).read_text()
    new = old.replace("import os\n", "import os\nimport colorsys\n", 1)
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        f"a/{rel}", f"b/{rel}"))
    task = Task("bench", str(repo), "p", Grader("pytest", fail_to_pass=("x",)), gold_patch=diff)
    traj = Trajectory("bench", "g", (), (), Counters(turns=5, tool_calls=8, output_tokens=900,
                      tool_output_tokens=4000, broken_tool_calls=1), StopReason.FINISHED, diff=diff)
    return task, traj, new


def _naive(task: Task, rel: str, new: str, rules: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        before, after = Path(tmp, "before"), Path(tmp, "after")
        shutil.copytree(task.repo, before)
        shutil.copytree(task.repo, after)
        (after / rel).write_text(new)
        for root in (before, after):
            subprocess.run([ruff_binary(), "check", "--isolated", "--no-cache", "--exit-zero",
                            "--output-format", "json", "--select", rules, "."], cwd=root,
                           capture_output=True, check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = RewardConfig()
    with tempfile.TemporaryDirectory() as tmp:
        task, traj, new = _setup(Path(tmp))
        n_files = sum(1 for _ in Path(task.repo).rglob("*.py"))
        ours, naive = [], []
        for _ in range(args.repeats):
            _lint_delta_cached.cache_clear()
            t0 = time.perf_counter()
            rb = compute_reward(task, traj, 1.0, cfg)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _naive(task, "rich/console.py", new, ",".join(cfg.style.lint_rules))
            naive.append(time.perf_counter() - t0)
        assert rb is not None and rb.details["new_lint_diagnostics"] == 1, rb
    a, b = statistics.median(ours), statistics.median(naive)
    print(f"repo: {n_files} .py files; components: "
          + ", ".join(f"{k}={v:+.4f}" for k, v in rb.components.items()))
    print(f"compute_reward (all terms, ruff on changed files): {a * 1e3:8.1f} ms")
    print(f"baseline: copy repo x2 + ruff whole tree x2:        {b * 1e3:8.1f} ms")
    print(f"ratio baseline / ours: {b / a:.1f}x")


if __name__ == "__main__":
    main()
