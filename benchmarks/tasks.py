"""Benchmark: build validated tasks from real PyPI packages, end to end, and time it.

    .venv/bin/python benchmarks/tasks.py                          # default package list
    .venv/bin/python benchmarks/tasks.py --packages toolz==1.2.0 parse==1.22.4 --max-tasks 40
    LOOPRL_HOME=/tmp/fresh .venv/bin/python benchmarks/tasks.py    # cold (nothing cached)

For each package: fetch the sdist, build its test venv (uv when installed), record its passing
tests (twice, in the sandbox), trace which tests call which function, screen mutations by
grading each untouched task on the tests that can notice it, validate every task (gold patch
through the harness's OracleAgent, graded in a fresh sandbox), and make release-diff tasks
against earlier releases. Prints per package the wall time against the package's own test-suite
time (the baseline: one plain run of its suite in the sandbox) and the stage breakdown
(``looprl.tasks.timing``), then the task table, an independent re-grade of random tasks
(``--recheck N``; ``--recheck-file F`` re-checks an existing task file only) and, last line:

    packages=N tasks=N validated=N seconds_per_package=S
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

from looprl import paths
from looprl.errors import TaskError
from looprl.rewards.tests import grade
from looprl.tasks import timing
from looprl.tasks.build import BuildConfig, build_package_tasks
from looprl.tasks.releases import build_release_tasks
from looprl.tasks.sources import fetch_package, uv_binary
from looprl.tasks.taskset import load_tasks, print_table, summarize, table_markdown, write_tasks
from looprl.types import Task

PACKAGES = ["inflection==0.5.1", "toolz==1.2.0", "semver==3.1.1", "parse==1.22.4",
            "python-slugify==9.2.0", "boltons==26.2.0", "tabulate==0.10.0", "cachetools==8.0.1",
            "six==1.17.0", "pathspec==1.1.1", "sqlparse==0.6.1", "humanize==4.17.0"]


def recheck(tasks: list[Task], n: int, seed: int = 0) -> str:
    """Grade ``n`` random tasks again, each in fresh sandboxes: untouched (must be 0.0) and
    with the gold patch (must be 1.0) - an independent check of the build's validation."""
    sample = random.Random(seed).sample(tasks, min(n, len(tasks)))

    async def one(t: Task) -> tuple[bool, bool]:
        return ((await grade(t, "", cache=False)).score == 0.0,
                (await grade(t, t.gold_patch or "", cache=False)).passed)

    async def run() -> list[tuple[bool, bool]]:
        sem = asyncio.Semaphore(2)

        async def limited(t: Task) -> tuple[bool, bool]:
            async with sem:
                return await one(t)

        return list(await asyncio.gather(*(limited(t) for t in sample)))

    res = asyncio.run(run())
    bad = [f"{t.id} ({'untouched passes' if not u else ''}{', ' if not (u or g) else ''}"
           f"{'gold fails' if not g else ''})" for t, (u, g) in zip(sample, res, strict=True)
           if not (u and g)]
    return (f"recheck of {len(sample)} random tasks in fresh sandboxes: untouched 0.0 on "
            f"{sum(u for u, _ in res)}/{len(res)}, gold patch 1.0 on {sum(g for _, g in res)}/"
            f"{len(res)}" + (f"; failed: {', '.join(bad)}" if bad else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packages", nargs="+", default=PACKAGES)
    ap.add_argument("--max-tasks", type=int, default=45, help="mutation tasks per package")
    ap.add_argument("--releases", type=int, default=2, help="earlier releases per package")
    ap.add_argument("--validate", default="oracle", choices=("oracle", "patch", "none"))
    ap.add_argument("--budget-s", type=float, default=75.0, help="screening budget per package")
    ap.add_argument("--out", default=str(paths.sub("tasks") / "benchmark.jsonl"))
    ap.add_argument("--recheck", type=int, default=20,
                    help="re-grade this many random tasks (untouched and gold) at the end")
    ap.add_argument("--recheck-file", help="only re-check the tasks of this JSONL file")
    args = ap.parse_args()
    if args.recheck_file:
        print(recheck(load_tasks(Path(args.recheck_file)), args.recheck))
        return

    cfg = BuildConfig(max_tasks=args.max_tasks, validate=args.validate, budget_s=args.budget_s)
    all_tasks, used, walls = [], [], []
    stage_sums: dict[str, float] = {}
    if not uv_binary():
        print("note: `uv` is not installed; test venvs are built with pip (slower)")
    for spec in args.packages:
        timing.reset()
        t0 = time.monotonic()
        try:
            snap = fetch_package(spec)
        except TaskError as e:
            print(f"{spec}: rejected: {str(e).splitlines()[0]}")
            continue
        fetched = time.monotonic() - t0
        tasks = build_package_tasks(snap, cfg)
        if args.releases:
            tasks += build_release_tasks(snap, args.releases, cfg)
        wall = time.monotonic() - t0
        walls.append(wall)
        used.append(spec)
        all_tasks += tasks
        kinds = sorted({str(t.metadata["source_kind"]) for t in tasks})
        print(f"{spec}: {len(tasks)} tasks ({', '.join(kinds)}) in {wall:.0f}s "
              f"(fetch {fetched:.0f}s); suite {snap.suite_wall_s:.1f}s -> "
              f"{wall / max(snap.suite_wall_s, 1e-3):.1f}x one suite run", flush=True)
        print(f"  stages: {timing.breakdown(timing.totals(), timing.counts())}", flush=True)
        for k, v in timing.totals().items():
            stage_sums[k] = stage_sums.get(k, 0.0) + v
    out = write_tasks(all_tasks, Path(args.out))
    print_table(all_tasks)
    print(table_markdown(summarize(all_tasks)))
    print(f"wrote {out}")
    print("stage busy-seconds per package (concurrent sandboxes add up): "
          + timing.breakdown({k: v / max(len(used), 1) for k, v in stage_sums.items()}))
    if args.recheck:
        print(recheck(all_tasks, args.recheck))
    validated = sum(1 for t in all_tasks if t.metadata.get("validated") in ("oracle", "patch"))
    per_pkg = sum(walls) / max(len(walls), 1)
    print(f"packages={len(used)} tasks={len(all_tasks)} validated={validated} "
          f"seconds_per_package={per_pkg:.1f}")


if __name__ == "__main__":
    main()
