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

Runs of earlier sessions are pooled from what they kept: ``--record docs/runs/NAME RUN`` writes a
run's evaluations without their samples and its config to ``docs/runs/NAME``, a directory this
script reads as it reads a run's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from looprl.bench.gate import METRICS, compare, load, runs_precision
from looprl.rundir import RunDir

SETS = {"functions": False, "packages": True}
"""Held-out set -> whether it is the packages' (``RunDir.evaluation``'s ``packages``)."""


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


def record(run: Path, dest: Path) -> None:
    """Keep ``run``'s evaluations in ``dest`` for pooling later, when the run directory is gone:
    each report without its samples (per-task rows and totals, ~60 KB instead of ~500), and
    ``run.json`` with the run's config and the sha256 of its task files."""
    rd = RunDir(run)
    if not rd.config.is_file():
        raise SystemExit(f"{run} has no config.json: give the directory `looprl train` wrote")
    dest.mkdir(parents=True, exist_ok=True)
    kept = []
    for packages in SETS.values():
        for label in ("start", "rl"):
            src = rd.evaluation(label, packages)
            if src.is_file():
                rep = {k: v for k, v in load(src).items() if k != "samples"}
                (dest / src.name).write_text(json.dumps(rep, indent=1) + "\n")
                kept.append(src.name)
    if not kept:
        raise SystemExit(f"{run} holds no evaluations (eval_start.json, eval_rl.json): give a "
                         "run directory that finished")
    tasks = {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
             for f in sorted(rd.tasks.glob("*.jsonl"))}
    config = json.loads(rd.config.read_text())
    (dest / "run.json").write_text(json.dumps({"run": str(run), "config": config,
                                               "task_files_sha256": tasks}, indent=1) + "\n")
    print(f"kept {', '.join(kept)} and run.json in {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run directories that evaluated SFT and RL")
    ap.add_argument("--record", type=Path, metavar="DIR",
                    help="instead of pooling, keep the one run's evaluations in DIR")
    args = ap.parse_args()
    if args.record:
        if len(args.runs) != 1:
            raise SystemExit("--record keeps one run: give one run directory")
        record(args.runs[0], args.record)
        return
    for name, packages in SETS.items():
        paths = [(RunDir(run).evaluation("start", packages), RunDir(run).evaluation("rl", packages))
                 for run in args.runs]
        have = [p for p in paths if p[0].is_file() and p[1].is_file()]
        if not have:
            continue
        if len(have) < len(paths):
            raise SystemExit(f"{len(paths) - len(have)} of the runs lack {paths[0][0].name} "
                             f"or {paths[0][1].name}: give runs that finished")
        pairs = [(load(start), load(rl)) for start, rl in have]
        starts = [start["per_task"] for start, _ in pairs]
        twice = next(((i, j) for i in range(len(starts)) for j in range(i + 1, len(starts))
                      if starts[i] == starts[j]), None)
        if twice:
            raise SystemExit(f"{have[twice[0]][0].parent} and {have[twice[1]][0].parent} share "
                             "their start's evaluation: they are one seed (a run and a step of "
                             "it); pool one of them with runs of other seeds")
        a, b = (pool([pair[i] for pair in pairs]) for i in (0, 1))
        c = compare(a, b)
        d = c.diffs[0]
        samples = sum(int(r["n"]) for r in a["per_task"].values())
        print(f"set={name} runs={len(have)} tasks={c.n_tasks} samples={samples} sft={d.a:.4f} "
              f"rl={d.b:.4f} delta={d.diff:+.4f} ci_low={d.lo:+.4f} ci_high={d.hi:+.4f} "
              f"half_width={(d.hi - d.lo) / 2:.4f}")
        runs = runs_precision(pairs)
        if runs or c.precision:
            print(f"  {(runs or c.precision).markdown()}")


if __name__ == "__main__":
    main()
