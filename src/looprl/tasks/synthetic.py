"""Synthetic bug-fix demonstrations from the pinned source corpus (``models.corpus``): SFT data that
teaches a small model to find and fix a bug through the harness tools before RL.

    repos = synthetic_repos(exclude={"toolz", "inflection"})       # never a task package
    items = synthetic_tasks(repos, n=3000, seed=0)
    demos = asyncio.run(oracle_demos([(i.task, i.files) for i in items], tok,  # tasks.demos
                                     tools=("grep", "read_file", "edit_file", "finish")))

An item is one single-site mutation (``mutate.LOCAL_KINDS`` by default: the fix can be read off
the mutated line) of a public function of a corpus package. Its workspace is a real sandbox over
the package's repository (``LOOPRL_HOME/corpus``) with the mutated file written in; the prompt
names the function in the task styles that need no test output (``bug_report``, ``terse``); the
``OracleAgent`` (grep the ``def``, read it, edit the smallest snippet, finish) runs through
``run_agent``, so every demo is token-exact harness data.
Demos are not graded by tests — there are none — but each is checked (``tasks.demos``): the
workspace must end identical to the pristine package, i.e. the mutation was undone.

Packages that are task sources must be excluded (``exclude``): a held-out function's source
must never be SFT data.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from looprl.errors import TaskError
from looprl.models.corpus import banned_names, corpus_repos
from looprl.pypi import normalize
from looprl.tasks import mutate
from looprl.tasks.prompts import Evidence, make_prompt
from looprl.types import Grader, Task

MAX_REPO_FILES = 300
"""Packages with more .py files than this are skipped (grep over them floods the context)."""
MAX_FILE_LINES = 3000


@dataclass(frozen=True)
class SyntheticTask:
    """A task record (repo = the pristine package copy) and the mutated files to write in."""

    task: Task
    files: dict[str, str]
    """path -> mutated text, written into the sandbox before the agent starts."""


def synthetic_repos(exclude: Iterable[str] = (), *, repos: Iterable[Path] | None = None,
                    max_files: int = MAX_REPO_FILES) -> list[Path]:
    """The repositories (each holding one import package of its own name) of ``repos`` (the
    pinned source corpus, ``models.corpus``, by default) with 3..``max_files`` Python files,
    minus ``exclude`` (distribution or import names, compared normalised)."""
    banned = banned_names(exclude)
    repos = corpus_repos(exclude) if repos is None else repos
    out = [r for r in repos if normalize(r.name) not in banned and (r / r.name).is_dir()
           and 3 <= sum(1 for _ in (r / r.name).rglob("*.py")) <= max_files]
    if not out:
        raise TaskError(f"no source repositories are usable for synthetic demos (3..{max_files} "
                        ".py files, not excluded)")
    return out


def _public(qual: str) -> bool:
    return not any(part.startswith("_") for part in qual.split("."))


def _file_items(repo: Path, rel: str, kinds: tuple[str, ...], rng: random.Random,
                per_file: int, counts: Counter[str]) -> list[SyntheticTask]:
    try:
        text = (repo / rel).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    if text.count("\n") > MAX_FILE_LINES:
        return []
    muts = [m for m in mutate.candidates(text, rel, kinds, check_syntax=False)
            if _public(m.functions[0])]
    rng.shuffle(muts)
    muts.sort(key=lambda m: counts[m.kind])  # the kinds made least so far first: a balanced mix
    out: list[SyntheticTask] = []
    used: set[str] = set()
    for m in muts:
        if len(out) >= per_file:
            break
        if m.functions[0] in used:
            continue
        files = mutate.mutated_files({rel: text}, m)
        if not mutate.parses(files[rel]):
            continue
        used.add(m.functions[0])
        counts[m.kind] += 1
        out.append(_item(repo, rel, text, m, files))
    return out


def _item(repo: Path, rel: str, text: str, m: mutate.Mutation, files: dict[str, str]) -> SyntheticTask:
    pkg = repo.name
    module = rel[:-3].replace("/", ".").removesuffix(".__init__")
    task_id = f"synthetic-{pkg}-{m.id}"
    prompt = make_prompt(Evidence(functions=m.functions, module=module, failing=(),
                                  kind=m.kind, package=pkg), task_id)
    gold = mutate.gold_patch({rel: text}, files)
    task = Task(id=task_id, repo=str(repo), prompt=prompt.text,
                grader=Grader("true"), gold_patch=gold,
                metadata={"package": pkg, "source_kind": "synthetic", "mutation_kind": m.kind,
                          "functions": ",".join(m.functions), "files": rel,
                          "prompt_style": prompt.style, "description": m.description})
    return SyntheticTask(task, files)


def synthetic_tasks(repos: list[Path], n: int, *, seed: int = 0,
                    kinds: tuple[str, ...] = mutate.LOCAL_KINDS, per_file: int = 2) -> list[SyntheticTask]:
    """``n`` mutations spread over ``repos`` and their files (round robin over packages, at
    most ``per_file`` per file and one per function), the kinds kept in balance."""
    rng = random.Random(seed)
    queues: list[list[str]] = []
    for repo in repos:
        files = sorted(str(f.relative_to(repo)) for f in repo.rglob("*.py")
                       if not any(p.startswith("test") for p in f.relative_to(repo).parts))
        rng.shuffle(files)
        queues.append(files)
    out: list[SyntheticTask] = []
    counts: Counter[str] = Counter()
    while len(out) < n and any(queues):
        for repo, files in zip(repos, queues, strict=True):
            if files and len(out) < n:
                out += _file_items(repo, files.pop(), kinds, rng, per_file, counts)[: n - len(out)]
    rng.shuffle(out)
    return out

