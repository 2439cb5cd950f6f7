"""The container backend behind the ``Sandbox`` protocol, against a real engine (Podman from
Debian's packages here) and an image built locally from a root filesystem (busybox, imported
with ``<engine> import``; nothing is pulled). Skipped, with the exact reason, where no engine
can run it."""

import asyncio
import shutil
import subprocess

import pytest

from looprl.errors import PathEscapeError, SandboxUnavailableError, ToolError
from looprl.sandbox.container import ContainerSandbox, _engines, check_engine
from looprl.sandbox.mounts import Mount

IMAGE = "localhost/looprl-test:busybox"
_APPLETS = ("sh ls ln cat echo mkdir rm sleep grep test wc tr head tail id ps touch printf "
            "true false").split()


def _build_image() -> str | None:
    """Import a busybox root filesystem as ``IMAGE`` with each engine there; why not, or None."""
    busybox = shutil.which("busybox")
    if busybox is None:
        return "no busybox on this host to build a test image from (apt-get install busybox-static)"
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = f"{d}/rootfs"
        subprocess.run(["mkdir", "-p", f"{root}/bin", f"{root}/tmp"], check=True)
        shutil.copy(busybox, f"{root}/bin/busybox")
        for a in _APPLETS:
            subprocess.run(["ln", "-s", "busybox", f"{root}/bin/{a}"], check=True)
        tar = subprocess.run(["tar", "-C", root, "-c", "."], capture_output=True, check=True).stdout
        for engine in _engines():
            subprocess.run([*engine, "import", "-", IMAGE], input=tar, capture_output=True,
                           timeout=120)
    return None


@pytest.fixture(scope="module")
def engine():
    if not _engines():
        pytest.skip("no container engine installed (docker or podman)")
    why = _build_image()
    if why:
        pytest.skip(why)
    try:
        return check_engine(IMAGE)
    except SandboxUnavailableError as e:
        pytest.skip(str(e))


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
