"""Check a fault drill's run directory (``scripts/fault_drill.sh``; docs/faults.md) for the four
facts issue 51 asks of it, and print the per-class table the docs quote.

    .venv/bin/python scripts/fault_drill_check.py runs/fault_drill

1. It finished: RL's record (``rl.json``) and the report are there, and the record's RL minutes
   cover the kept steps of every life.
2. Every injectable class was set to >= 5% and injected, and at the last metrics row each class's
   count (``infra/<class>``) equals the injector's own settled count (``faults.reconcile``).
3. No task lost: the drill's walks (``loop.experimental.passes``) end RL, and every train task was trained in
   each (a task whose group infrastructure emptied went out again: ``loop/groups_dropped`` +
   ``loop/groups_stale`` = ``loop/groups_requeued`` at every row; the counters start again in
   each life of the trainer).
4. None trained twice: no task was trained more often than the walks, the checkpoint's sampler
   agrees with the metrics rows, and every trained trajectory belongs to a metrics row's group.
5. No infrastructure failure scored: no trained trajectory is an infrastructure error or holds an
   injected fault's text (``faults.MARK``).

"Trained" is a group taken by a GRPO step (its row's ``tasks``), as the sampler counts it. Exit
status 1 when any check fails, with the failing checks named.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from looprl import faults
from looprl.rundir import RunDir
from looprl.trainer.checkpoint import latest_checkpoint
from looprl.types import Trajectory

MIN_RATE = 0.05


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def check(run: Path) -> list[str]:
    """Print the drill's figures; return the failed checks (empty: all hold)."""
    rd = RunDir(run)
    failed: list[str] = []
    if not (rd.rl_record.is_file() and rd.report.is_file()):
        failed.append(f"not finished: no {rd.rl_record.name} or {rd.report.name} in {run}")
    rows = _jsonl(rd.metrics)
    last = rows[-1]
    attempts = last["infra/attempts"]
    print(f"steps {last['step']}; RL time (kept steps) {last['elapsed_s'] / 60:.1f} min; "
          f"passes begun {last['loop/pass']}; rollout attempts {attempts:.0f}")

    if rd.rl_record.is_file():  # the record's RL minutes count every life's kept steps
        rl_min = json.loads(rd.rl_record.read_text())["minutes"]
        if rl_min < last["elapsed_s"] / 60:
            failed.append(f"{rd.rl_record.name} says {rl_min:.1f} min of RL, less than the "
                          f"{last['elapsed_s'] / 60:.1f} min its kept steps took")
    rates = json.loads(rd.config.read_text())["faults"]["rates"]
    recon = faults.reconcile(run)
    print(f"{'class':20s} {'rate set':>8s} {'metrics':>8s} {'injected':>9s} {'settled':>8s} "
          f"{'cut off':>8s} {'per attempt':>12s}")
    for k, v in recon.items():
        set_ = rates.get(k, rates.get("all", 0.0))
        if v["metrics"] or v["injected"] or k in {c.value for c in faults.INJECTABLE}:
            print(f"{k:20s} {set_:8.2f} {v['metrics']:8d} {v['injected']:9d} {v['settled']:8d} "
                  f"{v['cut_off']:8d} {v['metrics'] / max(attempts, 1):12.3f}")
        if v["metrics"] != v["settled"]:
            failed.append(f"{k}: metrics count {v['metrics']} != the injector's settled "
                          f"{v['settled']}")
    for kind in faults.INJECTABLE:
        set_ = rates.get(kind.value, rates.get("all", 0.0))
        if set_ < MIN_RATE or not recon[kind.value]["injected"]:
            failed.append(f"{kind.value}: rate {set_} (want >= {MIN_RATE}), injected "
                          f"{recon[kind.value]['injected']} (want > 0)")

    tasks = [t["id"] for t in _jsonl(rd.task_file("train"))]
    trained = Counter(t for r in rows for t in r["tasks"])
    passes = int(json.loads(rd.config.read_text())["loop"]["experimental"]["passes"])
    print(f"train tasks {len(tasks)}; walks {passes}; "
          f"times trained -> tasks {sorted(Counter(trained[t] for t in tasks).items())}")
    # the walk ends RL: its last pass waits for every task still out, so each is trained in
    # every pass, once (a run stopped by loop.max_minutes first cannot say what was lost)
    lost = [t for t in tasks if trained[t] < passes]
    twice = [t for t in tasks if trained[t] > passes]
    if lost:
        failed.append(f"{len(lost)} task(s) lost (trained fewer than the {passes} walks; or "
                      f"loop.max_minutes ended RL first): {lost[:3]}")
    if twice:
        failed.append(f"{len(twice)} task(s) trained more than the {passes} walks: {twice[:3]}")
    # the loop's group counters start again in each life of the trainer; at every row of each,
    # every emptied group's task had gone out again
    unrequeued = [r["step"] for r in rows if r["loop/groups_dropped"] + r["loop/groups_stale"]
                  != r["loop/groups_requeued"]]
    print(f"groups emptied by infrastructure in the last life: {last['loop/groups_dropped']:.0f}"
          f" (stale {last['loop/groups_stale']:.0f}), handed out again: "
          f"{last['loop/groups_requeued']:.0f}; rows where one was not: {len(unrequeued)}")
    if unrequeued:
        failed.append(f"an emptied group's task was not handed out again (lost), first at step "
                      f"{unrequeued[0]}")
    ckpt = latest_checkpoint(rd.ckpt)
    saved = Counter(json.loads((ckpt / "meta.json").read_text())["sampler_state"]["trained"]) \
        if ckpt is not None else Counter()
    if saved != trained:
        failed.append("the last checkpoint's sampler does not hold the metrics rows' trained tasks")

    trajs = [Trajectory.from_json(x) for x in rd.train_trajectories.read_text().splitlines()
             if x.strip()]
    ids = Counter(t.id for t in trajs)
    if any(n > 1 for n in ids.values()):
        failed.append(f"{sum(n > 1 for n in ids.values())} trajectory id(s) trained twice")
    pairs = {(r["step"], t) for r in rows for t in r["tasks"]}
    stray = [t.id for t in trajs if (t.metadata.get("train_step"), t.task_id) not in pairs]
    if stray:
        failed.append(f"{len(stray)} trained trajectory(ies) of no metrics row's groups (a step "
                      f"a killed life trained, kept beside its retraining): {stray[:3]}")
    scored = [t.id for t in trajs if t.is_infra_error or faults.MARK in t.to_json()]
    print(f"trained trajectories {len(trajs)}; infrastructure failures among them: {len(scored)}")
    if scored:
        failed.append(f"{len(scored)} infrastructure failure(s) scored: {scored[:3]}")
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the drill's run directory")
    failed = check(ap.parse_args().run)
    for f in failed:
        print(f"FAILED: {f}")
    print("all checks hold" if not failed else f"{len(failed)} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
