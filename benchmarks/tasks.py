"""Benchmark: build validated tasks from real PyPI packages, end to end, and time it.

    .venv/bin/python benchmarks/tasks.py                          # default package list
    .venv/bin/python benchmarks/tasks.py --packages toolz==1.2.0 parse==1.22.4 --max-tasks 40
    LOOPRL_HOME=/tmp/fresh .venv/bin/python benchmarks/tasks.py    # cold (nothing cached)

For each package: fetch the sdist, build its test venv, record its passing tests (twice, in the
sandbox), screen mutations, write task repos, validate every task (gold patch through the
harness's OracleAgent, graded in a fresh sandbox), and make release-diff tasks against earlier
releases. Prints the task table, the per-package wall time against the package's own test-suite
time (the baseline: one plain run of its suite in the sandbox), and, last line exactly:

    packages=N tasks=N validated=N seconds_per_package=S
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from looprl import paths
from looprl.errors import TaskError
from looprl.tasks.build import BuildConfig, build_package_tasks
from looprl.tasks.releases import build_release_tasks
from looprl.tasks.sources import fetch_package
from looprl.tasks.taskset import print_table, summarize, table_markdown, write_tasks

PACKAGES = ["inflection==0.5.1", "toolz==1.2.0", "semver==3.1.1", "parse==1.22.4",
            "python-slugify==9.2.0", "boltons==26.2.0", "tabulate==0.10.0"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packages", nargs="+", default=PACKAGES)
    ap.add_argument("--max-tasks", type=int, default=50, help="mutation tasks per package")
    ap.add_argument("--releases", type=int, default=2, help="earlier releases per package")
    ap.add_argument("--validate", default="oracle", choices=("oracle", "patch", "none"))
    ap.add_argument("--budget-s", type=float, default=75.0, help="screening budget per package")
    ap.add_argument("--out", default=str(paths.sub("tasks") / "benchmark.jsonl"))
    args = ap.parse_args()

    cfg = BuildConfig(max_tasks=args.max_tasks, validate=args.validate, budget_s=args.budget_s)
    all_tasks, used, walls = [], [], []
    for spec in args.packages:
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
    out = write_tasks(all_tasks, Path(args.out))
    print_table(all_tasks)
    print(table_markdown(summarize(all_tasks)))
    print(f"wrote {out}")
    validated = sum(1 for t in all_tasks if t.metadata.get("validated") in ("oracle", "patch"))
    per_pkg = sum(walls) / max(len(walls), 1)
    print(f"packages={len(used)} tasks={len(all_tasks)} validated={validated} "
          f"seconds_per_package={per_pkg:.1f}")


if __name__ == "__main__":
    main()
