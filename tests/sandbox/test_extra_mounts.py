"""A sandbox's workspace at a chosen path (a task's WORKDIR) and extra host directories
(``Mount``: a verifier's pristine tests read-only, its output directory writable), every way a
command can be started."""

import asyncio
import os

import pytest

from looprl.sandbox import Mount, create_sandbox
from looprl.sandbox.launch import launcher_path
from tests.bwrap_support import needs_bwrap

pytestmark = needs_bwrap
PATHS = ["rooted", "bwrap_per_command", "stock_tools"]


@pytest.mark.parametrize("path", PATHS)
def test_workdir_and_extra_mounts(tmp_path, monkeypatch, path):
    from looprl.sandbox import bwrap as bwrap_mod

    if path == "rooted" and not bwrap_mod.can_root(["/app"]):
        pytest.skip("sandbox roots need root and a C compiler")
    if path != "rooted":
        monkeypatch.setattr(bwrap_mod, "can_root", lambda paths: False)
    if path == "stock_tools":
        monkeypatch.setenv("LOOPRL_SANDBOX_LAUNCHER", "tools")
        launcher_path.cache_clear()
    repo, tests, logs = tmp_path / "repo", tmp_path / "tests", tmp_path / "logs"
    for d in (repo, tests, logs):
        d.mkdir()
    logs.chmod(0o777)
    (repo / "a.txt").write_text("in the workspace\n")
    (tests / "check.sh").write_text("echo checked\n")

    async def go():
        sb = await create_sandbox(repo, workdir="/app", mounts=(
            Mount(str(tests), "/tests"), Mount(str(logs), "/logs", readonly=False)))
        try:
            r = await sb.exec("pwd; cat /app/a.txt; sh /tests/check.sh; echo 1 > /logs/out; "
                              "echo x > /tests/check.sh; echo y > b.txt")
            return r, await sb.diff()
        finally:
            await sb.close()

    try:
        r, diff = asyncio.run(go())
    finally:
        launcher_path.cache_clear()
    assert r.stdout.split("\n")[:3] == ["/app", "in the workspace", "checked"]
    assert "Read-only file system" in r.stderr
    assert (tests / "check.sh").read_text() == "echo checked\n"
    assert (logs / "out").read_text() == "1\n"
    assert "+++ b/b.txt" in diff and not (repo / "b.txt").exists()
    assert os.stat(logs / "out").st_uid != 0 or os.geteuid() != 0  # the sandbox's own uid wrote it
