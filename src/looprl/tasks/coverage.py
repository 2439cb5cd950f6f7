"""Which tests execute which function: a per-test call map, recorded once per package, so that
screening a mutation runs only the tests that can notice it.

    cmap = await record_coverage(snap)            # one traced run of the suite in a sandbox
    cmap.tests_for("toolz/itertoolz.py", 120)     # node ids whose run called the function
                                                  # defined at that line (decorators included)
    line = def_line(fn_node)                      # the key line of an ast function node

A mutation inside a function body can only change the outcome of a test that calls that
function, so the tests that fail under it are a subset of the tests that called it in the
baseline run (the check in ``tests/tasks/test_coverage.py`` compares with full-suite runs).
The tracer is a pytest plugin written into the sandbox's source root: ``sys.settrace`` sees
each new frame once ('call' events only, no line tracing) during every test's setup, call and
teardown; code objects of files under the workspace are kept, keyed by
(repo-relative path, ``co_firstlineno``).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

from looprl.errors import SandboxError, TaskError
from looprl.rewards.tests import run_tests
from looprl.tasks.sources import PackageSnapshot
from looprl.tasks.timing import stage

PLUGIN_MODULE = "_looprl_callmap"
OUTPUT_FILE = ".looprl-callmap.json"
PLUGIN_SOURCE = '''\
"""looprl: record which functions of the workspace each test calls (written by looprl)."""
import json, os, sys, threading

import pytest

_ROOT = os.getcwd() + os.sep
_seen = set()
_map = {}


def _tracer(frame, event, arg):
    _seen.add(frame.f_code)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _seen.clear()
    threading.settrace(_tracer)
    sys.settrace(_tracer)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)
        keys = set()
        for code in _seen:
            if code.co_filename.startswith("<"):
                continue
            path = os.path.abspath(code.co_filename)
            if path.startswith(_ROOT):
                keys.add(path[len(_ROOT):] + ":" + str(code.co_firstlineno))
        _map[item.nodeid] = sorted(keys)


def pytest_sessionfinish(session, exitstatus):
    with open(os.path.join(_ROOT, "OUTPUT"), "w") as f:
        json.dump(_map, f)
'''.replace("OUTPUT", OUTPUT_FILE)


def def_line(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The line Python reports as a function's ``co_firstlineno`` (its first decorator)."""
    return min([fn.lineno, *(d.lineno for d in fn.decorator_list)])


@dataclass(frozen=True)
class CallMap:
    """'path:line' of a function -> node ids of the recorded passing tests that called it."""

    tests_by_function: dict[str, tuple[str, ...]]

    def tests_for(self, path: str, line: int) -> tuple[str, ...]:
        return self.tests_by_function.get(f"{path}:{line}", ())

    def to_json(self) -> str:
        return json.dumps({k: list(v) for k, v in sorted(self.tests_by_function.items())})

    @classmethod
    def from_json(cls, text: str) -> CallMap:
        return cls({k: tuple(v) for k, v in json.loads(text).items()})

    @classmethod
    def from_per_test(cls, per_test: dict[str, list[str]], passing: tuple[str, ...]) -> CallMap:
        """Invert the plugin's {node id: ['path:line', ...]} over the recorded passing tests."""
        out: dict[str, list[str]] = {}
        for node in passing:  # in the snapshot's (collection) order
            for key in per_test.get(node, ()):
                out.setdefault(key, []).append(node)
        return cls({k: tuple(v) for k, v in out.items()})


def _cache_file(snap: PackageSnapshot) -> Path:
    return Path(snap.repo).parent / "callmap.json"


async def record_coverage(snap: PackageSnapshot, *, timeout_s: float | None = None) -> CallMap:
    """The call map of ``snap``'s passing tests (cached next to its repo). Raises ``TaskError``
    when the traced run does not reproduce the recorded passing tests."""
    cache = _cache_file(snap)
    if cache.is_file():
        return CallMap.from_json(cache.read_text())
    from looprl.sandbox import create_sandbox

    root = "" if snap.pythonpath == "." else snap.pythonpath + "/"
    timeout = timeout_s or max(120.0, 6 * snap.suite_wall_s)
    with stage("coverage_map"):
        sb = await create_sandbox(snap.repo, venv=snap.venv)
        try:
            await sb.write(f"{root}{PLUGIN_MODULE}.py", PLUGIN_SOURCE.encode())
            run = await run_tests(sb, f"{snap.test_command} -p {PLUGIN_MODULE}",
                                  list(snap.test_targets), timeout_s=timeout)
            try:
                per_test = json.loads(await sb.read(OUTPUT_FILE))
            except Exception as e:  # noqa: BLE001 - no map, whatever the reason
                raise TaskError(f"{snap.key}: the traced test run wrote no call map ({e}); "
                                f"output tail:\n{run.output_tail[-800:]}") from None
        except SandboxError as e:
            raise TaskError(f"{snap.key}: the traced test run failed in the sandbox: {e}") from e
        finally:
            await sb.close()
    traced = sum(1 for t in snap.passing_tests if t in per_test)
    if traced < 0.9 * len(snap.passing_tests):
        raise TaskError(f"{snap.key}: the traced run mapped only {traced} of "
                        f"{len(snap.passing_tests)} passing tests")
    cmap = CallMap.from_per_test(per_test, snap.passing_tests)
    tmp = cache.with_name(cache.name + ".tmp")
    tmp.write_text(cmap.to_json())
    tmp.replace(cache)
    return cmap
