"""One RL arm from the start of a finished ``looprl train`` run: what does this RL change make of
the same start model, on the same tasks, measured against the same start evaluation?

    .venv/bin/python scripts/rl_arm.py runs/quickstart --name lr3e4 -o grpo.lr=3e-4

The arm is a run of its own, ``RUNS/NAME`` beside ``RUN``: it takes ``RUN``'s tasks, start model
(``model_start/``, ``start.json``, the validation demos) and start evaluations, and the config
``RUN`` saved with the ``-o`` overrides; ``looprl train`` then finds those stages done and runs
RL, the RL evaluation and the report. Overrides may change RL (``grpo``, ``loop``, ``rollout``,
``reward``, ``trainer``, ...), not what the arm copies: the tasks, the start model and how it was
made, or the evaluation (``tasks``, ``model``, ``demos``, ``sft``, ``eval``, ``seed``); those need
a run of their own (or ``scripts/sft_probe.py`` for an SFT change). One exception: more packages
in ``tasks.experimental.train_only_packages`` add their tasks to the arm's train tasks (RL only: the start
model, its demos and the held-out sets stay the base's). Where and how the model
runs (``model.device``, ``model.experimental.threads``, ``.rl_threads``, ``.speculative``,
``.lookup``) may change.

``--start DIR`` replaces the copied start model with another checkpoint on the same tasks (e.g.
``looprl model upcycle RUN/model_start DIR``: a MoE of the base's start); the start evaluations
and turn accuracies are then not copied but measured again on it, and ``start.json`` records it.

Last lines: the arm's report line, then the arm's RL model against ``RUN``'s, paired over the
same held-out tasks (when ``RUN`` has its RL evaluation):
``arm_minus_base=… arm_minus_base_ci_low=… arm_minus_base_ci_high=…``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from looprl.bench.gate import compare, load
from looprl.config import apply_overrides, from_dict
from looprl.errors import ConfigError
from looprl.pypi import spec_name
from looprl.rundir import RunDir
from looprl.train.config import TrainConfig
from looprl.train.run import run
from looprl.train.tasks import TaskSets, build_tasks


def copied(rd: RunDir) -> tuple[Path, ...]:
    """What the arm takes from the base run (those present): the stages before RL."""
    return (rd.tasks, rd.model_start, rd.start_record, rd.validation_demos,
            *(f for packages in (False, True)
              for f in (rd.evaluation("start", packages), rd.eval_trajectories("start", packages))))


FIXED = ("tasks", "model", "demos", "sft", "eval", "seed")
"""Config sections an arm may not override: they made (or measure) what it copies."""
RUNTIME = ("model.device", "model.experimental.threads", "model.experimental.rl_threads",
           "model.experimental.speculative", "model.experimental.lookup")
"""Fields of those sections that say where and how the copied model runs, not what it is: free."""
MORE_TRAIN = "tasks.experimental.train_only_packages"
"""Packages whose tasks RL trains on too: added to the copied train tasks, the start unchanged."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run directory with its start evaluated "
                    "(config.json, start.json, model_start/, tasks/, eval_start.json)")
    ap.add_argument("--name", required=True, help="the arm's name: its run is RUN/../NAME")
    ap.add_argument("--start", type=Path, default=None, metavar="DIR",
                    help="another start model (a checkpoint dir) instead of RUN's model_start")
    ap.add_argument("-o", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    base_rd = RunDir(args.run)
    missing = [str(f.relative_to(base_rd.root)) for f in (
        base_rd.config, base_rd.start_record, base_rd.model_start / "config.json",
        base_rd.task_file("train"), base_rd.evaluation("start")) if not f.is_file()]
    if missing:
        raise SystemExit(f"{args.run} is not a run whose start was evaluated (no "
                         f"{', '.join(missing)}); give a directory `looprl train` wrote, once it "
                         "has reached RL")
    keys = [o.split("=", 1)[0] for o in args.overrides]
    fixed = [k for k in keys if k.split(".")[0] in FIXED and k not in (*RUNTIME, MORE_TRAIN)]
    if fixed:
        raise SystemExit(f"-o {fixed[0]}: an arm starts from {args.run}'s tasks, "
                         f"start model and start evaluation, so it may not change "
                         f"{', '.join(FIXED)}; change RL only (grpo, loop, rollout, reward, ...)")
    if "name" in keys:
        raise SystemExit("give the arm's name with --name, not -o name=...")
    arm_rd = RunDir(args.run.parent / args.name)
    arm = arm_rd.root
    if arm.exists():
        raise SystemExit(f"{arm} exists; pick another --name")
    saved = json.loads(base_rd.config.read_text())
    try:
        base = from_dict(TrainConfig, saved)
        cfg = from_dict(TrainConfig, apply_overrides(saved, [*args.overrides, f"name={args.name}"]))
    except ConfigError as e:  # e.g. a run saved before a key was renamed: edit its config.json
        raise SystemExit(f"error: {base_rd.config}: {e}") from None

    if args.start is not None and not (args.start / "config.json").is_file():
        raise SystemExit(f"--start {args.start}: no config.json there; give a checkpoint "
                         "directory (e.g. what `looprl model upcycle` saved)")
    arm_rd.trajectories.mkdir(parents=True)
    take = copied(base_rd) if args.start is None else (
        base_rd.tasks, base_rd.start_record, base_rd.validation_demos)
    for src in take:
        dest = arm / src.relative_to(base_rd.root)
        if src.is_dir():
            shutil.copytree(src, dest)
        elif src.is_file():
            shutil.copy2(src, dest)
    if args.start is not None:
        shutil.copytree(args.start, arm_rd.model_start)
        record = json.loads(arm_rd.start_record.read_text())
        record.update(turns={}, origin={"kind": "dir", "path": str(args.start.resolve())})
        arm_rd.start_record.write_text(json.dumps(record))
    added = (set(cfg.tasks.experimental.train_only_packages)
             - set(base.tasks.experimental.train_only_packages))
    if added:
        sets = TaskSets.load(arm)
        assert sets is not None, "the base's tasks were checked above"
        names = {spec_name(s) for s in added}
        more = [t for t in build_tasks(cfg.tasks).train  # cached: the packages' tasks as a run's
                if spec_name(str(t.metadata.get("package", ""))) in names]
        TaskSets(sets.train + more, sets.heldout, sets.heldout_packages).save(arm)
        print(f"{len(more)} train tasks of {', '.join(sorted(added))} added to the "
              f"{len(sets.train)} of {args.run}")
    report = run(cfg, args.run.parent)
    if report is None:
        return
    print(report.read_text().splitlines()[-1])
    if base_rd.evaluation("rl").is_file():
        c = compare(load(base_rd.evaluation("rl")), load(arm_rd.evaluation("rl")), seed=cfg.seed)
        d = c.diffs[0]
        print(f"arm_minus_base={d.diff:.4f} arm_minus_base_ci_low={d.lo:.4f} "
              f"arm_minus_base_ci_high={d.hi:.4f}")


if __name__ == "__main__":
    main()
