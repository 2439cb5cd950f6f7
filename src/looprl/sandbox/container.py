"""A sandbox whose commands run in a container (Docker or Podman, whichever works here): the
backend for tasks whose environment is an image, behind the same ``Sandbox`` protocol.

    engine = container_engine()            # ["podman"] / ["docker"] / LOOPRL_CONTAINER_ENGINE
    sb = await ContainerSandbox.create("/data/repos/x", image="python:3.11", workdir="/app",
                                       mounts=(Mount("/data/tests/x", "/tests"),))
    r = await sb.exec("python -m pytest -q", timeout_s=60)
    await sb.diff(); await sb.close()

The workspace is the same copy-on-write ``Workspace`` as bwrap's (``workspace.py``), on the
host, bind-mounted into one long-running container (``sleep infinity``, as Harbor keeps its
environments) at ``workdir``; each command is a ``<engine> exec``; files are read and written
on the host by ``files.WorkspaceFiles`` (as ``BwrapSandbox``'s are) and the diff is the
workspace's, so tools and the grader see exactly what they see with bwrap. The container gets no network (``--network none``), no
capabilities (``--cap-drop ALL``, ``no-new-privileges``), a pids and memory limit, the sandbox's
rlimits (``--ulimit``: some engines refuse to run without explicit ones) and, when looprl runs
as root, the workspace's unprivileged uid as its user. A command that runs over its time limit
takes the whole container with it (``restart -t 0``: nothing of it survives; the workspace,
on the host, does).

``LOOPRL_CONTAINER_ENGINE`` names the engine command (e.g. ``podman --runtime /usr/sbin/runc``);
by default Docker if its daemon answers, else Podman. ``check_engine(image)`` says why one
cannot run a container here (the reason a skipped test prints).

What this does NOT protect against: what the engine and its runtime leave open (kernel
exploits through the system calls the default seccomp profile allows, a rootful engine's own
privileges, images that ship setuid binaries are blunted only by ``no-new-privileges``), and
what is inside the image: its contents are trusted as given. Images are used as they are in
the engine's local store; nothing is pulled (``--pull never``).

``snapshot`` freezes both halves of the state: the workspace (a frozen layer, as bwrap's) and
the container's own root filesystem (``<engine> commit`` to a local image, removed once no
snapshot or sandbox of it is left); ``fork(n)`` starts ``n`` containers of that image over forks
of that layer; ``reset`` (the pool's idle reuse) starts a fresh container of the task's image
over the reset workspace. A command left running in the background while a snapshot is taken
may still write during it (bwrap's snapshot waits for its orphans; a container's are its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import shlex
import shutil
import subprocess
import threading
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from looprl import faults
from looprl.errors import InfraKind, SandboxError, SandboxUnavailableError
from looprl.sandbox.bwrap import Gate
from looprl.sandbox.files import WorkspaceFiles
from looprl.sandbox.idmap import UID_POOL
from looprl.sandbox.launch import Capped
from looprl.sandbox.mounts import TOOLS_DIR, Mount, harness_tools
from looprl.sandbox.workspace import Snapshot, Workspace, create_workspace
from looprl.types import ExecResult

ENGINE_ENV = "LOOPRL_CONTAINER_ENGINE"
_PROBE_TIMEOUT_S = 120


def _engines() -> list[list[str]]:
    """Engine command lines to try, in order."""
    if os.environ.get(ENGINE_ENV):
        return [shlex.split(os.environ[ENGINE_ENV])]
    out = []
    if shutil.which("docker"):
        out.append(["docker"])
    if shutil.which("podman"):
        out.append(["podman"])
        runc = shutil.which("runc") or ("/usr/sbin/runc" if Path("/usr/sbin/runc").exists() else None)
        if runc:  # crun refuses some hosts' cgroup layouts (hybrid v1/v2) where runc runs
            out.append(["podman", "--runtime", runc])
    return out


def ulimit_args() -> list[str]:
    """``--ulimit`` for the file and process limits, at most ours (an engine that sets higher
    ones than this process holds fails with EPERM)."""
    args = []
    for name, res, want in (("nofile", resource.RLIMIT_NOFILE, 1024),
                            ("nproc", resource.RLIMIT_NPROC, 1024)):
        _, hard = resource.getrlimit(res)
        n = want if hard == resource.RLIM_INFINITY else min(want, hard)
        args += ["--ulimit", f"{name}={n}:{n}"]
    return args


def _run(argv: list[str], timeout: float = _PROBE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)


@functools.lru_cache(maxsize=8)
def _probe(image: str) -> tuple[tuple[str, ...] | None, str]:
    reasons = []
    for engine in _engines():
        name = " ".join(engine)
        try:
            if _run([*engine, "image", "inspect", image]).returncode != 0:
                reasons.append(f"{name}: image {image} is not in its local store")
                continue
            r = _run([*engine, "run", "--rm", "--pull", "never", "--network", "none",
                      *ulimit_args(), "--entrypoint", "/bin/sh", image, "-c", "true"])
        except (OSError, subprocess.TimeoutExpired) as e:
            reasons.append(f"{name}: {e}")
            continue
        if r.returncode == 0:
            return tuple(engine), ""
        reasons.append(f"{name}: {(r.stderr or r.stdout).strip().splitlines()[-1:] or ['failed']}")
    if not reasons:
        return None, "no container engine installed (docker or podman)"
    return None, "; ".join(reasons)


def check_engine(image: str) -> tuple[str, ...]:
    """The engine command that runs ``image`` here; ``SandboxUnavailableError`` saying why none
    does (no engine, no daemon, the image not in the local store, the runtime refusing)."""
    engine, why = _probe(image)
    if engine is None:
        _probe.cache_clear()  # (an engine started or an image built meanwhile is seen next time)
        raise SandboxUnavailableError(f"cannot run containers of {image}: {why}")
    return engine


def image_workdir(engine: tuple[str, ...], image: str) -> str:
    """The image's WORKDIR ('' when it sets none)."""
    r = _run([*engine, "image", "inspect", "--format", "{{.Config.WorkingDir}}", image])
    if r.returncode != 0:
        raise SandboxError(f"inspecting {image} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return r.stdout.strip()


def copy_out(engine: tuple[str, ...], image: str, path: str, dest: Path) -> None:
    """Copy ``path`` of ``image`` (a directory) to ``dest`` on the host, links as links: a
    container is created, never started."""
    name = f"looprl-copy-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    r = _run([*engine, "create", "--pull", "never", "--name", name, image, "/bin/sh"])
    if r.returncode != 0:
        raise SandboxError(f"creating a container of {image} failed: "
                           f"{(r.stderr or r.stdout).strip()[-300:]}")
    try:
        dest.mkdir(parents=True)
        r = _run([*engine, "cp", f"{name}:{path.rstrip('/')}/.", str(dest)])
        if r.returncode != 0:
            raise SandboxError(f"copying {path} out of {image} failed: "
                               f"{(r.stderr or r.stdout).strip()[-300:]}")
    finally:
        _run([*engine, "rm", "-f", name])


class _Committed:
    """Images ``snapshot`` committed, each removed from the engine's store once no snapshot or
    sandbox holds it (counts per process; a crashed process leaves its ``looprl-snap`` images
    behind, ``<engine> image prune`` takes them)."""

    def __init__(self) -> None:
        self._refs: dict[str, int] = {}
        self._lock = threading.Lock()

    def hold(self, image: str) -> None:
        with self._lock:
            self._refs[image] = self._refs.get(image, 0) + 1

    def drop(self, engine: tuple[str, ...], image: str) -> None:
        with self._lock:
            n = self._refs.get(image, 0) - 1
            if n > 0:
                self._refs[image] = n
                return
            self._refs.pop(image, None)
        _run([*engine, "image", "rm", image])

    def held(self, image: str) -> bool:
        return image in self._refs


_COMMITTED = _Committed()


@dataclass(frozen=True, eq=False)
class ContainerSnapshot(Snapshot):
    """A container sandbox's frozen state: the workspace's layers and, in ``image``, the
    container's root filesystem committed."""

    image: str = ""
    engine: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        _COMMITTED.hold(self.image)
        object.__setattr__(self, "_image_finalizer",
                           weakref.finalize(self, _COMMITTED.drop, self.engine, self.image))

    def release(self) -> None:
        super().release()
        self._image_finalizer()  # type: ignore[attr-defined]


class ContainerSandbox(WorkspaceFiles):
    """``looprl.protocols.Sandbox`` over a copy-on-write workspace, commands in a container."""

    tools_dir = TOOLS_DIR
    """The harness's programs (``mounts.harness_tools``: the host's ruff), bound read-only, as
    bwrap binds them; a dynamically linked one runs only in an image with a compatible libc."""

    def __init__(self, engine: tuple[str, ...], image: str, workspace: Workspace, workdir: str,
                 mounts: tuple[Mount, ...], memory_mb: int, output_bytes: int) -> None:
        self.engine, self.image, self.workspace = engine, image, workspace
        self.workdir, self.mounts = workdir, mounts
        self.memory_mb, self.output_bytes = memory_mb, output_bytes
        self.name = ""
        self._root = str(workspace.path)
        self._closed = False
        self._gate = Gate()
        self._holds = _COMMITTED.held(image)
        if self._holds:  # a fork's: the committed image outlives its snapshot while this runs
            _COMMITTED.hold(image)

    @property
    def cow_backend(self) -> str:
        return self.workspace.cow_backend

    @classmethod
    async def create(cls, base_dir: str | os.PathLike[str], *, image: str, workdir: str,
                     mounts: tuple[Mount, ...] = (), memory_mb: int = 2048,
                     output_bytes: int = 64_000,
                     snapshot: Snapshot | None = None) -> ContainerSandbox:
        """A workspace over ``base_dir`` and a container of ``image`` with it at ``workdir``;
        from a ``snapshot`` (``ContainerSnapshot``: its committed image instead)."""
        if isinstance(snapshot, ContainerSnapshot):  # (committed by an engine that runs it)
            image, engine = snapshot.image, snapshot.engine
        else:
            engine = await asyncio.to_thread(check_engine, image)
        uid = UID_POOL.take() if os.geteuid() == 0 else None
        try:
            ws = await asyncio.to_thread(create_workspace, base_dir, snapshot=snapshot, uid=uid)
        except BaseException:
            if uid is not None:
                UID_POOL.give(uid)
            raise
        sb = cls(engine, image, ws, workdir, mounts, memory_mb, output_bytes)
        try:
            await sb._start()
        except BaseException:
            await sb.close()
            raise
        return sb

    def _run_argv(self) -> list[str]:
        uid = self.workspace.uid
        user = ["--user", f"{uid}:{uid}"] if uid is not None else []
        binds = ["-v", f"{self.workspace.path}:{self.workdir}:rw"]
        for name, host in harness_tools():
            binds += ["-v", f"{host}:{TOOLS_DIR}/{name}:ro"]
        for m in self.mounts:
            binds += ["-v", f"{m.source}:{m.target}:{'ro' if m.readonly else 'rw'}"]
        return [*self.engine, "run", "-d", "--pull", "never", "--name", self.name,
                "--network", "none",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--pids-limit", "512", "--memory", f"{self.memory_mb}m", *ulimit_args(), *user,
                "--tmpfs", "/tmp:rw,mode=1777", "-w", self.workdir, *binds, "--entrypoint",
                "/bin/sh", self.image, "-c", "sleep infinity"]

    async def _start(self) -> None:
        self.name = f"looprl-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        r = await asyncio.to_thread(_run, self._run_argv())
        if r.returncode != 0:
            raise SandboxError(f"starting a container of {self.image} failed: "
                               f"{(r.stderr or r.stdout).strip()[-500:]}")

    async def exec(self, cmd: str, *, timeout_s: float = 60.0,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        self._check_open()
        # the injected hang: the sandbox never answers; here, so the grader's commands cross it too
        faults.maybe_raise(InfraKind.EXEC_TIMEOUT, "ContainerSandbox.exec")
        envs = [a for k, v in (env or {}).items() for a in ("--env", f"{k}={v}")]
        await self._gate.enter(False)
        try:
            return await self._exec(cmd, envs, timeout_s)
        finally:
            await self._gate.leave(False)

    async def _exec(self, cmd: str, envs: list[str], timeout_s: float) -> ExecResult:
        argv = [*self.engine, "exec", "-i", "-w", self.workdir, *envs, self.name,
                "/bin/sh", "-c", cmd]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE)
        out, err = Capped(self.output_bytes), Capped(self.output_bytes)

        async def pump(stream: asyncio.StreamReader | None, sink: Capped) -> None:
            while stream is not None and (chunk := await stream.read(65536)):
                sink.add(chunk)

        timed_out = False
        try:
            await asyncio.wait_for(asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err),
                                                  proc.wait()), timeout_s)
        except TimeoutError:
            timed_out = True
            # the command's processes live in the container, not under the client: restart it
            await asyncio.to_thread(_run, [*self.engine, "restart", "-t", "0", self.name])
            with contextlib.suppress(ProcessLookupError):  # (the restart may have ended it)
                proc.kill()
            await proc.wait()
        stdout, cut_out = out.text()
        stderr, cut_err = err.text()
        code = None if timed_out else proc.returncode
        if code in (125, 126, 127) and "Error:" in stderr and self.name in stderr:
            raise SandboxError(f"the container engine failed: {stderr.strip()[-400:]}")
        return ExecResult(code, stdout, stderr, timed_out, cut_out or cut_err, loop.time() - t0)

    async def diff(self) -> str:
        self._check_open()
        return await asyncio.to_thread(self.workspace.diff)

    def _remove(self) -> None:
        """Kill the container and remove it (Docker's ``rm`` takes no stop timeout)."""
        _run([*self.engine, "kill", self.name])
        _run([*self.engine, "rm", "-f", self.name])

    async def snapshot(self) -> ContainerSnapshot:
        """Freeze the workspace and the container's root filesystem (waits for running
        commands; blocks new ones meanwhile)."""
        self._check_open()
        await self._gate.enter(True)
        try:
            image = f"localhost/looprl-snap:{os.getpid()}-{uuid.uuid4().hex[:12]}"
            r = await asyncio.to_thread(_run, [*self.engine, "commit", "-q", self.name, image])
            if r.returncode != 0:
                raise SandboxError(f"committing container {self.name} failed: "
                                   f"{(r.stderr or r.stdout).strip()[-300:]}")
            try:
                ws = await asyncio.to_thread(self.workspace.snapshot)
            except BaseException:
                await asyncio.to_thread(_run, [*self.engine, "image", "rm", image])
                raise
            snap = ContainerSnapshot(ws.id, ws.base, ws.layers, ws.cow_backend, image=image,
                                     engine=self.engine)
            ws.release()  # (the container snapshot holds the same layers)
            return snap
        finally:
            await self._gate.leave(True)

    async def fork(self, n: int) -> list[ContainerSandbox]:
        """``n`` independent sandboxes starting from this one's current state."""
        snap = await self.snapshot()
        try:
            return [await ContainerSandbox.create(snap.base, image=snap.image,
                                                  workdir=self.workdir, mounts=self.mounts,
                                                  memory_mb=self.memory_mb,
                                                  output_bytes=self.output_bytes, snapshot=snap)
                    for _ in range(n)]
        finally:
            snap.release()

    async def reset(self) -> None:
        """Back to the starting state: the workspace reset, a fresh container of the image."""
        self._check_open()
        await self._gate.enter(True)
        try:
            await asyncio.to_thread(self._remove)
            await asyncio.to_thread(self.workspace.reset)
            await self._start()
        finally:
            await self._gate.leave(True)

    async def close(self) -> None:
        """Remove the container (killing what runs in it), then the workspace."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._remove)
        if self._holds:
            await asyncio.to_thread(_COMMITTED.drop, self.engine, self.image)
        if not self.workspace.closed:
            await asyncio.to_thread(self.workspace.destroy)
            if self.workspace.uid is not None:
                UID_POOL.give(self.workspace.uid)

    def _check_open(self) -> None:
        if self._closed or self.workspace.closed:
            raise SandboxError("sandbox is closed (its container and workspace were removed)")
