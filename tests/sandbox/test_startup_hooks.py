"""Python start-up hooks the agent plants: a ``usercustomize.py`` in the sandbox's home (which
outlives each command) and a ``sitecustomize.py`` in the workspace.

Decided behaviour: the agent's own commands run as on any machine of its own (its home's hooks
and its workspace's apply); the harness's test tool runs in a fresh home with the user site off
(``harness_command``), so the home's hooks never reach it, while the workspace — the agent's code,
shown in its diff — reaches it as any run of those tests; the linter is immune (a native ruff run
``--isolated``); the grader's run, in a fresh sandbox under ``python -I``, runs neither and flags
the workspace hook (``startup_hook``).
"""

from __future__ import annotations

import asyncio
import sys
import sysconfig
from pathlib import Path

from looprl.harness.tools import ToolContext
from looprl.harness.tools.read_lints import ReadLints
from looprl.harness.tools.run_tests import RunTests
from looprl.rewards.tests import grade
from looprl.sandbox import create_sandbox
from looprl.types import Grader, Task

from .conftest import needs_bwrap, run

pytestmark = needs_bwrap
SITE = sysconfig.get_paths()["purelib"]  # this venv's: pytest, for the system interpreter
# the system interpreter (user site on, unlike a venv's) with this venv's pytest on its path
TESTS = f"PYTHONPATH=.:{SITE} /usr/bin/python3 -m pytest -p no:cacheprovider -o addopts="
PLANT = ("d=$(/usr/bin/python3 -c 'import site; print(site.getusersitepackages())') && "
         "mkdir -p $d ~/.config/ruff && "
         "echo \"open('$PWD/HOOKS', 'a').write('user ')\" > $d/usercustomize.py && "
         "echo \"open('$PWD/HOOKS', 'a').write('site ')\" > sitecustomize.py && "
         "printf '[lint]\\nignore = [\"F401\"]\\n' > ~/.config/ruff/ruff.toml && "
         "printf 'import os\\n' > unused.py")


async def _hooks(sb) -> list[str]:
    r = await sb.exec("cat HOOKS 2>/dev/null; rm -f HOOKS")
    return r.stdout.split()


def test_home_hooks_reach_the_agents_commands_but_not_the_harness_tools(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo, venv=sys.prefix)
        try:
            assert (await sb.exec(PLANT)).ok
            await _hooks(sb)
            await sb.exec("/usr/bin/python3 -c pass")  # the agent's own command
            mine = await _hooks(sb)
            ctx = ToolContext(sandbox=sb)
            report = await RunTests(test_command=TESTS).run({}, ctx)
            theirs = await _hooks(sb)
            lints = await ReadLints().run({"paths": ["unused.py"]}, ctx)
            return sb.root is not None, mine, report, theirs, lints
        finally:
            await sb.close()
    shared_tmp, mine, report, theirs, lints = run(go())
    # a sandbox with its own root keeps /tmp (its home) across commands; without one each
    # command has a fresh /tmp, so nothing in the home carries over to begin with
    assert mine == (["user"] if shared_tmp else [])
    assert "1 failed" in report, report  # the real outcome: pkg.calc.add is still wrong
    assert theirs == ["site"]  # the workspace's hook ran (the agent's code); the home's did not
    assert "F401" in lints, lints  # ~/.config/ruff did not silence the linter


def test_the_graders_run_takes_neither_hook_and_flags_the_workspaces(base_repo: Path) -> None:
    task = Task("calc", str(base_repo), "fix add", venv=sys.prefix,
                grader=Grader("PYTHONPATH=. python -m pytest -p no:cacheprovider -o addopts=",
                              ("tests/test_calc.py::test_add",),
                              test_files=("tests/test_calc.py",), timeout_s=60))

    async def agent() -> str:
        sb = await create_sandbox(base_repo, venv=sys.prefix)
        try:
            assert (await sb.exec(PLANT.replace("open(", "print('HOOK-RAN') or open(") +
                                  " && sed -i 's/a - b/a + b/' pkg/calc.py")).ok
            return await sb.diff()
        finally:
            await sb.close()
    diff = run(agent())
    assert "b/sitecustomize.py" in diff
    g = asyncio.run(grade(task, diff, cache=False))
    assert "startup_hook" in g.flags and "HOOK-RAN" not in g.output_tail, g
    assert g.tests == {"tests/test_calc.py::test_add": "passed"}, g
