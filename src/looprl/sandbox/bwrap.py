"""Run commands under bubblewrap: the isolation half of a sandbox (``BwrapSandbox``).

Each command runs in fresh user, pid, net, ipc, uts and cgroup namespaces,
as uid 1000 inside with no capabilities and nested user namespaces disabled. On the host it is an
unprivileged uid of the sandbox's own (``idmap.py``, when looprl runs as root): host uid 0 would
still count as root for sysctls, device-node ownership and RLIMIT_NPROC. It gets:

- the workspace (an overlay from ``workspace.py``) as the only writable path besides a private,
  size-capped tmpfs /tmp (the sandbox's own: shared by its commands, emptied by ``reset``); it is
  mounted at the base repository's absolute path (so editable installs and absolute paths of the
  task resolve to the workspace) and is the working directory;
- a read-only system: /usr (+ the /bin, /lib* links), an /etc with a few host files (copied at
  first use), a minimal /proc and /dev;
- the task's venv bound read-only at its own absolute path (venvs hard-code paths), plus the
  interpreter prefix it points to (``home`` in ``pyvenv.cfg``);
- no network: ``--unshare-net`` leaves only a dead loopback; no DNS config is visible;
- rlimits (CPU seconds, address space, file size, open files, processes) and, where the cgroup v1
  memory/pids controllers are writable, a memory limit and a pid limit per command;
- a wall-clock timeout that kills the whole tree: the process group and every pid of the cgroup
  are SIGKILLed, and ``--die-with-parent`` + the pid namespace take the rest down with bwrap;
- a plain command line (words of ordinary characters, e.g. ``python -m pytest -q``) is executed
  directly, its program found on the sandbox's PATH (by the launcher inside the sandbox, or on
  the host side where bwrap builds the tree: ``command_argv``); anything
  else — quotes, pipes, redirections, globs, variables, builtins — runs as ``/bin/sh -c CMD``;
- output capped to head + tail with a ``[... N bytes truncated ...]`` marker;
- a seccomp filter (``seccomp.py``): loading kernel code, mounting, namespaces, io_uring, bpf,
  perf events, the keyring, ptrace and a few more fail with EPERM (x86-64 and aarch64; on other
  machines there is no filter).

The setup before bwrap (cgroups, rlimits, host uid) is one exec of a small C launcher
(``launch.py``). As root, a sandbox's ``/`` is a ``SandboxRoot`` (``root.py``) that bwrap binds,
and each sandbox keeps its next command's whole bwrap started ahead, waiting inside for the
command line: a command pays for one exec, and its result is returned as soon as it ends (the
launcher inside reports its status; the namespaces are torn down in the background). A pool's
``Blank`` sandboxes go further: started before their base is known (with the workspace's upper
layer and a likely venv in place), they receive the workspace by mount propagation. Otherwise
each sandbox keeps the next command's launcher prepared, and bwrap starts per command; where no
C compiler exists, a stock-tool chain does the same.

What this does NOT protect against: kernel exploits through the system calls the filter allows
(namespaces share the host kernel), CPU/memory-bandwidth contention and timing side channels
between sandboxes, exhaustion of host resources no limit covers (e.g. inotify watches, kernel
memory outside the cgroup), and reads of world-readable files under the read-only system paths.
Run as a non-root user, there are no per-sandbox uids and usually no writable cgroups: commands
then run as that user and the fork-bomb guard is RLIMIT_NPROC alone (shared by all of that
user's processes).

    sb = await create_sandbox("/data/repos/attrs", venv="/data/venvs/attrs")  # looprl.sandbox
    r = await sb.exec("python -m pytest -q", timeout_s=60)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import posixpath
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
from pathlib import Path, PurePosixPath
from typing import TypeVar

from looprl.errors import PathEscapeError, SandboxError, SandboxUnavailableError, ToolError
from looprl.sandbox.beneath import Root
from looprl.sandbox.cgroups import Cgroup, cgroup_janitor
from looprl.sandbox.idmap import FIRST_UID, UID_POOL, as_fsuid
from looprl.sandbox.launch import (
    Capped,
    LaunchStatus,
    Prepared,
    check_env,
    drain,
    encode_argv,
    encode_message,
    launcher_argv,
    launcher_exec_argv,
    launcher_path,
    pump,
    tool_chain,
)
from looprl.sandbox.mounts import TOOLS_DIR, bind_args, system_binds, venv_paths  # noqa: F401
from looprl.sandbox.root import LAUNCH, SandboxRoot, rootable
from looprl.sandbox.seccomp import filter_fd
from looprl.sandbox.workspace import (
    IGNORED_NAMES,
    Snapshot,
    Workspace,
    _overlay_ok,
    _remove_tree,
    create_workspace,
    janitor,
    overlay_capable,
    stage_workspace,
)
from looprl.types import ExecResult, FileEntry

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
    pumps: asyncio.Future[list[None]] | None = None
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
            pumps = asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err))
            # When we are cancelled the pumps are too; retrieve that so asyncio does not log it.
            pumps.add_done_callback(lambda f: f.cancelled() or f.exception())
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


def _retire(prepared: Prepared, pumps: asyncio.Future[list[None]]) -> None:
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


class _Gate:
    """Many concurrent commands, or one exclusive snapshot. Entering a free gate and leaving
    one nobody waits for touch no lock (every command passes it)."""

    def __init__(self) -> None:
        self.active = 0
        self.exclusive = False
        self._waiting = 0
        self._cond: asyncio.Condition | None = None  # made for the first waiter

    def _free(self, exclusive: bool) -> bool:
        return not self.exclusive and (not exclusive or self.active == 0)

    async def enter(self, exclusive: bool) -> None:
        if not self._free(exclusive):
            if self._cond is None:
                self._cond = asyncio.Condition()
            self._waiting += 1
            try:
                async with self._cond:
                    await self._cond.wait_for(lambda: self._free(exclusive))
            finally:
                self._waiting -= 1
        if exclusive:
            self.exclusive = True
        else:
            self.active += 1

    async def leave(self, exclusive: bool) -> None:
        if exclusive:
            self.exclusive = False
        else:
            self.active -= 1
        if self._waiting and self._cond is not None:
            async with self._cond:
                self._cond.notify_all()


class BwrapSandbox:
    """``looprl.protocols.Sandbox`` over a copy-on-write workspace, commands under bubblewrap.

    File operations act on the workspace on the host and refuse any path that leaves it
    (absolute, ``..``, symlinks resolving outside) with ``PathEscapeError`` (a ``ToolError``).
    With a ``root`` (``root.py``: as root, with the C launcher) each next command's whole bwrap
    is started ahead; otherwise its launcher is.
    """

    def __init__(self, workspace: Workspace, venv: str | None = None,
                 limits: SandboxLimits | None = None, workdir: str | None = None,
                 root: SandboxRoot | None = None):
        self.workspace = workspace
        self.venv = str(Path(venv).absolute()) if venv else None
        self.limits = limits or SandboxLimits()
        self.workdir = workdir or str(workspace.base)
        self.root = root
        self._bwrap = check_bwrap()
        self._gate = _Gate()
        self._root = str(workspace.path)  # real as made: under the resolved sandbox_root()
        self._ready: Prepared | None = None
        """The next command prepared ahead: its launcher, or with a root its whole bwrap."""
        self._refill: asyncio.Task[None] | None = None
        self._running: set[Prepared] = set()
        """Commands running now (``close`` kills them)."""
        self._closing = False

    def _attach(self, venv: bool = True) -> None:
        """Attach the workspace (read-write) and the venv (read-only; ``venv=False``: a blank's
        root has it already, see ``_venv_fits``) to the root."""
        assert self.root is not None
        self.root.attach(self.workspace.path, self.workdir, readonly=False)
        for p in venv_paths(self.venv) if venv else ():
            self.root.attach(p, p, readonly=True)

    def _venv_fits(self, attached: str) -> bool:
        """Whether a venv attached before the workspace serves this sandbox: the same venv, and
        no path of it inside the workdir or around it (attached first, it would be covered)."""
        if attached != self.venv:
            return False
        w = self.workdir.rstrip("/") + "/"
        return not any(w.startswith(p.rstrip("/") + "/") or (p.rstrip("/") + "/").startswith(w)
                       for p in venv_paths(attached))

    async def _prepare(self) -> Prepared | None:
        if self.root is not None:
            return await prepare_rooted(self.limits, self.workspace.uid, self.root)
        return await prepare(self.limits, self.workspace.uid)

    async def prime(self) -> None:
        """Prepare the next command now (cgroups joined, rlimits set, uid dropped; with a root
        also bwrap's namespaces and mounts), so that command starts without paying for it. Done
        after every command by itself."""
        if self._ready is not None or self._closing or launcher_path() is None:
            return
        ready = await self._prepare()
        if self._ready is not None or self._closing:
            if ready is not None:
                ready.discard()
            return
        self._ready = ready

    def _take_ready(self) -> Prepared | None:
        ready, self._ready = self._ready, None
        if ready is not None and not ready.usable():  # its setup failed
            ready.discard()
            ready = None
        return ready

    def _schedule_prime(self) -> None:
        """After a command: prepare the next one while the caller thinks (not during the
        command, where spawning would compete with it)."""
        if self._refill is None or self._refill.done():
            self._refill = asyncio.ensure_future(self._prime_quietly())

    async def _prime_quietly(self) -> None:
        try:
            await self.prime()
        except SandboxError:
            pass  # the next command prepares its own and reports the failure

    tools_dir = TOOLS_DIR

    @property
    def cow_backend(self) -> str:
        return self.workspace.cow_backend

    async def exec(self, cmd: str, *, timeout_s: float = 60.0,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        self._check_open()
        uid = self.workspace.uid
        argv: list[str] | None = None
        message: bytes | None = None
        if self.root is not None:
            message = encode_message(self.workdir, command_env(self.venv, env, self.workdir),
                                     command_argv(cmd, self.venv, env, lookup=False))
        else:
            binds = bind_args(self.workspace.path, self.workdir, self.venv,
                              staged=uid is not None)

            def build(seccomp_fd: int | None, status_fd: int) -> list[str]:
                return build_argv(self._bwrap, self.workdir, binds, cmd, venv=self.venv,
                                  limits=self.limits, env=env, status_fd=status_fd,
                                  seccomp_fd=seccomp_fd)

            check_env(command_env(self.venv, env))  # the caller's errors, before any spawn
            encode_argv([cmd])
        await self._gate.enter(False)
        try:
            prepared = self._take_ready()
            if prepared is None:
                prepared = await (self._prepare() if self.root is not None
                                  else prepare(self.limits, uid, build))
            assert prepared is not None  # (given ``build``, ``prepare`` always spawns one)
            if self.root is None:
                assert prepared.status_fd is not None
                argv = build(prepared.seccomp_fd, prepared.status_fd)
            if self._closing:  # closed while this command waited for its launcher
                prepared.discard()
                raise SandboxError("sandbox was closed before the command could start")
            self._running.add(prepared)
            try:
                r = await run_bwrap(argv, timeout_s=timeout_s, limits=self.limits,
                                    prepared=prepared, message=message)
            finally:
                self._running.discard(prepared)
            if self._closing:
                raise SandboxError("sandbox was closed while the command ran; it was killed")
            return r
        finally:
            await self._gate.leave(False)
            if not (self.workspace.closed or self._closing):
                self._schedule_prime()

    def _check_path(self, path: str) -> str:
        """``path`` normalised, or the model's ``ToolError`` for one no lookup may take; the
        lookup itself (``beneath.Root``) is what keeps every access inside the workspace."""
        self._check_open()
        if not isinstance(path, str) or not path or "\0" in path:
            raise ToolError(f"invalid path {path!r}: give a workspace-relative path like 'src/a.py'")
        try:
            os.fsencode(path)
        except UnicodeEncodeError:  # a lone surrogate no file name can hold
            raise ToolError(f"invalid path {ascii(path)[:100]}: not valid Unicode text") from None
        p = PurePosixPath(path)
        if p.is_absolute():
            raise PathEscapeError(f"path {path!r} is absolute; use a path relative to the workspace root")
        if ".." in p.parts:
            raise PathEscapeError(f"path {path!r} contains '..'; paths must stay inside the workspace")
        return str(p)

    def _os_error(self, ws: Root, path: str, e: OSError) -> ToolError:
        if e.errno == errno.ENOENT:
            return ToolError(f"file not found: {path}")
        if e.errno == errno.ELOOP:
            link = ws.link_on_path(path)
            if link is None:  # (gone again: a command is swapping it)
                return PathEscapeError(f"path {path!r} goes through a symlink; the file tools "
                                       "do not follow symlinks")
            name, target = link
            # where it leads, as commands see it (the workspace is mounted at ``workdir``)
            inner = posixpath.join(self.workdir, posixpath.dirname(name), target,
                                   path[len(name) + 1:])
            where = posixpath.relpath(posixpath.normpath(inner), self.workdir)
            hint = ("it leads outside the workspace" if where == ".." or where.startswith("../")
                    else f"use the path it points to ({where!r})")
            what = "is a symlink" if name == path else f"goes through the symlink {name!r}"
            return PathEscapeError(f"path {path!r} {what} (-> {target!r}); the file tools do not "
                                   f"follow symlinks: {hint}")
        if e.errno == errno.EXDEV:
            return PathEscapeError(f"path {path!r} resolves outside the workspace")
        if e.errno == errno.EISDIR:
            return ToolError(f"{path} is a directory, not a regular file")
        if e.errno == errno.EINVAL:
            return ToolError(f"{path} is not a regular file")
        return ToolError(f"cannot access {path}: {e.strerror}")

    async def read(self, path: str) -> bytes:
        rel = self._check_path(path)
        with Root(self._root) as ws:
            try:
                return ws.read(rel)
            except OSError as e:
                raise self._os_error(ws, path, e) from None

    async def write(self, path: str, data: bytes) -> None:
        rel = self._check_path(path)
        if rel == ".":
            raise ToolError("cannot write to the workspace root; name a file")
        await asyncio.to_thread(self._write_as_owner, path, rel, data)

    def _write_as_owner(self, path: str, rel: str, data: bytes) -> None:
        with as_fsuid(self.workspace.uid), Root(self._root) as ws:  # new files: the sandbox's
            try:
                ws.write(rel, data)
            except OSError as e:
                raise self._os_error(ws, path, e) from None

    async def walk(self, under: str = ".", *, max_entries: int = 100_000) -> list[FileEntry]:
        rel = self._check_path(under)
        out: list[FileEntry] = []
        with Root(self._root) as ws:
            try:
                for d, _, entries in ws.walk(rel):
                    entries[:] = [e for e in entries if e[0] not in IGNORED_NAMES
                                  or not stat.S_ISDIR(e[1].st_mode)]
                    for name, st in entries:
                        kind = ("link" if stat.S_ISLNK(st.st_mode) else
                                "dir" if stat.S_ISDIR(st.st_mode) else "file")
                        out.append(FileEntry(name if d == "." else f"{d}/{name}", kind,
                                             st.st_size if kind == "file" else 0))
                        if len(out) >= max_entries:
                            return sorted(out, key=lambda e: e.path)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise ToolError(f"{under} is not a directory in the workspace") from None
                raise self._os_error(ws, under, e) from None
        return sorted(out, key=lambda e: e.path)

    async def diff(self) -> str:
        self._check_open()
        return await asyncio.to_thread(self.workspace.diff)

    async def snapshot(self) -> Snapshot:
        """Freeze the current state (waits for running commands; blocks new ones meanwhile).
        The copy (``cp -a``, which copies links as links) walks by path: it runs only once no
        process of this sandbox is left to rename anything (the gate, then ``settle``)."""
        self._check_open()
        await self._gate.enter(True)
        try:
            await settle()  # finished commands' trees reaped: their orphans are gone too
            return await asyncio.to_thread(self.workspace.snapshot)
        finally:
            await self._gate.leave(True)

    async def fork(self, n: int) -> list[BwrapSandbox]:
        """``n`` independent sandboxes starting from this one's current state."""
        snap = await self.snapshot()
        try:
            return [await sandbox_from(snap, venv=self.venv, limits=self.limits,
                                       workdir=self.workdir) for _ in range(n)]
        finally:
            snap.release()

    async def reset(self) -> None:
        """Back to the starting state (base or snapshot); with a root also a fresh /tmp."""
        await self._gate.enter(True)
        try:
            if self.root is not None and self._ready is not None:
                self._ready.discard()  # prepared before the reset: start the next one after it
                self._ready = None
            await asyncio.to_thread(self._reset)
        finally:
            await self._gate.leave(True)
        if self.root is not None:
            self._schedule_prime()

    def _reset(self) -> None:
        if self.root is None:
            self.workspace.reset()
            return
        self.root.detach_all()
        self.root.reset_tmp()
        self.workspace.reset()
        self._attach()

    async def close(self) -> None:
        """Kill what still runs (a lease that expired mid-command), then free everything. The
        sandbox's host uid goes back to the pool only once none of its processes is left."""
        self._closing = True
        for p in list(self._running):
            await asyncio.to_thread(p.cg.kill_all)  # (first: it stops the tree, then kills it)
            p.kill_now()
        await self._gate.enter(True)  # the killed commands' exec calls have reaped them
        await self._gate.leave(True)
        await settle()  # finished commands reaped, their cgroups gone
        if self._refill is not None and not self._refill.done():
            self._refill.cancel()
        if self._ready is not None:
            self._ready.discard()
            self._ready = None
        if not self.workspace.closed:
            if self.root is not None:
                await asyncio.to_thread(self.root.close)
            await asyncio.to_thread(self.workspace.destroy)
            if self.workspace.uid is not None:
                UID_POOL.give(self.workspace.uid)

    def _check_open(self) -> None:
        if self.workspace.closed:
            raise SandboxError("sandbox is closed (its workspace was destroyed)")
        if not os.path.isdir(self._root):
            raise SandboxError(f"the sandbox's workspace {self._root} vanished from the host")


@functools.lru_cache(maxsize=1)
def _janitor_once() -> None:
    janitor()
    cgroup_janitor()


@dataclass(eq=False)
class Blank:
    """A sandbox without a workspace yet: its own host uid, its ``SandboxRoot`` and its first
    command's bwrap already started inside it (``prepare_rooted``). A pool keeps a few ready;
    ``new_sandbox(..., blank=)`` turns one into a sandbox over any base by creating the
    workspace and attaching it (it reaches the waiting bwrap by mount propagation)."""

    uid: int
    root: SandboxRoot
    ready: Prepared
    limits: SandboxLimits
    staged: Path | None = None
    """The workspace's base-independent half (``stage_workspace``), made ahead."""
    venv: str | None = None
    """A venv already attached to the root (the one the pool's last lease used)."""

    def usable(self) -> bool:
        return self.ready.usable() and not self.root.closed

    def close(self) -> None:
        self.ready.discard()
        self.root.close()
        if self.staged is not None:
            _remove_tree(self.staged)
        UID_POOL.give(self.uid)


def can_root(paths: list[str]) -> bool:
    """Whether sandboxes over these paths get a ``SandboxRoot`` (and prepared bwraps): as root,
    with the C launcher, every path attachable."""
    return os.geteuid() == 0 and launcher_path() is not None and rootable(paths)


async def make_blank(limits: SandboxLimits | None = None, venv: str | None = None) -> Blank:
    """A ``Blank``: uid, root, the workspace's upper layer, ``venv`` (if given and attachable)
    already attached, and the first command's bwrap started (it keeps starting in the
    background after this returns)."""
    check_bwrap()
    _janitor_once()
    limits = limits or SandboxLimits()
    uid = UID_POOL.take()
    root = staged = None
    try:
        UID_POOL.userns_fd(uid)  # the workspace's idmap needs it: made now, not at the lease
        root = SandboxRoot(limits.tmp_mb)
        venv = str(Path(venv).absolute()) if venv else None
        if venv and rootable(venv_paths(venv)):
            for p in venv_paths(venv):
                root.attach(p, p, readonly=True)
        else:
            venv = None
        if _overlay_ok():  # the half of an overlay workspace that needs no base
            staged = stage_workspace(limits.disk_mb, uid)
        ready = await prepare_rooted(limits, uid, root)
    except BaseException:
        if root is not None:
            root.close()
        if staged is not None:
            _remove_tree(staged)
        UID_POOL.give(uid)
        raise
    return Blank(uid, root, ready, limits, staged, venv)


async def new_sandbox(base_dir: str | os.PathLike[str], venv: str | None = None, *,
                      limits: SandboxLimits | None = None, snapshot: Snapshot | None = None,
                      workdir: str | None = None, blank: Blank | None = None,
                      resolved: bool = False) -> BwrapSandbox:
    """A new sandbox over ``base_dir`` (or starting at ``snapshot``), with its own host uid.
    ``blank``: a pre-started ``Blank`` to build it from (taken over; closed if it cannot serve).
    ``resolved``: ``base_dir`` is ``os.path.realpath``'d already (a pool's key)."""
    check_bwrap()
    _janitor_once()
    limits = limits or SandboxLimits()
    # once: the calls below take it as resolved
    base = os.fspath(base_dir) if resolved else os.path.realpath(base_dir)
    mounts = [workdir or base, *venv_paths(venv)]
    if blank is not None and not (blank.limits == limits and blank.usable() and can_root(mounts)):
        await asyncio.to_thread(blank.close)
        blank = None
    if blank is None and can_root(mounts):
        blank = await make_blank(limits, venv)  # its bwrap starts while the workspace is mounted
    if blank is not None:
        return await _from_blank(blank, base, venv, limits, snapshot, workdir)
    uid = UID_POOL.take() if os.geteuid() == 0 else None
    # the first command's launcher is spawned while the workspace is being mounted
    ready = asyncio.ensure_future(prepare(limits, uid))
    try:
        ws = await asyncio.to_thread(create_workspace, base, snapshot=snapshot,
                                     disk_mb=limits.disk_mb, uid=uid, resolved=True)
    except BaseException:
        await _drop_prepared(ready)
        if uid is not None:
            UID_POOL.give(uid)
        raise
    sb = BwrapSandbox(ws, venv, limits, workdir)
    try:
        sb._ready = await ready
    except SandboxError:
        pass  # the first command prepares its own launcher and reports the failure
    return sb


async def _from_blank(blank: Blank, base: str, venv: str | None, limits: SandboxLimits,
                      snapshot: Snapshot | None, workdir: str | None) -> BwrapSandbox:
    """``base``: resolved (``realpath``)."""
    staged, blank.staged = blank.staged, None
    try:
        if snapshot is not None or overlay_capable(base, resolved=True):
            # a few mount syscalls (~0.5 ms): on the loop, a thread hop would cost a third of it
            ws = create_workspace(base, snapshot=snapshot, disk_mb=limits.disk_mb,
                                  uid=blank.uid, staged=staged, resolved=True,
                                  vetted=snapshot is None)
        else:  # a copy: off the loop
            if staged is not None:
                _remove_tree(staged)
            ws = await asyncio.to_thread(create_workspace, base, disk_mb=limits.disk_mb,
                                         uid=blank.uid, resolved=True)
    except BaseException:
        await asyncio.to_thread(blank.close)
        raise
    sb = BwrapSandbox(ws, venv, limits, workdir, root=blank.root)
    try:
        fits = blank.venv is not None and sb._venv_fits(blank.venv)
        if blank.venv is not None and not fits:
            blank.root.detach_all()  # another venv, or one the workspace would cover
        sb._attach(venv=not fits)
    except BaseException:
        blank.ready.discard()
        await sb.close()
        raise
    sb._ready = blank.ready
    return sb


async def _drop_prepared(fut: asyncio.Future[Prepared | None]) -> None:
    try:
        ready = await fut
    except Exception:
        return
    if ready is not None:
        ready.discard()


async def sandbox_from(snapshot: Snapshot, *, venv: str | None = None,
                       limits: SandboxLimits | None = None,
                       workdir: str | None = None) -> BwrapSandbox:
    """A new sandbox whose workspace starts at ``snapshot``."""
    return await new_sandbox(snapshot.base, venv, limits=limits, snapshot=snapshot,
                             workdir=workdir)
