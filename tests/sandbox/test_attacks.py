"""Adversarial tests: each evil command must fail AND leave the host unharmed.

Every attack runs in a fresh sandbox with small limits; ``host_guard`` checks afterwards that the
base repository and the venv are byte-identical, that nothing appeared outside the workspace, and
that no process the attack started survived.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from looprl.errors import ToolError
from looprl.sandbox import SandboxLimits, create_sandbox, seccomp
from looprl.types import ExecResult
from tests.bwrap_support import START_PATHS, use_start_path

from .conftest import needs_bwrap, run, tree_hash

pytestmark = needs_bwrap
MARK = "4242.4242"  # a unique sleep duration: lets the guard find leftover attack processes
SMALL = SandboxLimits(cpu_s=2, memory_mb=128, address_space_mb=1024, file_size_mb=8,
                      open_files=64, processes=32, disk_mb=16, tmp_mb=8, output_bytes=4000)


@dataclass
class Host:
    base: Path
    venv: str
    outside: Path  # a host directory outside the workspace, with a secret in it
    secret: Path
    listener_port: int
    accepted: list[int] = field(default_factory=list)


def leftover_pids() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if MARK.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
    return out


@pytest.fixture()
def host(base_repo: Path, venv: str, tmp_path: Path):
    outside = tmp_path / "host-private"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("TOP-SECRET-HOST-DATA\n")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    h = Host(base_repo, venv, outside, secret, srv.getsockname()[1])
    stop = threading.Event()

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                h.accepted.append(1)
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=accept_loop, daemon=True)
    t.start()
    base_before, venv_before = tree_hash(base_repo), tree_hash(Path(venv) / "bin")
    devnull = os.stat("/dev/null")
    yield h
    stop.set()
    t.join()
    srv.close()
    # the host is unharmed, whatever the attack was
    assert tree_hash(base_repo) == base_before, "the base repository was modified"
    assert tree_hash(Path(venv) / "bin") == venv_before, "the venv was modified"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"], "wrote outside workspace"
    assert secret.read_text() == "TOP-SECRET-HOST-DATA\n"
    assert not Path("/usr/pwned").exists() and not Path("/tmp/pwned-by-sandbox").exists()
    assert not h.accepted, "the sandbox reached a host loopback port"
    now = os.stat("/dev/null")
    assert (now.st_mode, now.st_uid, now.st_mtime_ns) == (
        devnull.st_mode, devnull.st_uid, devnull.st_mtime_ns), "host /dev/null was changed"
    assert leftover_pids() == [], "an attack process outlived its command"


def sh(h: Host, cmd: str, timeout_s: float = 10, limits: SandboxLimits = SMALL) -> ExecResult:
    async def go():
        sb = await create_sandbox(h.base, h.venv, limits=limits)
        try:
            return await sb.exec(cmd, timeout_s=timeout_s)
        finally:
            await sb.close()
    return run(go())


def py(code: str) -> str:
    return "python - <<'EOF'\n" + code + "\nEOF"


# (name, command with {secret}/{outside}/{port}/{venv}/{mark}, check(result) -> attack failed)
SHELL_ATTACKS = [
    ("read_host_file", "cat {secret}", lambda r: r.exit_code != 0 and "TOP-SECRET" not in r.stdout),
    ("list_host_dir", "ls {outside}", lambda r: r.exit_code != 0),
    ("read_shadow", "cat /etc/shadow", lambda r: r.exit_code != 0),
    ("write_outside", "echo x > {outside}/pwned", lambda r: r.exit_code != 0),
    ("write_usr", "touch /usr/pwned", lambda r: r.exit_code != 0),
    ("write_etc_passwd", "echo 'evil::0:0::/:/bin/sh' >> /etc/passwd", lambda r: r.exit_code != 0),
    ("write_venv", "touch {venv}/bin/pwned; echo x >> {venv}/bin/activate",
     lambda r: r.exit_code != 0),
    ("symlink_escape_shell", "ln -s {secret} leak && cat leak",
     lambda r: "TOP-SECRET" not in r.stdout),
    ("dotdot_escape_shell", "cat ../../../../../../{secret}", lambda r: r.exit_code != 0),
    ("tamper_base", "echo evil > pkg/calc.py && rm -rf tests README.md && cat pkg/calc.py",
     lambda r: r.stdout == "evil\n"),  # works in the workspace only; the guard checks the base
    ("chmod_host_device", "chmod 600 /dev/null", lambda r: r.exit_code != 0),
    ("touch_host_device", "touch -m /dev/null", lambda r: r.exit_code != 0),
    ("sysctl_write", "echo 1 > /proc/sys/vm/drop_caches", lambda r: r.exit_code != 0),
    ("see_host_processes", "ls /proc | grep -E '^[0-9]+$' | wc -l",  # bwrap's init, the
     lambda r: r.ok and int(r.stdout) <= 6),  # launcher, sh and the pipeline's 3: nothing else
    ("kill_host_processes", "kill -9 -1; kill -9 1; kill -TERM $PPID; echo alive",
     lambda r: True),  # the guard and the test process surviving are the check
    ("connect_host_loopback", py("import socket; socket.create_connection(('127.0.0.1', {port}), 2)"),
     lambda r: r.exit_code != 0 and "Error" in r.stderr),
    ("dns_lookup", py("import socket; print(socket.getaddrinfo('pypi.org', 443))"),
     lambda r: r.exit_code != 0),
    ("internet_connect", py("import socket; socket.create_connection(('1.1.1.1', 53), 2)"),
     lambda r: r.exit_code != 0),
    ("become_root", py("import os; os.setuid(0)"), lambda r: r.exit_code != 0),
    ("capabilities", "grep CapEff /proc/self/status",
     lambda r: r.stdout.split()[1] == "0000000000000000"),
    ("nested_userns", "unshare -r id", lambda r: r.exit_code != 0),
    ("mount_tmpfs", "mount -t tmpfs none /mnt", lambda r: r.exit_code != 0),
    ("change_hostname", "hostname evil-host", lambda r: r.exit_code != 0),
    ("raw_disk", "ls /dev; cat /dev/vda | head -c 10", lambda r: "vda" not in r.stdout),
    ("setuid_binary", "cp /bin/sh ./rootsh && chmod u+s ./rootsh && ./rootsh -c 'id -u'",
     lambda r: r.stdout.strip().splitlines()[-1:] != ["0"]),
    ("fork_bomb", "bomb() {{ bomb | bomb & }}; bomb; sleep 1; echo survived",
     lambda r: "Cannot fork" in r.stderr),  # the pids cgroup; the guard checks none survived
    ("memory_bomb", py("x = bytearray(1 << 30); print('allocated')"),
     lambda r: "allocated" not in r.stdout),
    ("memory_bomb_children", "for i in 1 2 3 4; do python -c 'x=bytearray(60<<20); import time; "
     "time.sleep(0.5)' & done; wait; echo ok", lambda r: True),
    ("disk_fill_one_file", "head -c 100000000 /dev/zero > big; ls -l big",
     lambda r: r.exit_code != 0 or "100000000" not in r.stdout),
    ("disk_fill_many_files", "for i in $(seq 1 40); do head -c 4000000 /dev/zero > f$i || "
     "exit 9; done", lambda r: r.exit_code != 0),
    ("tmp_fill", "for i in $(seq 1 20); do head -c 4000000 /dev/zero > /tmp/f$i || exit 9; done",
     lambda r: r.exit_code != 0),
    ("cpu_burn", py("while True: pass"), lambda r: r.exit_code is None),
    ("output_flood", "head -c 30000000 /dev/zero | tr '\\0' x",
     lambda r: r.ok and r.truncated and len(r.stdout) < 5000),
    ("open_files", py("fs = [open('/dev/null') for _ in range(10000)]"),
     lambda r: r.exit_code != 0 and "Too many open files" in r.stderr),
]


@pytest.mark.parametrize("name,cmd,failed", SHELL_ATTACKS, ids=[a[0] for a in SHELL_ATTACKS])
def test_shell_attack(host: Host, name: str, cmd: str, failed) -> None:
    r = sh(host, cmd.format(secret=host.secret, outside=host.outside, port=host.listener_port,
                            venv=host.venv, mark=MARK), timeout_s=5)
    assert failed(r), f"attack {name} was not stopped: {r}"
    assert r.wall_s < 15


def test_orphan_is_gone_after_timeout(host: Host) -> None:
    r = sh(host, f"(sleep {MARK} &) ; setsid sleep {MARK} & nohup sleep {MARK} & sleep {MARK}",
           timeout_s=1)
    assert r.timed_out and r.exit_code is None
    time.sleep(0.2)
    assert leftover_pids() == []


def test_orphan_is_gone_after_normal_exit(host: Host) -> None:
    r = sh(host, f"setsid nohup sleep {MARK} > /dev/null 2>&1 & echo spawned")
    assert r.ok and r.stdout == "spawned\n"
    assert leftover_pids() == []


def test_infinite_loop_is_killed_on_time(host: Host) -> None:
    t0 = time.monotonic()
    r = sh(host, "while :; do :; done", timeout_s=1)
    assert r.timed_out and time.monotonic() - t0 < 6


def test_file_api_refuses_escapes(host: Host) -> None:
    async def go():
        sb = await create_sandbox(host.base, limits=SMALL)
        try:
            await sb.exec(f"ln -s {host.secret} leak; ln -s {host.outside} outdir; "
                          "ln -s ../.. up; ln -s /etc/passwd pw")
            bad_reads = ["leak", "pw", "up/repo/README.md", "../host-private/secret.txt",
                         str(host.secret), "/etc/passwd", "pkg/../../host-private/secret.txt"]
            for p in bad_reads:
                with pytest.raises(ToolError):
                    await sb.read(p)
            for p in ["outdir/pwned", "../host-private/pwned", str(host.outside / "pwned"),
                      "up/pwned"]:
                with pytest.raises(ToolError):
                    await sb.write(p, b"x")
            await sb.write("leak", b"x")  # the link is replaced by a file, never written through
            assert (await sb.exec("test -f leak && ! test -L leak && cat leak")).stdout == "x"
            with pytest.raises(ToolError):
                await sb.walk("outdir")
            assert (await sb.read("pkg/calc.py")).startswith(b"def add")  # inside still works
        finally:
            await sb.close()
    run(go())


def test_file_api_wins_the_symlink_swap_race(host: Host) -> None:
    """A command swaps a directory for a symlink to the host over and over while the host reads,
    writes and lists through it: every operation lands inside the workspace or is refused."""
    name = host.secret.name

    async def go():
        sb = await create_sandbox(host.base, limits=dataclasses.replace(SMALL, cpu_s=30))
        try:
            swap = (f"while :; do rm -rf d; mkdir d; echo inside > d/{name}; rm -rf d; "
                    f"ln -s {host.outside} d; done")
            swapper = asyncio.ensure_future(sb.exec(swap, timeout_s=4))
            await asyncio.sleep(0.2)
            got, t_end = [], time.monotonic() + 3
            while time.monotonic() < t_end:
                for op in (sb.read(f"d/{name}"), sb.write(f"d/{name}", b"pwned"),
                           sb.walk("d")):
                    try:
                        got.append(await op)
                    except ToolError:
                        pass
            await swapper
            return got
        finally:
            await sb.close()
    got = run(go())
    assert got, "no operation ever succeeded: the race was not exercised"
    assert not any(isinstance(g, bytes) and b"TOP-SECRET" in g for g in got)
    assert host.secret.read_text() == "TOP-SECRET-HOST-DATA\n"
    assert sorted(p.name for p in host.outside.iterdir()) == [name]


def test_sandbox_still_usable_after_killing_its_own_init(host: Host) -> None:
    async def go():
        sb = await create_sandbox(host.base, limits=SMALL)
        try:
            await sb.exec("kill -9 1", timeout_s=5)
            r = await sb.exec("echo fine", timeout_s=5)
            assert r.ok and r.stdout == "fine\n"
        finally:
            await sb.close()
    run(go())


def test_host_can_still_fork_after_fork_bomb(host: Host) -> None:
    sh(host, "bomb() { bomb | bomb & }; bomb", timeout_s=2)
    assert subprocess.run(["true"]).returncode == 0
    assert os.getloadavg()  # the test process itself is alive and well


def test_fork_bomb_without_cgroups_is_stopped_by_the_sandbox_uid_nproc(host: Host) -> None:
    limits = SandboxLimits(cpu_s=2, processes=32, cgroups=False)
    r = sh(host, "bomb() { bomb | bomb & }; bomb; sleep 1; ps -e --no-headers | wc -l",
           timeout_s=4, limits=limits)
    assert "Cannot fork" in r.stderr, r
    assert subprocess.run(["true"]).returncode == 0


def test_cancelled_exec_kills_its_tree(host: Host) -> None:
    async def go():
        sb = await create_sandbox(host.base, limits=SMALL)
        try:
            with pytest.raises(asyncio.TimeoutError):  # the caller gives up, e.g. a rollout ends
                await asyncio.wait_for(sb.exec(f"sleep {MARK} & sleep {MARK}", timeout_s=60), 0.5)
            await asyncio.sleep(0.2)
            assert leftover_pids() == []
        finally:
            await sb.close()
    run(go())


SYSCALL_PROBE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for name, nr in {calls}:
    ctypes.set_errno(0)
    r = libc.syscall(nr, 0, 0, 0, 0, 0)
    print(name, r, ctypes.get_errno())
"""


def sh_by(h: Host, path: str, monkeypatch: pytest.MonkeyPatch, cmd: str,
          timeout_s: float = 10) -> ExecResult:
    """``sh`` with the command started the ``path`` way (skips where that way is unavailable)."""
    from looprl.sandbox.launch import launcher_path

    use_start_path(path, str(h.base), monkeypatch)
    try:
        return sh(h, cmd, timeout_s=timeout_s)
    finally:
        launcher_path.cache_clear()


@pytest.mark.parametrize("path", START_PATHS)
def test_harness_tools_run_inside_and_cannot_be_replaced(host: Host, path: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's ruff (what ``read_lints`` runs on model-written files) is in every sandbox,
    runs there, and a command can neither replace it, append to it nor remove it (the guard
    also checks the host's copy, in the venv's bin, is unchanged)."""
    from looprl.sandbox.mounts import TOOLS_DIR, harness_tools

    assert dict(harness_tools()).get("ruff"), "the test venv has ruff (a looprl dependency)"
    ruff = f"{TOOLS_DIR}/ruff"
    r = sh_by(host, path, monkeypatch,
              f"{ruff} --version; cp /bin/true {ruff} || echo a; echo x >> {ruff} || echo b; "
              f"cp /bin/true /tmp/t && mv /tmp/t {ruff} || echo c; rm -f {ruff} || echo d; "
              f"{ruff} --version")
    version = subprocess.run([dict(harness_tools())["ruff"], "--version"], capture_output=True,
                             text=True, check=True).stdout.split()
    assert r.stdout.split() == [*version, "a", "b", "c", "d", *version], r


@pytest.mark.skipif(seccomp.program() is None, reason="no syscall table for this machine")
@pytest.mark.parametrize("path", START_PATHS)
def test_kernel_interfaces_fail_with_eperm(host: Host, path: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every denied call fails with EPERM on each way a command can be started (a sandbox's
    prepared bwrap, bwrap per command, the stock-tool chain); an allowed one still works."""
    import platform

    table = seccomp._TABLES[platform.machine()][1]
    calls = [(n, table[n]) for n in seccomp.DENIED if n in table]
    calls.append(("getppid", {"x86_64": 110, "aarch64": 173}[platform.machine()]))
    r = sh_by(host, path, monkeypatch, py(SYSCALL_PROBE.format(calls=calls)), timeout_s=20)
    assert r.ok, r
    got = {line.split()[0]: (int(line.split()[1]), int(line.split()[2]))
           for line in r.stdout.splitlines()}
    assert got.pop("getppid")[0] > 0
    eperm = 1
    assert got == {n: (-1, eperm) for n, _ in calls if n != "getppid"}


def test_seccomp_off_lets_the_calls_through(host: Host) -> None:
    """The filter, not something else, is what denies them: without it, unshare(0) (no new
    namespace: allowed to anyone) succeeds."""
    probe = py("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "print(libc.unshare(0), ctypes.get_errno())")
    r = sh(host, probe, limits=dataclasses.replace(SMALL, seccomp=False))
    assert r.ok and r.stdout.split() == ["0", "0"], r
    r = sh(host, probe)
    assert r.ok and r.stdout.split() == ["-1", "1"], r
