"""Task files: JSONL of ``Task.to_dict()``, one task a line, readable by ``datasets``.

    write_tasks(tasks, "tasks.jsonl")
    tasks = load_tasks("tasks.jsonl")                    # TaskError names the line and field
    # paths inside LOOPRL_HOME are stored as ${LOOPRL_HOME}/...: the file is shareable
    ds = datasets.load_dataset("json", data_files="tasks.jsonl")["train"]
    splits = split_by_package(tasks, held_out={"toolz"})  # {"train": [...], "test": [...]}
    print_table(tasks)                                     # CursorBench-like summary

Every task's ``metadata`` carries the same keys with the same types (``METADATA_DEFAULTS``), so
Arrow infers one schema for the whole file.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from looprl import paths
from looprl.errors import TaskError
from looprl.types import Metadata, Task

METADATA_DEFAULTS: Metadata = {
    "package": "", "version": "", "source_kind": "", "mutation_kind": "", "functions": "",
    "files": "", "lines_changed": 0, "prompt_chars": 0, "prompt_style": "", "description": "",
    "n_fail_to_pass": 0, "validated": "", "split": "", "from_version": "",
}


def normalized(task: Task) -> Task:
    """The task with every metadata key of ``METADATA_DEFAULTS`` present and typed alike."""
    meta = dict(METADATA_DEFAULTS)
    for k, v in task.metadata.items():
        default = METADATA_DEFAULTS.get(k)
        meta[k] = type(default)(v) if default is not None and v is not None else v
    return replace(task, metadata=meta)


HOME, ENV = "${LOOPRL_HOME}", "${LOOPRL_ENV}"
"""Placeholders a task file's paths may start with: the looprl home of whoever loads the file
(where ``looprl tasks build`` keeps the repositories and venvs it made), and the Python
environment looprl runs in (``sys.prefix``: a venv with pytest, for hand-written tasks)."""


def _places() -> tuple[tuple[str, Path], ...]:
    return (HOME, paths.home(create=False).absolute()), (ENV, Path(sys.prefix).absolute())


def _portable(t: Task) -> Task:
    """``t`` with paths inside the looprl home written as ``${LOOPRL_HOME}/...``, so the file
    works for another user, machine or ``LOOPRL_HOME`` that holds the same packages."""
    home = _places()[0][1]

    def fix(p: str | None) -> str | None:
        if p is None or "://" in p or not Path(p).is_absolute():
            return p
        try:
            return f"{HOME}/{Path(p).relative_to(home)}"
        except ValueError:
            return p

    v = t.grader.verifier
    if v is not None:
        v = replace(v, tests_dir=fix(v.tests_dir) or v.tests_dir, venv=fix(v.venv))
    return replace(t, repo=fix(t.repo) or t.repo, venv=fix(t.venv),
                   grader=replace(t.grader, verifier=v))


def write_tasks(tasks: list[Task], path: str | Path) -> Path:
    """Write ``tasks`` as JSONL, paths inside the looprl home relative to it (``HOME``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text("".join(json.dumps(normalized(_portable(t)).to_dict(), ensure_ascii=False)
                           + "\n" for t in tasks), encoding="utf-8")
    tmp.replace(p)
    return p


_REQUIRED: tuple[tuple[str, type], ...] = (("id", str), ("repo", str), ("prompt", str),
                                           ("grader", dict))


def parse_task(d: object, where: str) -> Task:
    """One task record, checked field by field; ``where`` prefixes errors ('file:line')."""
    if not isinstance(d, dict):
        raise TaskError(f"{where}: a task must be a JSON object, got {type(d).__name__}")
    for name, tp in _REQUIRED:
        if name not in d:
            raise TaskError(f"{where}: missing field '{name}' (each line is Task.to_dict())")
        if not isinstance(d[name], tp):
            raise TaskError(f"{where}: field '{name}' must be {tp.__name__}, got "
                            f"{type(d[name]).__name__}")
    g = d["grader"]
    if not isinstance(g.get("test_command"), str) or not g["test_command"].strip():
        raise TaskError(f"{where}: field 'grader.test_command' must be a non-empty string")
    for name in ("fail_to_pass", "pass_to_pass", "test_files"):
        v = g.get(name, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise TaskError(f"{where}: field 'grader.{name}' must be a list of strings")
    v = g.get("verifier")
    if v is not None:
        _check_verifier(v, where)
    elif not g.get("fail_to_pass") and not g.get("pass_to_pass"):
        raise TaskError(f"{where}: field 'grader.fail_to_pass' is empty: a task needs tests")
    if d.get("metadata") is not None and not isinstance(d["metadata"], dict):
        raise TaskError(f"{where}: field 'metadata' must be an object")
    try:
        return Task.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise TaskError(f"{where}: malformed task: {e}") from None


def _check_verifier(v: object, where: str) -> None:
    """``grader.verifier``: an object with a ``tests_dir`` string, string env values."""
    if not isinstance(v, dict):
        raise TaskError(f"{where}: field 'grader.verifier' must be an object or null")
    if not isinstance(v.get("tests_dir"), str) or not v["tests_dir"]:
        raise TaskError(f"{where}: field 'grader.verifier.tests_dir' must be a non-empty string "
                        "(the directory holding the verifier's test.sh)")
    for name in ("workdir", "venv"):
        if v.get(name) is not None and not isinstance(v[name], str):
            raise TaskError(f"{where}: field 'grader.verifier.{name}' must be a string")
    env = v.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(x, str) for x in env.values()):
        raise TaskError(f"{where}: field 'grader.verifier.env' must map names to strings")


def _relative_to(t: Task, base: Path) -> Task:
    """``t`` with a relative ``repo``, ``venv`` or verifier path taken relative to ``base`` (the
    task file's directory), so a task file can sit beside the repositories it names, and the
    placeholders (``HOME``, ``ENV``) expanded."""
    def fix(p: str | None) -> str | None:
        if p is None or "://" in p:
            return p
        for name, where in _places():
            if p == name or p.startswith(name + "/"):
                return str(where / p[len(name):].lstrip("/"))
        if Path(p).is_absolute():
            return p
        return str((base / p).resolve())

    v = t.grader.verifier
    if v is not None:
        v = replace(v, tests_dir=fix(v.tests_dir) or v.tests_dir, venv=fix(v.venv))
    return replace(t, repo=fix(t.repo) or t.repo, venv=fix(t.venv),
                   grader=replace(t.grader, verifier=v))


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks of a JSONL file; relative ``repo`` and ``venv`` paths are relative to the file's
    directory. Raises ``TaskError`` naming the line and field of a bad record."""
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"task file {p} not found; build one with `looprl tasks build`")
    out, ids = [], set()
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{p}:{i}: not valid JSON ({e.msg} at column {e.colno})") from None
        t = _relative_to(parse_task(d, f"{p}:{i}"), p.parent)
        if t.id in ids:
            raise TaskError(f"{p}:{i}: field 'id': duplicate task id {t.id!r}")
        ids.add(t.id)
        out.append(t)
    return out


# ------------------------------------------------------------------ splits


def _with_split(t: Task, split: str) -> Task:
    return replace(t, metadata={**t.metadata, "split": split})


def split_by_package(tasks: list[Task], held_out: set[str]) -> dict[str, list[Task]]:
    """Held-out packages form "test": no code of theirs is seen in training."""
    out: dict[str, list[Task]] = {"train": [], "test": []}
    for t in tasks:
        s = "test" if t.metadata.get("package") in held_out else "train"
        out[s].append(_with_split(t, s))
    return out


def split_by_function(tasks: list[Task], test_fraction: float = 0.2, seed: int = 0,
                      max_test: int | None = None) -> dict[str, list[Task]]:
    """Whole functions held out: no (package, functions) appears in both train and test.

    The functions are shuffled by ``seed`` and held out in that order: a ``test_fraction`` of
    them at most, and no more once ``max_test`` tasks are held out (the rest train).

    >>> from looprl.types import Grader
    >>> ts = [Task(f"t{i}", "/r", "p", Grader("pytest"), metadata={"functions": f"f{i % 10}"})
    ...       for i in range(40)]
    >>> s = split_by_function(ts, 0.5, max_test=8)
    >>> len(s["test"]), len(s["train"]), {t.metadata["functions"] for t in s["train"]} & {
    ...     t.metadata["functions"] for t in s["test"]}
    (8, 32, set())
    >>> len(split_by_function(ts, 0.5)["test"])  # half the functions
    20
    """
    def key(t: Task) -> str:
        return f"{t.metadata.get('package', '')}/{t.metadata.get('functions') or t.id}"

    keys = sorted({key(t) for t in tasks})
    random.Random(seed).shuffle(keys)
    per = Counter(key(t) for t in tasks)
    held: set[str] = set()
    n = 0
    for k in keys[: max(1, int(len(keys) * test_fraction))]:
        if max_test is not None and n >= max_test:
            break
        held.add(k)
        n += per[k]
    out: dict[str, list[Task]] = {"train": [], "test": []}
    for t in tasks:
        s = "test" if key(t) in held else "train"
        out[s].append(_with_split(t, s))
    return out


SPLITS = {"package": split_by_package, "function": split_by_function}


# ------------------------------------------------------------------ summary table


@dataclass(frozen=True)
class TableRow:
    package: str
    tasks: int
    by_kind: dict[str, int]
    median_lines_changed: float
    median_prompt_chars: float


def summarize(tasks: list[Task]) -> list[TableRow]:
    """One row per package plus an "all" row."""
    groups: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        groups[str(t.metadata.get("package", "?"))].append(t)
    rows = []
    for name, ts in sorted(groups.items()) + [("all", tasks)]:
        kinds: dict[str, int] = defaultdict(int)
        for t in ts:
            kinds[str(t.metadata.get("source_kind", "?"))] += 1
        rows.append(TableRow(
            name, len(ts), dict(sorted(kinds.items())),
            statistics.median([int(t.metadata.get("lines_changed") or 0) for t in ts] or [0]),
            statistics.median([len(t.prompt) for t in ts] or [0])))
    return rows


def table_markdown(rows: list[TableRow]) -> str:
    kinds = sorted({k for r in rows for k in r.by_kind})
    head = ["package", "tasks", *kinds, "median lines changed", "median prompt chars"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.package, str(r.tasks), *(str(r.by_kind.get(k, 0)) for k in kinds),
                 f"{r.median_lines_changed:g}", f"{r.median_prompt_chars:g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_table(tasks: list[Task]) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = summarize(tasks)
    kinds = sorted({k for r in rows for k in r.by_kind})
    table = Table(title=f"{len(tasks)} tasks")
    for col in ["package", "tasks", *kinds, "median lines changed", "median prompt chars"]:
        table.add_column(col, justify="left" if col == "package" else "right")
    for r in rows:
        table.add_row(r.package, str(r.tasks), *(str(r.by_kind.get(k, 0)) for k in kinds),
                      f"{r.median_lines_changed:g}", f"{r.median_prompt_chars:g}")
    Console().print(table)
