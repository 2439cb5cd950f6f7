"""The command launcher: one C exec (cgroups, rlimits, uid) prepared ahead, and the stock-tool
fallback chain; both must give each command the same limits and identity."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from looprl.errors import SandboxError, ToolError
from looprl.sandbox import SandboxLimits, create_sandbox
from looprl.sandbox import bwrap as bwrap_mod
from looprl.sandbox.cgroups import Cgroup
from looprl.sandbox.launch import Prepared, launcher_argv, launcher_path

from .conftest import needs_bwrap, run

pytestmark = needs_bwrap

LIMITS = SandboxLimits(open_files=77, processes=99, file_size_mb=3, cpu_s=42)
PROBE = "ulimit -n; ulimit -p; ulimit -f; ulimit -t; id -u"
EXPECTED = ["77", "99", str(3 * 2**20 // 512), "42", "1000"]  # ulimit -f counts 512-byte blocks


def _host_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def test_c_launcher_is_built_here() -> None:
    path = launcher_path()
    assert path is not None and os.access(path, os.X_OK), "cc is installed on this machine"


def test_prepared_launcher_is_set_up_before_the_command(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo, limits=LIMITS)
        try:
            ready = sb._ready
            assert ready is not None, "the first command's launcher is prepared at creation"
            pid = ready.proc.pid
            await asyncio.sleep(0.2)  # let it finish its setup; it must then be blocked, alive
            assert ready.proc.returncode is None
            assert _host_uid(pid) == sb.workspace.uid  # already dropped to the sandbox's uid
            if ready.cg.dirs:  # already inside its own cgroups
                assert all(str(pid) in (d / "cgroup.procs").read_text().split()
                           for d in ready.cg.dirs)
            limits = Path(f"/proc/{pid}/limits").read_text()
            assert re.search(r"Max open files\s+77\s+77", limits), limits
            r = await sb.exec(PROBE)
            assert r.ok and r.stdout.split() == EXPECTED, r
            for _ in range(200):  # refilled in the background for the next command
                if sb._ready is not None:
                    break
                await asyncio.sleep(0.01)
            assert sb._ready is not None and sb._ready is not ready
            r = await sb.exec(PROBE)  # the refilled one gives the same fresh limits
            assert r.ok and r.stdout.split() == EXPECTED, r
        finally:
            await sb.close()
    run(go())


def test_unused_launcher_exits_unrun_and_leaves_no_cgroups(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        ready = sb._ready
        assert ready is not None
        dirs = list(ready.cg.dirs)
        await sb.close()
        assert ready.proc.returncode == 0  # reaped: it saw EOF and ran nothing
        assert not any(d.exists() for d in dirs)
    run(go())


def test_prepared_in_another_event_loop_is_replaced(base_repo: Path) -> None:
    sb = run(create_sandbox(base_repo))  # its prepared launcher belongs to that (closed) loop
    try:
        r = run(sb.exec("echo second loop"))
        assert r.ok and r.stdout == "second loop\n"
    finally:
        run(sb.close())


def test_launcher_setup_failure_is_infra(base_repo: Path) -> None:
    async def go():
        path = launcher_path()
        assert path is not None
        pipe = os.pipe()
        chain = launcher_argv(path, ["/nonexistent/cgroup.procs"], [], None, pipe[0])
        prepared = Prepared.spawn(chain, Cgroup(1, 1, enabled=False), pipe)
        with pytest.raises(SandboxError, match="cannot join cgroup") as e:
            await bwrap_mod.run_bwrap(["/bin/true"], timeout_s=5, limits=SandboxLimits(),
                                      prepared=prepared)
        assert e.value.is_infra
    run(go())


def test_nul_in_command_is_the_callers_error(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            with pytest.raises(ToolError, match="NUL"):
                await sb.exec("echo a\0b")
            assert (await sb.exec("echo still fine")).ok
        finally:
            await sb.close()
    run(go())


def test_stock_tool_chain_gives_the_same_limits(base_repo: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPRL_SANDBOX_LAUNCHER", "tools")
    launcher_path.cache_clear()
    try:
        async def go():
            sb = await create_sandbox(base_repo, limits=LIMITS)
            try:
                assert sb._ready is None  # nothing can be prepared ahead with stock tools
                r = await sb.exec(PROBE)
                assert r.ok and r.stdout.split() == EXPECTED, r
                r = await sb.exec("sleep 30", timeout_s=0.3)
                assert r.timed_out
            finally:
                await sb.close()
        run(go())
    finally:
        monkeypatch.delenv("LOOPRL_SANDBOX_LAUNCHER")
        launcher_path.cache_clear()
