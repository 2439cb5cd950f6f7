"""The tasks stage of ``looprl train``: train and held-out tasks from task files or real packages.

    sets = build_tasks(cfg.tasks)   # TaskSets(train, heldout, heldout_packages)

Held-out tasks are of two kinds, reported side by side: whole functions of the train packages
(never trained on: ``taskset.split_by_function``) and whole packages never trained on
(``tasks.heldout_packages``), the harder test of generalisation.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from looprl.errors import TaskError
from looprl.plugins import find
from looprl.rundir import RunDir
from looprl.tasks.taskset import load_tasks, split_by_function, write_tasks
from looprl.train.config import TasksSection
from looprl.types import Task

SPLITS = ("train", "heldout", "heldout_packages")
"""The sets of a run, each saved as ``tasks/<split>.jsonl`` (``TaskSets`` fields by name)."""

Progress = Callable[[str], None]
"""Called with the package spec being built (for a progress bar)."""


@dataclass(frozen=True)
class TaskSets:
    """The tasks of one run."""

    train: list[Task]
    heldout: list[Task]
    """Held-out functions of the train packages (or of the train file)."""
    heldout_packages: list[Task]
    """Tasks of packages never trained on (``tasks.heldout_packages``); may be empty."""

    def save(self, run_dir: Path) -> None:
        """``run_dir/tasks/{train,heldout,heldout_packages}.jsonl``: what ``--resume`` reloads."""
        rd = RunDir(run_dir)
        rd.tasks.mkdir(parents=True, exist_ok=True)
        for name in SPLITS:
            write_tasks(getattr(self, name), rd.task_file(name))

    @classmethod
    def load(cls, run_dir: Path) -> TaskSets | None:
        """The sets saved by ``save``, or None if the run never got that far."""
        files = [RunDir(run_dir).task_file(name) for name in SPLITS]
        if not all(f.is_file() for f in files):
            return None
        return cls(*(load_tasks(f) for f in files))


def select_code(task: Task, files: dict[str, str] | None = None, width: str = "line") -> Task:
    """``task`` with the code its fix replaces appended to the prompt as the user's selection
    (``oracle.selections``), or the block or function around it (``width``,
    ``harness.selection``); unchanged when the fix is not a set of in-place edits."""
    from looprl.harness.oracle import selections
    from looprl.tasks.prompts import with_selection

    picked = selections(task, files, width)
    if not picked:
        return task
    return dataclasses.replace(task, prompt=with_selection(task.prompt, picked),
                               metadata={**task.metadata, "selection": width})


def package_tasks(specs: list[str], cfg: TasksSection, seed: int,
                  progress: Progress | None = None) -> dict[str, list[Task]]:
    """spec -> its validated tasks (fetched, screened and cached by ``looprl.tasks.build``)."""
    from looprl.tasks.build import build_package_tasks
    from looprl.tasks.sources import fetch_package

    bcfg = cfg.build_config(seed)
    out: dict[str, list[Task]] = {}
    for spec in specs:
        if progress:
            progress(spec)
        out[spec] = build_package_tasks(fetch_package(spec), bcfg)
        if not out[spec]:
            raise TaskError(f"{spec} gave no tasks (its sdist may ship no offline pytest suite, "
                            "or screening found no bug its tests catch); drop it from the config")
    return out


def build_tasks(cfg: TasksSection, progress: Progress | None = None) -> TaskSets:
    """Train and held-out tasks as ``cfg`` says (module docstring); ``cfg.experimental.seed``
    seeds the build, the split and the held-out packages' sample."""
    x = cfg.experimental
    seed = x.seed
    built = package_tasks(list(cfg.train_packages) + list(x.train_only_packages)
                          + list(cfg.heldout_packages), cfg, seed, progress)
    tasks = load_tasks(cfg.train_file) if cfg.train_file else []
    tasks += [t for s in cfg.train_packages for t in built[s]]
    for name in cfg.sources:
        tasks += find("task_sources", name, {})(seed)
    if cfg.heldout_file:
        train, held = tasks, load_tasks(cfg.heldout_file)
    elif any(t.metadata.get("split") == "test" for t in tasks):
        train = [t for t in tasks if t.metadata.get("split") != "test"]
        held = [t for t in tasks if t.metadata.get("split") == "test"]
    else:
        split = split_by_function(tasks, x.heldout_fraction, seed, x.max_heldout)
        train, held = split["train"], split["test"]
    train += [dataclasses.replace(t, metadata={**t.metadata, "split": "train"})
              for s in x.train_only_packages for t in built[s]]
    other = [t for s in cfg.heldout_packages for t in built[s]]
    if len(other) > x.max_heldout:  # evaluation time: a seeded sample, as many as the others
        other = sorted(random.Random(seed).sample(other, x.max_heldout), key=lambda t: t.id)
    if x.selection:
        train, held, other = ([select_code(t, width=x.selection_width) for t in ts]
                              for ts in (train, held, other))
    if not train or not held:
        raise TaskError(f"{len(train)} train and {len(held)} held-out tasks: both sets need "
                        "tasks; add packages, lower tasks.experimental.heldout_fraction, or give "
                        "tasks.heldout_file")
    missing = [t for t in train + held + other if "://" not in t.repo and not Path(t.repo).is_dir()]
    if missing:
        raise TaskError(f"{len(missing)} task(s) name a repo that is not a directory (e.g. task "
                        f"{missing[0].id}: {missing[0].repo}); fix the task file's repo paths")
    overlap = {t.id for t in train} & {t.id for t in held + other}
    if overlap:
        raise TaskError(f"{len(overlap)} task(s) are both trained on and held out (e.g. "
                        f"{sorted(overlap)[0]}); held-out tasks must be new to the model")
    return TaskSets(train, held, other)
