"""Release-diff tasks: tests a newer release added or changed that fail on the older release's
code. The task repo is the older release; the gold patch is the real upstream diff of the
source files; the new tests stay hidden in ``Grader.test_patch`` (applied only when grading).

    snap = fetch_package("semver==3.0.2")
    tasks = build_release_tasks(snap, n_pairs=2, cfg=BuildConfig())   # vs the 2 prior releases

One task per changed test module that has tests failing on the old code (``fail_to_pass``, at most
``cfg.max_fail``), its other passing tests as ``pass_to_pass``. A pair is skipped when the
source layout changed or the source diff is larger than ``MAX_GOLD_LINES``.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

from looprl import paths
from looprl.diffs import lines_changed, unified_diff
from looprl.errors import RewardError, TaskError
from looprl.pypi import download_sdist, normalize, sha256, unpack
from looprl.rewards.tests import run_tests
from looprl.tasks.build import BuildConfig, Progress, _module_of, validate_all
from looprl.tasks.prompts import Evidence, make_prompt
from looprl.tasks.sources import PackageSnapshot, find_layout
from looprl.tasks.timing import stage
from looprl.types import Grader, Task

MAX_GOLD_LINES = 400


def list_versions(name: str) -> list[str]:
    """Final releases of ``name`` on PyPI, newest first (``pip index versions``)."""
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name,
                        "--disable-pip-version-check"], capture_output=True, text=True)
    m = re.search(r"Available versions: (.+)", r.stdout)
    if r.returncode != 0 or not m:
        raise TaskError(f"cannot list versions of {name} on PyPI: {r.stderr.strip()[-300:]}")
    return [v.strip() for v in m.group(1).split(",") if re.fullmatch(r"[\d.]+", v.strip())]


def _read(repo: Path, rel: str) -> str | None:
    p = repo / rel
    return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None


def tree_diff(old_repo: Path, new_repo: Path, files: set[str]) -> str:
    return "".join(unified_diff(f, _read(old_repo, f), _read(new_repo, f)) for f in sorted(files))


async def _old_outcomes(old_repo: Path, snap: PackageSnapshot, test_patch: str,
                        targets: list[str]) -> dict[str, str]:
    """Outcomes of the new tests on the old code (test patch applied in a sandbox)."""
    from looprl.rewards.tests import apply_diff
    from looprl.sandbox import create_sandbox

    sb = await create_sandbox(old_repo, venv=snap.venv)
    try:
        await apply_diff(sb, test_patch, "release test patch")
        run = await run_tests(sb, snap.test_command, targets,
                              timeout_s=max(60.0, 4 * snap.suite_wall_s))
        return run.outcomes
    finally:
        await sb.close()


async def _pair_tasks(snap: PackageSnapshot, old_version: str, cfg: BuildConfig) -> list[Task]:
    sdist = await asyncio.to_thread(download_sdist, snap.name, old_version)
    digest = await asyncio.to_thread(sha256, sdist)
    root = paths.sub("tasks") / f"{normalize(snap.name)}-{old_version}-to-{snap.version}"
    old_repo = root / f"repo-{digest[:12]}"
    if not old_repo.is_dir():
        await asyncio.to_thread(unpack, sdist, old_repo)
    return await release_tasks_from_repos(snap, old_repo, old_version, cfg)


async def release_tasks_from_repos(snap: PackageSnapshot, old_repo: Path, old_version: str,
                                   cfg: BuildConfig) -> list[Task]:
    """Tasks from the older release unpacked at ``old_repo`` against the snapshot's release
    (not yet validated)."""
    new_repo = Path(snap.repo)
    old_pp, _, old_tests, old_src = find_layout(old_repo)
    if old_pp != snap.pythonpath:
        return []  # layout moved (e.g. to src/): not a clean release diff
    src_files = set(old_src) | set(snap.source_files)
    gold = tree_diff(old_repo, new_repo, src_files)
    if not gold or lines_changed(gold) > MAX_GOLD_LINES:
        return []
    test_files = {f for f in set(old_tests) | set(snap.test_files) if f.endswith(".py")}
    changed = [f for f in sorted(test_files) if _read(old_repo, f) != _read(new_repo, f)]
    test_patch = tree_diff(old_repo, new_repo, set(changed))
    new_passing = [t for t in snap.passing_tests if t.split("::", 1)[0] in changed]
    if not new_passing:
        return []
    outcomes = await _old_outcomes(old_repo, snap, test_patch, new_passing)
    tasks = []
    for f in changed:
        in_file = [t for t in new_passing if t.split("::", 1)[0] == f]
        f2p = tuple(t for t in in_file if outcomes.get(t) != "passed")
        if not 1 <= len(f2p) <= cfg.max_fail:
            continue
        p2p = tuple(t for t in in_file if t not in set(f2p))
        tid = f"{normalize(snap.name)}-{old_version}-release-{snap.version}-" \
              f"{re.sub(r'[^A-Za-z0-9]+', '_', f)}"
        first_src = next((p for p in sorted(src_files) if p in gold), sorted(src_files)[0])
        ev = Evidence(functions=(), module=_module_of(first_src, snap.pythonpath), failing=f2p,
                      kind="release", package=snap.name)
        prompt = make_prompt(ev, tid)
        tasks.append(Task(
            id=tid, repo=str(old_repo), prompt=prompt.text, venv=snap.venv, gold_patch=gold,
            grader=Grader(snap.test_command, f2p, p2p, tuple(sorted(set(old_tests) |
                                                                  set(snap.test_files))),
                          test_patch=test_patch),
            metadata={"package": snap.name, "version": old_version, "from_version": old_version,
                      "source_kind": "release", "mutation_kind": "release",
                      "files": ",".join(sorted(p for p in src_files if f"a/{p}" in gold)),
                      "functions": f, "lines_changed": lines_changed(gold),
                      "prompt_chars": len(prompt.text), "prompt_style": prompt.style,
                      "description": f"{snap.name} {old_version} -> {snap.version}",
                      "n_fail_to_pass": len(f2p)}))
    return tasks


async def abuild_release_tasks(snap: PackageSnapshot, n_pairs: int, cfg: BuildConfig,
                               progress: Progress | None = None) -> list[Task]:
    with stage("release"):
        versions = await asyncio.to_thread(list_versions, snap.name)
        if snap.version not in versions:
            return []
        older = versions[versions.index(snap.version) + 1:][:n_pairs]

        async def pair(v: str) -> list[Task]:
            try:
                return await _pair_tasks(snap, v, cfg)
            except (TaskError, RewardError):
                return []  # no sdist of that release, or its tests cannot take the new ones

        tasks = [t for ts in await asyncio.gather(*(pair(v) for v in older)) for t in ts]
    tasks = await validate_all(tasks, cfg.validate, cfg.workers, progress)
    for t in tasks:
        t.metadata["validated"] = cfg.validate
        if cfg.validate != "none":
            t.metadata["untouched_score"] = 0.0
    return tasks


def build_release_tasks(snap: PackageSnapshot, n_pairs: int = 2, cfg: BuildConfig | None = None,
                        progress: Progress | None = None) -> list[Task]:
    """Validated release-diff tasks of ``snap`` against its ``n_pairs`` previous releases."""
    return asyncio.run(abuild_release_tasks(snap, n_pairs, cfg or BuildConfig(), progress))
