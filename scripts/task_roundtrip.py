"""Round trip of looprl's quickstart tasks through Harbor directories and SWE-bench rows
(issue 50's must-show), with the user's own commands:

    python scripts/task_roundtrip.py --n 100 --out runs/roundtrip

1. picks ``--n`` of the quickstart config's train-package tasks (round robin over its packages;
   built and cached by ``looprl tasks build`` / ``looprl quickstart``, built here if not yet),
   writes them to ``OUT/quickstart.jsonl``;
2. ``looprl tasks export harbor`` -> ``OUT/harbor/`` and ``looprl tasks export swebench`` ->
   ``OUT/rows.jsonl`` + ``OUT/rows.repos/``;
3. ``looprl tasks import harbor OUT/harbor`` and ``looprl tasks import swebench OUT/rows.jsonl
   --repos OUT/rows.repos``, once graded by looprl's pytest grader and once (``--grade-by
   eval_script``, format ``swebench_eval``) by each row's SWE-bench v5 eval script, its log read
   by the row's log parser and judged by SWE-bench's rule (each import realises every task
   offline under bubblewrap and validates it: gold 1, untouched less);
4. reads each imported task's grades: the import graded its gold patch (kept only at 1.0)
   and the untouched task (``metadata.untouched_score``) with the rollout grader; with
   ``--regrade`` every imported task is graded again, afresh, the same two ways;
5. writes ``OUT/summary.json`` and prints one table: tasks exported, imported, gold = 1 and
   untouched = 0 per format, and the wall time of each step.

Then train on either file: ``looprl train -c configs/train_cpu.toml -o
tasks.train_file=OUT/from_harbor.jsonl -o loop.max_minutes=3``. Exits 1 when any task did
not make the round trip with gold 1.0 and untouched 0.0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from itertools import chain, zip_longest
from pathlib import Path
from typing import Any

from looprl.config import load_config
from looprl.rewards.tests import grade
from looprl.tasks.taskset import load_tasks, write_tasks
from looprl.train.config import TrainConfig
from looprl.train.tasks import package_tasks
from looprl.types import Task


def pick(n: int, config: Path) -> list[Task]:
    """``n`` quickstart train-package tasks, round robin over the packages (each in id order)."""
    cfg = load_config(TrainConfig, config)
    built = package_tasks(list(cfg.tasks.train_packages), cfg.tasks, cfg.tasks.seed)
    per = [sorted(ts, key=lambda t: t.id) for ts in built.values()]
    tasks = [t for t in chain.from_iterable(zip_longest(*per)) if t is not None]
    if len(tasks) < n:
        sys.exit(f"the quickstart packages give {len(tasks)} tasks, fewer than --n {n}")
    return tasks[:n]


def distinct(tasks: Iterable[Task]) -> list[Task]:
    """The first task of each id, in order (cached task files of one package overlap)."""
    seen: dict[str, Task] = {}
    for t in tasks:
        seen.setdefault(t.id, t)
    return list(seen.values())


def looprl(*args: str) -> float:
    """Run ``looprl ARGS`` (this interpreter's); its wall time. Exit 1 (some task skipped,
    said on stderr) is a result the summary counts, not a failure of the script."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "looprl", *args])
    if r.returncode not in (0, 1):
        sys.exit(f"`looprl {' '.join(args)}` failed (exit {r.returncode})")
    return time.monotonic() - t0


async def regrade(tasks: list[Task], jobs: int) -> list[tuple[str, float, float]]:
    """(id, gold score, untouched score) of each task, graded afresh (no grade cache)."""
    gate = asyncio.Semaphore(jobs)

    async def one(t: Task) -> tuple[str, float, float]:
        async with gate:
            gold = await grade(t, t.gold_patch or "", cache=False)
            none = await grade(t, "", cache=False)
            return t.id, gold.score, none.score

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def _untouched(t: Task) -> float:
    """The untouched task's score as its import graded it (-1 when it did not record one)."""
    u = t.metadata.get("untouched_score")
    return float(u) if isinstance(u, (int, float)) and not isinstance(u, bool) else -1.0


FORMATS = ("harbor", "swebench", "swebench_eval")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100, help="quickstart tasks to round-trip")
    ap.add_argument("--out", type=Path, default=Path("runs/roundtrip"))
    ap.add_argument("--config", type=Path, default=Path("configs/quickstart.toml"))
    ap.add_argument("--tasks", type=Path, nargs="+", default=None,
                    help="looprl task files to round-trip instead of the quickstart's tasks "
                         "(the first task of each id is kept)")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help=f"comma-separated subset of {','.join(FORMATS)}")
    ap.add_argument("--jobs", type=int, default=2, help="tasks validated/graded at once")
    ap.add_argument("--regrade", action="store_true",
                    help="grade the imported tasks again after the import (twice the time)")
    a = ap.parse_args()
    fmts = [f for f in a.formats.split(",") if f]
    if unknown := sorted(set(fmts) - set(FORMATS)):
        ap.error(f"--formats: {', '.join(unknown)} not known; choose from {', '.join(FORMATS)}")
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    src = distinct(chain.from_iterable(load_tasks(f) for f in a.tasks))[:a.n] if a.tasks \
        else pick(a.n, a.config)
    write_tasks(src, out / "quickstart.jsonl")
    times["pick"] = time.monotonic() - t0
    times["export harbor"] = looprl("tasks", "export", "harbor", str(out / "quickstart.jsonl"),
                                    "--out", str(out / "harbor"))
    times["export swebench"] = looprl("tasks", "export", "swebench",
                                      str(out / "quickstart.jsonl"), "--out",
                                      str(out / "rows.jsonl"))
    if "harbor" in fmts:
        times["import harbor"] = looprl("tasks", "import", "harbor", str(out / "harbor"),
                                        "--out", str(out / "from_harbor.jsonl"),
                                        "--jobs", str(a.jobs))
    if "swebench" in fmts:
        times["import swebench"] = looprl("tasks", "import", "swebench",
                                          str(out / "rows.jsonl"), "--repos",
                                          str(out / "rows.repos"), "--out",
                                          str(out / "from_swebench.jsonl"), "--jobs", str(a.jobs))
    if "swebench_eval" in fmts:
        times["import swebench_eval"] = looprl(
            "tasks", "import", "swebench", str(out / "rows.jsonl"), "--repos",
            str(out / "rows.repos"), "--out", str(out / "from_swebench_eval.jsonl"),
            "--jobs", str(a.jobs), "--grade-by", "eval_script")
    rows = sum(1 for line in (out / "rows.jsonl").read_text().splitlines() if line.strip())
    exported = {"harbor": sum(1 for p in (out / "harbor").iterdir() if (p / "task.toml").is_file()),
                "swebench": rows, "swebench_eval": rows}
    formats: dict[str, dict[str, Any]] = {}
    ok = True
    for fmt in fmts:
        f = out / f"from_{fmt}.jsonl"
        tasks = load_tasks(f) if f.is_file() else []
        if a.regrade:
            t1 = time.monotonic()
            scores = asyncio.run(regrade(tasks, a.jobs))
            times[f"regrade {fmt}"] = time.monotonic() - t1
        else:  # the import's own grades (it writes a task only once its gold scored 1.0)
            scores = [(t.id, 1.0 if t.metadata.get("validated") == "gold" else -1.0,
                       _untouched(t)) for t in tasks]
        bad = [s for s in scores if s[1] != 1.0 or s[2] != 0.0]
        # a Harbor task is named org/name ("looprl/<id>"), which imports as "looprl-<id>"
        want = {(f"looprl-{t.id}" if fmt == "harbor" else t.id) for t in src}
        missing = sorted(want - {t.id for t in tasks})
        ok = ok and not bad and not missing
        formats[fmt] = {
            "exported": exported[fmt], "imported": len(tasks),
            "gold_1": sum(s[1] == 1.0 for s in scores),
            "untouched_0": sum(s[2] == 0.0 for s in scores),
            "not_imported": missing, "off": bad}
    summary = {"source_tasks": len(src), "times_s": times, "formats": formats}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{len(src)} tasks ({out / 'quickstart.jsonl'})")
    print(f"{'format':10} {'exported':>8} {'imported':>8} {'gold=1':>7} {'untouched=0':>11}")
    for fmt, s in formats.items():
        print(f"{fmt:10} {s['exported']:>8} {s['imported']:>8} {s['gold_1']:>7} "
              f"{s['untouched_0']:>11}")
    print("wall time: " + ", ".join(f"{k} {v:.0f}s" for k, v in times.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
