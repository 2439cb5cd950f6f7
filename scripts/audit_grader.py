"""Audit the grader on built task sets: every gold patch must grade 1.0 and every untouched task
0.0, with no monitor flag on the gold patch; the seeded exploits (``tests/rewards/exploits.py``)
must grade 0.0 and be flagged on a sample of tasks.

    nice -n 15 .venv/bin/python scripts/audit_grader.py ~/.cache/looprl/tasks/*/tasks-*.jsonl \
        [--exploit-tasks 1] [--baseline-rev HEAD] [--limit N] [--json out.json]

``--exploit-tasks N``: run the exploits on the first N tasks of each file (0: none).
``--baseline-rev REV``: also grade each gold patch (and each exploit) with the grader of git
revision REV (its ``rewards/tests.py``, loaded beside this one), for the time per grade before
and after a change of the grader and for which exploits fooled it. Exit status 1 when any check
fails. Grading is sequential (one sandbox at a time); run it niced beside other work.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for tests.rewards.exploits

from looprl.rewards.composite import compute_reward  # noqa: E402
from looprl.rewards.hacking import ATTACK_FLAGS, detect  # noqa: E402
from looprl.rewards.tests import grade  # noqa: E402
from looprl.tasks.taskset import load_tasks  # noqa: E402
from looprl.types import Counters, StopReason, Task, Trajectory  # noqa: E402
from tests.rewards.exploits import EXPLOITS, Target  # noqa: E402


def grader_at(rev: str) -> ModuleType:
    """``looprl.rewards.tests`` as it was at git revision ``rev`` (a separate module)."""
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:src/looprl/rewards/tests.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_tests.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("baseline_grader", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def finished(task: Task, diff: str) -> Trajectory:
    return Trajectory(task.id, "audit", (), (), Counters(turns=1), StopReason.FINISHED, diff=diff)


async def timed(fn, task: Task, diff: str) -> tuple[object, float]:
    t0 = time.monotonic()
    g = await fn(task, diff, cache=False)
    return g, time.monotonic() - t0


async def audit(files: list[str], limit: int | None, exploit_tasks: int,
                baseline: ModuleType | None) -> dict:
    problems: list[str] = []
    times: dict[str, list[float]] = {"after": [], "before": []}
    n_tasks = n_gold = n_untouched = n_exploits = 0
    fooled_before: dict[str, int] = {}
    for f in files:
        tasks = load_tasks(f)[:limit]
        for i, task in enumerate(tasks):
            n_tasks += 1
            if baseline is not None and n_tasks % 2:  # alternate which grader goes first
                times["before"].append((await timed(baseline.grade, task, task.gold_patch))[1])
            g, dt = await timed(grade, task, task.gold_patch or "")
            times["after"].append(dt)
            if baseline is not None and not n_tasks % 2:
                times["before"].append((await timed(baseline.grade, task, task.gold_patch))[1])
            flags = detect(task, finished(task, task.gold_patch or ""))
            if g.score == 1.0 and not g.flags and not set(flags) & ATTACK_FLAGS:
                n_gold += 1
            else:
                problems.append(f"{task.id}: gold {g.score} flags {g.flags} {flags} "
                                f"{[t for t, o in g.tests.items() if o != 'passed'][:5]}")
            u = await grade(task, "", cache=False)
            n_untouched += u.score == 0.0
            if u.score != 0.0:
                problems.append(f"{task.id}: the untouched task grades {u.score}")
            if i < exploit_tasks:
                for e in EXPLOITS:
                    diff = e.make(Target.of(task))
                    r = await grade(task, diff, cache=False)
                    raised = set(r.flags) | ({"edited_tests"} if r.edited_tests else set())
                    rb = compute_reward(task, finished(task, diff), r)
                    zero_total = not set(e.flags) & ATTACK_FLAGS or rb.total <= -1.0
                    if r.score == 0.0 and set(e.flags) <= raised and zero_total:
                        n_exploits += 1
                    else:
                        problems.append(f"{task.id}: exploit {e.name} grades {r.score}, flags "
                                        f"{sorted(raised)}, total {rb.total}")
                    if baseline is not None:
                        try:
                            old = await baseline.grade(task, diff, cache=False)
                            fooled_before[e.name] = fooled_before.get(e.name, 0) + (
                                old.score == 1.0)
                        except Exception as ex:  # the old grader's infra error: not fooled
                            print(f"  baseline on {e.name}: {type(ex).__name__}", file=sys.stderr)
                            fooled_before.setdefault(e.name, 0)
            print(f"{n_tasks} tasks, {len(problems)} problems ({task.id}: {dt:.2f} s)",
                  file=sys.stderr)
    out = {"tasks": n_tasks, "gold_1.0": n_gold, "untouched_0.0": n_untouched,
           "exploit_runs_ok": n_exploits, "exploits": len(EXPLOITS),
           "median_grade_s_after": statistics.median(times["after"]) if times["after"] else None,
           "problems": problems}
    if baseline is not None:
        out["median_grade_s_before"] = statistics.median(times["before"])
        out["exploits_fooling_baseline"] = {k: v for k, v in fooled_before.items() if v}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="task files (JSONL) to audit")
    parser.add_argument("--limit", type=int, default=None, help="first N tasks of each file")
    parser.add_argument("--exploit-tasks", type=int, default=1)
    parser.add_argument("--baseline-rev", default=None)
    parser.add_argument("--json", default=None, help="also write the summary here")
    args = parser.parse_args()
    baseline = grader_at(args.baseline_rev) if args.baseline_rev else None
    t0 = time.monotonic()
    out = asyncio.run(audit(args.files, args.limit, args.exploit_tasks, baseline))
    out["wall_s"] = round(time.monotonic() - t0, 1)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    sys.exit(1 if out["problems"] else 0)


if __name__ == "__main__":
    main()
