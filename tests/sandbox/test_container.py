"""The container backend behind the ``Sandbox`` protocol, against a real engine (Podman from
Debian's packages here) and an image built locally from a root filesystem (busybox, imported
with ``<engine> import``; nothing is pulled). Skipped, with the exact reason, where no engine
can run it."""

import asyncio
import subprocess
import time

import pytest

from looprl.errors import PathEscapeError, SandboxUnavailableError, ToolError
from looprl.sandbox import create_sandbox
from looprl.sandbox.container import ContainerSandbox, check_engine
from looprl.sandbox.mounts import Mount
from looprl.types import Image
from tests.container_support import BUSYBOX_IMAGE, engine_for

IMAGE = BUSYBOX_IMAGE


@pytest.fixture(scope="module")
def engine():
    return engine_for(IMAGE)


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    (r / "src" / "a.txt").write_text("hello\n")
    return r


def run(coro):
    return asyncio.run(coro)


async def _session(repo, tests, body):
    sb = await ContainerSandbox.create(repo, image=IMAGE, workdir="/app",
                                       mounts=(Mount(str(tests), "/tests"),))
    try:
        return await body(sb)
    finally:
        await sb.close()


@pytest.mark.slow
def test_commands_run_in_the_container_over_the_workspace(engine, repo, tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "t.sh").write_text("echo from-tests\n")

    async def body(sb):
        r = await sb.exec("pwd; cat src/a.txt; sh /tests/t.sh; ls /sys/class/net; id -u")
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.split()
        assert lines[:3] == ["/app", "hello", "from-tests"]
        assert lines[3:-1] == ["lo"]  # no network but a dead loopback
        assert lines[-1] != "0" or sb.workspace.uid is None  # not root, when we can map a uid
        assert (await sb.exec("exit 3")).exit_code == 3
        bad = await sb.exec("touch /tests/x")
        assert bad.exit_code != 0 and "Read-only" in bad.stderr
        await sb.write("src/b.txt", b"written on the host\n")
        r = await sb.exec("cat src/b.txt && echo made > src/c.txt")
        assert r.stdout == "written on the host\n"
        assert await sb.read("src/c.txt") == b"made\n"
        assert [e.path for e in await sb.walk("src")] == ["src/a.txt", "src/b.txt", "src/c.txt"]
        d = await sb.diff()
        assert "+++ b/src/b.txt" in d and "+++ b/src/c.txt" in d and "a.txt" not in d
        with pytest.raises(PathEscapeError):
            await sb.read("../etc/passwd")
        with pytest.raises(ToolError):
            await sb.read("src/missing.txt")
        # a link a command made: the file tools' message is bwrap's (one WorkspaceFiles), naming
        # where it leads as the container sees it (/app/src/a.txt -> 'src/a.txt')
        assert (await sb.exec("ln -s a.txt src/l.txt")).exit_code == 0
        with pytest.raises(PathEscapeError, match=r"is a symlink .*use the path it points to "
                                                  r"\('src/a.txt'\)"):
            await sb.read("src/l.txt")
        return sb.name

    name = run(_session(repo, tests, body))
    ps = subprocess.run([*engine, "ps", "-a", "--format", "{{.Names}}"], capture_output=True,
                        text=True)
    assert name not in ps.stdout  # close removed the container
    assert (repo / "src" / "a.txt").read_text() == "hello\n" and not (repo / "src" / "c.txt").exists()


@pytest.mark.slow
def test_a_command_over_its_time_limit_takes_all_it_started_with_it(engine, repo, tmp_path):
    async def body(sb):
        r = await sb.exec("sleep 300 & sleep 200", timeout_s=2)
        assert (r.timed_out, r.exit_code) == (True, None)
        after = await sb.exec("ps")
        assert after.exit_code == 0 and "sleep 300" not in after.stdout
        assert (await sb.exec("cat src/a.txt")).stdout == "hello\n"  # the workspace survives

    (tmp_path / "tests").mkdir()
    run(_session(repo, tmp_path / "tests", body))


def test_an_image_no_engine_has_is_unavailable_with_the_reason(engine):
    with pytest.raises(SandboxUnavailableError, match="not in its local store"):
        check_engine("localhost/looprl-no-such-image:0")


def _images(engine):
    out = subprocess.run([*engine, "images", "--format", "{{.Repository}}:{{.Tag}}"],
                         capture_output=True, text=True).stdout
    return {line for line in out.split() if "looprl-snap" in line}


@pytest.mark.slow
def test_fork_starts_each_child_at_the_state_workspace_and_root_filesystem(engine, repo):
    """What a command changed in the workspace and outside it (the container's own root
    filesystem) is in every fork; each fork's changes are its own; the committed image goes
    once the last fork closes."""
    before = _images(engine)

    async def body():
        sb = await create_sandbox(repo, image=Image(IMAGE, "/app"))
        try:
            assert isinstance(sb, ContainerSandbox)
            r = await sb.exec("echo ws > src/w.txt && echo root > /var/state/r.txt")
            assert r.exit_code == 0, r.stderr
            t0 = time.perf_counter()
            kids = await sb.fork(2)
            fork_s = time.perf_counter() - t0
            try:
                for i, kid in enumerate(kids):
                    r = await kid.exec(f"cat src/w.txt /var/state/r.txt; echo {i} > src/k.txt; "
                                       f"echo {i} > /var/state/k.txt")
                    assert r.stdout == "ws\nroot\n", r.stderr
                for i, kid in enumerate(kids):
                    r = await kid.exec("cat src/k.txt /var/state/k.txt")
                    assert r.stdout == f"{i}\n{i}\n"
                assert (await sb.exec("ls src /var/state")).stdout.split().count("k.txt") == 0
                assert "+++ b/src/k.txt" in await kids[0].diff()
                assert len(_images(engine) - before) == 1  # one commit, held by the forks
            finally:
                for kid in kids:
                    await kid.close()
            snap = await sb.snapshot()
            with pytest.raises(ValueError, match="is a container's: fork it with its task's image"):
                await create_sandbox(repo, snapshot=snap)  # never bubblewrap over its layer
            snap.release()
            await sb.reset()  # the pool's idle reuse: the base and a fresh container
            r = await sb.exec("ls src; ls /var/state")
            assert r.stdout.split() == ["a.txt"], r.stdout
        finally:
            await sb.close()
        return fork_s

    fork_s = run(body())
    assert fork_s < 60
    assert _images(engine) == before  # the committed image went with its last fork


def test_an_image_task_where_no_engine_is_installed_is_refused_naming_it(monkeypatch, repo):
    from looprl.sandbox import container

    monkeypatch.setattr(container, "_engines", lambda: [])
    container._probe.cache_clear()
    with pytest.raises(SandboxUnavailableError,
                       match=r"^cannot run containers of x:1: no container engine installed "
                             r"\(docker or podman\)$"):
        run(create_sandbox(repo, image=Image("x:1", "/app")))


@pytest.mark.slow
def test_the_pool_reuses_a_returned_container_reset_for_the_same_image(engine, repo):
    from looprl.sandbox.pool import SandboxPool

    async def body():
        pool = SandboxPool(max_running=1, warm=0)
        try:
            async with pool.lease(repo, image=Image(IMAGE, "/app")) as sb:
                first = sb.inner
                assert isinstance(first, ContainerSandbox)
                assert (await sb.exec("echo x > src/left.txt; echo y > /var/state/left")).ok
            async with pool.lease(repo, image=Image(IMAGE, "/app")) as sb:
                assert sb.inner is first and pool.metrics().warm_hits_total == 1
                r = await sb.exec("ls src /var/state")
                assert r.stdout.split() == ["/var/state:", "src:", "a.txt"], r.stdout
        finally:
            await pool.close()
        assert first.workspace.closed

    run(body())


@pytest.mark.slow
def test_the_harness_programs_are_bound_at_tools_dir_read_only(engine, repo):
    from looprl.sandbox.mounts import harness_tools

    async def body():
        sb = await create_sandbox(repo, image=Image(IMAGE, "/app"))
        try:
            r = await sb.exec(f"ls {sb.tools_dir}; touch {sb.tools_dir}/pytest_runner.py")
            return r.stdout.split(), r.exit_code
        finally:
            await sb.close()

    names, code = run(body())
    assert names == sorted(name for name, _ in harness_tools()) and code != 0
