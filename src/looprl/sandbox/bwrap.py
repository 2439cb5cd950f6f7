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
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from looprl import faults
from looprl.errors import InfraKind, SandboxError
from looprl.sandbox.cgroups import cgroup_janitor
from looprl.sandbox.command import (
    SandboxLimits,
    build_argv,
    check_bwrap,
    command_argv,
    command_env,
    prepare,
    prepare_rooted,
    run_bwrap,
    settle,
)
from looprl.sandbox.files import WorkspaceFiles
from looprl.sandbox.idmap import UID_POOL
from looprl.sandbox.launch import (
    Prepared,
    check_env,
    encode_argv,
    encode_message,
    launcher_path,
)
from looprl.sandbox.mounts import (
    TOOLS_DIR,
    Mount,
    bind_args,
    venv_paths,
)
from looprl.sandbox.root import SandboxRoot, rootable
from looprl.sandbox.workspace import (
    Snapshot,
    Workspace,
    _overlay_ok,
    _remove_tree,
    create_workspace,
    janitor,
    overlay_capable,
    stage_workspace,
)
from looprl.types import ExecResult


class Gate:
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


class BwrapSandbox(WorkspaceFiles):
    """``looprl.protocols.Sandbox`` over a copy-on-write workspace, commands under bubblewrap.

    File operations act on the workspace on the host and refuse any path that leaves it
    (absolute, ``..``, symlinks resolving outside) with ``PathEscapeError`` (a ``ToolError``).
    With a ``root`` (``root.py``: as root, with the C launcher) each next command's whole bwrap
    is started ahead; otherwise its launcher is.
    """

    def __init__(self, workspace: Workspace, venv: str | None = None,
                 limits: SandboxLimits | None = None, workdir: str | None = None,
                 root: SandboxRoot | None = None, mounts: tuple[Mount, ...] = ()):
        self.workspace = workspace
        self.venv = str(Path(venv).absolute()) if venv else None
        self.limits = limits or SandboxLimits()
        self.workdir = workdir or str(workspace.base)
        self.root = root
        self.mounts = mounts
        """Extra host directories the commands see (``mounts.Mount``), e.g. a verifier's."""
        self._bwrap = check_bwrap()
        self._gate = Gate()
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
        for m in self.mounts:
            self.root.attach(m.source, m.target, readonly=m.readonly)

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
        # the injected hang: the sandbox never answers; here, so the grader's commands cross it too
        faults.maybe_raise(InfraKind.EXEC_TIMEOUT, "BwrapSandbox.exec")
        uid = self.workspace.uid
        argv: list[str] | None = None
        message: bytes | None = None
        if self.root is not None:
            message = encode_message(self.workdir, command_env(self.venv, env, self.workdir),
                                     command_argv(cmd, self.venv, env, lookup=False))
        else:
            binds = bind_args(self.workspace.path, self.workdir, self.venv,
                              staged=uid is not None, mounts=self.mounts)

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
                                       workdir=self.workdir, mounts=self.mounts)
                    for _ in range(n)]
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
                      resolved: bool = False, mounts: tuple[Mount, ...] = ()) -> BwrapSandbox:
    """A new sandbox over ``base_dir`` (or starting at ``snapshot``), with its own host uid.
    ``workdir``: where its commands see the workspace (default: the base's own path).
    ``blank``: a pre-started ``Blank`` to build it from (taken over; closed if it cannot serve).
    ``resolved``: ``base_dir`` is ``os.path.realpath``'d already (a pool's key).
    ``mounts``: extra host directories its commands see (``mounts.Mount``)."""
    check_bwrap()
    _janitor_once()
    limits = limits or SandboxLimits()
    # once: the calls below take it as resolved
    base = os.fspath(base_dir) if resolved else os.path.realpath(base_dir)
    targets = [workdir or base, *venv_paths(venv), *(m.target for m in mounts)]
    if blank is not None and not (blank.limits == limits and blank.usable() and can_root(targets)):
        await asyncio.to_thread(blank.close)
        blank = None
    if blank is None and can_root(targets):
        blank = await make_blank(limits, venv)  # its bwrap starts while the workspace is mounted
    if blank is not None:
        return await _from_blank(blank, base, venv, limits, snapshot, workdir, mounts)
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
    sb = BwrapSandbox(ws, venv, limits, workdir, mounts=mounts)
    try:
        sb._ready = await ready
    except SandboxError:
        pass  # the first command prepares its own launcher and reports the failure
    return sb


async def _from_blank(blank: Blank, base: str, venv: str | None, limits: SandboxLimits,
                      snapshot: Snapshot | None, workdir: str | None,
                      mounts: tuple[Mount, ...] = ()) -> BwrapSandbox:
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
    sb = BwrapSandbox(ws, venv, limits, workdir, root=blank.root, mounts=mounts)
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
                       limits: SandboxLimits | None = None, workdir: str | None = None,
                       mounts: tuple[Mount, ...] = ()) -> BwrapSandbox:
    """A new sandbox whose workspace starts at ``snapshot``."""
    return await new_sandbox(snapshot.base, venv, limits=limits, snapshot=snapshot,
                             workdir=workdir, mounts=mounts)
