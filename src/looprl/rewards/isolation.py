"""How the grader keeps the workspace away from the test runner: the test command, rewritten to
run the isolated runner (``pytest_runner.py``, read-only in every sandbox's tools dir); the
runner's report; the workspace paths that reach the runner besides the package under test.

    cmd = PytestCommand.parse(task.grader.test_command)    # RewardError if it is not pytest
    line = cmd.isolated(f"{sandbox.tools_dir}/{RUNNER}", new_report_name())
    # 'exec 3>&1; COLUMNS=240 PYTHONPATH=src python -I /.looprl/bin/pytest_runner.py .looprl-..'
    report = RunnerReport.parse(report_bytes, exec_stdout)   # .outcomes, .status, .intact
    runner_paths(task, diff), shadowing_paths(task, diff)   # what the grader keeps as in the base

The command keeps the task's options and environment; only the interpreter's start changes
(``-I``, the runner instead of ``-m pytest``), so a grade means what the task's own command
measured when the task was built. ``runner_config_paths``, ``startup_hook_paths`` and
``shadowing_paths`` feed ``hacking``'s detectors of the same names.

What pytest reads besides the package, and how each is kept from the agent: the inifile (the
names the installed pytest discovers, ``pytest_config_names``, searched up from the test paths;
the rootdir, moved by a ``setup.py``, when there is none) and every ``conftest.py`` are graded as
the base has them, wherever they are; ``pytest11`` entry points and ``-p`` plugins load before
the workspace is on ``sys.path`` (``pytest_runner.py``), and workspace distribution metadata is
graded as the base has it; plugins a pristine conftest names (``pytest_plugins``) are package
code, watched by ``hacking.tampering_lines``. After the run the runner lists the inifile and
conftests pytest read (``RunnerReport.config``), so a config name a later pytest adds is caught
even where this list lacks it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import posixpath
import re
import secrets
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from looprl.diffs import FilePatch, apply_patch, parse_diff, touched_paths
from looprl.errors import DiffError, RewardError
from looprl.sandbox.beneath import Root
from looprl.types import Task

RUNNER = "pytest_runner.py"
"""The runner's file name in ``Sandbox.tools_dir`` (``sandbox/mounts.py`` binds it there)."""

_ASSIGN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON_RE = re.compile(r"python(3(\.\d+)?)?")
HONOURED_PYTHON_VARS = frozenset({"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"})
"""``PYTHON*`` variables the runner applies itself (isolated mode makes the interpreter ignore
every ``PYTHON*`` variable); a command setting another one is refused, not silently changed."""


@dataclass(frozen=True)
class PytestCommand:
    """A task's test command taken apart: environment assignments, interpreter, pytest options.

    >>> c = PytestCommand.parse("COLUMNS=240 PYTHONPATH=src python -m pytest -q -rA")
    >>> c.env, c.python, c.args, c.pythonpath
    (('COLUMNS=240', 'PYTHONPATH=src'), 'python', ('-q', '-rA'), ('src',))
    >>> c.isolated("/.looprl/bin/pytest_runner.py", "r.jsonl")
    'exec 3>&1; COLUMNS=240 PYTHONPATH=src python -I /.looprl/bin/pytest_runner.py r.jsonl 3 -q -rA'
    """

    env: tuple[str, ...]
    python: str
    args: tuple[str, ...]

    @classmethod
    def parse(cls, command: str) -> PytestCommand:
        """Raises ``RewardError`` (the task's grader is unusable) naming the accepted form."""
        try:
            words = shlex.split(command)
        except ValueError as e:
            raise RewardError(f"grader.test_command {command!r} is not a valid shell line: {e}") \
                from None
        i = 0
        while i < len(words) and _ASSIGN_RE.match(words[i]):
            i += 1
        env, rest = tuple(words[:i]), words[i:]
        prog = posixpath.basename(rest[0]) if rest else ""
        if _PYTHON_RE.fullmatch(prog) and rest[1:3] == ["-m", "pytest"]:
            python, args = rest[0], rest[3:]
        elif prog in ("pytest", "py.test"):
            python, args = "python", rest[1:]
        else:
            raise RewardError(f"grader.test_command {command!r} is not a pytest command; the "
                              "grader runs pytest isolated from the workspace and needs "
                              "'[NAME=value ...] python -m pytest [options]'")
        for assignment in env:
            name = assignment.split("=", 1)[0]
            if name.startswith("PYTHON") and name not in HONOURED_PYTHON_VARS:
                raise RewardError(f"grader.test_command sets {name}, which the grader's isolated "
                                  f"interpreter would ignore; use only "
                                  f"{sorted(HONOURED_PYTHON_VARS)} or pass it as a pytest option")
        return cls(env, python, tuple(args))

    @property
    def pythonpath(self) -> tuple[str, ...]:
        """The ``PYTHONPATH`` entries (workspace-relative as written), in order."""
        for assignment in reversed(self.env):
            name, _, value = assignment.partition("=")
            if name == "PYTHONPATH":
                return tuple(p for p in value.split(":") if p)
        return ()

    def isolated(self, runner: str, report: str) -> str:
        """The shell line that runs these options through the isolated runner into ``report``;
        the runner's digest goes to descriptor 3, the command's stdout as the shell got it (the
        caller sends the command's own stdout elsewhere, e.g. ``> console.out 2>&1``)."""
        return "exec 3>&1; " + shlex.join([*self.env, self.python, "-I", runner, report, "3",
                                           *self.args])


def new_report_name() -> str:
    """A workspace-relative report path nobody can predict (or plant a file or link at)."""
    return f".looprl-report-{secrets.token_hex(12)}.jsonl"


@dataclass(frozen=True)
class RunnerReport:
    """What the runner wrote: each test's outcome (the report file), and pytest's exit status
    with the digest of the report (the lines it prints at its start and when pytest returns)."""

    outcomes: dict[str, str]
    status: int | None
    """pytest's exit status; None when the session never ended (the process exited early or was
    killed: no last line)."""
    intact: bool
    """The runner's own words: one line per test in the report; exactly its two lines printed,
    with the same nonce; the report's bytes match the digest. Anything else (a rewritten report,
    a test reported twice, a line added to the printed ones) was written by the code under
    test."""
    config: tuple[str, ...] = ()
    """Workspace files pytest took configuration from (its inifile, the conftest modules it
    loaded), as the runner's last line lists them."""

    @classmethod
    def parse(cls, report: bytes, digest: str) -> RunnerReport:
        r"""From the report file's bytes and what the runner printed to its digest descriptor.

        >>> rep = b'{"id": "t.py::a", "outcome": "passed"}\n'
        >>> lines = '{"begin": 7}\n' + json.dumps(
        ...     {"done": 0, "sha256": hashlib.sha256(rep).hexdigest(), "nonce": 7})
        >>> RunnerReport.parse(rep, lines)
        RunnerReport(outcomes={'t.py::a': 'passed'}, status=0, intact=True, config=())
        >>> RunnerReport.parse(rep.replace(b"passed", b"failed"), lines).intact
        False
        >>> RunnerReport.parse(rep, lines.replace('"nonce": 7', '"nonce": 8')).intact
        False
        >>> RunnerReport.parse(rep, '{"begin": 7}').status is None
        True
        """
        outcomes: dict[str, str] = {}
        intact = True
        lines = report.decode("utf-8", "replace").splitlines()
        for i, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
            if (isinstance(rec, dict) and isinstance(rec.get("id"), str)
                    and isinstance(rec.get("outcome"), str)):
                intact = intact and rec["id"] not in outcomes
                outcomes[rec["id"]] = rec["outcome"]
            else:  # a last line cut by a kill mid-write; anything else is foreign
                intact = intact and i == len(lines) - 1
        status: int | None = None
        config: tuple[str, ...] = ()
        printed = [ln for ln in digest.splitlines() if ln.strip()]
        try:
            first, last = (json.loads(printed[0]), json.loads(printed[-1])) if printed else ({}, {})
        except json.JSONDecodeError:
            first, last = {}, {}
        if isinstance(last, dict) and type(last.get("done")) is int:
            status = last["done"]
            intact = (intact and len(printed) == 2 and isinstance(first, dict)
                      and first.get("begin") is not None
                      and first.get("begin") == last.get("nonce")
                      and last.get("sha256") == hashlib.sha256(report).hexdigest())
            listed = last.get("config")
            config = tuple(p for p in listed if isinstance(p, str)) if isinstance(listed, list) else ()
        return cls(outcomes, status, intact, config)


# ------------------------------------------------------------------ what else reaches the runner
# The grader (``tests.py``) restores every ``runner_paths`` path and every ``shadowing_paths``
# module from the base before the tests run; the others say which of them were an attempt on the
# test run (``hacking``'s detectors).

RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging",
                            "pygments", "exceptiongroup", "tomli", "colorama"})
"""pytest and what it imports: a workspace module of one of these names shadows the runner."""
STARTUP_HOOK_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
"""Modules Python imports at start-up (``*.pth`` files too): code that would run before pytest."""
ROOTDIR_MARKER = "setup.py"
"""Without an inifile, pytest's rootdir is the nearest ancestor of the test paths holding this
file (``findpaths.determine_setup``): creating or deleting one moves the rootdir, and with it
which ``conftest.py`` files load."""
_DIST_SUFFIXES = (".dist-info", ".egg-info")  # distribution metadata: entry points load plugins
_PYTEST_SECTION = {"pyproject.toml": r"tool\.pytest[\w.\-]*", "setup.cfg": r"tool:pytest",
                   "tox.ini": r"pytest"}
"""Config files pytest reads only a section of; it reads every other config name whole."""
_EARLIEST_NAMES = frozenset({"pytest.ini", "tox.ini", "setup.cfg"})  # every pytest since 2.x


def _findpaths(venv: str | None) -> Path | None:
    """The ``_pytest/config/findpaths.py`` of the pytest that ``venv`` holds (None: the one this
    interpreter imports)."""
    if venv:
        return next(Path(venv).glob("lib/python*/site-packages/_pytest/config/findpaths.py"), None)
    # the top-level package's spec: finding it imports nothing (a submodule's would import
    # _pytest.config, 0.1 s on every ``looprl`` command that checks a config)
    spec = importlib.util.find_spec("_pytest")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "config" / "findpaths.py"
    return path if path.is_file() else None


def config_names_in(source: str) -> frozenset[str]:
    r"""The config file names a ``findpaths.py`` discovers: the keys of its
    ``CONFIG_LOADERS_BY_NAME`` (pytest 9), else the literal ``config_names`` list of its
    ``locate_config`` (older pytest).

    >>> sorted(config_names_in('CONFIG_LOADERS_BY_NAME = {"pytest.toml": f, "tox.ini": g}'))
    ['pytest.toml', 'tox.ini']
    >>> sorted(config_names_in('def locate_config():\n    config_names = ["pytest.ini"]'))
    ['pytest.ini']
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if not isinstance(target, ast.Name) or target.id not in ("CONFIG_LOADERS_BY_NAME",
                                                                  "config_names"):
            continue
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        items = (value.keys if isinstance(value, ast.Dict) else
                 value.elts if isinstance(value, (ast.List, ast.Tuple)) else [])
        names |= {k.value for k in items if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return frozenset(names)


@functools.lru_cache(maxsize=64)
def pytest_config_names(venv: str | None = None) -> frozenset[str]:
    """The names pytest finds its inifile by, read from the pytest that grades (``venv``'s) and
    the one this interpreter has: a name a later pytest adds is known without a release of
    looprl. (What neither names is still caught after the run: ``tests.grade_in`` checks the
    inifile pytest reports.)"""
    names = set(_EARLIEST_NAMES)
    for path in {_findpaths(venv), _findpaths(None)}:
        if path is not None:
            try:
                names |= config_names_in(path.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, UnicodeDecodeError):
                continue  # this pytest's layout is unknown: the other one and the floor stand
    return frozenset(names)


def _is_config(path: str, venv: str | None) -> bool:
    name = posixpath.basename(path)
    return name == "conftest.py" or name in pytest_config_names(venv)


def _is_runner_path(path: str, venv: str | None) -> bool:
    parts = posixpath.normpath(path).split("/")
    return (_is_config(path, venv) or parts[-1] in STARTUP_HOOK_FILES or parts[-1].endswith(".pth")
            or any(d.endswith(_DIST_SUFFIXES) for d in parts))


def _moves_rootdir(fp: FilePatch) -> bool:
    """A ``setup.py`` created or deleted (its content does not matter to pytest)."""
    return posixpath.basename(fp.path) == ROOTDIR_MARKER and (fp.old_path is None) != (
        fp.new_path is None)


def runner_paths(task: Task, diff: str) -> tuple[str, ...]:
    r"""Paths of ``diff`` that pytest or the interpreter read before or besides the package under
    test, whatever their content: every config file name pytest discovers
    (``pytest_config_names``) and ``conftest.py``, anywhere; start-up hooks; distribution
    metadata; a ``setup.py`` created or deleted (``ROOTDIR_MARKER``). The grader grades the base's
    version of each (``pyproject.toml`` and ``setup.cfg`` included, whose other sections do not
    matter to a test run from the workspace).

    >>> from looprl.types import Grader
    >>> t = Task("t", "/nonexistent", "p", Grader("pytest"))
    >>> runner_paths(t, "--- a/src/m.py\n+++ b/src/m.py\n@@ -1 +1 @@\n-a\n+b\n"
    ...                 "--- /dev/null\n+++ b/x.pth\n@@ -0,0 +1 @@\n+import os\n"
    ...                 "--- /dev/null\n+++ b/tests/pytest.toml\n@@ -0,0 +1 @@\n+[pytest]\n")
    ('x.pth', 'tests/pytest.toml')
    """
    out = []
    for fp in parse_diff(diff):
        out += [p for p in fp.paths if _is_runner_path(p, task.venv)]
        if _moves_rootdir(fp):
            out.append(fp.path)
    return tuple(dict.fromkeys(out))


def startup_hook_paths(diff: str) -> tuple[str, ...]:
    """Start-up hooks the diff creates or edits: ``sitecustomize.py``, ``usercustomize.py``,
    ``*.pth`` files, anywhere."""
    return tuple(p for p in touched_paths(diff)
                 if posixpath.basename(p) in STARTUP_HOOK_FILES or p.endswith(".pth"))


def _section(text: str, name: str) -> str:
    """The lines of ini/TOML sections whose header matches ``name`` (a regex)."""
    out, inside = [], False
    for line in text.split("\n"):
        header = re.match(r"\s*\[+\s*([^\]]+?)\s*\]+\s*$", line)
        if header:
            inside = re.fullmatch(name, header.group(1)) is not None
        if inside:
            out.append(line)
    return "\n".join(out)


def _changes_pytest_section(task: Task, fp: FilePatch) -> bool:
    """Whether a pyproject.toml / setup.cfg / tox.ini patch changes its pytest section (the base
    file's sections decide; without it, whether a changed line mentions pytest)."""
    name = _PYTEST_SECTION[posixpath.basename(fp.path)]
    try:
        old = ""
        if fp.old_path is not None:
            with Root(task.repo) as base:
                old = base.read_text(fp.old_path)
        new = "" if fp.new_path is None else apply_patch(old, fp)
    except (OSError, UnicodeDecodeError, DiffError):
        return any("pytest" in ln for ln in fp.added_lines + fp.removed_lines) or fp.binary
    return _section(old, name) != _section(new, name)


def runner_config_paths(task: Task, diff: str) -> tuple[str, ...]:
    """Paths of ``diff`` that change how pytest runs: any ``conftest.py``, any config file pytest
    reads whole (``pytest.toml``, ``pytest.ini``, ... : every ``pytest_config_names`` name but
    those of ``_PYTEST_SECTION``), the pytest section of ``pyproject.toml``/``setup.cfg``/
    ``tox.ini``, a ``setup.py`` created or deleted, entry points (a ``pytest11`` plugin) in
    distribution metadata."""
    hits = []
    for fp in parse_diff(diff):
        name = posixpath.basename(fp.path)
        if name in _PYTEST_SECTION:
            if _changes_pytest_section(task, fp):
                hits.append(fp.path)
        elif _is_config(fp.path, task.venv) or _moves_rootdir(fp):
            hits.append(fp.path)
        elif (name == "entry_points.txt" and any(d.endswith(_DIST_SUFFIXES) for d in
                                                  fp.path.split("/"))
              and (fp.binary or any("pytest11" in ln for ln in fp.added_lines))):
            hits.append(fp.path)
    return tuple(dict.fromkeys(hits))


@functools.lru_cache(maxsize=64)
def _installed_modules(venv: str | None) -> frozenset[str]:
    """Top-level module names of a venv's site-packages (its test dependencies)."""
    names: set[str] = set()
    for site in Path(venv).glob("lib/python*/site-packages") if venv else ():
        for entry in site.iterdir():
            n = entry.name
            if entry.is_dir() and "." not in n and n != "__pycache__":
                names.add(n)
            elif n.endswith((".py", ".so", ".pyd")):
                names.add(n.split(".")[0])
    return frozenset(names)


def _import_roots(task: Task) -> set[str]:
    """Workspace directories that can be on ``sys.path`` while the tests run: the root, the
    command's ``PYTHONPATH`` entries, and the graded test modules' directories and their parents
    (pytest inserts those)."""
    roots = {""}
    try:
        roots |= {p for p in PytestCommand.parse(task.grader.test_command).pythonpath
                  if not p.startswith("/")}
    except RewardError:
        pass
    for t in (*task.grader.fail_to_pass, *task.grader.pass_to_pass):
        d = posixpath.dirname(t.split("::", 1)[0])
        while d:
            roots.add(d)
            d = posixpath.dirname(d)
    return {"" if r in (".", "") else posixpath.normpath(r) for r in roots}


def _in_base(task: Task, rel: str) -> bool:
    """Whether the base has an entry at ``rel`` (looked up beneath it, no link followed)."""
    try:
        with Root(task.repo) as base:
            return base.lstat(rel) is not None
    except FileNotFoundError:
        return False


def shadowing_paths(task: Task, diff: str) -> tuple[str, ...]:
    r"""Modules or packages the diff adds where they would shadow the test runner, a module of the
    standard library or one the task's venv provides: at an import root (``_import_roots``)
    with such a name, not in the base. Returned as the module's file or top directory.

    >>> from looprl.types import Grader
    >>> t = Task("t", "/nonexistent", "p", Grader("PYTHONPATH=src python -m pytest"))
    >>> shadowing_paths(t, "--- /dev/null\n+++ b/src/_pytest/runner.py\n@@ -0,0 +1 @@\n+x = 1\n"
    ...                    "--- /dev/null\n+++ b/src/pkg/json.py\n@@ -0,0 +1 @@\n+x = 1\n")
    ('src/_pytest',)
    """
    protected = RUNNER_MODULES | sys.stdlib_module_names | _installed_modules(task.venv)
    roots = _import_roots(task)
    hits = []
    for fp in parse_diff(diff):
        if fp.new_path is None:
            continue
        p = posixpath.normpath(fp.new_path)
        for r in roots:
            if r and not p.startswith(r + "/"):
                continue
            rel = p[len(r) + 1:] if r else p
            top = rel.split("/", 1)[0]
            module = top if "/" in rel else top.split(".", 1)[0] if top.endswith(
                (".py", ".pyc", ".so", ".pyd")) else ""
            here = posixpath.join(r, top)
            if module in protected and not _in_base(task, here):
                hits.append(here)
    return tuple(dict.fromkeys(hits))
