"""A sandbox's workspace at a chosen path (a task's WORKDIR) and extra host directories
(``Mount``: a verifier's pristine tests read-only, its output directory writable), every way a
command can be started."""

import asyncio
import os

import pytest

from looprl.sandbox import Mount, create_sandbox
from looprl.sandbox.launch import launcher_path
from tests.bwrap_support import START_PATHS, needs_bwrap, use_start_path

pytestmark = needs_bwrap
@pytest.mark.parametrize("path", START_PATHS)
def test_workdir_and_extra_mounts(tmp_path, monkeypatch, path):
    use_start_path(path, "/app", monkeypatch)
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
