"""Turn a fetched package into validated tasks: screen mutations by grading them, write task
repos, prove each task solvable.

    snap = fetch_package("inflection==0.5.1")
    tasks = build_package_tasks(snap, BuildConfig(max_tasks=40))   # -> list[Task], validated

Screening a mutation writes its task repo (the pristine repo as hard links, mutated files
replaced and byte-compiled) and grades the untouched task in a fresh sandbox on the tests that
can notice it: those that called a mutated function in a traced baseline run (``coverage.py``)
plus the other recorded tests of their modules. It is kept only if between 1 and ``max_fail``
of them fail: those are ``fail_to_pass``, the rest ``pass_to_pass``. The gold patch is the
reverse diff. Screening runs the tests in another order than the task's grader (which runs
``fail_to_pass`` first) and stops at ``max_fail``, and some suites are order-dependent (a test
that passes once another test imported a module), so validation grades the untouched task
again through the real grader.
Validation (``validate``): ``"oracle"`` replays the gold patch through the harness
(``OracleAgent``) and grades its diff, ``"patch"`` grades the gold patch directly; a task is
kept only if it grades 1.0. Results are cached per package and config under
``LOOPRL_HOME/tasks``; ``timing.totals()`` says where the time went.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import importlib.util
import itertools
import json
import os
import py_compile
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from looprl import paths
from looprl.config import FieldError, check_choice
from looprl.diffs import lines_changed
from looprl.errors import RewardError, SandboxError, TaskError, ToolError
from looprl.pypi import normalize
from looprl.rewards.tests import (
    OUTPUT_FILE,
    GradeResult,
    failure_details,
    grade,
    grade_in,
    parse_pytest_output,
)
from looprl.tasks import mutate
from looprl.tasks.coverage import CallMap, def_line, record_coverage
from looprl.tasks.prompts import Evidence, make_prompt
from looprl.tasks.sources import PackageSnapshot
from looprl.tasks.timing import stage
from looprl.types import Grader, Task

Progress = Callable[[str, int], None]
"""Called with (what happened, how many) as work completes, e.g. for a progress bar."""


@dataclass(frozen=True)
class BuildConfig:
    """How many tasks of which kinds to make from one package, and how hard to look."""

    max_tasks: int = 60
    """Upper bound on tasks per package (all kinds together)."""
    mix: dict[str, float] = field(default_factory=lambda: {
        "mutation": 0.55, "multi_site": 0.2, "feature_deletion": 0.25})
    """Share of each source kind among the tasks."""
    max_fail: int = 25
    """A mutation breaking more recorded tests than this is too blunt to be a good task."""
    budget_s: float = 90.0
    """Wall-clock budget for screening one package (validation comes after). With
    ``max_tries`` it is only a safety cap: a build it stops says so."""
    max_tries: int = 0
    """Candidates screened per package at most; 0 = no count limit (``budget_s`` decides, so
    the task set depends on the machine's speed and load). With it, the same config builds the
    same tasks on any machine."""
    workers: int = 2
    """Sandboxes screening in parallel (the machine has 2 cores)."""
    seed: int = 0
    validate: str = "oracle"
    """'oracle' (through the harness), 'patch' (grade the gold patch), or 'none'."""
    grade_timeout_s: float = 120.0
    max_tests: int = 150
    """Tests a task's grader runs: the tests that can notice the mutation, then other tests of
    their modules (evenly spread) as pass_to_pass up to this many. Every grading (screening,
    validation, each rollout) runs them, so a 500-test module costs on every rollout."""
    kinds: tuple[str, ...] = mutate.SINGLE_KINDS
    """Mutation kinds of the single-site (and multi-site) tasks; ``mutate.LOCAL_KINDS`` keeps
    the bugs whose fix can be read off the mutated line."""
    selection: str = "calls"
    """Tests run per mutation: 'calls' (those that called the mutated function in a traced
    baseline run) or 'names' (test modules whose tests mention it)."""

    def __post_init__(self) -> None:
        check_choice("validate", self.validate, ("oracle", "patch", "none"))
        check_choice("selection", self.selection, ("calls", "names"))
        for kind in self.kinds:
            check_choice("kinds", kind, mutate.MUTATORS)
        for source in self.mix:
            check_choice("mix", source, ("mutation", "multi_site", "feature_deletion"))
        for name in ("max_tasks", "workers", "max_tests"):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be >= 1, got {getattr(self, name)!r}")
        if not self.budget_s > 0:
            raise FieldError("budget_s", f"must be > 0 seconds, got {self.budget_s!r}")

    def key(self) -> str:
        d = asdict(self)
        d["build"] = BUILD_VERSION
        if tuple(self.kinds) == mutate.SINGLE_KINDS:
            del d["kinds"]  # the default kinds are implied by BUILD_VERSION
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


BUILD_VERSION = 2
"""Part of every task-set cache key: 2 = the untouched task of a mutation is graded by its real
grader (version 1 trusted the screening run, which differs in test order)."""


@dataclass(frozen=True)
class Screened:
    """A mutation that passed screening, with what its failing tests showed."""

    mutation: mutate.Mutation
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    messages: dict[str, str]


def _name_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(name)}\b")


def listed_task_ids(root: Path) -> set[str]:
    """Ids of the tasks that any cached task set under ``root`` lists. Task repos are shared by
    every build config of a package (a task id is its mutation), so a build that rejects a
    mutation (validation timing differs from run to run) must not remove a repo another
    config's cached set still uses."""
    ids: set[str] = set()
    for f in sorted(root.glob("tasks-*.jsonl")) if root.is_dir() else ():
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                ids.add(str(json.loads(line)["id"]))
    return ids


def remove_task_repo(root: Path, task_id: str, keep: set[str]) -> None:
    """Remove ``root/<task_id>`` unless a cached task set lists it (``keep``)."""
    if task_id not in keep:
        shutil.rmtree(root / task_id, ignore_errors=True)


class Screener:
    """Screens mutations by grading each untouched task: the mutated task repo is written, then
    the grader runs (fresh sandbox, tests restored) the tests that can notice the mutation.

    ``selection="calls"``: the recorded passing tests that called a mutated function in the
    traced baseline run (``coverage.py``); a mutation inside a function cannot change any other
    test's outcome, so these hold every test it breaks. Their modules' other recorded tests run
    too (they become pass_to_pass). ``"names"`` (the fallback when tracing fails): the recorded
    tests of the modules whose test sources mention a mutated function."""

    def __init__(self, snap: PackageSnapshot, cfg: BuildConfig, root: Path | None = None):
        self.snap, self.cfg = snap, cfg
        self.root = root or package_root(snap)
        self.keep = listed_task_ids(self.root)
        repo = Path(snap.repo)
        self.originals = {p: (repo / p).read_text(encoding="utf-8") for p in snap.source_files}
        self.passing_by_file: dict[str, list[str]] = {}
        for t in snap.passing_tests:
            self.passing_by_file.setdefault(t.split("::", 1)[0], []).append(t)
        self.test_texts: dict[str, str] = {}  # "file::Class::test" -> that test's source
        for f in self.passing_by_file:
            self.test_texts.update(_test_sources(f, (repo / f).read_text(encoding="utf-8",
                                                                            errors="replace")))
        self.passing_by_test: dict[str, list[str]] = {}
        for t in snap.passing_tests:
            self.passing_by_test.setdefault(t.split("[", 1)[0], []).append(t)
        self.def_lines: dict[tuple[str, str], list[int]] = {}  # (path, qualname) -> def lines
        for path, text in self.originals.items():
            try:
                tree = ast.parse(text)
            except SyntaxError:
                continue
            for qual, fn in mutate.functions(tree):
                self.def_lines.setdefault((path, qual), []).append(def_line(fn))
        self.test_dirs = tuple(sorted({f.rpartition("/")[0] or "." for f in snap.test_files
                                       if f.endswith(".py")}))
        self.calls: CallMap | None = None
        self.timeout_s = max(30.0, 4 * snap.suite_wall_s)

    async def __aenter__(self) -> Screener:
        if self.cfg.selection == "calls":
            try:
                self.calls = await record_coverage(self.snap)
            except TaskError as e:
                print(f"note: {e}; screening falls back to the tests that name the function",
                      file=sys.stderr)
        elif self.cfg.selection != "names":
            raise TaskError(f"unknown test selection {self.cfg.selection!r}: use calls or names")
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def discard(self, s: Screened) -> None:
        """Remove the repo screening wrote for ``s`` (it will not become a task)."""
        remove_task_repo(self.root, task_id_of(self.snap, s.mutation), self.keep)

    def covering_tests(self, mut: mutate.Mutation) -> list[str]:
        """Recorded passing tests that called a mutated function (needs the call map)."""
        assert self.calls is not None
        out: dict[str, None] = {}
        for site in mut.sites:
            for line in self.def_lines.get((site.path, site.function), ()):
                out.update(dict.fromkeys(self.calls.tests_for(site.path, line)))
        return list(out)

    def targets(self, mut: mutate.Mutation) -> list[str]:
        """The tests that can notice ``mut`` (node ids): the covering tests (call map), else the
        recorded tests of modules with a test whose source mentions a mutated function (or
        its class, for dunder methods). Empty (no run) when no test reaches the code."""
        if self.calls is not None:
            return self.covering_tests(mut)
        names = set()
        for q in mut.functions:
            parts = q.split(".")
            names.add(parts[-2] if parts[-1].startswith("__") and len(parts) > 1 else parts[-1])
        pats = [_name_re(n) for n in names]
        files: list[str] = []
        for key, text in self.test_texts.items():
            f = key.split("::", 1)[0]
            if f not in files and self.passing_by_test.get(key) and any(
                    p.search(text) for p in pats):
                files.append(f)
        return [t for f in files for t in self.passing_by_file[f]]

    async def screen(self, mut: mutate.Mutation) -> Screened | None:
        """Grade the untouched task of ``mut`` on its target tests plus their modules' other
        recorded tests; keep it if 1..max_fail of them fail (fail_to_pass; the rest are
        pass_to_pass), else remove its repo."""
        targets = self.targets(mut)
        if not targets:
            return None
        files = mutate.mutated_files(self.originals, mut)
        if not all(mutate.parses(text) for text in files.values()):
            return None
        modules = dict.fromkeys(t.split("::", 1)[0] for t in targets)
        chosen = set(targets)
        others = _spread([t for f in modules for t in self.passing_by_file[f]
                          if t not in chosen], self.cfg.max_tests - len(targets))
        repo = write_task_repo(self.snap, self.root, mut, files)
        # past max_fail failures the verdict is known: pytest stops there
        probe = Task(id=f"screen-{mut.id}", repo=str(repo), prompt="", venv=self.snap.venv,
                     grader=Grader(f"PYTHONDONTWRITEBYTECODE= {self.snap.test_command} "
                                   f"--maxfail={self.cfg.max_fail + 1}",
                                   tuple(targets), tuple(others), self.snap.test_files,
                                   timeout_s=self.timeout_s))
        with stage("screen"):
            graded = await _grade_untouched(probe, self.test_dirs)
        if graded is not None:
            g, output, bytecode = graded
            f2p = tuple(t for t in (*targets, *others) if g.tests.get(t) != "passed")
            if not g.timed_out and 1 <= len(f2p) <= self.cfg.max_fail:
                _add_files(repo, bytecode)
                failed = set(f2p)
                p2p = tuple(t for t in (*targets, *others) if t not in failed)
                return Screened(mut, f2p, p2p, _failure_messages(output, f2p))
        remove_task_repo(self.root, repo.parent.name, self.keep)
        return None


def _spread(items: list[str], n: int) -> list[str]:
    """At most ``n`` of ``items``, evenly spaced, in order."""
    if n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)] if n > 0 else []


async def _grade_untouched(task: Task, test_dirs: tuple[str, ...]
                           ) -> tuple[GradeResult, str, dict[str, bytes]] | None:
    """``grade(task, "")``, plus pytest's whole output (for the failure messages prompts
    quote) and the bytecode pytest wrote for the test modules (see ``_pytest_bytecode``);
    None when the grader could not run (infrastructure, never the mutation's fault)."""
    from looprl.sandbox import create_sandbox

    try:
        sb = await create_sandbox(task.repo, venv=task.venv)
    except SandboxError:
        return None
    try:
        g = await grade_in(sb, task, "")
        output = (await sb.read(OUTPUT_FILE)).decode("utf-8", "replace")
        return g, output, _pytest_bytecode(sb, test_dirs)
    except (RewardError, SandboxError, ToolError):
        return None
    finally:
        await sb.close()


def _pytest_bytecode(sb: object, test_dirs: tuple[str, ...]) -> dict[str, bytes]:
    """The assertion-rewritten test modules pytest cached in ``sb``'s workspace: copied into
    the task repo, every later sandbox over it (oracle, grading, rollouts) skips rewriting
    them (~0.4 s a run here). They embed the workspace path, which is the task repo's path in
    every sandbox over it, so tracebacks stay right. Empty when the workspace is not on disk."""
    root = getattr(getattr(sb, "workspace", None), "path", None)
    out: dict[str, bytes] = {}
    if root is None:
        return out
    for d in test_dirs:
        cache = Path(root, d, "__pycache__")
        for pyc in cache.glob("*-pytest-*.pyc") if cache.is_dir() else ():
            out[pyc.relative_to(root).as_posix()] = pyc.read_bytes()
    return out


def _add_files(repo: Path, files: dict[str, bytes]) -> None:
    """Write files that are not yet in ``repo`` (new names only: nothing shared is changed)."""
    for rel, data in files.items():
        dest = repo / rel
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, dest)


def _failure_messages(output: str, f2p: tuple[str, ...]) -> dict[str, str]:
    """node id -> what its failure showed (the ``E`` lines, else the summary message)."""
    _, messages = parse_pytest_output(output)
    details = failure_details(output)
    out = {}
    for t in f2p[:5]:
        head = t.split("::", 1)[-1].replace("::", ".")
        out[t] = details.get(head) or messages.get(t, "")
    return out


def _test_sources(path: str, text: str) -> dict[str, str]:
    """'path::test' and 'path::Class::test' -> source of each test function of a test module."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    lines = text.splitlines(keepends=True)

    def source(node: ast.AST) -> str:  # whole lines: ast.get_source_segment re-splits the file
        return "".join(lines[node.lineno - 1: node.end_lineno])  # type: ignore[attr-defined]

    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[f"{path}::{node.name}"] = source(node)
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{path}::{node.name}::{m.name}"] = source(m)
    return out


def failing_test_sources(repo: str, nodes: tuple[str, ...]) -> dict[str, str]:
    """node id (without parameters) -> its test function's source, read from the pristine repo."""
    out: dict[str, str] = {}
    for path in sorted({n.split("::", 1)[0] for n in nodes}):
        try:
            text = (Path(repo) / path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.update(_test_sources(path, text))
    return out


def _plan(cfg: BuildConfig) -> dict[str, int]:
    return {k: max(1, round(cfg.max_tasks * share)) for k, share in cfg.mix.items() if share > 0}


def _ordered_candidates(screener: Screener, kinds: tuple[str, ...], rng: random.Random
                        ) -> list[mutate.Mutation]:
    """Candidates spread over functions and kinds: at most one per (function, kind)."""
    pool: list[mutate.Mutation] = []
    for path, text in screener.originals.items():
        pool += mutate.candidates(text, path, kinds, check_syntax=False)  # checked when screened
    rng.shuffle(pool)
    seen: set[tuple[str, str]] = set()
    firsts, rest = [], []
    for m in pool:
        k = (m.functions[0], m.kind)
        (rest if k in seen else firsts).append(m)
        seen.add(k)
    return firsts + rest


@dataclass
class _Screening:
    """What a package's screening has spent: candidates screened and whether time ran out."""

    tries: int = 0
    timed_out: bool = False


async def _screen_until(screener: Screener, cands: list[mutate.Mutation], want: int,
                        deadline: float, max_tries: int | None, spent: _Screening,
                        progress: Progress | None) -> list[Screened]:
    """Screen candidates in order until ``want`` are kept, ``spent.tries`` reaches
    ``max_tries`` or time runs out. Candidates go ``workers`` at a time and are kept in
    candidate order, so which ones are kept never depends on which sandbox finished first."""
    kept: list[Screened] = []
    used_functions: dict[str, int] = {}  # diversity: at most two per function and kind family
    fresh = (m for m in cands if used_functions.get(m.functions[0], 0) < 2)
    while len(kept) < want and (max_tries is None or spent.tries < max_tries):
        if time.monotonic() > deadline:
            spent.timed_out = True
            break
        n = screener.cfg.workers if max_tries is None else min(screener.cfg.workers,
                                                                max_tries - spent.tries)
        chunk = list(itertools.islice(fresh, n))
        if not chunk:
            break
        results = await asyncio.gather(*(screener.screen(m) for m in chunk))
        spent.tries += len(chunk)
        for m, s in zip(chunk, results, strict=True):
            if progress:
                progress("tried", 1)
            if s is None:
                continue
            if len(kept) < want and used_functions.get(m.functions[0], 0) < 2:
                kept.append(s)
                used_functions[m.functions[0]] = used_functions.get(m.functions[0], 0) + 1
                if progress:
                    progress("screened", 1)
            else:  # its function's quota (or the want) was filled by one before it
                screener.discard(s)
    return kept


async def screen_package(snap: PackageSnapshot, cfg: BuildConfig,
                         progress: Progress | None = None) -> list[Screened]:
    """Screened mutations of every kind planned in ``cfg.mix``. With ``max_tries``, each kind's
    share of the candidates (multi-site tasks combine screened singles, so singles get their
    share too) bounds it; without, its share of ``budget_s``."""
    plan = _plan(cfg)
    rng = random.Random(f"{snap.key}/{cfg.seed}")
    t0 = time.monotonic()
    share = {k: v / sum(cfg.mix.values()) for k, v in cfg.mix.items() if k in plan}
    # cumulative shares: singles, then feature deletions, then combinations of singles
    cut_singles = 1.0 - share.get("feature_deletion", 0.0) - share.get("multi_site", 0.0)
    cut_fd = 1.0 - share.get("multi_site", 0.0)

    def caps(cut: float) -> tuple[float, int | None]:
        tries = round(cfg.max_tries * cut) if cfg.max_tries else None
        return (t0 + cfg.budget_s * (cut if not cfg.max_tries else 1.0)), tries

    spent = _Screening()
    out: list[Screened] = []
    async with Screener(snap, cfg) as sc:
        # combos draw from every kept single (the mutation tasks too): few extra are needed
        singles_wanted = plan.get("mutation", 0) + min(4, plan.get("multi_site", 0))
        singles = await _screen_until(sc, _ordered_candidates(sc, tuple(cfg.kinds), rng),
                                      singles_wanted, *caps(cut_singles), spent, progress)
        out += singles[: plan.get("mutation", 0)]
        if plan.get("feature_deletion"):
            fd = _ordered_candidates(sc, ("feature_deletion",), rng)
            out += await _screen_until(sc, fd, plan["feature_deletion"], *caps(cut_fd), spent,
                                       progress)
        if plan.get("multi_site") and len(singles) >= 2:
            out += await _screen_until(sc, _combos(singles, plan["multi_site"] * 3, rng),
                                       plan["multi_site"], *caps(1.0), spent, progress)
    for s in singles[plan.get("mutation", 0):]:  # screened only to be combined: not tasks
        sc.discard(s)
    if cfg.max_tries and spent.timed_out:
        print(f"note: screening {snap.name}=={snap.version} stopped at budget_s={cfg.budget_s:g} "
              f"after {spent.tries} of max_tries={cfg.max_tries} candidates: the task set now "
              "depends on this machine's speed; raise budget_s to make it reproducible",
              file=sys.stderr)
    return out


def _combos(singles: list[Screened], n: int, rng: random.Random) -> list[mutate.Mutation]:
    out, seen = [], set()
    for _ in range(n * 4):
        group = rng.sample(singles, min(len(singles), rng.choice((2, 2, 3))))
        funcs = [f for s in group for f in s.mutation.functions]
        key = tuple(sorted(s.mutation.id for s in group))
        if len(set(funcs)) == len(funcs) and key not in seen:
            seen.add(key)
            out.append(mutate.combine([s.mutation for s in group]))
        if len(out) >= n:
            break
    return out


# ------------------------------------------------------------------ tasks


def source_kind(kind: str) -> str:
    return kind if kind in ("multi_site", "feature_deletion", "release") else "mutation"


def _module_of(path: str, pythonpath: str) -> str:
    rel = path[len(pythonpath) + 1:] if pythonpath != "." else path
    mod = rel[:-3].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def package_root(snap: PackageSnapshot) -> Path:
    """Where the task repos and task files of one package version live."""
    return paths.sub("tasks") / f"{normalize(snap.name)}-{snap.version}-{snap.sdist_sha256[:12]}"


def task_id_of(snap: PackageSnapshot, mut: mutate.Mutation) -> str:
    return f"{normalize(snap.name)}-{snap.version}-{source_kind(mut.kind)}-{mut.id}"


def write_task_repo(snap: PackageSnapshot, root: Path, mut: mutate.Mutation,
                    files: dict[str, str]) -> Path:
    """``root/<task id>/repo``: the pristine repo (hard links) with ``files`` (path -> mutated
    text) written and byte-compiled, made atomically; kept if already there."""
    repo = root / task_id_of(snap, mut) / "repo"
    if repo.is_dir():
        return repo
    repo.parent.mkdir(parents=True, exist_ok=True)
    tmp = repo.with_name(f"repo.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    r = subprocess.run(["cp", "-al", snap.repo, str(tmp)], capture_output=True, text=True)
    if r.returncode != 0:
        raise TaskError(f"copying {snap.repo} for a task failed: {r.stderr.strip()}")
    for p, text in files.items():
        (tmp / p).unlink()  # break the hard links before writing
        (tmp / p).write_text(text, encoding="utf-8")
        pyc = Path(importlib.util.cache_from_source(str(tmp / p)))
        pyc.unlink(missing_ok=True)  # a hard link to the pristine bytecode
        # bytecode recorded against the repo's final path: every sandbox over it skips a compile
        py_compile.compile(str(tmp / p), cfile=str(pyc), dfile=str(repo / p), doraise=False,
                           quiet=2)
    os.replace(tmp, repo)
    return repo


def make_task(snap: PackageSnapshot, s: Screened, root: Path, originals: dict[str, str]) -> Task:
    """Write the task's repo (pristine + mutated files, if screening did not) and its record."""
    mut = s.mutation
    kind = source_kind(mut.kind)
    task_id = task_id_of(snap, mut)
    files = mutate.mutated_files(originals, mut)
    repo = write_task_repo(snap, root, mut, files)
    gold = mutate.gold_patch(originals, files)
    ev = Evidence(functions=mut.functions, module=_module_of(mut.sites[0].path, snap.pythonpath),
                  failing=s.fail_to_pass, messages=s.messages, kind=kind, package=snap.name,
                  sources=failing_test_sources(snap.repo, s.fail_to_pass))
    prompt = make_prompt(ev, task_id)
    return Task(
        id=task_id, repo=str(repo), prompt=prompt.text, venv=snap.venv, gold_patch=gold,
        grader=Grader(snap.test_command, s.fail_to_pass, s.pass_to_pass, snap.test_files),
        metadata={"package": snap.name, "version": snap.version, "source_kind": kind,
                  "mutation_kind": mut.kind, "functions": ",".join(mut.functions),
                  "files": ",".join(mut.paths), "lines_changed": lines_changed(gold),
                  "prompt_chars": len(prompt.text), "prompt_style": prompt.style,
                  "description": mut.description, "n_fail_to_pass": len(s.fail_to_pass)})


async def oracle_solves(task: Task) -> bool:
    """Replay the gold patch through the harness tools (``OracleAgent``), grade the final diff."""
    from looprl.chat import ChatFormat
    from looprl.harness.agent import AgentConfig, run_agent
    from looprl.harness.policies import OracleAgent
    from looprl.harness.tools import make_tools
    from looprl.models.tokenizer import build_tokenizer
    from looprl.sandbox import create_sandbox

    tok = build_tokenizer(None)  # bytes only: the oracle needs no model; no context limit either
    cfg = AgentConfig(context_window=1 << 24, max_total_new_tokens=1 << 22,
                      max_new_tokens=1 << 20, wall_time_s=600)
    sb = await create_sandbox(task.repo, venv=task.venv)
    try:
        traj = await run_agent(task, sb, OracleAgent(task, tok), ChatFormat(tok),
                               make_tools(test_command=task.grader.test_command), cfg,
                               group_id=task.id, trajectory_id=f"{task.id}/oracle")
    finally:
        await sb.close()
    return not traj.is_infra_error and (await grade(task, traj.diff)).passed


async def validate_task(task: Task, how: str, untouched: bool = True) -> bool:
    """True when its gold patch, applied ``how``, grades 1.0 and (``untouched``) the untouched
    task grades 0.0, both through the grader in fresh sandboxes."""
    if how == "none":
        return True
    if how not in ("patch", "oracle"):
        raise TaskError(f"unknown validation {how!r}: use oracle, patch or none")
    try:
        if untouched:
            with stage("validate_untouched"):
                if (await grade(task, "")).score != 0.0:
                    return False
        with stage(f"validate_{how}"):
            if how == "patch":
                return (await grade(task, task.gold_patch or "")).passed
            return await oracle_solves(task)
    except (RewardError, SandboxError, TaskError):
        return False


async def validate_all(tasks: list[Task], how: str, workers: int = 2,
                       progress: Progress | None = None, untouched: bool = True) -> list[Task]:
    """The tasks that pass ``validate_task``, ``workers`` at a time."""
    sem = asyncio.Semaphore(workers)

    async def one(t: Task) -> bool:
        async with sem:
            ok = await validate_task(t, how, untouched)
        if progress:
            progress("validated", 1)
        return ok

    oks = await asyncio.gather(*(one(t) for t in tasks))
    return [t for t, ok in zip(tasks, oks, strict=True) if ok]


async def abuild_package_tasks(snap: PackageSnapshot, cfg: BuildConfig,
                               progress: Progress | None = None) -> list[Task]:
    root = package_root(snap)
    cache = root / f"tasks-{cfg.key()}.jsonl"
    if cache.is_file():  # a task id once listed twice (one mutation reached twice) counts once
        cached = [Task.from_json(line) for line in cache.read_text().splitlines() if line.strip()]
        gone = [t.id for t in cached if not Path(t.repo).is_dir()]
        if not gone:
            return list({t.id: t for t in cached}.values())
        print(f"note: {len(gone)} task repos listed in {cache} are gone (e.g. {gone[0]}: "
              "removed outside looprl, or by an older looprl's build); rebuilding the set",
              file=sys.stderr)
        cache.unlink()
    keep = listed_task_ids(root)
    screened = await screen_package(snap, cfg, progress)
    originals = {p: (Path(snap.repo) / p).read_text(encoding="utf-8") for p in snap.source_files}
    with stage("write_tasks"):
        made = [make_task(snap, s, root, originals) for s in screened]
    tasks = await validate_all(made, cfg.validate, cfg.workers, progress)
    for t in set(t.id for t in made) - set(t.id for t in tasks):
        remove_task_repo(root, t, keep)  # not solvable as recorded: not a task (here)
    for t in tasks:
        t.metadata["validated"] = cfg.validate
        if cfg.validate != "none":
            t.metadata["untouched_score"] = 0.0
    if tasks:  # an empty result (e.g. the budget ran out) is not worth remembering
        root.mkdir(parents=True, exist_ok=True)
        cache.write_text("".join(t.to_json() + "\n" for t in tasks))
    return tasks


def build_package_tasks(snap: PackageSnapshot, cfg: BuildConfig | None = None,
                        progress: Progress | None = None) -> list[Task]:
    return asyncio.run(abuild_package_tasks(snap, cfg or BuildConfig(), progress))
