"""One command under bubblewrap: its limits (``SandboxLimits``), its argv (the bwrap namespaces,
binds and seccomp filter, a plain command line exec'd directly, anything else through
``/bin/sh -c``), the launcher handshake that starts it (``prepare``, ``prepare_rooted``), and
``run_bwrap``, which runs it to its exit or its wall-clock timeout, kills the whole tree, and
returns its capped output. The sandbox that owns a workspace and runs such commands in it is
``bwrap.py`` (what the isolation covers and does not is told there).

    r = await run_bwrap(argv, timeout_s=60, limits=SandboxLimits())
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from looprl.errors import SandboxError, SandboxUnavailableError
from looprl.sandbox.cgroups import Cgroup
from looprl.sandbox.idmap import FIRST_UID
from looprl.sandbox.launch import (
    Capped,
    LaunchStatus,
    Prepared,
    check_env,
    drain,
    encode_argv,
    launcher_argv,
    launcher_exec_argv,
    launcher_path,
    pump,
    tool_chain,
)
from looprl.sandbox.mounts import (
    system_binds,
)
from looprl.sandbox.root import LAUNCH, SandboxRoot
from looprl.sandbox.seccomp import filter_fd
from looprl.types import ExecResult

T = TypeVar("T")


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox. Every command gets its own fresh set."""

    cpu_s: int = 300
    """RLIMIT_CPU per process, in CPU seconds (SIGXCPU, then SIGKILL)."""
    memory_mb: int = 2048
    """cgroup memory limit for the whole command tree (the OOM killer acts inside it)."""
    address_space_mb: int = 8192
    """RLIMIT_AS per process; generous because interpreters reserve virtual memory up front."""
    file_size_mb: int = 256
    """RLIMIT_FSIZE: largest file a process may write (SIGXFSZ / EFBIG beyond)."""
    open_files: int = 1024
    """RLIMIT_NOFILE per process."""
    processes: int = 256
    """pids cgroup limit for the command tree (the fork-bomb guard), also set as RLIMIT_NPROC."""
    disk_mb: int = 1024
    """Size of the tmpfs holding the workspace's changes: a disk quota (overlay backend only)."""
    tmp_mb: int = 256
    """Size of the private /tmp."""
    output_bytes: int = 64_000
    """Cap on captured stdout and on stderr, each (head and tail kept, a marker in between)."""
    cgroups: bool = True
    """Put each command in its own memory + pids cgroup (where writable). Costs one cgroup
    migration per command (an RCU grace period: ~1 ms idle, 10+ ms on a loaded host). Off, the
    guards are RLIMIT_NPROC (per sandbox: each has its own host uid) and RLIMIT_AS per process."""
    uid: int = 1000
    """uid/gid the command runs as inside the sandbox (never 0: no capabilities). On the host it
    is an unprivileged uid of its own (``idmap.py``) when looprl runs as root."""
    seccomp: bool = True
    """Run commands under ``seccomp.py``'s filter (kernel interfaces they have no use for fail
    with EPERM). Off only to compare, or for a workload that needs one of those calls."""


# ---------------------------------------------------------------- availability


@functools.lru_cache(maxsize=1)
def check_bwrap() -> str:
    """Path of a working bwrap, or ``SandboxUnavailableError`` saying how to get one."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailableError(
            "bubblewrap is not installed: `apt-get install bubblewrap` (Debian/Ubuntu) or "
            "`dnf install bubblewrap`, then retry")
    for tool in () if launcher_path() else ("prlimit", "setpriv"):
        if shutil.which(tool) is None:
            raise SandboxUnavailableError(f"`{tool}` is missing: install util-linux "
                                          "(`apt-get install util-linux`)")
    drop = functools.partial(_drop_to, FIRST_UID) if os.geteuid() == 0 else None
    # The probe binds what a sandbox binds (the read-only system), not the whole host root: a
    # recursive bind of / also takes in every other sandbox's mounts, and one that goes away
    # meanwhile (another process closing a sandbox) failed the probe as if namespaces were off.
    r = subprocess.run([path, "--unshare-all", "--unshare-user", *system_binds(), "true"],
                       capture_output=True, text=True, timeout=30, preexec_fn=drop)
    if r.returncode != 0:
        raise SandboxUnavailableError(
            f"bubblewrap cannot create namespaces here ({r.stderr.strip()}). Enable unprivileged "
            "user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` and "
            "`sysctl -w user.max_user_namespaces=15000` (or, under AppArmor, "
            "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`); in a container, run "
            "it with --privileged or a seccomp profile that allows unshare/clone(CLONE_NEWUSER)")
    return path


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def default_path(venv: str | None) -> str:
    """PATH of a sandboxed command the caller sets none for: the venv's bin, then the system's."""
    path = "/usr/local/bin:/usr/bin:/bin"
    return f"{venv}/bin:{path}" if venv else path


def command_env(venv: str | None, env: Mapping[str, str] | None,
                workdir: str | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed command: ours, then the caller's on top, then
    ``PWD`` = ``workdir`` (if given) as the shell exports it."""
    base_env = {"PATH": default_path(venv), "HOME": "/tmp", "USER": "sandbox",
                "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": "/tmp", "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1", "PIP_NO_INDEX": "1"}
    if venv:
        base_env["VIRTUAL_ENV"] = venv
    return {**base_env, **(env or {}), **({"PWD": workdir} if workdir else {})}


def _namespaces(bwrap: str, limits: SandboxLimits, seccomp_fd: int | None) -> list[str]:
    uid = str(limits.uid)
    filt = [] if seccomp_fd is None else ["--seccomp", str(seccomp_fd)]
    return [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", uid,
            "--gid", uid, "--hostname", "sandbox", "--die-with-parent", "--new-session", *filt]


@contextlib.contextmanager
def _filter_fd(limits: SandboxLimits) -> Iterator[int | None]:
    """A fresh fd with the seccomp program for one bwrap to read (None: off, or no table for
    this machine), closed here once the launcher holding it is spawned."""
    fd = filter_fd() if limits.seccomp else None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./:,+@%^-]+")
_PLAIN_ARG = re.compile(r"[A-Za-z0-9_./:,+@%^=-]+")
_SHELL_WORDS = frozenset(
    ". : [ alias bg break case cd command continue do done echo elif else esac eval exec exit "
    "export fc fg fi for getopts hash if in jobs kill local printf pwd read readonly return "
    "set shift test then times trap type ulimit umask unalias unset until wait while".split())
"""Keywords and builtins of the shell: such a command always runs through ``/bin/sh -c``."""


def command_argv(cmd: str, venv: str | None, env: Mapping[str, str] | None, *,
                 lookup: bool = True) -> list[str]:
    """How ``cmd`` is executed: its own words, the program resolved to an absolute path, when it
    is a plain command line; otherwise ``/bin/sh -c cmd``. The direct path saves the shell's
    exec (~0.4 ms per command) and behaves as the shell would: it is taken only for words of
    characters the shell gives no meaning to, a first word that is neither a keyword nor a
    builtin (``true``/``false`` excepted: /usr/bin's behave alike), and the sandbox's default
    PATH (``env`` sets none), whose directories — the venv's bin and the system dirs — have the
    same contents on the host as inside. A program found nowhere goes to the shell too, which
    reports it (``not found``, exit 127) as it always has; so does a program given by path.
    ``lookup=False``: the program's bare name is left for the ``-x`` launcher to look up inside
    the sandbox, which falls back to the shell the same way (``launch.py``)."""
    words = re.split(r"[ \t]+", cmd.strip(" \t"))  # the shell's blanks; a newline is a separator
    if (words[0] in _SHELL_WORDS or not _PLAIN_WORD.fullmatch(words[0])
            or not all(_PLAIN_ARG.fullmatch(w) for w in words[1:])):
        return ["/bin/sh", "-c", cmd]
    # a path (maybe into the workspace, which differs inside) is the shell's to resolve
    if "/" in words[0] or (env and "PATH" in env):
        return ["/bin/sh", "-c", cmd]
    if not lookup:
        return words
    found = _which(words[0], default_path(venv))
    return ["/bin/sh", "-c", cmd] if found is None else [found, *words[1:]]


def _which(name: str, path: str) -> str | None:
    """The first executable regular file ``name`` in ``path``'s directories (absolute ones, as
    a sandbox's default PATH has), as ``shutil.which`` finds it, in fewer syscalls."""
    for d in path.split(":"):
        f = f"{d}/{name}"
        try:
            st = os.stat(f)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(f, os.X_OK):
            return f
    return None


def build_argv(bwrap: str, workdir: str, binds: list[str], cmd: str, *, venv: str | None,
               limits: SandboxLimits, env: Mapping[str, str] | None, status_fd: int,
               seccomp_fd: int | None = None) -> list[str]:
    """The full bwrap command line for one command (``binds`` from ``bind_args``), for a
    sandbox without a ``SandboxRoot``: bwrap builds the whole tree itself. ``status_fd`` and
    ``seccomp_fd``: fds, in the process that execs bwrap, of its status channel (bwrap reports
    there whether it started the command: ``launch.py``) and of the seccomp program
    (``Prepared.status_fd``, ``Prepared.seccomp_fd``)."""
    argv = [*_namespaces(bwrap, limits, seccomp_fd), "--json-status-fd", str(status_fd),
            *system_binds(), "--proc", "/proc",
            "--dev", "/dev", "--size", str(limits.tmp_mb * 2**20), "--tmpfs", "/tmp",
            *binds, "--chdir", workdir,
            "--clearenv"]
    merged = command_env(venv, env, workdir)
    check_env(merged)
    for k, v in merged.items():
        argv += ["--setenv", k, v]
    return [*argv, "--", *command_argv(cmd, venv, env)]


def rooted_argv(bwrap: str, root: SandboxRoot, limits: SandboxLimits, wait_fd: int,
                status_fd: int, seccomp_fd: int | None = None) -> list[str]:
    """bwrap over a ``SandboxRoot``, running the launcher that waits for its command (``-x``)
    and reports its exit status on ``status_fd`` (``-s``)."""
    return [*_namespaces(bwrap, limits, seccomp_fd), *root.bwrap_args(), "--clearenv", "--",
            LAUNCH, "-x", "-w", str(wait_fd), "-s", str(status_fd)]


# ---------------------------------------------------------------- running


def rlimits(limits: SandboxLimits) -> list[tuple[int, int, int]]:
    """(resource, soft, hard) for every rlimit a command gets, capped at our own hard limits."""
    mb = 2**20

    def cap(res: int, v: int) -> int:  # never above our own hard limit (cannot raise it)
        cur = resource.getrlimit(res)[1]
        return v if cur == resource.RLIM_INFINITY else min(v, cur)

    def both(res: int, v: int) -> tuple[int, int, int]:
        return res, cap(res, v), cap(res, v)

    # SIGXCPU at the soft CPU limit (reported as a CPU-limit kill), SIGKILL 1 s later
    return [(resource.RLIMIT_CPU, cap(resource.RLIMIT_CPU, limits.cpu_s),
             cap(resource.RLIMIT_CPU, limits.cpu_s + 1)),
            both(resource.RLIMIT_AS, limits.address_space_mb * mb),
            both(resource.RLIMIT_FSIZE, limits.file_size_mb * mb),
            both(resource.RLIMIT_NOFILE, limits.open_files),
            both(resource.RLIMIT_NPROC, limits.processes),
            (resource.RLIMIT_CORE, 0, 0)]


async def prepare(limits: SandboxLimits, uid: int | None,
                  build: Callable[[int | None, int], list[str]] | None = None) -> Prepared | None:
    """Spawn the launcher of one command: in fresh cgroups, with fresh rlimits, as host ``uid``,
    holding the seccomp program on ``Prepared.seccomp_fd`` and the write end of its status
    channel on ``Prepared.status_fd``. With the C launcher it then waits for its command line
    (``Prepared.go``); with the stock-tool chain the command line is needed now:
    ``build(seccomp_fd, status_fd)`` makes it (None without it: nothing can be prepared ahead)."""
    path = launcher_path()
    if path is None and build is None:
        return None
    cg = Cgroup(limits.memory_mb, limits.processes, enabled=limits.cgroups)
    try:
        with _filter_fd(limits) as fd:
            status = os.pipe()
            if path is None:
                assert build is not None
                chain = [*tool_chain(rlimits(limits), cg.procs_files(), uid), *build(fd, status[1])]
                return Prepared.spawn(chain, cg, status=status, seccomp_fd=fd)
            pipe = os.pipe()
            chain = launcher_argv(path, cg.procs_files(), rlimits(limits), uid, pipe[0])
            return Prepared.spawn(chain, cg, pipe, status, seccomp_fd=fd)
    except BaseException:
        cg.close()
        raise


async def prepare_rooted(limits: SandboxLimits, uid: int | None, root: SandboxRoot) -> Prepared:
    """Start one command's whole sandbox now — launcher setup, then bwrap over ``root`` — with
    the launcher inside waiting for the command (``encode_message``)."""
    path = launcher_path()
    if path is None:
        raise SandboxError("a prepared sandbox needs the compiled launcher (no C compiler here)")
    cg = Cgroup(limits.memory_mb, limits.processes, enabled=limits.cgroups)
    try:
        with _filter_fd(limits) as fd:
            pipe, status = os.pipe(), os.pipe()
            bwrap = rooted_argv(check_bwrap(), root, limits, pipe[0], status[1], fd)
            return Prepared.spawn(launcher_exec_argv(path, cg.procs_files(), rlimits(limits),
                                                     uid, bwrap), cg, pipe, status, fd)
    except BaseException:
        cg.close()
        raise


_KILLED = {128 + signal.SIGKILL: "killed", 128 + signal.SIGXCPU: "CPU time limit",
           128 + signal.SIGXFSZ: "file size limit"}


async def run_bwrap(argv: list[str] | None, *, timeout_s: float, limits: SandboxLimits,
                    prepared: Prepared, message: bytes | None = None) -> ExecResult:
    """Run one command with limits, a wall timeout and capped output. ``prepared``: its launcher
    (``prepare``, then ``argv`` is the bwrap command line built for it) or, with ``message``
    instead of ``argv``, its whole sandbox (``prepare_rooted``), taken over. The command is
    answered as soon as its status channel says how it ended; the rest of its tree is killed at
    once and reaped in the background (``_retire``). A command the channel does not report as
    started is the machinery's failure: ``SandboxError`` (whatever the command printed)."""
    t0 = time.perf_counter()
    assert prepared.status is not None, "every launcher has a status channel (prepare*)"
    proc, cg = prepared.proc, prepared.cg
    out, err = Capped(limits.output_bytes), Capped(limits.output_bytes)
    pumps: asyncio.Future[tuple[None, None]] | None = None
    rc: int | None = None
    status = LaunchStatus(started=False)
    finished = False  # the status came in time: the command has ended
    try:
        assert proc.stdout is not None and proc.stderr is not None
        timed_out = False
        try:
            data = message if message is not None else encode_argv(argv or [])
            await prepared.go(data)  # the timeout clock runs from here
            # The readers start while the command does (its pipes hold 64 KiB until then).
            pumps = running = asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err))
            # When we are cancelled the pumps are too; retrieve that so asyncio does not log it.
            running.add_done_callback(lambda f: f.cancelled() or f.exception())
            status = await _within(prepared.read_status(), timeout_s)
            rc = status.code
            if rc is None:  # not started, or it killed its launcher: wait for the process
                await _within(prepared.wait(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:  # kill the whole tree, also when we are cancelled
            finished = rc is not None and not timed_out
            if finished:  # orphans die with the launcher's pid namespace as it ends; kill them
                # and the rest of the tree right after this returns, off the caller's path
                asyncio.get_running_loop().call_soon(prepared.kill_now)
            else:  # the cgroups first: they stop the whole tree before any of it dies
                cg.kill_all()
                if proc.returncode is None:  # not reaped yet: its pid cannot have been reused
                    _kill_tree(proc.pid)
        assert pumps is not None  # (only a cancellation, which propagates, ends before them)
        if finished:  # the command's output is in the pipes already
            pumps.cancel()
            drain(proc.stdout, out)
            drain(proc.stderr, err)
        else:
            try:
                await asyncio.wait_for(pumps, 2.0)
            except asyncio.TimeoutError:
                pumps.cancel()
            rc = proc.returncode if proc.returncode is not None else await prepared.wait()
        oom = rc != 0 and cg.oom_killed()  # a command that exits 0 was not killed
    finally:
        if pumps is not None and not pumps.done():
            pumps.cancel()
        if finished:
            assert pumps is not None
            _retire(prepared, pumps)
        else:
            prepared.discard()
    stdout, t1 = out.text()
    stderr, t2 = err.text()
    code: int | None = rc
    if timed_out:
        code = None
        stderr += f"\n[looprl: timed out after {timeout_s:g} s; the process tree was killed]\n"
    elif not status.started and not oom:  # (an OOM kill needs a command that ran)
        why = status.failure or stderr.strip()[-2000:] or f"exit status {rc}, no output"
        raise SandboxError(f"the sandbox could not start the command: {why}")
    elif oom:
        code = None
        stderr += f"\n[looprl: killed: out of memory (limit {limits.memory_mb} MB)]\n"
    elif rc in _KILLED:
        code = None
        stderr += f"\n[looprl: {_KILLED[rc]}]\n"
    return ExecResult(code, stdout, stderr, timed_out, t1 or t2, time.perf_counter() - t0)


async def _within(aw: Awaitable[T], timeout_s: float) -> T:
    """``await aw``, or ``asyncio.TimeoutError`` after ``timeout_s``: ``asyncio.timeout`` where
    there is one (3.11+; ``wait_for`` wraps ``aw`` in a task of its own, one more task and loop
    pass in every command's path)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await aw
    return await asyncio.wait_for(aw, timeout_s)


_RETIRING: set[asyncio.Future[None]] = set()


def _retire(prepared: Prepared, pumps: asyncio.Future[tuple[None, None]]) -> None:
    """Reap a finished command's sandbox and remove its cgroups in the background (its
    namespaces take a few ms to go), once its cancelled pumps have let go of its pipes (so a
    pipe's fd number is never reused under a live reader)."""
    async def go() -> None:
        await asyncio.wait([pumps])
        await asyncio.to_thread(prepared.discard)

    fut = asyncio.ensure_future(go())
    _RETIRING.add(fut)
    fut.add_done_callback(_RETIRING.discard)


async def settle() -> None:
    """Wait until every finished command's sandbox started from this event loop is reaped
    (``_retire``): a few ms. Another loop of the process (a server beside a client, each with
    its own) reaps its own: a future can only be awaited from the loop it belongs to."""
    loop = asyncio.get_running_loop()
    while mine := [f for f in _RETIRING if f.get_loop() is loop]:
        await asyncio.gather(*mine, return_exceptions=True)


def _kill_tree(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- the sandbox
