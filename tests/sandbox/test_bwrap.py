"""BwrapSandbox: commands, limits plumbing, file API, errors (attacks live in test_attacks.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from looprl.errors import SandboxError, SandboxUnavailableError, ToolError
from looprl.protocols import Sandbox
from looprl.sandbox import SandboxLimits, create_sandbox
from looprl.sandbox import command as command_mod
from looprl.sandbox.root import LAUNCH

from .conftest import needs_bwrap, run

pytestmark = needs_bwrap


@pytest.mark.slow  # two pytest runs inside the sandbox: ~3 s idle, more on a busy machine
def test_runs_the_repos_tests_with_the_venv(base_repo: Path, venv: str) -> None:
    async def go():
        sb = await create_sandbox(base_repo, venv)
        try:
            assert isinstance(sb, Sandbox)
            r = await sb.exec("python -m pytest -q -p no:cacheprovider tests", timeout_s=60)
            assert r.exit_code == 1 and "assert 0 == 4" in r.stdout, r.stdout + r.stderr
            await sb.write("pkg/calc.py", b"def add(a, b):\n    return a + b\n")
            r = await sb.exec("python -m pytest -q -p no:cacheprovider tests", timeout_s=60)
            assert r.ok and "1 passed" in r.stdout, r.stdout + r.stderr
            assert "+    return a + b" in await sb.diff()
        finally:
            await sb.close()
    run(go())


def test_exit_code_env_cwd_and_identity(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            r = await sb.exec("echo $FOO; pwd; id -u; exit 3", env={"FOO": "bar"})
            assert r.exit_code == 3 and not r.timed_out
            foo, cwd, uid = r.stdout.split()
            assert (foo, cwd, uid) == ("bar", str(base_repo), "1000")
            r = await sb.exec("echo made > out.txt && ls")
            assert "out.txt" in r.stdout and (await sb.read("out.txt")) == b"made\n"
            assert not (base_repo / "out.txt").exists()
        finally:
            await sb.close()
    run(go())


@pytest.mark.parametrize(("cmd", "direct"), [
    ("true", True), ("ls -a --color=never", True), ("python -m pytest -q t.py::test_x", True),
    ("echo hi", False), ("exit 3", False), ("ls | wc -l", False), ("cat *.py", False),
    ("FOO=1 true", False), ("grep -n 'a b' f", False), ("./run.sh", False), ("/bin/ls", False),
    ("no-such-program-xyz", False), ("ls ~", False), ("ls $HOME", False), ("true\nfalse", False),
    ("true\rx", False), ("", False), ("  true\t", True)])
def test_plain_command_lines_skip_the_shell(cmd: str, direct: bool, venv: str) -> None:
    argv = command_mod.command_argv(cmd, venv, None)
    assert (argv[:2] != ["/bin/sh", "-c"]) == direct, argv
    if direct:
        assert os.path.isabs(argv[0]) and argv[1:] == cmd.split()[1:]
    else:
        assert argv == ["/bin/sh", "-c", cmd]
    assert command_mod.command_argv(cmd, venv, {"PATH": "/usr/bin"})[:2] == ["/bin/sh", "-c"]


def test_program_lookup_agrees_with_shutil_which(tmp_path: Path) -> None:
    dirs = [tmp_path / n for n in ("a", "b", "c", "d")]
    for d in dirs:
        d.mkdir()
    (dirs[0] / "tool").mkdir()  # a directory named like it: skipped
    (dirs[1] / "tool").write_text("#!/bin/sh\n")  # not executable: skipped
    for d in dirs[2:]:
        (d / "tool").write_text("#!/bin/sh\n")
        (d / "tool").chmod(0o755)
    os.symlink(dirs[3] / "tool", dirs[1] / "link")  # a link to an executable: found
    path = ":".join(map(str, dirs))
    for name in ("tool", "link", "missing"):
        assert command_mod._which(name, path) == shutil.which(name, path=path), name
    assert command_mod._which("tool", path) == f"{dirs[2]}/tool"


def test_direct_and_shell_commands_agree(base_repo: Path, venv: str) -> None:
    """The same command line run directly and through the shell (a quoted word forces it):
    same output and exit code; a missing program is the command's failure (127), not ours."""
    async def go():
        sb = await create_sandbox(base_repo, venv)
        try:
            for plain, quoted in [("ls -a --color=never", "'ls' -a --color=never"),
                                  ("python -c pass", "'python' -c pass"),
                                  # in the venv and in /usr/bin: the venv's (PATH order)
                                  ("python3 -m sysconfig", "'python3' -m sysconfig"),
                                  ("env", "'env'"),
                                  ("false", "'false'"), ("true\nfalse", "'true'\nfalse")]:
                a, b = await sb.exec(plain), await sb.exec(quoted)
                assert (a.exit_code, sorted(a.stdout.splitlines())) == \
                    (b.exit_code, sorted(b.stdout.splitlines())), (plain, a, b)  # env: any order
            r = await sb.exec("python -c pass")
            assert r.ok, r
            r = await sb.exec("no-such-program-xyz --flag")
            assert r.exit_code == 127 and "not found" in r.stderr, r
        finally:
            await sb.close()
    run(go())


def test_timeout_and_output_cap(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo, limits=SandboxLimits(output_bytes=1000))
        try:
            # 2 s: on a loaded machine the sandboxed shell may take over 0.5 s to print
            r = await sb.exec("echo start; sleep 30", timeout_s=2.0)
            assert r.timed_out and r.exit_code is None and r.wall_s < 8
            assert "start" in r.stdout and "timed out" in r.stderr
            r = await sb.exec("seq 1 100000", timeout_s=20)
            assert r.ok and r.truncated and len(r.stdout) < 1200
            assert r.stdout.startswith("1\n2\n") and r.stdout.rstrip().endswith("100000")
            assert "bytes truncated" in r.stdout
        finally:
            await sb.close()
    run(go())


def test_file_api_read_write_walk(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            await sb.write("new/dir/f.txt", b"hello")
            assert await sb.read("new/dir/f.txt") == b"hello"
            r = await sb.exec("cat new/dir/f.txt")
            assert r.stdout == "hello"
            await sb.exec("mkdir -p pkg/__pycache__ && touch pkg/__pycache__/x.pyc")
            paths = {e.path: e.kind for e in await sb.walk()}
            assert paths["new/dir/f.txt"] == "file" and paths["pkg/sub"] == "dir"
            assert not any("__pycache__" in p for p in paths)
            assert [e.path for e in await sb.walk("pkg/sub")] == ["pkg/sub/data.txt"]
            assert len(await sb.walk(max_entries=3)) == 3
            with pytest.raises(ToolError, match="not found"):
                await sb.read("missing.py")
            with pytest.raises(ToolError, match="not a regular file"):
                await sb.read("pkg")
        finally:
            await sb.close()
    run(go())


def test_fork_from_a_live_sandbox(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        await sb.exec("echo mid-episode > state.txt")
        kids = await sb.fork(2)
        try:
            r = await kids[0].exec("cat state.txt && echo k0 > k.txt")
            assert r.stdout == "mid-episode\n"
            r = await kids[1].exec("cat k.txt")
            assert r.exit_code != 0, "siblings must not see each other's writes"
        finally:
            for s in (sb, *kids):
                await s.close()
    run(go())


def test_closed_sandbox_raises_infra_error(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        await sb.close()
        with pytest.raises(SandboxError):
            await sb.exec("true")
        with pytest.raises(SandboxError):
            await sb.read("README.md")
    run(go())


def test_broken_sandbox_machinery_is_infra_not_a_command_failure(base_repo: Path) -> None:
    async def go():
        sb = await create_sandbox(base_repo)
        try:
            if sb.root is not None:  # the root's launcher vanishes: bwrap cannot start it
                (sb.root.dir / LAUNCH.lstrip("/")).unlink()
                if sb._ready is not None:
                    sb._ready.discard()
                    sb._ready = None
            else:  # the venv bind source vanishes: bubblewrap cannot set up
                sb.venv = str(base_repo.parent / "vanished-venv")
            with pytest.raises(SandboxError) as e:
                await sb.exec("true")
            assert e.value.is_infra
        finally:
            await sb.close()
    run(go())


def test_missing_bwrap_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    command_mod.check_bwrap.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
            command_mod.check_bwrap()
    finally:
        command_mod.check_bwrap.cache_clear()
        monkeypatch.undo()
        assert shutil.which("bwrap")


def test_userns_off_says_which_sysctl(monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = Path(tempfile.mkdtemp())  # world-readable: the check runs bwrap unprivileged
    tmp_path.chmod(0o755)
    fake = tmp_path / "bwrap"  # a bwrap that fails like a kernel with user namespaces disabled
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    for tool in ("prlimit", "setpriv"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    command_mod.check_bwrap.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        with pytest.raises(SandboxUnavailableError, match="sysctl"):
            command_mod.check_bwrap()
    finally:
        command_mod.check_bwrap.cache_clear()
        shutil.rmtree(tmp_path)


def test_limits_are_reported_as_kills(base_repo: Path, venv: str) -> None:
    async def go():
        sb = await create_sandbox(base_repo, venv, limits=SandboxLimits(memory_mb=64, cpu_s=1))
        try:
            r = await sb.exec("python -c 'x = bytearray(300 << 20); x[::4096] = b\"1\" * len(x[::4096])'",
                              timeout_s=30)
            assert r.exit_code is None and "out of memory" in r.stderr, r
            r = await sb.exec("python -c 'while True: pass'", timeout_s=30)
            assert r.exit_code is None and not r.timed_out and "CPU time limit" in r.stderr, r
            assert (await sb.exec("echo still fine")).ok
        finally:
            await sb.close()
    run(go())


def test_base_owned_by_another_uid_still_editable(base_repo: Path) -> None:
    os.chown(base_repo / "pkg" / "calc.py", 1234, 1234)  # as a tarball extracted as-is would be

    async def go():
        sb = await create_sandbox(base_repo)
        try:
            assert sb.cow_backend == "copy"  # the idmap cannot show uid 1234 as the sandbox's
            r = await sb.exec("echo '# edited' >> pkg/calc.py && tail -1 pkg/calc.py")
            assert r.stdout == "# edited\n", r
            assert "+# edited" in await sb.diff()
        finally:
            await sb.close()
    run(go())
    assert "edited" not in (base_repo / "pkg" / "calc.py").read_text()


def test_machine_without_a_syscall_table_runs_commands_unfiltered(
        base_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from looprl.sandbox import seccomp

    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    seccomp.program.cache_clear()
    try:
        assert seccomp.program() is None and seccomp.filter_fd() is None

        async def go():
            sb = await create_sandbox(base_repo)
            try:
                r = await sb.exec("grep Seccomp: /proc/self/status")
                assert r.ok and r.stdout.split() == ["Seccomp:", "0"], r
            finally:
                await sb.close()
        run(go())
    finally:
        seccomp.program.cache_clear()


def test_settle_waits_only_for_its_own_loops_reaping():
    """A server and a client in one process each run an event loop; a sandbox retiring on the
    other loop must not make this loop's settle() fail ("attached to a different loop")."""
    import asyncio

    other = asyncio.new_event_loop()
    pending = other.create_future()  # another loop's reaping, still going
    command_mod._RETIRING.add(pending)
    try:
        run(asyncio.wait_for(command_mod.settle(), 5))
    finally:
        command_mod._RETIRING.discard(pending)
        other.close()
