"""The grader's pytest entry point. It runs inside the grading sandbox, under the task's own
interpreter in isolated mode, from the read-only tools dir (``Sandbox.tools_dir``, where
``sandbox/mounts.py`` binds this file), never from the workspace:

    exec 3>&1; COLUMNS=240 PYTHONPATH=src python -I /.looprl/bin/pytest_runner.py REPORT 3 \
        [pytest args ...] > console.out 2>&1

(``isolation.PytestCommand.isolated`` writes that line from a task's ``python -m pytest`` command.)

- ``-I`` keeps the workspace off ``sys.path`` while the interpreter starts, so no
  ``sitecustomize``/``usercustomize`` module or shadowing module of the workspace runs (``.pth``
  files count only in the venv's site-packages), and ``PYTHON*`` variables are ignored; this
  script honours the three the grader's commands use (``PYTHONPATH``, ``PYTHONDONTWRITEBYTECODE``,
  ``PYTHONUNBUFFERED``).
- pytest, its dependencies, the plugins the venv's distributions register (``pytest11`` entry
  points), ``-p`` plugins (so a workspace module named by ``-p`` does not import at all) and the
  (pristine: the grader keeps the base's) configuration all load while the workspace is still
  off ``sys.path``. Only then — first thing in ``pytest_load_initial_conftests``, before
  any conftest — does the workspace go where ``python -m pytest`` with ``PYTHONPATH`` puts it (the
  current directory, then the ``PYTHONPATH`` entries, ahead of the standard library), so the
  package under test is the workspace's copy, as when the task was built.
- Outcomes come from this plugin, not from the console: one JSON line per test when its teardown
  ends (``{"id": node id as the command line names it, "outcome": ...}``), written to ``REPORT``
  — a name the grader draws at random per run, created exclusively before any workspace code
  runs, dropped from ``sys.argv``. Descriptor 3 is the sandbox command's own stdout, read by the
  host: what is written there cannot be rewritten, only appended to. Before any workspace code
  runs the runner writes ``{"begin": nonce}`` there (a random nonce kept in a local variable),
  and when pytest returns ``{"done": exit status, "sha256": digest of REPORT's bytes, "nonce":
  nonce, "config": [the workspace files pytest took configuration from: its inifile and the
  conftest modules it loaded]}``. Printed "PASSED" lines change nothing; a rewritten report no longer matches the
  digest; a line the code under test adds makes three lines or carries another nonce; a run
  without the last line ended early (``os._exit``, a signal, ``SystemExit`` out of a conftest
  import). Both descriptors are moved to random high numbers first.

What this does NOT protect against: the package under test runs in this process (the tests import
it) and can do anything the process can — patch pytest or this plugin, rewrite the report or the
test files, read the nonce from this process's memory (a frame's locals) and forge the last
line. The grader's static monitor (``hacking.runner_tampering``: pytest's internals, exits,
``/proc``, ``gc`` and frame walks, descriptor juggling), its check that the test files are
unchanged after the run and the digest catch the plain forms of that; nothing in-process catches
all of them.

Standalone on purpose: it imports nothing from looprl (the sandbox has only the task's venv) and
keeps to Python 3.8 syntax.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import sys

_USAGE = "usage: python -I pytest_runner.py REPORT DIGEST_FD [pytest args ...]"


def _open_report(path: str) -> int:
    """Create the report, refusing one that exists (a file or link the workspace planted)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o644)


def _hide(fd: int) -> int:
    """``fd`` moved to a random free high descriptor (not inherited): code under test cannot
    just write to the obvious numbers (3, 4)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = min(soft, 4096) if soft > 0 else 4096
    rng = random.SystemRandom()
    for _ in range(64):
        target = rng.randrange(limit // 2, limit)
        try:
            os.fstat(target)
        except OSError:  # free
            os.dup2(fd, target, inheritable=False)
            os.close(fd)
            return target
    return fd


def _make_plugin(pytest: object, fd: int, roots: list[str], start_path: list[str]) -> object:
    """The plugin object (built once pytest is imported: its hook markers come from pytest)."""
    hookimpl = pytest.hookimpl  # type: ignore[attr-defined]

    class GraderReport:
        def __init__(self) -> None:
            self.config = None
            self.outcome: dict[str, str] = {}
            self.digest = hashlib.sha256()

        def emit(self, record: dict) -> None:
            data = (json.dumps(record) + "\n").encode()
            self.digest.update(data)
            os.write(fd, data)

        @hookimpl(tryfirst=True)
        def pytest_load_initial_conftests(self, early_config: object) -> None:
            # where ``python -m pytest`` puts them: after entries pytest's ``pythonpath`` ini
            # option added, before the interpreter's own (standard library, site-packages)
            at = sys.path.index(start_path[0]) if start_path and start_path[0] in sys.path else 0
            sys.path[at:at] = [r for r in roots if r not in sys.path]

        def pytest_configure(self, config: object) -> None:
            self.config = config

        def config_read(self) -> list:
            """Workspace files pytest took configuration from: its inifile and every conftest
            module it loaded (the grader checks none of them is one the diff changed)."""
            config = self.config
            if config is None:
                return []
            here = os.path.realpath(os.getcwd())
            files = [str(config.inipath)] if getattr(config, "inipath", None) else []
            files += [getattr(p, "__file__", None) or "" for p in config.pluginmanager.get_plugins()]
            out = set()
            for f in files:
                if f and (f == str(config.inipath) or os.path.basename(f) == "conftest.py"):
                    real = os.path.realpath(f)
                    if real.startswith(here + os.sep):
                        out.add(os.path.relpath(real, here))
            return sorted(out)

        def pytest_runtest_logreport(self, report: object) -> None:
            r = report  # a TestReport: when, outcome, nodeid, maybe wasxfail
            node = self.config.cwd_relative_nodeid(r.nodeid)  # type: ignore[union-attr]
            xfail = hasattr(r, "wasxfail")
            if r.when == "call":
                if r.passed:
                    self.outcome[node] = "xpassed" if xfail else "passed"
                elif r.failed:
                    self.outcome[node] = "failed"
                else:
                    self.outcome[node] = "xfailed" if xfail else "skipped"
            elif r.failed:  # setup or teardown
                self.outcome[node] = "error"
            elif r.skipped and r.when == "setup":
                self.outcome[node] = "xfailed" if xfail else "skipped"
            if r.when == "teardown":
                self.emit({"id": node, "outcome": self.outcome.pop(node, "error")})

    return GraderReport()


def main(argv: list[str]) -> int:
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    if os.environ.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    if len(argv) < 2 or not argv[1].isdigit():
        print(_USAGE, file=sys.stderr)
        return 4
    report, digest = _hide(_open_report(argv[0])), _hide(int(argv[1]))
    nonce = random.SystemRandom().getrandbits(128)
    os.write(digest, (json.dumps({"begin": nonce}) + "\n").encode())
    sys.argv[1:] = argv[2:]  # as under ``python -m pytest``: the report's name is not handed on
    start_path = list(sys.path)
    roots = [os.getcwd()] + [os.path.abspath(p) for p in
                             os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    import pytest  # the venv's: the workspace is not on sys.path

    plugin = _make_plugin(pytest, report, roots, start_path)
    status = int(pytest.main(argv[2:], plugins=[plugin]))
    line = {"done": status, "sha256": plugin.digest.hexdigest(),  # type: ignore[attr-defined]
            "nonce": nonce, "config": plugin.config_read()}  # type: ignore[attr-defined]
    os.write(digest, (json.dumps(line) + "\n").encode())
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
