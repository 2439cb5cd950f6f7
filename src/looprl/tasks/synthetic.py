"""Synthetic bug-fix demonstrations from the Python source installed in this venv: SFT data that
teaches a small model to find and fix a bug through the harness tools before RL.

    repos = synthetic_repos(exclude={"toolz", "inflection"})       # never a task package
    items = synthetic_tasks(repos, n=3000, seed=0)
    demos = asyncio.run(oracle_demos([(i.task, i.files) for i in items], tok,  # tasks.demos
                                     tools=("grep", "read_file", "edit_file", "finish")))

An item is one single-site mutation (``mutate.LOCAL_KINDS`` by default: the fix can be read off
the mutated line) of a public function of an installed package. Its workspace is a real sandbox
over a hard-linked copy of the package (made once under ``LOOPRL_HOME/synthetic``) with the
mutated file written in; the prompt names the function in the task styles that need no test
output (``bug_report``, ``terse``); the ``OracleAgent`` (grep the ``def``, read it, edit the
smallest snippet, finish) runs through ``run_agent``, so every demo is token-exact harness data.
Demos are not graded by tests — there are none — but each is checked (``tasks.demos``): the
workspace must end identical to the pristine package, i.e. the mutation was undone.

Packages that are task sources must be excluded (``exclude``): a held-out function's source
must never be SFT data.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sysconfig
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from looprl import paths
from looprl.errors import TaskError
from looprl.tasks import mutate
from looprl.tasks.prompts import Evidence, make_prompt
from looprl.tasks.sources import normalize
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


def _package_dirs(purelib: Path) -> Iterable[Path]:
    for p in sorted(purelib.iterdir()):
        if p.is_dir() and (p / "__init__.py").is_file() and not p.name.startswith(("_", ".")):
            yield p


def synthetic_repos(exclude: Iterable[str] = (), *, purelib: Path | None = None,
                    max_files: int = MAX_REPO_FILES) -> list[Path]:
    """Repos (``LOOPRL_HOME/synthetic/repos/<pkg>``, holding ``<pkg>/...``) of the installed
    packages with 3..``max_files`` Python files, minus ``exclude`` (distribution or import
    names, compared normalised). Made once by hard links; cached."""
    purelib = purelib or Path(sysconfig.get_paths()["purelib"])
    banned = {normalize(x.split("==")[0]) for x in exclude}
    root = paths.sub("synthetic") / "repos"
    out = []
    for pkg in _package_dirs(purelib):
        if normalize(pkg.name) in banned:
            continue
        py = [f for f in pkg.rglob("*.py") if "__pycache__" not in f.parts]
        if not 3 <= len(py) <= max_files:
            continue
        repo = root / pkg.name
        if not (repo / pkg.name).is_dir():
            tmp = root / f".{pkg.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            r = subprocess.run(["cp", "-al", str(pkg), str(tmp / pkg.name)], capture_output=True)
            if r.returncode != 0:  # another filesystem: a real copy
                shutil.rmtree(tmp / pkg.name, ignore_errors=True)
                shutil.copytree(pkg, tmp / pkg.name, symlinks=True)
            for cache in list(tmp.rglob("__pycache__")):
                shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(repo, ignore_errors=True)
            tmp.rename(repo)
        out.append(repo)
    if not out:
        raise TaskError(f"no installed packages under {purelib} are usable for synthetic demos "
                        f"(3..{max_files} .py files, not excluded)")
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

