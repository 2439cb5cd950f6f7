"""The held-out gain of several runs together: pool runs that share their held-out tasks (seeds of
one config) into one paired interval.

    .venv/bin/python scripts/pool_runs.py runs/quickstart runs/quickstart_s1

One run's RL − SFT interval on 200 held-out tasks × 3 samples is about ±4.5 points: the tasks
differ in how much RL helps them, and each sample passes or fails by chance. Runs with other
seeds sample both again, so their mean is tighter. Each task's pass@1 (and every other metric)
is averaged over the runs, weighted by samples, for the start and for the RL model; the pooled
pair then goes through ``bench.gate.compare`` as one run's evaluations do (the same paired
bootstrap over tasks), so a task counts once however many runs graded it. One line per held-out
set: ``set=… runs=… tasks=… samples=… sft=… rl=… delta=… ci_low=… ci_high=… half_width=…``,
then what a ±3-point interval would take: from two runs on, how many runs
(``bench.gate.runs_precision``: part of one run's spread over tasks is its own and shrinks only
with more runs, not with more samples of the same run).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from looprl.bench.gate import METRICS, compare, load, runs_precision

SETS = {"functions": "", "packages": "_packages"}


def pool(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report whose per-task rows are the sample-weighted means of ``reports``' rows."""
    tasks = set(reports[0]["per_task"])
    for r in reports[1:]:
        if set(r["per_task"]) != tasks:
            raise SystemExit("the runs' held-out tasks differ: pool only runs of one config "
                             "that share their held-out split (tasks/heldout*.jsonl)")
    per_task = {}
    for t in sorted(tasks):
        rows = [r["per_task"][t] for r in reports]
        n = sum(int(x["n"]) for x in rows)
        per_task[t] = {"n": n, **{m: sum(float(x[m]) * int(x["n"]) for x in rows) / n
                                  for m in METRICS}}
    return {"per_task": per_task}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run directories that evaluated SFT and RL")
    args = ap.parse_args()
    for name, suffix in SETS.items():
        paths = [(run / f"eval_start{suffix}.json", run / f"eval_rl{suffix}.json")
                 for run in args.runs]
        have = [p for p in paths if p[0].is_file() and p[1].is_file()]
        if not have:
            continue
        if len(have) < len(paths):
            raise SystemExit(f"{len(paths) - len(have)} of the runs lack eval_start{suffix}.json "
                             f"or eval_rl{suffix}.json: give runs that finished")
        a, b = (pool([load(p[i]) for p in have]) for i in (0, 1))
        c = compare(a, b)
        d = c.diffs[0]
        samples = sum(int(r["n"]) for r in a["per_task"].values())
        print(f"set={name} runs={len(have)} tasks={c.n_tasks} samples={samples} sft={d.a:.4f} "
              f"rl={d.b:.4f} delta={d.diff:+.4f} ci_low={d.lo:+.4f} ci_high={d.hi:+.4f} "
              f"half_width={(d.hi - d.lo) / 2:.4f}")
        runs = runs_precision([(load(p[0]), load(p[1])) for p in have])
        if runs or c.precision:
            print(f"  {(runs or c.precision).markdown()}")


if __name__ == "__main__":
    main()
