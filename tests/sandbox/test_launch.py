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
from looprl.sandbox import command as command_mod
from looprl.sandbox.cgroups import Cgroup
from looprl.sandbox.launch import Prepared, launcher_argv, launcher_path
from tests.bwrap_support import START_PATHS, use_start_path

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
        pipe, status = os.pipe(), os.pipe()
        chain = launcher_argv(path, ["/nonexistent/cgroup.procs"], [], None, pipe[0])
        prepared = Prepared.spawn(chain, Cgroup(1, 1, enabled=False), pipe, status)
        with pytest.raises(SandboxError, match="cannot join cgroup") as e:
            await command_mod.run_bwrap(["/bin/true"], timeout_s=5, limits=SandboxLimits(),
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


# --- who failed: the status channel, never the command's output ------------------------------

@pytest.fixture(params=START_PATHS)
def start_path(request: pytest.FixtureRequest, base_repo: Path,
               monkeypatch: pytest.MonkeyPatch):
    """Sandboxes made while this fixture is active start commands the ``request.param`` way."""
    use_start_path(request.param, str(base_repo), monkeypatch)
    yield request.param
    monkeypatch.undo()
    launcher_path.cache_clear()


def test_a_command_cannot_pass_its_failure_off_as_the_sandboxes(base_repo: Path,
                                                                 start_path: str) -> None:
    """Model-written code printing what the machinery prints on failure, exiting with the
    launcher's failure status, or killing its parent, is still the command's own result."""
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            r = await sb.exec("echo 'bwrap: Creating new namespace failed: x' >&2; "
                              "echo 'looprl-launch: cannot join cgroup' >&2; exit 1")
            assert r.exit_code == 1 and r.stderr.startswith("bwrap:"), r
            r = await sb.exec("exit 125")
            assert r.exit_code == 125, r
            r = await sb.exec("ls /proc/self/fd")  # no status channel to write to: stdio only
            assert r.stdout.split() == ["0", "1", "2", "3"], r  # (3: ls's own listing)
            r = await sb.exec("kill -9 $PPID; sleep 1; exit 3", timeout_s=20)
            if start_path == "rooted":  # its parent is the launcher: the command killed it
                assert r.exit_code is None and "killed" in r.stderr and not r.timed_out, r
            else:  # its parent is bwrap's init, which no signal from inside reaches
                assert r.exit_code == 3, r
        finally:
            await sb.close()
    run(go())


def test_machinery_that_cannot_start_the_command_is_infra(base_repo: Path, start_path: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher (rooted: its child cannot enter the working directory, reported on the
    status channel) or bubblewrap (a system bind source vanished) fails before the command:
    ``SandboxError`` with the machinery's reason, and the command never ran."""
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            if start_path == "rooted":
                sb.workdir = str(base_repo.parent / "no-such-workdir")
                why = "looprl-launch: chdir"
            else:
                binds = command_mod.system_binds
                monkeypatch.setattr(command_mod, "system_binds",
                                    lambda: [*binds(), "--ro-bind", "/vanished-src", "/x"])
                why = "bwrap: Can't find source path /vanished-src"
            with pytest.raises(SandboxError, match=why) as e:
                await sb.exec("touch ran")
            assert e.value.is_infra
            assert not (Path(sb.workspace.path) / "ran").exists()
        finally:
            await sb.close()
    run(go())


def test_arguments_no_exec_can_take_are_the_callers_error(base_repo: Path,
                                                         start_path: str) -> None:
    """A command line over the kernel's per-argument limit would fail the exec inside the
    machinery; it is refused up front as the caller's ``ToolError``."""
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            with pytest.raises(ToolError, match="longer than the kernel takes"):
                await sb.exec("echo " + "x" * 200_000)
            r = await sb.exec("printf %s " + "x" * 100_000 + " | wc -c")
            assert r.stdout.strip() == "100000", r
        finally:
            await sb.close()
    run(go())


def test_status_channel_parsing() -> None:
    """``parse_status``'s examples: the launcher's lines and bubblewrap's records."""
    import doctest

    from looprl.sandbox import launch

    result = doctest.testmod(launch)
    assert result.attempted >= 5 and result.failed == 0
