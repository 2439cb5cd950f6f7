"""Turn a fetched package into validated tasks: screen mutations in sandboxes, write task repos,
prove each task solvable.

    snap = fetch_package("inflection==0.5.1")
    tasks = build_package_tasks(snap, BuildConfig(max_tasks=40))   # -> list[Task], validated

A mutation is kept only if it makes between 1 and ``max_fail`` of the package's recorded passing
tests fail; only the test modules that mention the mutated function run, for speed. Its task
repo is the pristine repo (hard links) with the mutated files replaced; ``fail_to_pass`` are the
tests it broke, ``pass_to_pass`` the other recorded tests of those modules, and the gold patch is
the reverse diff. Validation (``validate``): ``"oracle"`` replays the gold patch through the
harness (``OracleAgent``) and grades its diff, ``"patch"`` grades the gold patch directly; either
way a task is kept only if it grades 1.0 (the untouched task already failed during screening).
Results are cached per package and config under ``LOOPRL_HOME/tasks``.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from looprl import paths
from looprl.errors import RewardError, SandboxError, TaskError
from looprl.rewards.diffs import lines_changed
from looprl.rewards.tests import grade, run_tests
from looprl.tasks import mutate
from looprl.tasks.prompts import Evidence, make_prompt
from looprl.tasks.sources import PackageSnapshot, normalize
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
    """Wall-clock budget for screening one package (validation comes after)."""
    workers: int = 2
    """Sandboxes screening in parallel (the machine has 2 cores)."""
    seed: int = 0
    validate: str = "oracle"
    """'oracle' (through the harness), 'patch' (grade the gold patch), or 'none'."""
    grade_timeout_s: float = 120.0

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Screened:
    """A mutation that passed screening, with what its failing tests showed."""

    mutation: mutate.Mutation
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    messages: dict[str, str]


def _name_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"\b{re.escape(name)}\b")


class Screener:
    """Runs mutations against the tests that mention the mutated code, in reused sandboxes."""

    def __init__(self, snap: PackageSnapshot, cfg: BuildConfig):
        self.snap, self.cfg = snap, cfg
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
        self.timeout_s = max(30.0, 4 * snap.suite_wall_s)
        self._free: asyncio.Queue = asyncio.Queue()
        self._sandboxes: list = []

    async def __aenter__(self) -> Screener:
        from looprl.sandbox import create_sandbox

        for _ in range(self.cfg.workers):
            sb = await create_sandbox(self.snap.repo, venv=self.snap.venv)
            self._sandboxes.append(sb)
            self._free.put_nowait(sb)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for sb in self._sandboxes:
            await sb.close()

    def targets(self, mut: mutate.Mutation) -> list[str]:
        """Test modules with a recorded passing test whose own source mentions a mutated
        function (or its class, for dunder methods). Mutations of code no test names are
        skipped without a run: they rarely break anything."""
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
        return files

    async def screen(self, mut: mutate.Mutation) -> Screened | None:
        """Run the test modules that exercise ``mut``; keep it if 1..max_fail recorded tests
        fail. fail_to_pass / pass_to_pass partition those modules' recorded passing tests."""
        targets = self.targets(mut)
        if not targets:
            return None
        files = mutate.mutated_files(self.originals, mut)
        if not all(mutate.parses(text) for text in files.values()):
            return None
        sb = await self._free.get()
        try:
            for p, text in files.items():
                await sb.write(p, text.encode())
            run = await run_tests(sb, self.snap.test_command, targets, timeout_s=self.timeout_s)
        finally:
            for p in files:
                await sb.write(p, self.originals[p].encode())
            self._free.put_nowait(sb)
        if run.timed_out:
            return None
        recorded = [t for f in targets for t in self.passing_by_file[f]]
        f2p = tuple(t for t in recorded if run.outcomes.get(t) != "passed")
        if not 1 <= len(f2p) <= self.cfg.max_fail:
            return None
        messages = {t: run.details.get(t) or run.messages.get(t, "") for t in f2p[:5]}
        p2p = tuple(t for t in recorded if t not in set(f2p))
        return Screened(mut, f2p, p2p, messages)


def _test_sources(path: str, text: str) -> dict[str, str]:
    """'path::test' and 'path::Class::test' -> source of each test function of a test module."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[f"{path}::{node.name}"] = ast.get_source_segment(text, node) or ""
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{path}::{node.name}::{m.name}"] = ast.get_source_segment(text, m) or ""
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


async def _screen_until(screener: Screener, cands: list[mutate.Mutation], want: int,
                        deadline: float, progress: Progress | None) -> list[Screened]:
    """Screen candidates with ``workers`` in flight until ``want`` are kept or time runs out."""
    kept: list[Screened] = []
    it = iter(cands)
    used_functions: dict[str, int] = {}

    async def worker() -> None:
        for m in it:
            if len(kept) >= want or time.monotonic() > deadline:
                return
            if used_functions.get(m.functions[0], 0) >= 2:
                continue  # diversity: at most two tasks per function and kind family
            s = await screener.screen(m)
            if progress:
                progress("tried", 1)
            if s and len(kept) < want:
                kept.append(s)
                used_functions[m.functions[0]] = used_functions.get(m.functions[0], 0) + 1
                if progress:
                    progress("screened", 1)

    await asyncio.gather(*(worker() for _ in range(screener.cfg.workers)))
    return kept


async def screen_package(snap: PackageSnapshot, cfg: BuildConfig,
                         progress: Progress | None = None) -> list[Screened]:
    """Screened mutations of every kind planned in ``cfg.mix``."""
    plan = _plan(cfg)
    rng = random.Random(f"{snap.key}/{cfg.seed}")
    deadline = time.monotonic() + cfg.budget_s
    out: list[Screened] = []
    async with Screener(snap, cfg) as sc:
        singles_wanted = plan.get("mutation", 0) + 2 * plan.get("multi_site", 0)
        singles = await _screen_until(sc, _ordered_candidates(sc, mutate.SINGLE_KINDS, rng),
                                      singles_wanted, deadline - cfg.budget_s * 0.45, progress)
        out += singles[: plan.get("mutation", 0)]
        if plan.get("feature_deletion"):
            fd = _ordered_candidates(sc, ("feature_deletion",), rng)
            out += await _screen_until(sc, fd, plan["feature_deletion"],
                                       deadline - cfg.budget_s * 0.2, progress)
        if plan.get("multi_site") and len(singles) >= 2:
            out += await _screen_until(sc, _combos(singles, plan["multi_site"] * 3, rng),
                                       plan["multi_site"], deadline, progress)
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


def _hardlink_copy(src: str, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    r = subprocess.run(["cp", "-al", src, str(tmp)], capture_output=True, text=True)
    if r.returncode != 0:
        raise TaskError(f"copying {src} for a task failed: {r.stderr.strip()}")
    os.replace(tmp, dst)


def make_task(snap: PackageSnapshot, s: Screened, root: Path, originals: dict[str, str]) -> Task:
    """Write the task's repo (pristine + mutated files) and its record."""
    mut = s.mutation
    kind = source_kind(mut.kind)
    task_id = f"{normalize(snap.name)}-{snap.version}-{kind}-{mut.id}"
    repo = root / task_id / "repo"
    files = mutate.mutated_files(originals, mut)
    if not repo.is_dir():
        _hardlink_copy(snap.repo, repo)
        for p, text in files.items():
            (repo / p).unlink()  # break the hard link before writing
            (repo / p).write_text(text, encoding="utf-8")
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
    from looprl.harness.agent import AgentConfig, run_agent
    from looprl.harness.format import ChatFormat
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


async def validate_task(task: Task, how: str) -> bool:
    """True when the task's gold patch, applied ``how``, grades 1.0."""
    if how == "none":
        return True
    try:
        if how == "patch":
            return (await grade(task, task.gold_patch or "")).passed
        if how == "oracle":
            return await oracle_solves(task)
    except (RewardError, SandboxError, TaskError):
        return False
    raise TaskError(f"unknown validation {how!r}: use oracle, patch or none")


async def validate_all(tasks: list[Task], how: str, workers: int = 2,
                       progress: Progress | None = None) -> list[Task]:
    sem = asyncio.Semaphore(workers)

    async def one(t: Task) -> bool:
        async with sem:
            ok = await validate_task(t, how)
        if progress:
            progress("validated", 1)
        return ok

    oks = await asyncio.gather(*(one(t) for t in tasks))
    return [t for t, ok in zip(tasks, oks, strict=True) if ok]


async def abuild_package_tasks(snap: PackageSnapshot, cfg: BuildConfig,
                               progress: Progress | None = None) -> list[Task]:
    root = paths.sub("tasks") / f"{normalize(snap.name)}-{snap.version}-{snap.sdist_sha256[:12]}"
    cache = root / f"tasks-{cfg.key()}.jsonl"
    if cache.is_file():
        return [Task.from_json(line) for line in cache.read_text().splitlines() if line.strip()]
    screened = await screen_package(snap, cfg, progress)
    originals = {p: (Path(snap.repo) / p).read_text(encoding="utf-8") for p in snap.source_files}
    tasks = [make_task(snap, s, root, originals) for s in screened]
    tasks = await validate_all(tasks, cfg.validate, cfg.workers, progress)
    for t in tasks:
        t.metadata["validated"] = cfg.validate
    if tasks:  # an empty result (e.g. the budget ran out) is not worth remembering
        root.mkdir(parents=True, exist_ok=True)
        cache.write_text("".join(t.to_json() + "\n" for t in tasks))
    return tasks


def build_package_tasks(snap: PackageSnapshot, cfg: BuildConfig | None = None,
                        progress: Progress | None = None) -> list[Task]:
    return asyncio.run(abuild_package_tasks(snap, cfg or BuildConfig(), progress))
