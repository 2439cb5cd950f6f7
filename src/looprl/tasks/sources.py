"""Real packages as task sources: fetch an sdist from PyPI, build a venv for its tests, record the
tests that pass (twice, in a sandbox with no network).

    snap = fetch_package("inflection==0.5.1")     # -> PackageSnapshot (cached under LOOPRL_HOME)
    snap.repo, snap.venv, snap.passing_tests, snap.test_command

Layout of the cache (``looprl.paths.sub("packages")``)::

    sdists/NAME-VERSION.tar.gz                     the release's sdist from the index (``looprl.pypi``)
    NAME-VERSION-SHA12-py3.11/repo/                the unpacked sdist (immutable base snapshot)
    NAME-VERSION-SHA12-py3.11/venv/                pytest + runtime deps + inferred test deps
                                                   (installed by uv if present, else pip)
    NAME-VERSION-SHA12-py3.11/snapshot.json        the PackageSnapshot (or rejected.json)
    NAME-VERSION-SHA12-py3.11/callmap.json         which tests call which function (coverage.py)

The venv holds the package's dependencies but not the package: tests import the workspace copy
through ``PYTHONPATH`` (``src`` for src layouts), so an agent's edit is what gets tested.
A package that ships no tests, whose suite mostly fails, or needs the network is rejected with
``TaskError`` naming the reason.
"""

from __future__ import annotations

import asyncio
import configparser
import email.parser
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import tomllib
from packaging.requirements import InvalidRequirement, Requirement

from looprl import paths
from looprl.errors import TaskError
from looprl.pypi import (
    NOT_SOURCE_DIRS,
    download_sdist,
    normalize,
    parse_spec,
    sha256,
    unpack,
)
from looprl.rewards.hacking import is_test_path
from looprl.rewards.tests import TestRun, pytest_command, run_tests
from looprl.tasks.timing import stage

TEST_EXTRAS = ("test", "tests", "testing")
# Tools a test suite lists but that a plain pytest run does not need (we drop addopts).
_SKIP_DEPS = {"coverage", "pytest-cov", "codecov", "coveralls", "flake8", "mypy", "black", "ruff",
              "pre-commit", "tox", "nox", "pylint", "isort", "sphinx", "twine", "wheel", "build",
              "pytest-xdist", "pytest-randomly", "pytest-benchmark", "pytest-codspeed",
              "pytest-mypy-plugins", "pytest-mypy", "pyright", "setuptools-scm"}
TEST_CONFIG_FILES = ("conftest.py", "pytest.ini", "setup.cfg", "pyproject.toml", "tox.ini")
_NOT_SOURCE_FILES = {"setup.py", "conftest.py", "noxfile.py", "tasks.py", "fabfile.py",
                     "docs_conf.py", "versioneer.py"}
MIN_PASSING = 10
MIN_PASS_RATE = 0.8


@dataclass(frozen=True)
class PackageSnapshot:
    """One fetched package version, ready to make tasks from."""

    name: str
    version: str
    sdist_sha256: str
    python_version: str
    repo: str
    """The unpacked sdist: the immutable base every task of this package starts from."""
    venv: str
    pythonpath: str
    """Source root put on PYTHONPATH ('src' or '.')."""
    test_command: str
    test_targets: tuple[str, ...]
    """Test directories / files passed to pytest to run the whole suite."""
    test_files: tuple[str, ...]
    """Every test file and test config, restored from the base before grading."""
    source_files: tuple[str, ...]
    """Library modules (mutation sites), repo-relative."""
    passing_tests: tuple[str, ...]
    """Node ids that passed in both sandboxed runs."""
    suite_wall_s: float

    @property
    def key(self) -> str:
        return f"{self.name}=={self.version}"

    @classmethod
    def from_dict(cls, d: dict) -> PackageSnapshot:
        tuples = ("test_targets", "test_files", "source_files", "passing_tests")
        return cls(**{k: tuple(v) if k in tuples else v for k, v in d.items()})  # type: ignore[arg-type]


# ------------------------------------------------------------------ layout


def _rel_py_files(root: Path) -> list[str]:
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if not any(part.startswith(".") for part in rel.split("/")):
            out.append(rel)
    return sorted(out)


def find_layout(repo: Path) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(pythonpath, test targets, test files incl. config, source files) of an unpacked sdist."""
    files = _rel_py_files(repo)
    pythonpath = "src" if (repo / "src").is_dir() and any(
        f.startswith("src/") for f in files) else "."
    tests = [f for f in files if is_test_path(f)]
    test_modules = [f for f in tests if f.rsplit("/", 1)[-1].startswith("test")
                    or f.endswith("_test.py")]
    targets: list[str] = []
    for f in test_modules:
        parts = f.split("/")
        top = next((("/".join(parts[: i + 1])) for i, p in enumerate(parts[:-1])
                    if p in ("tests", "test", "testing")), f)
        if top not in targets:
            targets.append(top)
    configs = [c for c in TEST_CONFIG_FILES if (repo / c).is_file()]
    test_files = tuple(sorted(set(tests) | set(configs)))
    sources = []
    for f in files:
        parts = f.split("/")
        if pythonpath == "src":
            if parts[0] != "src" or len(parts) < 2:
                continue
            parts = parts[1:]
        if (f in tests or parts[-1] in _NOT_SOURCE_FILES or parts[-1].startswith("_version")
                or any(p in NOT_SOURCE_DIRS for p in parts[:-1])):
            continue
        if len(parts) > 1 and not (repo / f).parent.joinpath("__init__.py").exists():
            continue  # a loose script dir, not an importable package
        sources.append(f)
    return pythonpath, tuple(targets), test_files, tuple(sources)


# ------------------------------------------------------------------ dependencies


def _requirement_names(lines: list[str], extras: tuple[str, ...], own: str) -> list[str]:
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if normalize(req.name) == normalize(own) or req.name.lower() in _SKIP_DEPS:
            continue
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            continue
        req.marker = None
        out.append(str(req))
    return out


def infer_dependencies(repo: Path, name: str) -> list[str]:
    """Runtime deps + test deps from PKG-INFO extras, pyproject (optional deps and dependency
    groups named test/tests/testing), tox.ini ``deps`` and requirements files for tests."""
    lines: list[str] = []
    pkg_info = repo / "PKG-INFO"
    if pkg_info.is_file():
        msg = email.parser.Parser().parsestr(pkg_info.read_text(errors="replace"))
        lines += msg.get_all("Requires-Dist") or []
    pyproject = repo / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text())
        except tomllib.TOMLDecodeError:
            data = {}
        project = data.get("project", {})
        if not lines:
            lines += project.get("dependencies", [])
        for group in (project.get("optional-dependencies", {}), data.get("dependency-groups", {})):
            for extra in TEST_EXTRAS:
                lines += [x for x in group.get(extra, []) if isinstance(x, str)]
    tox = repo / "tox.ini"
    if tox.is_file():
        cp = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            cp.read_string(tox.read_text(errors="replace"))
            if cp.has_option("testenv", "deps"):
                lines += [x.strip() for x in cp.get("testenv", "deps").splitlines()
                          if not x.strip().startswith(("-r", "{", "."))]
        except configparser.Error:
            pass
    for req in ("requirements-test.txt", "test-requirements.txt", "requirements/test.txt",
                "requirements-tests.txt", "tests/requirements.txt"):
        if (repo / req).is_file():
            lines += (repo / req).read_text(errors="replace").splitlines()
    return list(dict.fromkeys(_requirement_names(lines, TEST_EXTRAS, name)))


def uv_binary() -> str | None:
    """The ``uv`` installer (PyPI package ``uv``; ~6x faster than pip here), if installed."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def build_venv(venv: Path, deps: list[str]) -> None:
    """A venv with pytest and ``deps`` (not the package itself), byte-compiled (the sandbox
    mounts it read-only). Uses ``uv`` when installed, else pip. Raises TaskError on failure."""
    if (venv / ".looprl-ok").exists():
        return
    shutil.rmtree(venv, ignore_errors=True)
    uv = uv_binary()
    if uv:
        create = [uv, "venv", "-q", "--python", sys.executable, str(venv)]
        install = [uv, "pip", "install", "-q", "--compile-bytecode", "--python",
                   str(venv / "bin" / "python"), "pytest", *deps]
    else:
        print("note: `uv` is not installed; building test venvs with pip (slower: "
              "`pip install uv`)", file=sys.stderr)
        create = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
        install = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                   "install", "-q", "--disable-pip-version-check", "pytest", *deps]
    r = subprocess.run(create, capture_output=True, text=True)
    if r.returncode != 0:
        raise TaskError(f"creating venv {venv} failed: {r.stderr.strip()[-400:]}")
    r = subprocess.run(install, capture_output=True, text=True)
    if r.returncode != 0:
        raise TaskError(f"installing test deps {deps} failed: {r.stderr.strip()[-800:]}")
    (venv / ".looprl-ok").touch()


# ------------------------------------------------------------------ fetch


async def record_passing(repo: Path, venv: Path, command: str, targets: tuple[str, ...],
                         runs: int = 2, timeout_s: float = 300.0) -> tuple[list[TestRun], set[str]]:
    """Run the suite ``runs`` times in fresh sandboxes; the node ids that passed every time."""
    from looprl.sandbox import create_sandbox

    async def one() -> TestRun:
        sb = await create_sandbox(repo, venv=str(venv))
        try:
            return await run_tests(sb, command, targets, timeout_s=timeout_s)
        finally:
            await sb.close()

    results = list(await asyncio.gather(*(one() for _ in range(runs))))  # independent runs
    stable = set.intersection(*(r.passed() for r in results))
    return results, stable


def _cache_dir(name: str, version: str, digest: str) -> Path:
    py = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return paths.sub("packages") / f"{normalize(name)}-{version}-{digest[:12]}-{py}"


def _resolved_version(sdist: Path, name: str) -> str:
    n = sdist.name
    for ext in (".tar.gz", ".zip", ".tar.bz2"):
        n = n[: -len(ext)] if n.lower().endswith(ext) else n
    return n.rpartition("-")[2]


def fetch_package(spec: str, *, runs: int = 2, timeout_s: float = 300.0) -> PackageSnapshot:
    """Fetch, build and record ``NAME==VERSION`` (cached by sdist sha256 + Python version).

    Raises ``TaskError`` when the package cannot be used, with the reason (cached too)."""
    return asyncio.run(afetch_package(spec, runs=runs, timeout_s=timeout_s))


async def afetch_package(spec: str, *, runs: int = 2, timeout_s: float = 300.0) -> PackageSnapshot:
    name, version = parse_spec(spec)
    with stage("download"):
        sdist = await asyncio.to_thread(download_sdist, name, version)
    version = version or _resolved_version(sdist, name)
    digest = await asyncio.to_thread(sha256, sdist)
    cache = _cache_dir(name, version, digest)
    if (cache / "snapshot.json").is_file():
        return PackageSnapshot.from_dict(json.loads((cache / "snapshot.json").read_text()))
    if (cache / "rejected.json").is_file():
        raise TaskError(json.loads((cache / "rejected.json").read_text())["reason"])
    cache.mkdir(parents=True, exist_ok=True)
    try:
        snap = await _build(name, version, sdist, digest, cache, runs, timeout_s)
    except TaskError as e:
        (cache / "rejected.json").write_text(json.dumps({"reason": str(e)}))
        raise
    (cache / "snapshot.json").write_text(json.dumps(asdict(snap), indent=1))
    return snap


async def _build(name: str, version: str, sdist: Path, digest: str, cache: Path, runs: int,
                 timeout_s: float) -> PackageSnapshot:
    with stage("unpack"):
        repo = await asyncio.to_thread(unpack, sdist, cache / "repo")
    if not find_layout(repo)[1]:
        raise TaskError(f"{name}=={version} ships no tests in its sdist (no test_*.py); pick "
                        "another package")
    venv = cache / "venv"
    with stage("venv"):
        await asyncio.to_thread(build_venv, venv, infer_dependencies(repo, name))
    with stage("compile"):  # once here, so every fresh sandbox over the repo starts with bytecode
        await asyncio.to_thread(subprocess.run, [str(venv / "bin" / "python"), "-m",
                                                 "compileall", "-q", str(repo)],
                                capture_output=True)
    return await record_snapshot(name, version, digest, repo, venv, runs=runs, timeout_s=timeout_s)


async def record_snapshot(name: str, version: str, digest: str, repo: Path, venv: Path, *,
                          runs: int = 2, timeout_s: float = 300.0) -> PackageSnapshot:
    """Find the layout of ``repo`` and record its stably passing tests with ``venv``
    (also usable on any local checkout that has a venv with pytest)."""
    key = f"{name}=={version}"
    pythonpath, targets, test_files, sources = find_layout(repo)
    if not targets:
        raise TaskError(f"{key} ships no tests (no test_*.py); pick another package")
    if not sources:
        raise TaskError(f"{key}: no importable source modules found under {repo}")
    command = pytest_command(pythonpath)
    with stage("baseline_runs"):
        results, stable = await record_passing(repo, venv, command, targets, runs, timeout_s)
    first = results[0]
    if first.timed_out:
        raise TaskError(f"{key}: its test suite took over {timeout_s:.0f}s; pick a smaller package")
    total = len(first.outcomes)
    if len(stable) < MIN_PASSING or len(stable) < MIN_PASS_RATE * total:
        raise TaskError(f"{key}: only {len(stable)} of {total} tests pass offline in the sandbox "
                        f"(missing test deps or tests that need the network); output tail:\n"
                        f"{first.output_tail[-1500:]}")
    # ids pytest cannot take back on a command line (odd characters) would break grading
    stable_ids = tuple(t for t in first.outcomes if t in stable and t.isascii() and "\\" not in t)
    return PackageSnapshot(
        name=name, version=version, sdist_sha256=digest,
        python_version=".".join(map(str, sys.version_info[:3])), repo=str(repo), venv=str(venv),
        pythonpath=pythonpath, test_command=command, test_targets=targets, test_files=test_files,
        source_files=sources, passing_tests=stable_ids,
        suite_wall_s=max(r.wall_s for r in results))
